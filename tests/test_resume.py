"""save -> stop -> resume gives bitwise the same parameters as an uninterrupted run."""
import jax
import numpy as np
import pytest

from conftest import toy_train
from vmx.models import VMSST, VMSSTModel


def _run(model_dir, name, vp, stop_at_step=None, kind="contrastive"):
  return toy_train(model_dir, name, vp, kind=kind, stop_at_step=stop_at_step)


@pytest.mark.parametrize("kind", ["contrastive", "vmsst"])
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
  direct = np.asarray(enc.model.predict_batch(
      jax.tree.map(np.asarray, resumed.params),
      {"left_tokens": enc.tokenizer.encode(["alpha beta", "GAMMA"], 8)}))
  np.testing.assert_allclose(v, direct, rtol=1e-5, atol=1e-6)
  if kind == "vmsst":  # the inference embedding is the semantic posterior's mean
    assert isinstance(enc.model, VMSSTModel)
    mu, _ = enc.model.module.apply({"params": jax.tree.map(np.asarray, resumed.params)},
                                   enc.tokenizer.encode(["alpha beta", "GAMMA"], 8),
                                   method=VMSST.semantic)
    mu = np.asarray(mu)
    np.testing.assert_allclose(v, mu / np.linalg.norm(mu, axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
