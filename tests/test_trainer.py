"""save -> stop -> resume gives bitwise the same parameters as an uninterrupted run."""
import json

import jax
import numpy as np
import pytest

from conftest import toy_train
from vmx.models import VMSST, VMSSTModel


def _run(model_dir, name, vp, stop_at_step=None, kind="contrastive"):
  return toy_train(model_dir, name, vp, kind=kind, stop_at_step=stop_at_step)


@pytest.mark.slow   # the fast tier: tests/test_stream.py's old replay position
def test_a_checkpoint_of_the_replaying_reader_resumes_by_replaying(tmp_path, toy_task, capsys):
  """A checkpoint whose data state is a replay position (written by the seqio reader, or
  before the index reader existed) resumes under a config asking for the index reader:
  by replaying, with a warning, and ends where the uninterrupted replaying run ends."""
  name, vp, _, _ = toy_task
  full = toy_train(tmp_path / "full", name, vp, reader="seqio")
  toy_train(tmp_path / "split", name, vp, stop_at_step=3, reader="seqio")
  capsys.readouterr()
  resumed = toy_train(tmp_path / "split", name, vp)           # reader: index (default)
  out = capsys.readouterr().out
  assert "data position (3 batches) was written by the replaying reader" in out
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.params, resumed.params)


@pytest.mark.parametrize("kind", ["contrastive", pytest.param("vmsst", marks=pytest.mark.slow)])
def test_resume_equals_uninterrupted(tmp_path, toy_task, kind):
  name, vp, _, _ = toy_task
  full = _run(tmp_path / "full", name, vp, kind=kind)
  first = _run(tmp_path / "split", name, vp, stop_at_step=3, kind=kind)
  assert int(first.step) == 3
  resumed = _run(tmp_path / "split", name, vp, kind=kind)
  assert int(resumed.step) == 6
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.flax_mutables, resumed.flax_mutables)
  if kind == "vmsst":
    assert int(resumed.flax_mutables["annealing"]["updates"]) == 6
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.params, resumed.params)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.opt_state, resumed.opt_state)
  steps = sorted(p.name for p in (tmp_path / "split").glob("checkpoint_*"))
  assert steps == ["checkpoint_3", "checkpoint_6"]
  # A model_dir is self-contained for inference.
  from vmx.inference import Encoder
  enc = Encoder.from_checkpoint(tmp_path / "split")
  v = enc.encode(["alpha beta", "GAMMA"], lang="xx")
  assert v.shape == (2, 16)
  np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
  direct = np.asarray(enc.model.encode_tokens(
      jax.tree.map(np.asarray, resumed.params),
      enc.tokenizer.encode(["alpha beta", "GAMMA"], 8), None))
  np.testing.assert_allclose(v, direct, rtol=1e-5, atol=1e-6)
  if kind == "vmsst":  # the inference embedding is the semantic posterior's mean
    assert isinstance(enc.model, VMSSTModel)
    mu, _ = enc.model.module.apply({"params": jax.tree.map(np.asarray, resumed.params)},
                                   enc.tokenizer.encode(["alpha beta", "GAMMA"], 8),
                                   method=VMSST.semantic)
    mu = np.asarray(mu)
    np.testing.assert_allclose(v, mu / np.linalg.norm(mu, axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_best_checkpoint_follows_the_dev_metric_across_a_resume(tmp_path, toy_task,
                                                                monkeypatch):
  """train.best_metric keeps the best evaluated step in MODEL_DIR/best/ (params only);
  a resumed run continues from the record and replaces it only with a better value;
  Encoder.from_checkpoint(dir, 'best') opens it; a different metric is refused."""
  from vmx.errors import CheckpointError, ConfigError, InputError
  from vmx.evaluation import evaluators
  from vmx.inference import Encoder
  from vmx.evaluation.periodic import TatoebaEvalConfig
  name, vp, _, _ = toy_task
  scores = []

  def scripted(self, ctx):                   # the harness's tatoeba task, scripted
    ctx.encode(["alpha beta"], None)         # the encoder of the current parameters works
    v = scores.pop(0)
    return {"scores": {"test": [{"hf_subset": f"{l}-eng", "languages": [l, "eng"],
                                 "main_score": v} for l in self.languages]},
            "main_score": v}

  monkeypatch.setattr(evaluators.Tatoeba, "run", scripted)
  d = tmp_path / "run"
  kw = dict(period=2, keep=10, eval_cfg=TatoebaEvalConfig(["deu"]), eval_period=2,
            best_metric="tatoeba/mean")

  def params(step):
    return jax.tree.map(np.asarray, Encoder.from_checkpoint(d, step=step).params)

  def same(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)

  scores[:] = [10.0, 40.0, 20.0]                # evaluations at steps 0, 2, 4
  toy_train(d, name, vp, stop_at_step=4, **kw)
  assert not scores
  record = json.loads((d / "best/best.json").read_text())
  assert record == {"metric": "tatoeba/mean", "mode": "max", "step": 2, "value": 40.0}
  assert sorted(p.name for p in (d / "best").glob("checkpoint_*")) == ["checkpoint_2"]
  assert {"params", "vmx_checksums.json"} <= {p.name for p in (d / "best/checkpoint_2").iterdir()}
  assert Encoder.from_checkpoint(d, step="best").revision == "best/checkpoint_2"
  same(params("best"), params(2))

  scores[:] = [50.0]                            # resumed at 4 (evaluated): step 6 only
  toy_train(d, name, vp, **kw)
  assert not scores
  assert json.loads((d / "best/best.json").read_text())["step"] == 6
  assert sorted(p.name for p in (d / "best").glob("checkpoint_*")) == ["checkpoint_6"]
  same(params("best"), params(6))

  with pytest.raises(ConfigError, match=r"keeps the best step by 'tatoeba/mean'"):
    toy_train(d, name, vp, **{**kw, "best_metric": "tatoeba/deu"})
  with pytest.raises(ConfigError, match=r"did you mean 'tatoeba/mean'"):
    toy_train(tmp_path / "other", name, vp, **{**kw, "best_metric": "tatoeba/maen"})
  with pytest.raises(ConfigError, match=r"needs periodic evaluation"):
    toy_train(tmp_path / "other", name, vp, best_metric="tatoeba/mean")
  plain = tmp_path / "plain"
  toy_train(plain, name, vp, total_steps=2, period=2)
  with pytest.raises(CheckpointError, match=r"has no best/ checkpoint.*train.best_metric"):
    Encoder.from_checkpoint(plain, step="best")
  with pytest.raises(InputError, match=r"step='last': expected a step number, 'best'"):
    Encoder.from_checkpoint(plain, step="last")


def test_a_best_checkpoint_per_metric_and_the_per_task_selection_of_a_protocol(
    tmp_path, toy_task, monkeypatch, capsys):
  """train.best_metric as a list keeps the best step by each metric (the first in best/,
  the others in best-<metric>/) across a resume; Encoder.from_checkpoint(dir,
  'best:<metric>') opens each; launch/eval.py --protocol=mpcl --step=per_task scores
  Tatoeba with the step best on BUCC and BUCC with the step best on Tatoeba (MPCL §3.3),
  and each figure names its checkpoint."""
  import importlib.util
  from conftest import REPO
  from vmx import signals
  from vmx.errors import CheckpointError, ConfigError
  from vmx.evaluation import evaluators
  from vmx.evaluation.periodic import HarnessEvalConfig
  from vmx.inference import Encoder
  name, vp, _, _ = toy_task
  scripted = {"tatoeba": [], "bucc": []}   # periodic values, in order; [] in launch/eval.py

  def value(ctx, task):
    v = float(ctx.encode(["alpha beta"], None)[0][0])   # depends on the parameters
    return scripted[task].pop(0) if scripted[task] else 100 * v

  def tatoeba_run(self, ctx):
    v = value(ctx, "tatoeba")
    return {"scores": {"test": [{"hf_subset": "deu-eng", "languages": ["deu", "eng"],
                                 "main_score": v, "accuracy_xx2en": v, "accuracy_en2xx": v}]},
            "main_score": v, "mean": {"xx2en": v, "en2xx": v, "xsim": 0.0}, "groups": {}}

  def bucc_run(self, ctx):
    v = value(ctx, "bucc")
    return {"scores": {"test": [{"hf_subset": "de-en", "main_score": v,
                                 "cosine_max": {"f1": v}, "threshold_split": "sample",
                                 "split": "sample"}]}, "main_score": v}

  monkeypatch.setattr(evaluators.Tatoeba, "run", tatoeba_run)
  monkeypatch.setattr(evaluators.Bucc, "run", bucc_run)
  d = tmp_path / "run"
  kw = dict(period=2, keep=10, eval_cfg=HarnessEvalConfig(["tatoeba", "bucc"]), eval_period=2,
            best_metric=["bucc/main_score", "tatoeba/main_score"])
  scripted.update(bucc=[1.0, 5.0, 2.0], tatoeba=[4.0, 1.0, 6.0])   # steps 0, 2, 4
  toy_train(d, name, vp, stop_at_step=4, **kw)
  scripted.update(bucc=[3.0], tatoeba=[7.0])                       # resumed: step 6
  toy_train(d, name, vp, **kw)
  assert scripted == {"tatoeba": [], "bucc": []}
  assert json.loads((d / "best/best.json").read_text()) == {
      "metric": "bucc/main_score", "mode": "max", "step": 2, "value": 5.0}
  assert json.loads((d / "best-tatoeba.main_score/best.json").read_text()) == {
      "metric": "tatoeba/main_score", "mode": "max", "step": 6, "value": 7.0}
  assert "best tatoeba/main_score 7.00; was 6.00 at step 4 -> " \
         "best-tatoeba.main_score/checkpoint_6" in capsys.readouterr().out
  by_bucc = Encoder.from_checkpoint(d, step="best:bucc/main_score")
  by_tatoeba = Encoder.from_checkpoint(d, step="best:tatoeba/main_score")
  assert by_bucc.revision == "best/checkpoint_2"
  assert by_tatoeba.revision == "best-tatoeba.main_score/checkpoint_6"
  for enc, step in ((by_bucc, 2), (by_tatoeba, 6)):
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, enc.params),
                 jax.tree.map(np.asarray, Encoder.from_checkpoint(d, step=step).params))
  with pytest.raises(CheckpointError, match=r"keeps no best checkpoint by 'dev/main_score'"):
    Encoder.from_checkpoint(d, step="best:dev/main_score")
  with pytest.raises(ConfigError, match=r"list of distinct metric names"):
    toy_train(tmp_path / "other", name, vp, **{**kw, "best_metric": ["bucc/main_score"] * 2})

  spec = importlib.util.spec_from_file_location("vmx_eval_launcher", REPO / "launch" / "eval.py")
  launcher = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(launcher)
  monkeypatch.setattr(signals, "install", lambda: None)
  out = tmp_path / "eval"
  argv = [f"--checkpoint_dir={d}", "--protocol=mpcl", "--step=per_task", "--languages=deu",
          f"--output_dir={out}", "--no_plots", "--no_progress"]
  launcher.main(argv)
  figures = json.loads((out / "protocol_mpcl.json").read_text())["figures"]
  want = {"tatoeba": (by_bucc, "best/checkpoint_2 (the step best by bucc/main_score)"),
          "bucc": (by_tatoeba, "best-tatoeba.main_score/checkpoint_6 (the step best by "
                               "tatoeba/main_score)")}
  assert {f["task"] for f in figures} == {"tatoeba", "bucc"}
  for f in figures:
    enc, checkpoint = want[f["task"]]
    assert f["checkpoint"] == checkpoint
    assert f["value"] == pytest.approx(100 * float(enc.encode(["alpha beta"])[0][0]), rel=1e-5)
  assert {p.name for p in out.iterdir()} >= {"best_checkpoint_2",
                                             "best-tatoeba.main_score_checkpoint_6"}
  (d / "best-tatoeba.main_score").rename(tmp_path / "moved")
  with pytest.raises(CheckpointError, match=r"keeps no best step by 'tatoeba/main_score', on "
                                            r"which bucc is selected: train with "
                                            r"--gin_file=runs/mpcl_paper_selection.gin"):
    launcher.parse_args(argv)        # before any task runs
  with pytest.raises(SystemExit):   # a protocol that selects no step per task
    launcher.parse_args([f"--checkpoint_dir={d}", "--protocol=vmsst", "--step=per_task"])
  assert "--step=per_task: needs a --protocol that selects a checkpoint per task (mpcl)" \
         in capsys.readouterr().err
