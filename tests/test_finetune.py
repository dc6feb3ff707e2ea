"""Cross-lingual transfer fine-tuning (vmx/finetune/, launch/finetune.py): XNLI fine-tuned
and scored on a tiny checkpoint from replicas of the layouts built on shared/data's XNLI
dev files; a stopped run resumed equals the uninterrupted one; pairs joined as each
tokenizer's model joins them; PAWS-X's layout; missing data as one line naming the flag
and the layout; any method's encoder as the start."""
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import DATA_DIR, REPO, save_model_dir, write_lines

XNLI = Path(DATA_DIR or "/nonexistent") / "eval" / "xnli"
needs_xnli = pytest.mark.skipif(not (XNLI / "dev-en.tsv").is_file(),
                                reason="shared/data's eval/xnli dev files not found")
LANGS = ("en", "de", "fr")


def _tiny_checkpoint(root: Path) -> Path:
  """A 1-layer CONTRASTIVE dual encoder (mean pooling, a 500-piece vocabulary of the XNLI
  text) saved as a vmx model directory, as a run or an import leaves one."""
  from vmx import encoders
  from vmx.data import vocab
  from vmx.models import DualEncoder, DualEncoderModel
  text = write_lines(root / "text.txt", [f for lang in LANGS for line in
                                         (XNLI / f"dev-{lang}.tsv").read_text().splitlines()
                                         for f in line.split("\t")[:2]])
  vp = vocab.train_sentencepiece([str(text)], str(root / "v.model"), 500)
  enc = encoders.TransformerEncoder(vocab_size=500, num_layers=1, emb_dim=32, num_heads=2,
                                    mlp_dim=64, max_length=32)
  model = DualEncoderModel(DualEncoder(enc))
  return save_model_dir(root / "ckpt", model, ["eng", "deu", "fra"], 32, vp)


def _xnli_replica(root: Path) -> Path:
  """The XNLI layout from the shared dev files: train-en.tsv = English lines 1-1494 (with
  XNLI-MT's header line and its `contradictory` spelling), dev = lines 1495-1992 and test
  = lines 1993-2490 of each language (no test item translates a training one)."""
  d = root / "xnli"
  for lang in LANGS:
    lines = (XNLI / f"dev-{lang}.tsv").read_text().splitlines()
    if lang == "en":
      write_lines(d / "train-en.tsv", ["premise\thypo\tlabel"] + [
          l.replace("\tcontradiction", "\tcontradictory") for l in lines[:1494]])
    write_lines(d / f"dev-{lang}.tsv", lines[1494:1992])
    write_lines(d / f"test-{lang}.tsv", lines[1992:])
  return d


def _run(ckpt, data, out, *bindings, **kw):
  import gin
  from vmx import experiment, finetune
  gin.clear_config()
  experiment.parse_gin(["finetune/xnli_tiny.gin"], [
      f"INITIAL_CHECKPOINT_PATH = '{ckpt}'", f"XNLI_DIR = '{data}'", f"MODEL_DIR = '{out}'",
      "EVAL_LANGUAGES = ['en', 'de', 'fr']", "MAX_TRAIN_EXAMPLES = 400", "LOG_PERIOD = 10",
      "finetune.progress = False", "finetune.prefetch_batches = 0", *bindings], "")
  try:
    return finetune.finetune(**kw)
  finally:
    gin.clear_config()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  root = tmp_path_factory.mktemp("finetune")
  return _tiny_checkpoint(root), _xnli_replica(root), root


@needs_xnli
def test_finetunes_and_scores_xnli_on_a_tiny_checkpoint(tiny, capsys):
  """InfoXLM's Table 1 protocol end to end: the checkpoint's encoder loaded, a
  classification head trained on English, the best joint-dev step kept (#M=1), every
  language's test set scored zero-shot; the fine-tuned directory is an encoder too; the
  protocol report names tables, vector and setting."""
  from vmx.evaluation import protocols
  from vmx.inference import Encoder
  ckpt, data, root = tiny
  out = root / "run"
  res = _run(ckpt, data, out, "TRAIN_STEPS = 20", "EVAL_PERIOD = 10", "CHECKPOINT_PERIOD = 10")
  log = capsys.readouterr().out
  assert "loaded   encoder/token_embed/embedding" in log and "new      head_out/kernel" in log
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert set(rows) == set(LANGS) and all(r["n"] == 498 for r in rows.values())
  assert [r["zero_shot"] for r in res["scores"]["test"]] == [False, True, True]
  assert res["main_score"] == pytest.approx(np.mean([r["accuracy"] for r in rows.values()]))
  assert res["zero_shot_mean"] == pytest.approx((rows["de"]["accuracy"] +
                                                 rows["fr"]["accuracy"]) / 2)
  assert res["n_train"] == 400 and res["steps"] == 20 and res["selected"].startswith("best/")
  assert res["vector"].startswith("mean of the last layer, fine-tuned")
  assert json.loads((out / "finetune_xnli.json").read_text())["main_score"] == res["main_score"]
  metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert {m["step"] for m in metrics if "dev/accuracy" in m} == {0, 10, 20}
  best = max((m for m in metrics if "dev/accuracy" in m), key=lambda m: (m["dev/accuracy"],
                                                                          m["step"]))
  assert res["step"] == best["step"]
  assert Encoder.from_checkpoint(out).encode(["Ein Satz."], lang="deu").shape == (1, 32)
  report = protocols.finetuned_report("infoxlm", res)
  figs = {(f["table"], f["column"]): f for f in report["figures"]}
  assert figs[("Tables 1, 7, 10", "xnli Avg.")]["value"] == res["main_score"]
  assert figs[("Table 1", "xnli de")]["value"] == rows["de"]["accuracy"]
  assert all(f["vector"] == res["vector"] for f in report["figures"])
  assert report["missing"][0]["benchmark"] == "mlqa (fine-tuned)"
  gap = figs[("Table 5", "xnli transfer gap (en minus the mean of the other languages; "
                         "lower is better)")]
  assert gap["value"] == pytest.approx(rows["en"]["accuracy"] - res["zero_shot_mean"])
  assert gap["n_languages"] == 2
  emmax = protocols.finetuned_report("emmax", res)      # EMMA-X fine-tunes on all 15
  assert {f.get("paper_setting") for f in emmax["figures"]} == {"translate-train-all"}
  faithful = dict(res, setting="translate-train-all (3 training languages, every evaluated "
                               "one)")             # what a run on every language writes
  assert {f.get("paper_setting") for f in protocols.finetuned_report(
      "emmax", faithful)["figures"]} == {None}
  assert {"anli (fine-tuned)", "pawsx (fine-tuned)"} <= {m["benchmark"] for m in emmax["missing"]}


@needs_xnli
def test_a_stopped_run_resumes_to_the_uninterrupted_result(tiny):
  """The same checkpointing and resume as training: stopped at step 6 and rerun, the run
  ends with the parameters of the run that was never stopped, bit for bit; other data in
  the same MODEL_DIR are refused."""
  from vmx.errors import DataError
  from vmx.modeldir import checkpoints
  from vmx.models.base import model_from_config
  from vmx.modeldir.layout import read_model_info
  ckpt, data, root = tiny
  steps = ["TRAIN_STEPS = 12", "EVAL_PERIOD = 0", "CHECKPOINT_PERIOD = 3"]
  _run(ckpt, data, root / "whole", *steps)
  assert _run(ckpt, data, root / "parts", *steps, stop_at_step=6) is None
  _run(ckpt, data, root / "parts", *steps)
  model = model_from_config(read_model_info(root / "whole")["model"])
  a, sa = checkpoints.restore_params(root / "whole", model, None, 32)
  b, sb = checkpoints.restore_params(root / "parts", model, None, 32)
  assert sa == sb == 12
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  with pytest.raises(DataError, match="other fine-tuning data"):
    _run(ckpt, data, root / "parts", "TRAIN_STEPS = 15", "EVAL_PERIOD = 0",
         "CHECKPOINT_PERIOD = 3", "MAX_TRAIN_EXAMPLES = 300", "ALLOW_CONFIG_CHANGE = True")


def test_missing_data_is_one_line_naming_the_flag_and_the_layout(tmp_path):
  from vmx import finetune
  from vmx.errors import DataError
  proc = subprocess.run([sys.executable, "launch/finetune.py", "--gin_file=finetune/xnli.gin",
                         f"--gin.INITIAL_CHECKPOINT_PATH={tmp_path}",
                         f"--gin.MODEL_DIR={tmp_path / 'out'}"],
                        capture_output=True, text=True, cwd=REPO, timeout=600)
  err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
  assert "XNLI_DIR is not set: --gin.XNLI_DIR=DIR: DIR/train-en.tsv" in err[0]
  assert "premise<TAB>hypo<TAB>label" in err[0] and "XNLI-MT 1.0" in err[0]
  write_lines(tmp_path / "x" / "train-en.tsv", ["a\tb\tneutral"])
  with pytest.raises(DataError, match=r"XNLI_DIR=.*: no test-de\.tsv \(--gin\.XNLI_DIR=DIR: "):
    finetune.read_pairs(finetune.BENCHMARKS["xnli"], tmp_path / "x", "test", "de")
  write_lines(tmp_path / "x" / "test-de.tsv", ["a\tb\tmaybe"])
  with pytest.raises(DataError, match=r"test-de\.tsv:1: label 'maybe'"):
    finetune.read_pairs(finetune.BENCHMARKS["xnli"], tmp_path / "x", "test", "de")


def test_pawsx_is_read_as_distributed(tmp_path):
  """PAWS-X's x-final/: header columns (id first), labels 0/1, English train.tsv and the
  other languages' translated_train.tsv, pairs with an empty translation skipped."""
  from vmx import finetune
  pawsx = finetune.BENCHMARKS["pawsx"]
  d = tmp_path / "x-final"
  write_lines(d / "en" / "train.tsv", ["id\tsentence1\tsentence2\tlabel", "1\ta\tb\t1",
                                       "2\tc\td\t0"])
  write_lines(d / "de" / "translated_train.tsv", ["id\tsentence1\tsentence2\tlabel",
                                                  "1\tA\t\t1", "2\tC\tD\t0"])
  a, b, y, skipped = finetune.read_pairs(pawsx, d, "train", "en")
  assert (a, b, y.tolist(), skipped) == (["a", "c"], ["b", "d"], [1, 0], 0)
  a, b, y, skipped = finetune.read_pairs(pawsx, d, "train", "de")
  assert (a, y.tolist(), skipped) == (["C"], [0], 1)
  write_lines(d / "fr" / "test_2k.tsv", ["id\ttext\tlabel", "1\tx\t1"])
  from vmx.errors import DataError
  with pytest.raises(DataError, match=r"no column\(s\) \['sentence1', 'sentence2'\]"):
    finetune.read_pairs(pawsx, d, "test", "fr")


def test_batches_are_a_function_of_the_step():
  """The data position of a checkpoint is its step: step s's batch is the same whether
  the run got there from step 0 or resumed at it; every pair once per epoch."""
  from vmx.finetune import RowBatches
  arrays = {"tokens": np.arange(70, dtype=np.int32).reshape(35, 2),
            "label": np.arange(35, dtype=np.int32)}
  run = RowBatches(arrays, 7, seed=3, digest="d")
  seen = [next(run) for _ in range(10)]
  resumed = RowBatches(arrays, 7, seed=3, digest="d", position=6)
  np.testing.assert_array_equal(next(resumed)["label"], seen[6]["label"])
  assert sorted(np.concatenate([b["label"] for b in seen[:5]]).tolist()) == list(range(35))
  assert run.state_at(4) == {"reader": "finetune", "position": 4, "data": "d"}
  np.testing.assert_array_equal(seen[3]["tokens"][:, 0] // 2, seen[3]["label"])
  assert not np.array_equal(RowBatches(arrays, 7, 4, "d").batch(0)["label"],
                            seen[0]["label"])


def test_pairs_are_joined_as_the_tokenizers_model_joins_them(tmp_path):
  """vmx's own SentencePiece: `a </s> b`; XLM-R's: `<s> a </s></s> b </s>` and mT5's
  `a </s> b </s>` as transformers' tokenizers give them; too long a pair loses tokens of
  its longer text first."""
  import sentencepiece as spm
  from vmx.data import vocab
  from vmx.data.vocab import TOKENIZER_SPEC, HfTokenizer
  sents = [l.split("\t")[0] for l in (Path(DATA_DIR or "/x") / "eval/xnli/dev-de.tsv")
           .read_text().splitlines()[:300]] if (Path(DATA_DIR or "/x") / "eval/xnli").is_dir() \
      else [f"satz nummer {i} mit worten" for i in range(300)]
  text = write_lines(tmp_path / "t.txt", sents)
  tok = vocab.load_tokenizer(vocab.train_sentencepiece([str(text)], str(tmp_path / "v.model"),
                                                       300))
  a, b = sents[:5], sents[5:10]
  got = tok.encode_pairs(a, b, 64)
  for i in range(5):
    want = tok.sp.encode(a[i]) + [tok.sp.eos_id()] + tok.sp.encode(b[i])
    assert got[i][:len(want)].tolist() == want[:64] and not got[i][len(want):].any()
  long_a, short_b = "ein sehr langer satz mit vielen worten und mehr", "kurz"
  x, z = tok.sp.encode(long_a), tok.sp.encode(short_b)
  while len(x) + len(z) > 7:                  # Hugging Face's longest_first, by hand
    if len(x) > len(z):
      x = x[:-1]
    else:
      z = z[:-1]
  assert len(tok.sp.encode(long_a)) > len(x)
  assert tok.encode_pairs([long_a], [short_b], 8)[0].tolist() == x + [tok.sp.eos_id()] + z
  transformers = pytest.importorskip("transformers")
  import shutil
  for kind, name, cls, ids in (
      ("fairseq_spm", "sentencepiece.bpe.model", "XLMRobertaTokenizer",
       dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)),
      ("t5_spm", "spiece.model", "T5Tokenizer", dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1))):
    d = tmp_path / kind
    d.mkdir()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sents), model_prefix=str(d / "m"),
                                   vocab_size=300, hard_vocab_limit=False, minloglevel=2, **ids)
    shutil.copy(d / "m.model", d / name)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": cls,
                                                         "extra_ids": 0}))
    (d / TOKENIZER_SPEC).write_text(json.dumps({"kind": kind, "file": name, "closing_special":
                                                True, "pad_id": 1 if kind == "fairseq_spm"
                                                else 0}))
    hf = transformers.AutoTokenizer.from_pretrained(d)
    mine = HfTokenizer(str(d / TOKENIZER_SPEC))
    got = mine.encode_pairs(a, b, 48)
    for i in range(5):
      want = hf(a[i], b[i], truncation="longest_first", max_length=48)["input_ids"]
      np.testing.assert_array_equal(mine.to_vmx_ids(got[i][:len(want)]), want, err_msg=kind)


def test_any_methods_encoder_is_the_start():
  """EMS keeps its sentence encoder at `sentence_encoder/` with the token table beside it,
  VMSST at `semantic_encoder/`: the classifier's `encoder/...` loads all of it."""
  from vmx import encoders
  from vmx.finetune import source_encoder
  from vmx.models import ems
  from vmx.models.classifier import ClassifierModel, SequenceClassifier
  from vmx.training import initial_checkpoint
  from vmx.modeldir.checkpoints import flatten
  enc = encoders.TransformerEncoder(vocab_size=40, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  src = ems.EMSModel(ems.EMS(enc, num_languages=3, contrastive_dims=(8,)))
  e, prefix, table, pooling = source_encoder(src)
  assert (prefix, table, pooling) == ("sentence_encoder", "token_embed", "mean")
  src_params = src.get_initial_variables(jax.random.PRNGKey(0), src.inference_shapes(8))
  clf = ClassifierModel(SequenceClassifier(e, 3, pooling))
  target = clf.get_initial_variables(jax.random.PRNGKey(1), {"tokens": (2, 8)})["params"]
  rules = [(r"encoder/token_embed/(.*)", rf"{table}/\1"), (r"encoder/(.*)", rf"{prefix}/\1")]
  loaded, new, _ = initial_checkpoint.assign(
      {k: v.shape for k, v in flatten(target).items()},
      {k: np.asarray(v) for k, v in flatten(src_params["params"]).items()}, rules)
  assert {k for k in new} == {k for k in flatten(target) if k.startswith("head_")}
  assert all(k.startswith("encoder/") for k in loaded)
