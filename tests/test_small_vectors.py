"""Small vectors. Matryoshka dimensions (MATRYOSHKA_DIMS): the gin switch reaches the model
and its recorded config; the model's loss is the sum over prefixes; the Encoder serves a
prefix, renormalized, only for a model trained with them, and refuses a size above the
model's. int8 and binary vectors (vmx/quantize.py): the formulas by hand, calibration
stored beside the model by launch/calibrate.py, the quantized geometry's scores."""
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import save_model_dir, write_lines

WORDS = "sun moon star tree river stone house road cloud rain wind fire snow bird".split()


def _model(dims=()):
  from vmx import encoders
  from vmx.models import DualEncoder, DualEncoderModel
  enc = encoders.TransformerEncoder(vocab_size=60, num_layers=1, emb_dim=32, num_heads=2,
                                    mlp_dim=64, max_length=16)
  return DualEncoderModel(DualEncoder(enc), temperature=0.1, matryoshka_dims=dims)


def test_gin_switch_reaches_the_model_and_its_recorded_config():
  import gin
  from vmx import experiment
  from vmx.models.base import model_from_config, to_config
  gin.clear_config()
  model = experiment.build_experiment(["contrastive_tiny.gin"],
                                      ["MATRYOSHKA_DIMS = [64, 32]"])[0]
  assert model.matryoshka_dims == (32, 64)
  assert model_from_config(to_config(model)).matryoshka_dims == (32, 64)
  gin.clear_config()
  assert experiment.build_experiment(["contrastive_tiny.gin"], [])[0].matryoshka_dims == ()
  gin.clear_config()


@pytest.mark.parametrize("dims", [(0,), ("32",), (True,)])
def test_bad_dims_are_refused(dims):
  from vmx.errors import ConfigError
  with pytest.raises(ConfigError, match="matryoshka_dims=.*expected positive integers"):
    _model(dims)


def test_model_loss_is_the_sum_over_prefixes():
  from vmx import losses
  from vmx.errors import ConfigError
  rng = np.random.default_rng(0)
  left = jnp.asarray(rng.normal(size=(6, 32)), jnp.float32)
  right = jnp.asarray(rng.normal(size=(6, 32)), jnp.float32)
  batch = {"left_tokens": jnp.asarray(rng.integers(3, 60, (6, 16)), jnp.int32),
           "right_tokens": jnp.asarray(rng.integers(3, 60, (6, 16)), jnp.int32)}
  loss, metrics, _ = _model((8, 16)).grad_cache_loss((left, right), batch)
  keys = _model().duplicate_keys(batch)
  ref = sum(float(losses.in_batch_softmax_loss(left[:, :d], right[:, :d], 0.1, True, True,
                                               **keys)[0]) for d in (8, 16, 32))
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
  assert {"loss_dim8", "loss_dim16", "loss_dim32"} <= set(metrics)
  with pytest.raises(ConfigError, match=r"has a size above the sentence vector's 32"):
    _model((8, 64)).grad_cache_loss((left, right), batch)


def _file_model(gin_file, dims):
  """The model an experiment file builds with MATRYOSHKA_DIMS = dims."""
  import gin
  from vmx import experiment
  gin.clear_config()
  try:
    return experiment.build_experiment([gin_file], [f"MATRYOSHKA_DIMS = {list(dims)}"])[0]
  finally:
    gin.clear_config()


def test_mpcl_takes_the_switch_too():
  """MPCL's objective with MATRYOSHKA_DIMS: the sum of its objective over the prefixes."""
  from vmx import encoders
  from vmx.models import DualEncoder
  from vmx.models.mpcl import MPCLModel
  assert _file_model("mpcl_tiny.gin", [16]).matryoshka_dims == (16,)
  enc = encoders.TransformerEncoder(vocab_size=60, num_layers=1, emb_dim=32, num_heads=2,
                                    mlp_dim=64, max_length=16)
  plain = MPCLModel(DualEncoder(enc), num_views=3, temperature=0.1)
  mat = MPCLModel(DualEncoder(enc), num_views=3, temperature=0.1, matryoshka_dims=(8, 16))
  emb = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3, 32)), jnp.float32)
  loss, m = mat.objective(emb, jnp.bool_(True))
  ref = sum(float(plain.objective(emb[..., :d], jnp.bool_(True))[0]) for d in (8, 16, 32))
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
  assert {"loss_dim8", "loss_dim16", "loss_dim32", "positive_accuracy"} <= set(m)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """Two initialized tiny dual encoders as model directories: with and without dims."""
  from vmx.data import vocab
  root = tmp_path_factory.mktemp("mat")
  r = np.random.default_rng(0)
  text = write_lines(root / "t.txt", [" ".join(r.choice(WORDS, 6)) for _ in range(300)])
  vp = vocab.train_sentencepiece([str(text)], str(root / "v.model"), 60)
  out = {}
  for name, dims in (("mat", (8, 16)), ("plain", ())):
    out[name] = save_model_dir(root / name, _model(dims), ["eng"], 16, vp)
  return out


def test_encoder_serves_renormalized_prefixes_of_matryoshka_models_only(checkpoints):
  from vmx.errors import InputError
  from vmx.evaluation import vectors
  from vmx.inference import Encoder
  sents = ["sun moon star", "tree river", "house road cloud rain"]
  full = Encoder.from_checkpoint(str(checkpoints["mat"])).encode(sents)
  assert full.shape == (3, 32)
  for enc, got in ((Encoder.from_checkpoint(str(checkpoints["mat"]), dim=8), None),
                   (Encoder.from_checkpoint(str(checkpoints["mat"])), 8)):
    v = enc.encode(sents, dim=got)
    ref = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(v, ref, rtol=1e-5, atol=1e-6)
  enc = Encoder.from_checkpoint(str(checkpoints["mat"]), dim=16)
  assert enc.get_sentence_embedding_dimension() == 16
  assert "its first 16 dimensions renormalized" in vectors.describe(enc)
  np.testing.assert_allclose(enc.encode_counting(sents)[0], enc.encode(sents), atol=1e-6)
  with pytest.raises(InputError, match=r"dim=64 is larger than the model's 32 dimensions"):
    enc.encode(sents, dim=64)
  with pytest.raises(InputError, match="DualEncoderModel was not trained with Matryoshka"):
    Encoder.from_checkpoint(str(checkpoints["plain"]), dim=8)
  with pytest.raises(InputError, match="not trained with Matryoshka"):
    Encoder.from_checkpoint(str(checkpoints["plain"])).encode(sents, dim=8)


def test_int8_and_binary_formulas_by_hand():
  from vmx import quantize
  from vmx.errors import InputError
  x = np.array([[0.0, -1.0, 0.5], [1.0, 1.0, -0.5]], np.float32)
  r = quantize.calibrate(x)
  assert r == {"min": [0.0, -1.0, -0.5], "max": [1.0, 1.0, 0.5], "sentences": 2}
  q = quantize.quantize(x, "int8", r)
  # floor((x - lo) / (hi - lo) * 256) - 128, clipped: the ends map to -128 and 127
  np.testing.assert_array_equal(q, [[-128, -128, 127], [127, 127, -128]])
  mid = quantize.quantize(np.array([[0.25, 0.0, 0.0]], np.float32), "int8", r)
  np.testing.assert_array_equal(mid, [[-64, 0, 0]])       # floor(64) - 128, floor(128) - 128
  # back to the centres of bins 64 and 128: lo + (bin + 0.5) * (hi - lo) / 256, unit length
  centre = np.array([0.0, -1.0, -0.5]) + np.array([64.5, 128.5, 128.5]) * np.array(
      [1.0, 2.0, 1.0]) / 256
  np.testing.assert_allclose(quantize.dequantize(mid, "int8", 3, r),
                             [centre / np.linalg.norm(centre)], atol=1e-6)
  signs = np.array([[1, -1, 2, -3, 0.5, 1, -1, -1, 4]], np.float32)
  u8 = quantize.quantize(signs, "ubinary")
  np.testing.assert_array_equal(u8, [[0b10101100, 0b10000000]])
  assert u8.dtype == np.uint8
  i8 = quantize.quantize(signs, "binary")          # sentence-transformers': ubinary - 128
  np.testing.assert_array_equal(i8, [[0b10101100 - 128, 0]])
  assert i8.dtype == np.int8
  for kind, q in (("ubinary", u8), ("binary", i8)):
    np.testing.assert_allclose(quantize.dequantize(q, kind, 9),
                               [np.sign(signs[0]) / 3.0], atol=1e-6)
  rng = np.random.default_rng(0)
  u, v = rng.normal(size=(2, 40)).astype(np.float32)
  bu, bv = (quantize.dequantize(quantize.quantize(w[None], "binary"), "binary", 40)
            for w in (u, v))
  hamming = int(((u > 0) != (v > 0)).sum())
  assert float((bu @ bv.T)[0, 0]) == pytest.approx(1 - 2 * hamming / 40)
  with pytest.raises(InputError, match="need the model's calibration.*launch/calibrate.py"):
    quantize.quantize(x, "int8")
  with pytest.raises(InputError, match="calibration is for 3-dimensional vectors, these "
                                       "have 2"):
    quantize.quantize(x[:, :2], "int8", r)


def test_calibrated_int8_and_binary_encoders(checkpoints, tmp_path):
  import subprocess
  import sys
  from conftest import REPO
  from vmx.errors import InputError
  from vmx.inference import Encoder
  d = checkpoints["mat"]
  r = np.random.default_rng(1)
  corpus = write_lines(tmp_path / "dev.txt", [" ".join(r.choice(WORDS, 5)) for _ in range(200)]
                       + [""])
  sents = [" ".join(r.choice(WORDS, 4)) for _ in range(30)]
  with pytest.raises(InputError, match="need the model's calibration"):
    Encoder.from_checkpoint(str(d)).encode(sents, precision="int8")
  run = lambda *a: subprocess.run([sys.executable, str(REPO / "launch" / "calibrate.py"),
                                   f"--checkpoint_dir={d}", f"--corpus={corpus}", *a],
                                  capture_output=True, text=True, timeout=300)
  p = run()
  assert p.returncode == 0 and "calibrated int8 for 32-dimensional vectors on 200 " \
      "sentences" in p.stdout, p.stderr
  assert run("--embedding_dim=8").returncode == 0
  enc = Encoder.from_checkpoint(str(d))
  full = enc.encode(sents)
  q = enc.encode(sents, precision="int8")
  assert q.dtype == np.int8 and q.shape == (30, 32)
  assert enc.encode(sents, precision="binary").shape == (30, 4)
  assert enc.encode(sents, precision="ubinary").dtype == np.uint8
  assert enc.encode(sents, dim=8, precision="int8").shape == (30, 8)
  for kind, floor in (("int8", 0.99), ("binary", 0.5)):
    geo = Encoder.from_checkpoint(str(d), quantized=kind).encode(sents)
    assert geo.shape == full.shape and np.allclose(np.linalg.norm(geo, axis=1), 1, atol=1e-5)
    assert np.min(np.sum(geo * full, axis=1)) > floor, kind
  p = run("--langs=deu,eng")
  assert p.returncode == 2 and "--langs has 2 codes for 1 --corpus files" in p.stderr


def test_vmsst_contrastive_takes_the_switch_on_its_contrastive_term():
  """VMSST-CONTRASTIVE with MATRYOSHKA_DIMS: the contrastive term is summed over mu_sem's
  prefixes (the generative terms unchanged); VMSST without that term refuses the dims."""
  from vmx import decoders, encoders, losses
  from vmx.errors import ConfigError
  from vmx.models import VMSST, VMSSTModel
  assert _file_model("vmsst_contrastive_tiny.gin", [32]).matryoshka_dims == (32,)
  enc = encoders.TransformerEncoder(vocab_size=60, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  dec = decoders.ConditionedDecoder(vocab_size=60, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  kw = dict(contrastive_weight=1.0, vmsst_weight=0.5, contrastive_temperature=0.1)
  plain = VMSSTModel(VMSST(enc, dec, num_languages=2), **kw)
  mat = VMSSTModel(VMSST(enc, dec, num_languages=2), matryoshka_dims=(4, 8), **kw)
  r = np.random.default_rng(0)
  pairs = {"nll": jnp.asarray(r.uniform(1, 5, (6, 4)), jnp.float32),
           "tokens": jnp.full((6, 4), 5.0), "kl": jnp.asarray(r.uniform(0, 1, 6), jnp.float32),
           "sem_left": jnp.asarray(r.normal(size=(6, 16)), jnp.float32),
           "sem_right": jnp.asarray(r.normal(size=(6, 16)), jnp.float32)}
  batch = {}
  loss, m = mat.objective_of(pairs, batch, jnp.float32(1.0))
  base, _ = plain.objective_of(pairs, batch, jnp.float32(1.0))
  extra = sum(float(losses.in_batch_softmax_loss(pairs["sem_left"][:, :d],
                                                 pairs["sem_right"][:, :d], 0.1)[0])
              for d in (4, 8))
  np.testing.assert_allclose(float(loss), float(base) + extra, rtol=1e-5)
  assert {"loss_dim4", "loss_dim8", "loss_dim16"} <= set(m)
  with pytest.raises(ConfigError, match=r"matryoshka_dims=\[8\]: nested dimensions are "
                                        r"trained by the contrastive term"):
    VMSSTModel(VMSST(enc, dec, num_languages=2), matryoshka_dims=(8,))


@pytest.mark.parametrize("max_dense", [1 << 24, 0])   # NumPy search, and the device kernel
def test_rescored_search_equals_a_numpy_reference(max_dense):
  """knn.rescored_topk: each side's multiplier x k nearest in the quantized geometry,
  rescored as the float query against the candidates' quantized vectors, best k kept."""
  from vmx import quantize
  from vmx.evaluation import knn
  r = np.random.default_rng(3)
  unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)
  x, y = unit(r.standard_normal((70, 16))), unit(r.standard_normal((90, 16)))
  ranges = quantize.calibrate(np.concatenate([x, y]))
  geometry = lambda v: quantize.dequantize(quantize.quantize(v, "int8", ranges), "int8", 16,
                                           ranges)
  nn = knn.rescored_topk(x, y, knn.Rescoring(geometry, 3), k=4, max_dense=max_dense)
  same = knn.rescored_topk(x, y, knn.Rescoring(lambda v: v, 3), k=4, max_dense=max_dense)
  exact = knn.topk(x, y, 4, max_dense=max_dense)      # no quantization: nothing to rescore
  for a, b in zip(same, exact):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  gx, gy = geometry(x), geometry(y)
  for q_f, q_g, base_g, idx, vals in ((x, gx, gy, nn.row_idx, nn.row_vals),
                                      (y, gy, gx, nn.col_idx, nn.col_vals)):
    for i in range(len(q_f)):
      cand = np.argsort(-(base_g @ q_g[i]), kind="stable")[:12]
      s = base_g[cand] @ q_f[i]
      best = cand[np.argsort(-s, kind="stable")[:4]]
      np.testing.assert_array_equal(idx[i], best)
      np.testing.assert_allclose(vals[i], base_g[best] @ q_f[i], rtol=1e-5, atol=1e-6)


def test_tatoeba_rescores_binary_candidates_with_the_float_vectors(checkpoints, tmp_path):
  """`--precision=binary --tatoeba.rescore=M`: with M x k >= the sentences, every
  candidate is rescored, so the accuracy is the float query against the binary vectors
  over all of them (a NumPy reference); without rescoring it is the binary geometry's."""
  from vmx.errors import ConfigError
  from vmx.evaluation import evaluators, harness
  from vmx.inference import Encoder
  r = np.random.default_rng(2)
  rows = [(" ".join(r.choice(WORDS, 4)), " ".join(r.choice(WORDS, 4))) for _ in range(40)]
  d = tmp_path / "eval" / "tatoeba" / "v1"
  write_lines(d / "tatoeba.deu-eng.deu", [a for a, _ in rows])
  write_lines(d / "tatoeba.deu-eng.eng", [b for _, b in rows])
  enc = Encoder.from_checkpoint(str(checkpoints["mat"]), quantized="binary")
  fx = enc.float_encoder().encode([a for a, _ in rows])
  fe = enc.float_encoder().encode([b for _, b in rows])
  gx, ge = enc.to_geometry(fx), enc.to_geometry(fe)
  np.testing.assert_array_equal(gx, enc.encode([a for a, _ in rows]))
  gold = np.arange(len(rows))

  def accuracy(q, base):
    return 100.0 * np.mean(np.argmax(q @ base.T, axis=1) == gold)

  def tatoeba(**settings):
    out = harness.run(enc, output_dir=tmp_path / f"out{len(settings)}", data_dir=str(tmp_path),
                      evaluators={"tatoeba": evaluators.Tatoeba(["deu"], **settings)},
                      plots=False, progress=False)
    return out["tatoeba"]["scores"]["test"][0]

  got = tatoeba(rescore=10)
  assert got["accuracy_xx2en"] == pytest.approx(accuracy(fx, ge))
  assert got["accuracy_en2xx"] == pytest.approx(accuracy(fe, gx))
  plain = tatoeba()
  assert plain["accuracy_xx2en"] == pytest.approx(accuracy(gx, ge))
  with pytest.raises(harness.EvaluationFailed):
    harness.run(enc.float_encoder(), output_dir=tmp_path / "f", data_dir=str(tmp_path),
                evaluators={"tatoeba": evaluators.Tatoeba(["deu"], rescore=4)}, plots=False,
                progress=False)
  plain_ctx = evaluators.Context(enc.float_encoder(), None, None)
  for task in (evaluators.Tatoeba(["deu"], rescore=4), evaluators.Bucc(rescore=4)):
    with pytest.raises(ConfigError, match=rf"--{task.NAME}.rescore=4: rescoring needs .* "
                                          "quantized"):
      evaluators.rescoring_of(plain_ctx, task)
  with pytest.raises(ConfigError, match=r"--bucc.rescore=-1: expected a multiplier"):
    evaluators.rescoring_of(plain_ctx, evaluators.Bucc(rescore=-1))
  # launch/eval.py's check before any checkpoint is loaded
  evaluators.check_rescoring([evaluators.Tatoeba(rescore=4), evaluators.Bucc()], "binary")
  for tasks, quantized, match in (
      ([evaluators.Tatoeba(rescore=4)], None, "needs quantized vectors"),
      ([evaluators.Bucc(rescore=-2)], "int8", r"--bucc.rescore=-2: expected a multiplier"),
      ([evaluators.TatoebaVector(rescore=2)], "binary", "scores a layer's vector")):
    with pytest.raises(ConfigError, match=match):
      evaluators.check_rescoring(tasks, quantized)
