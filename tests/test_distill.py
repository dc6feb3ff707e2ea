"""Multilingual distillation: the MSE loss against NumPy, the teacher-embedding cache
(built once, resumed from its parts, looked up by the pipeline), the feature converter,
and a step of the one-hour recipe's model."""
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import write_lines


def test_distillation_mse_matches_numpy():
  import jax.numpy as jnp
  from vmx import losses
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(5, 7)).astype(np.float32), rng.normal(size=(5, 7)).astype(np.float32)
  np.testing.assert_allclose(float(losses.distillation_mse(jnp.asarray(s), jnp.asarray(t))),
                             np.mean((s - t) ** 2), rtol=1e-6)


def test_distillation_model_loss_is_both_sides_mse_plus_weighted_infonce():
  import jax
  import jax.numpy as jnp
  from vmx import losses
  from vmx.errors import ConfigError
  from vmx.models import DistillationModel, DualEncoder
  from vmx.encoders import TransformerEncoder
  rng = np.random.default_rng(1)
  t_, s_, teacher = (rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3))
  enc = TransformerEncoder(vocab_size=20, num_layers=1, emb_dim=8, num_heads=2, mlp_dim=16,
                           max_length=4)
  plain = DistillationModel(DualEncoder(enc, projection_dims=(6,)))
  loss, m, _ = plain.grad_cache_loss((jnp.asarray(t_), jnp.asarray(s_)),
                                     {"teacher": jnp.asarray(teacher)})
  ref = np.mean((s_ - teacher) ** 2) + np.mean((t_ - teacher) ** 2)
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
  np.testing.assert_allclose(float(m["mse_pivot"]), np.mean((s_ - teacher) ** 2), rtol=1e-5)
  both = DistillationModel(DualEncoder(enc, projection_dims=(6,)), contrastive_weight=0.5)
  tokens = {"left_tokens": jnp.arange(12).reshape(4, 3),    # 4 different sentences a side
            "right_tokens": jnp.arange(12, 24).reshape(4, 3)}
  loss2, m2, _ = both.grad_cache_loss((jnp.asarray(t_), jnp.asarray(s_)),
                                      {"teacher": jnp.asarray(teacher), **tokens})
  c, _ = losses.in_batch_softmax_loss(jnp.asarray(t_), jnp.asarray(s_), 0.05)
  np.testing.assert_allclose(float(loss2), ref + 0.5 * float(c), rtol=1e-5)
  assert "in_batch_accuracy" in m2
  with pytest.raises(ConfigError, match=r"student's sentence vectors have 6 dimensions, the "
                                        r"teacher's 5: set DualEncoder.projection_dims = \[5\]"):
    plain.grad_cache_loss((jnp.asarray(t_), jnp.asarray(s_)),
                          {"teacher": jnp.asarray(teacher[:, :5])})
  with pytest.raises(ConfigError, match=r"contrastive_weight=-1"):
    DistillationModel(DualEncoder(enc), contrastive_weight=-1)
  # the gradient flows to the student only
  g = jax.grad(lambda x: plain.grad_cache_loss((x, x), {"teacher": jnp.asarray(teacher)})[0])(
      jnp.asarray(s_))
  np.testing.assert_allclose(np.asarray(g), 2 * 2 * (s_ - teacher) / s_.size, rtol=1e-5)


@pytest.fixture
def teacher_setup(tmp_path, toy_task):
  """(data dir with a tatoeba-challenge corpus of the toy sentences, a trained toy teacher
  model dir, the toy vocabulary)."""
  from conftest import toy_train
  name, vp, src, tgt = toy_task
  data = tmp_path / "data"
  root = data / "train/tatoeba-challenge/xxx-eng"
  write_lines(root / "train.xxx.gz", Path(src).read_text().splitlines()[:40], gz=True)
  write_lines(root / "train.eng.gz", Path(tgt).read_text().splitlines()[:40], gz=True)
  teacher = tmp_path / "teacher"
  toy_train(teacher, name, vp, total_steps=2, period=2)
  return str(data), str(teacher), vp


def test_teacher_cache_is_built_once_resumes_from_parts_and_feeds_the_pipeline(
    teacher_setup, tmp_path, monkeypatch):
  import seqio
  import tasks
  from tasks import teacher as teacher_pass
  from vmx.data import teacher as teacher_lib
  from vmx.errors import DataError
  from vmx.data.feature_converters import DistillFeatureConverter
  from vmx.inference import Encoder
  data, teacher_dir, vp = teacher_setup
  corpora = {"tatoeba-challenge": ["xxx"]}
  monkeypatch.setattr(teacher_pass, "CHUNK", 8)        # 5 parts for the distinct sentences
  out = tmp_path / "cache"
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path = tasks.teacher_embeddings(teacher_dir, corpora, data, output_dir=str(out),
                                    progress=False)
  # the chunks' truncation warnings, summed into one
  said = [str(w.message) for w in caught if "longer than" in str(w.message)]
  assert len(said) == 1 and re.search(r"\d+ of \d+ sentences are longer than its max_length=8",
                                      said[0]), said
  english, capped = teacher_pass.pivot_sentences(
      [f"{data}/train/tatoeba-challenge/xxx-eng/train.eng.gz"])
  assert capped == 0 and not teacher_lib.partial(path)
  keys, emb = teacher_lib.load(path)
  assert len(keys) == len(english) and np.all(np.diff(keys) > 0)
  ref = np.asarray(Encoder.from_checkpoint(teacher_dir).encode(english), np.float32)
  np.testing.assert_allclose(teacher_lib.lookup(path, teacher_lib.text_fingerprints(english)),
                             ref, rtol=1e-5, atol=1e-6)
  # killed after its parts were written: the rebuild reads them instead of the teacher
  for f in ("teacher.json", "keys.npy", "embeddings.npy"):
    (out / f).unlink()
  teacher_lib.load.cache_clear()
  monkeypatch.setattr(Encoder, "encode", lambda *a, **k: pytest.fail("re-encoded"))
  assert tasks.teacher_embeddings(teacher_dir, corpora, data, output_dir=str(out),
                                  progress=False) == path
  np.testing.assert_array_equal(teacher_lib.load(path)[1], emb)
  with pytest.raises(DataError, match=r"has no embedding for 1 pivot sentence"):
    teacher_lib.lookup(path, np.array([12345], np.int64), "task t: ")

  name = tasks.parallel_corpora_mixture(corpora, vp, ["xxx", "eng"], data_dir=data,
                                        validation_percent=0, teacher=path)
  assert ".teacher_" in name
  lengths = {"inputs": 8, "targets": 8, "teacher": ref.shape[1]}
  task = seqio.get_mixture_or_task(name).tasks[0]      # the task keeps the texts
  by_text = dict(zip(english, ref))
  for ex in task.get_dataset(lengths, split="train", shuffle=False).take(5).as_numpy_iterator():
    np.testing.assert_allclose(ex["teacher"], by_text[ex["targets_pretokenized"].decode()],
                               rtol=1e-5, atol=1e-6)
  ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split="train", shuffle=False)
  assert set(ds.element_spec) >= {"inputs", "targets", "inputs_lang", "teacher"}
  conv = DistillFeatureConverter(pack=False)
  batch = next(conv(ds, {"inputs": 8, "targets": 8, "teacher": ref.shape[1]})
               .batch(3).as_numpy_iterator())
  assert batch["teacher"].shape == (3, ref.shape[1]) and batch["left_tokens"].shape == (3, 8)
  assert batch["teacher"].dtype == np.float32


def test_a_capped_teacher_pass_embeds_a_fixed_sample_and_the_tasks_keep_its_pairs(
    teacher_setup, tmp_path):
  """max_sentences_per_file: the sentences with the smallest fingerprints of each file are
  embedded; the tasks keep (and count) exactly the pairs whose English side was."""
  import seqio
  import tasks
  from tasks import teacher as teacher_pass
  from vmx.data import readers, teacher as teacher_lib
  from vmx.errors import ConfigError
  data, teacher_dir, vp = teacher_setup
  corpora = {"tatoeba-challenge": ["xxx"]}
  src = f"{data}/train/tatoeba-challenge/xxx-eng/train.xxx.gz"
  eng = f"{data}/train/tatoeba-challenge/xxx-eng/train.eng.gz"
  everything, _ = teacher_pass.pivot_sentences([eng])
  with pytest.raises(ConfigError, match="max_sentences_per_file=0"):
    tasks.teacher_embeddings(teacher_dir, corpora, data, max_sentences_per_file=0)
  path = tasks.teacher_embeddings(teacher_dir, corpora, data, output_dir=str(tmp_path / "c"),
                                  progress=False, max_sentences_per_file=10)
  keys, _ = teacher_lib.load(path)
  np.testing.assert_array_equal(keys, np.sort(teacher_lib.text_fingerprints(everything))[:10])
  assert teacher_lib.partial(path)
  embedded = {s for s in everything if teacher_lib.text_fingerprints([s])[0] in set(keys)}
  pairs = [(a.strip(), b.strip()) for a, b in readers.read_parallel(src, eng)]
  kept = [p for p in pairs if p[1] in embedded]
  assert 10 <= len(kept) < len(pairs)
  name = tasks.parallel_corpora_mixture(corpora, vp, ["xxx", "eng"], data_dir=data,
                                        validation_percent=0, teacher=path)
  task = seqio.get_mixture_or_task(name).tasks[0]
  assert task.num_input_examples("train") == len(kept)
  got = [(ex["inputs_pretokenized"].decode().strip(), ex["targets_pretokenized"].decode().strip())
         for ex in task.get_dataset({"inputs": 8, "targets": 8, "teacher": 12}, split="train",
                                    shuffle=False, num_epochs=1).as_numpy_iterator()]
  assert got == kept


def test_the_one_hour_distillation_recipe_builds_and_takes_a_step():
  from conftest import build_and_step

  def batch(model, b):
    rng = np.random.default_rng(0)
    return {"left_tokens": rng.integers(1, 40, (b, 8)).astype(np.int32),
            "right_tokens": rng.integers(1, 40, (b, 8)).astype(np.int32),
            "left_lang": np.zeros(b, np.int32), "right_lang": np.zeros(b, np.int32),
            "teacher": rng.normal(size=(b, 12)).astype(np.float32)}
  model, _, metrics = build_and_step(
      "distill_minilm_1h.gin", ["NUM_LAYERS = 1", "EMB_DIM = 16", "NUM_HEADS = 2",
                                "MLP_DIM = 32", "VOCAB_SIZE = 40", "MAX_LENGTH = 8",
                                "BATCH_SIZE = 4", "TEACHER_DIM = 12"], batch)
  assert type(model).__name__ == "DistillationModel"
  assert list(model.module.projection_dims) == [12]
  assert np.isfinite(float(metrics["loss"].compute()))


def test_sentence_length_ignores_the_teacher_vector():
  """The model's max_length (inference, evaluation) comes from the token features only."""
  from vmx.data import pipeline
  from vmx.models import DistillationModel
  cfg = pipeline.DatasetConfig("unset", {"inputs": 8, "targets": 8, "teacher": 384}, 4)
  assert pipeline.token_lengths(cfg, DistillationModel(None).FEATURE_CONVERTER_CLS) == [8, 8]
