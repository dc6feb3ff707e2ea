"""The exported model card (vmx/modeldir/model_card.py) says how the run was trained and
how this checkpoint scored, read from the run's files: config.gin's experiment header and
settings, metrics.jsonl's rows of the step, launch/eval.py's results and protocol figures of
that checkpoint (and its variants), nothing of other steps."""
import json

from vmx.modeldir import model_card

CONFIG = """# vmx experiment: contrastive_tiny.gin
# binding: MODEL_DIR='/tmp/x'
# header of contrastive_tiny.gin:
#   Command:  python launch/train.py --gin_file=contrastive_tiny.gin
#   Result:   Tatoeba mean accuracy 40

# Macros:
# ==============================================================================
EMB_DIM = 128
MATRYOSHKA_DIMS = [32, 64]
NUM_LAYERS = 2
TRAIN_STEPS = 1200
"""


def _result(task, score, vector="mean of the last layer"):
  return {"task_name": task, "main_score": score, "vector": vector,
          "dataset_revision": "abc123", "scores": {}}


def test_card_reads_the_runs_own_files(tmp_path):
  d = tmp_path / "run"
  (d / "eval" / "checkpoint_1200").mkdir(parents=True)
  (d / "eval" / "checkpoint_1200_dim32").mkdir()
  (d / "eval" / "checkpoint_600").mkdir()
  (d / "config.gin").write_text(CONFIG)
  (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
      {"step": 600, "time": 1.0, "tatoeba/mean": 27.9},
      {"step": 1200, "time": 2.0, "train/loss": 2.7},
      {"step": 1200, "time": 3.0, "tatoeba/mean": 39.17, "eval/seconds": 5.0}]) + "\n")
  (d / "eval" / "checkpoint_1200" / "tatoeba.json").write_text(json.dumps(
      _result("tatoeba", 39.16875)))
  (d / "eval" / "checkpoint_1200" / "protocol_vmsst.json").write_text(json.dumps(
      {"paper": "Wieting et al. 2023", "figures": [
          {"table": "Table 2", "column": "Tatoeba", "value": 39.2, "metric": "accuracy",
           "vector": "mean"}]}))
  (d / "eval" / "checkpoint_1200_dim32" / "tatoeba.json").write_text(json.dumps(
      _result("tatoeba", 36.7, "mean of the last layer, its first 32 dimensions")))
  (d / "eval" / "checkpoint_600" / "tatoeba.json").write_text(json.dumps(
      _result("tatoeba", 27.9)))
  info = {"model": {"__class__": "vmx.models.dual_encoder:DualEncoderModel",
                    "matryoshka_dims": [32, 64]},
          "languages": ["deu", "eng"], "max_length": 32}
  card = model_card.render(d, 1200, info, "my-model", quantization_sizes=[128])
  assert card.startswith("---\nlibrary_name: sentence-transformers\n")
  assert "language:\n- deu\n- eng\n---" in card and "# my-model" in card
  assert "trained with vmx (DualEncoderModel), exported at checkpoint step 1200" in card
  assert "Command:  python launch/train.py --gin_file=contrastive_tiny.gin" in card
  assert "vmx experiment: contrastive_tiny.gin" in card and "Macros" not in card
  assert "| `EMB_DIM` | `128` |" in card and "| `TRAIN_STEPS` | `1200` |" in card
  assert "Matryoshka dimensions [32, 64]" in card and "vector sizes [128]" in card
  assert "| tatoeba/mean | 39.17 |" in card and "train/loss" not in card
  assert "eval/seconds" not in card
  assert "(float32, all dimensions):" in card and "(dim32):" in card
  assert "| tatoeba | 39.17 | mean of the last layer | abc123 |" in card
  assert "| tatoeba | 36.70 | mean of the last layer, its first 32 dimensions |" in card
  assert "| Table 2 | Tatoeba | 39.20 | accuracy | mean |" in card
  assert "27.9" not in card                       # step 600 is another checkpoint


def test_card_without_evaluations_says_so(tmp_path):
  info = {"model": {"__class__": "vmx.models.dual_encoder:DualEncoderModel"},
          "languages": ["eng"], "max_length": 16}
  card = model_card.render(tmp_path, 0, info)
  assert "No evaluation of checkpoint 0 was found" in card
  assert "Matryoshka" not in card and "int8" not in card
