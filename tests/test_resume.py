"""save -> stop -> resume gives the same parameters as an uninterrupted run."""
import gin
import jax
import numpy as np
import pytest

from conftest import write_lines
from vmx import decoders, encoders
from vmx.data import pipeline, vocab
from vmx.models import VMSST, DualEncoder, DualEncoderModel, VMSSTModel
from vmx.training import checkpoints, optimizers, partitioning
from vmx.training.trainer import train

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


@pytest.fixture(scope="module")
def toy_task(tmp_path_factory):
  import tasks
  d = tmp_path_factory.mktemp("toy")
  rng = np.random.default_rng(0)
  src, tgt = [], []
  for _ in range(300):
    ws = list(rng.choice(WORDS, size=rng.integers(2, 7)))
    src.append(" ".join(ws))
    tgt.append(" ".join(w.upper() for w in ws))
  s = write_lines(d / "toy.xx", src)
  t = write_lines(d / "toy.en", tgt)
  vp = vocab.train_sentencepiece([s, t], str(d / "toy.model"), 60, ["xx", "en"])
  name = tasks.moses_task("toy_xx_en", s, t, "xx", "en", vp, ["xx", "en"])
  return name, vp


def _model(kind):
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, dropout_rate=0.1)
  if kind == "contrastive":
    return DualEncoderModel(DualEncoder(enc), temperature=0.1)
  # VMSST: sampled latents + KL annealing state in flax_mutables must resume exactly too.
  dec = decoders.ConditionedDecoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, dropout_rate=0.1)
  return VMSSTModel(VMSST(enc, dec, num_languages=2), kl_anneal_steps=10)


def _run(model_dir, name, vp, stop_at_step=None, kind="contrastive"):
  gin.clear_config()
  model = _model(kind)
  lr = optimizers.learning_rate_schedule("linear", 1e-2, 2, total_steps=6)
  state, _ = train(model=model,
                   train_dataset_cfg=pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8},
                                                            batch_size=8),
                   optimizer=optimizers.create_optimizer("adamw", lr, weight_decay=0.01),
                   learning_rate=lr, model_dir=str(model_dir), total_steps=6, vocabulary=vp,
                   languages=["xx", "en"], partitioner=partitioning.Partitioner(num_devices=2),
                   checkpoint_cfg=checkpoints.CheckpointConfig(period=3, keep=2),
                   log_period=2, random_seed=1, progress=False, stop_at_step=stop_at_step)
  return state


@pytest.mark.parametrize("kind", ["contrastive", "vmsst"])
def test_resume_equals_uninterrupted(tmp_path, toy_task, kind):
  name, vp = toy_task
  full = _run(tmp_path / "full", name, vp, kind=kind)
  first = _run(tmp_path / "split", name, vp, stop_at_step=3, kind=kind)
  assert int(first.step) == 3
  resumed = _run(tmp_path / "split", name, vp, kind=kind)
  assert int(resumed.step) == 6
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.flax_mutables, resumed.flax_mutables)
  if kind == "vmsst":
    assert int(resumed.flax_mutables["annealing"]["updates"]) == 6
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       rtol=1e-6, atol=1e-7),
               full.params, resumed.params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       rtol=1e-6, atol=1e-7),
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
