"""EMS: XTR loss vs NumPy, the full objective vs NumPy, ablation switches, 1 vs 8 devices."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import initial_variables
from vmx import encoders, losses
from vmx.models import ems

V = 50


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_bag(tokens):
  """Dense bag-of-tokens distributions [B, V] (padding id 0 ignored)."""
  p = np.zeros((len(tokens), V))
  for i, row in enumerate(tokens):
    toks = row[row > 0]
    for t in toks:
      p[i, t] += 1.0 / len(toks)
  return p


def _np_kl(logits, tokens):
  p = _np_bag(tokens)
  logq = _np_log_softmax(logits.astype(np.float64))
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(p > 0, p * (np.log(p) - logq), 0.0).sum(-1)


def test_bag_of_tokens_kl_matches_numpy_and_ignores_padding():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, V, size=(5, 9)).astype(np.int32)
  tokens[0, 3:] = 0                       # padding
  tokens[1, :4] = 7                       # repeated token
  tokens[2] = 0                           # empty row
  logits = rng.normal(size=(5, V)).astype(np.float32) * 3
  got = np.asarray(losses.bag_of_tokens_kl(jnp.asarray(logits), jnp.asarray(tokens)))
  np.testing.assert_allclose(got, _np_kl(logits, tokens), rtol=1e-5, atol=1e-6)
  assert got[2] == 0.0
  p = _np_bag(tokens)
  np.testing.assert_allclose(p[[0, 1, 3, 4]].sum(-1), 1.0)
  assert p[:, 0].sum() == 0                # padding never in the target
  # q = p exactly gives KL 0: the target IS the normalized counts, padding excluded
  exact = np.where(p > 0, np.log(np.maximum(p, 1e-30)), -1e9).astype(np.float32)
  kl0 = np.asarray(losses.bag_of_tokens_kl(jnp.asarray(exact), jnp.asarray(tokens)))
  np.testing.assert_allclose(kl0[[0, 1, 3, 4]], 0.0, atol=1e-5)


def _model(**kw):
  enc = encoders.TransformerEncoder(vocab_size=V, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  module_kw = {k: kw.pop(k) for k in list(kw) if k in
               ("use_language_token", "xtr_shared_embedding", "contrastive_dims", "xtr_norms")}
  module = ems.EMS(encoder=enc, num_languages=3, language_dim=4,
                   contrastive_dims=module_kw.pop("contrastive_dims", (16, 8)), **module_kw)
  return ems.EMSModel(module, **kw)


def _batch(b=6, seed=0):
  rng = np.random.default_rng(seed)
  toks = rng.integers(1, V, size=(2, b, 8)).astype(np.int32)
  toks[:, :, 6:] = 0
  return {"left_tokens": toks[0], "right_tokens": toks[1],
          "left_lang": (np.arange(b) % 3).astype(np.int32),
          "right_lang": ((np.arange(b) + 1) % 3).astype(np.int32)}


def _init(model, batch):
  return initial_variables(model, {k: v.shape for k, v in batch.items()})["params"]


def _np_infonce_sum_of_directions(zu, zv, t):
  zu = zu / np.linalg.norm(zu, axis=1, keepdims=True)
  zv = zv / np.linalg.norm(zv, axis=1, keepdims=True)
  s = zu @ zv.T / t
  idx = np.arange(len(s))
  return -(_np_log_softmax(s)[idx, idx].mean() + _np_log_softmax(s.T)[idx, idx].mean())


@pytest.mark.parametrize("xw,cw", [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0)])
def test_objective_matches_numpy(xw, cw):
  model = _model(xtr_weight=xw, contrastive_weight=cw, temperature=0.1)
  batch = _batch()
  params = _init(model, batch)
  out = model.module.apply({"params": params}, batch["left_tokens"], batch["right_tokens"],
                           batch["left_lang"], batch["right_lang"])
  loss, m = model.objective(model.per_pair(out, batch), batch)
  o = jax.tree.map(np.asarray, out)
  xtr = np.mean(_np_kl(o["logits_u"], batch["right_tokens"]) +
                _np_kl(o["logits_v"], batch["left_tokens"]))
  con = _np_infonce_sum_of_directions(o["z_u"], o["z_v"], 0.1)
  assert float(m["xtr"]) == pytest.approx(xtr, rel=1e-5)
  assert float(m["contrastive"]) == pytest.approx(con, rel=1e-5)
  assert float(loss) == pytest.approx(xw * xtr + cw * con, rel=1e-5)


def test_xtr_conditions_on_the_target_language_and_ablations_change_structure():
  batch = _batch()
  model = _model()
  params = _init(model, batch)
  out = model.module.apply({"params": params}, batch["left_tokens"], batch["right_tokens"],
                           batch["left_lang"], batch["right_lang"])
  other = model.module.apply({"params": params}, batch["left_tokens"], batch["right_tokens"],
                             batch["left_lang"], (batch["right_lang"] + 1) % 3)
  assert not np.allclose(out["logits_u"], other["logits_u"])       # target language matters
  np.testing.assert_allclose(out["u"], other["u"])                   # the embedding does not
  p = _init(_model(use_language_token=False), batch)
  assert "target_language_embed" not in p
  p = _init(_model(xtr_shared_embedding=True), batch)
  assert "xtr_out" not in p and p["xtr_fc"]["kernel"].shape[1] == 16
  p = _init(_model(contrastive_dims=()), batch)
  assert "contrastive_head" not in p
  with pytest.raises(ValueError, match="both 0"):
    _model(xtr_weight=0.0, contrastive_weight=0.0)


def test_no_xtr_leaves_the_xtr_head_untrained():
  batch = _batch()
  model = _model(xtr_weight=0.0)
  params = _init(model, batch)
  grads = jax.jit(jax.grad(lambda p: model.compute_loss(p, batch, None, None)[0]))(params)
  assert float(jnp.abs(grads["xtr_out"]["kernel"]).sum()) == 0.0
  assert float(jnp.abs(grads["sentence_encoder"]["final_norm"]["scale"]).sum()) > 0
  grads = jax.jit(jax.grad(lambda p: _model().compute_loss(p, batch, None, None)[0]))(params)
  assert float(jnp.abs(grads["xtr_out"]["kernel"]).sum()) > 0


def test_inference_embedding_is_the_pooled_sentence_vector():
  batch = _batch()
  model = _model()
  params = _init(model, batch)
  emb = model.encode_tokens(params, batch["left_tokens"], batch["left_lang"])
  aux = {"unnormalized": model.embed(params, batch["left_tokens"], batch["left_lang"])}
  out = model.module.apply({"params": params}, batch["left_tokens"], batch["right_tokens"],
                           batch["left_lang"], batch["right_lang"])
  np.testing.assert_allclose(aux["unnormalized"], out["u"], rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  assert not model.uses_languages


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_loss_and_grads_equal_on_1_and_8_devices():
  from conftest import assert_same_loss_and_grads_on_1_and_8_devices
  model = _model()
  assert_same_loss_and_grads_on_1_and_8_devices(
      model, _batch(b=8), lambda p, b: model.compute_loss(p, b, None, None)[0])


@pytest.mark.slow   # 50 s cold; the fast tier: test_step's and test_packing's GradCache
@pytest.mark.parametrize("num_devices,chunks", [(1, 4), (8, 2)])
def test_grad_cache_equals_the_uncached_step(num_devices, chunks):
  """GradCache on EMS (train.grad_cache_chunks): per-pair XTR terms and contrastive
  vectors as the cached "embeddings" give the whole-batch loss and gradients, and the
  same trained parameters, on 1 device and with the chunks split over 8."""
  from vmx.training import grad_cache, optimizers, partitioning
  from vmx.training.step import TrainStep
  if jax.device_count() < num_devices:
    pytest.skip("needs 8 (simulated) devices")
  model, batch = _model(), _batch(b=16)
  shapes = {k: v.shape for k, v in batch.items()}
  out = []
  for n, c in ((1, 1), (num_devices, chunks)):
    part = partitioning.Partitioner(num_devices=n)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-2), part, shapes,
                 grad_cache_chunks=c)
    state = tr.create_state(0)
    gb = part.global_batch(batch, tr.batch_shardings)
    if c == 1:
      fn = jax.jit(jax.value_and_grad(lambda p, b: model.compute_loss(p, b, None, None)[0]))
    else:
      fn = jax.jit(lambda p, b: (lambda r: (r[0], r[2]))(
          grad_cache.loss_and_grads(model, p, b, None, c)))
    with part.context():
      loss, grads = fn(state.params, gb)
    for _ in range(2):         # dropout is 0 here: the steps are the same function
      state, m = tr.step(state, batch)
    out.append((float(loss), jax.tree.map(np.asarray, grads), float(m["loss"].compute()),
                jax.tree.map(np.asarray, state.params)))
  (l1, g1, s1, p1), (l2, g2, s2, p2) = out
  assert l2 == pytest.approx(l1, rel=1e-5) and s2 == pytest.approx(s1, rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), g1, g2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p2)


EMS_FILES = ["ems_tiny.gin", "ems.gin", "ems_authors.gin", "ablations/ems_no_language_token.gin",
             "ablations/ems_no_contrastive.gin", "ablations/ems_no_xtr.gin",
             "ablations/ems_no_mlp.gin", "ablations/ems_xtr_shared_embedding.gin"]


# ems_tiny.gin is ems.gin at other sizes, and the switches of these three ablations are
# checked on the module (test_xtr_conditions_on_the_target_language_and_ablations_change_
# structure): their builds are the slow tier's.
SLOW_EMS_FILES = ("ems_tiny.gin", "ablations/ems_no_language_token.gin", "ablations/ems_no_mlp.gin",
                  "ablations/ems_xtr_shared_embedding.gin")


@pytest.mark.parametrize("name", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_EMS_FILES
                                  else f for f in EMS_FILES])
def test_every_ems_file_builds_and_takes_a_step(name):
  from conftest import build_and_step
  # TRAIN_STEPS: ems.gin counts its epochs from the data (test_three_epochs_... below).
  model, _, metrics = build_and_step(
      name, ["NUM_LAYERS = 1", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32",
             "VOCAB_SIZE = 50", "MAX_LENGTH = 8", "BATCH_SIZE = 4", "TRAIN_STEPS = 20"],
      lambda m, b: _batch(b=b))
  assert np.isfinite(float(metrics["loss"].compute()))
  assert float(metrics["grad_norm"].compute()) > 0
  if name == "ablations/ems_no_xtr.gin":
    assert model.xtr_weight == 0.0
  if name == "ablations/ems_no_contrastive.gin":
    assert model.contrastive_weight == 0.0


def test_amsgrad_with_coupled_l2_matches_a_numpy_reference():
  """EMS's optimizer: PyTorch Adam(amsgrad=True, weight_decay=wd), L2 added to the gradient."""
  from vmx.training import optimizers
  lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-8
  tx = optimizers.create_optimizer("amsgrad", lr, weight_decay=wd)
  p = jnp.array([1.0, -2.0, 0.5])
  state = tx.init(p)
  m = v = vmax = np.zeros(3)
  ref = np.array(p, np.float64)
  for t, g in enumerate([np.array([0.3, -0.1, 0.2]), np.array([-0.5, 0.4, 0.1]),
                         np.array([0.05, 0.05, -0.3])], 1):
    upd, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
    p = p + upd
    gg = g + wd * ref
    m = b1 * m + (1 - b1) * gg
    v = b2 * v + (1 - b2) * gg * gg
    vmax = np.maximum(vmax, v)
    ref = ref - lr * (m / (1 - b1 ** t)) / (np.sqrt(vmax / (1 - b2 ** t)) + eps)
  np.testing.assert_allclose(np.asarray(p), ref, rtol=1e-4)   # eps enters after the correction


def test_xtr_head_is_eq_4_without_the_code_norms():
  """xtr_norms=False: q = softmax(W_emb swish(W_fc (u_la ⊕ u))) exactly (EMS Eq. 4); the
  authors' LayerNorms exist only with xtr_norms=True."""
  model = _model(xtr_norms=False)
  batch = _batch()
  params = _init(model, batch)
  assert "xtr_norm" not in params and "language_norm" not in params
  assert "xtr_norm" in _init(_model(), batch)
  u = np.random.default_rng(3).normal(size=(6, 16)).astype(np.float32)
  logits = np.asarray(model.module.apply({"params": params}, jnp.asarray(u),
                                         jnp.asarray(batch["right_lang"]),
                                         method=ems.EMS.xtr_logits))
  e = np.asarray(params["target_language_embed"]["embedding"])[batch["right_lang"]]
  x = np.concatenate([e, u], axis=1)
  fc = params["xtr_fc"]
  h = x @ np.asarray(fc["kernel"]) + np.asarray(fc["bias"])
  h = h / (1 + np.exp(-h))                                   # swish
  want = h @ np.asarray(params["xtr_out"]["kernel"])
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)


def _paper_and_authors_settings(name):
  import gin
  from vmx import experiment
  gin.clear_config()
  try:
    experiment.parse_experiment([name], ["TRAIN_STEPS = 20"])
    q = gin.query_parameter
    return {"epochs": q("steps_for_epochs.epochs"), "optimizer": q("%OPTIMIZER"),
            "schedule": q("%LR_SCHEDULE"), "lr": q("%LEARNING_RATE"),
            "warmup": q("%WARMUP_STEPS"), "wd": q("%WEIGHT_DECAY"),
            "dropout": q("%DROPOUT_RATE"), "batch": q("%BATCH_SIZE"),
            "length": q("%MAX_LENGTH"), "xtr_norms": q("EMS.xtr_norms"),
            "lowercase": q("vocabulary_path.lowercase"),
            "pretokenize": q("vocabulary_path.pretokenize"), "alpha": q("%ALPHA"),
            "swish": "TransformerEncoder.activation = 'swish'" in gin.config_str()}
  finally:
    gin.clear_config()


def test_ems_gin_is_the_paper_and_ems_authors_gin_the_code():
  """§4.2-4.3 in ems.gin: three epochs, Adam (L2 1e-5), 3e-4 after 10k warm-up steps,
  dropout 0.1, batch 152, 120 tokens, lowercased Moses/jieba/Juman++ text, Eq. 4 head,
  epochs of the whole corpus (pairs drawn in proportion to the languages' sizes); the
  authors' code's 15 epochs, AMSGrad, cosine, swish and head norms in ems_authors.gin."""
  paper = _paper_and_authors_settings("ems.gin")
  assert paper == {"epochs": 3, "optimizer": "adam", "schedule": "constant", "lr": 3e-4,
                   "warmup": 10000, "wd": 1e-5, "dropout": 0.1, "batch": 152, "length": 120,
                   "xtr_norms": False, "lowercase": True, "pretokenize": "moses",
                   "alpha": 1.0, "swish": False}
  authors = _paper_and_authors_settings("ems_authors.gin")
  assert authors == {**paper, "epochs": 15, "optimizer": "amsgrad", "schedule": "cosine",
                     "xtr_norms": True, "swish": True}


def test_adam_with_weight_decay_is_pytorch_adam_with_l2():
  """ems.gin's optimizer: PyTorch Adam(weight_decay=wd), L2 added to the gradient."""
  from vmx.training import optimizers
  lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-8
  tx = optimizers.create_optimizer("adam", lr, weight_decay=wd)
  p = jnp.array([1.0, -2.0, 0.5])
  state = tx.init(p)
  refs = {}
  for decay in (wd, 0.0):
    m = v = np.zeros(3)
    ref = np.array([1.0, -2.0, 0.5])
    for t, g in enumerate([np.array([0.3, -0.1, 0.2]), np.array([-0.5, 0.4, 0.1]),
                           np.array([0.05, 0.05, -0.3])], 1):
      if decay:
        upd, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
        p = p + upd
      gg = g + decay * ref
      m = b1 * m + (1 - b1) * gg
      v = b2 * v + (1 - b2) * gg * gg
      ref = ref - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    refs[decay] = ref
  np.testing.assert_allclose(np.asarray(p), refs[wd], rtol=1e-4)
  assert np.abs(refs[wd] - refs[0.0]).max() > 1e-3       # the decay is visible at this rtol


def test_three_epochs_are_counted_from_the_training_mixture(toy_task, capsys):
  """steps_for_epochs (ems.gin's TRAIN_STEPS): ceil(epochs x the train examples, as read,
  / batch), the same number again (a resumed run), a warning when the warm-up is longer."""
  import math

  import gin
  import seqio

  from vmx import configurables, experiment
  from vmx.data import pipeline
  from vmx.errors import ConfigError
  name = toy_task[0]
  n = sum(1 for _ in seqio.get_mixture_or_task(name).get_dataset(
      {"inputs": 8, "targets": 8}, split="train", shuffle=False, num_epochs=1))
  cfg = pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8)
  capsys.readouterr()
  steps = configurables.steps_for_epochs(3, cfg, warmup_steps=5000, warmup_hint="see x.gin")
  assert steps == math.ceil(3 * n / 8)
  out = capsys.readouterr().out
  assert f"3 epochs of {n:,} train examples ({name}) at batch 8: {steps:,} steps" in out
  assert (f"warm-up (5,000 steps) is longer than the whole run ({steps:,} steps)" in out
          and out.rstrip().endswith("see x.gin"))
  assert configurables.steps_for_epochs(3, cfg, warmup_steps=5000) == steps
  assert capsys.readouterr().out == ""                      # said once
  assert configurables.steps_for_epochs(0.5, cfg) == math.ceil(n / 16)
  assert "warning" not in capsys.readouterr().out           # no warm-up given
  for bad in (0, -1, True):
    with pytest.raises(ConfigError, match="steps_for_epochs.epochs"):
      configurables.steps_for_epochs(bad, cfg)
  with pytest.raises(ConfigError, match="steps_for_epochs.dataset_cfg"):
    configurables.steps_for_epochs(3, pipeline.MultiTaskConfig({"a": cfg}))
  with pytest.raises(ConfigError, match=r"read in blocks \(DatasetConfig.block_length=16\), "
                                        r"whose number is known only once"):
    configurables.steps_for_epochs(3, pipeline.DatasetConfig(name, {"inputs": 8},
                                                             batch_size=8, block_length=16))
  # ems.gin's binding: three epochs of the run's own mixture at its batch size
  gin.clear_config()
  try:
    experiment.parse_experiment(["ems.gin"], [f"MIXTURE_OR_TASK_NAME = '{name}'",
                                              "BATCH_SIZE = 8", "MAX_LENGTH = 8"])
    assert configurables.steps_for_epochs() == steps
    assert "ems_authors.gin" in capsys.readouterr().out      # 10k warm-up > the toy run
  finally:
    gin.clear_config()


def test_holdout_of_mldoc_and_amazon_is_by_sentence(tmp_path):
  """EMS §4.2 removes the sentences of every evaluation dataset: a training sentence found
  inside a multi-sentence MLDoc or Amazon document is dropped (the whole document, each
  sentence, in Latin, Chinese, Arabic and Hindi script), a sentence of no document kept."""
  from conftest import write_lines
  from vmx.evaluation import heldout
  assert heldout.document_sentences("First one. Second one!  Third?\nFourth…  Fifth") == [
      "First one.", "Second one!", "Third?", "Fourth…", "Fifth"]
  assert heldout.document_sentences("第一句。第二句！第三句") == ["第一句。", "第二句！", "第三句"]
  assert heldout.document_sentences("هل أنت هنا؟ نعم") == ["هل أنت هنا؟", "نعم"]
  assert heldout.document_sentences("पहला वाक्य। दूसरा") == ["पहला वाक्य।", "दूसरा"]
  mldoc = tmp_path / "mldoc"
  write_lines(mldoc / "en.train.tsv", ["Stocks fell on Monday. Traders were nervous.\tCCAT"])
  write_lines(mldoc / "zh.test.tsv", ["股市周一下跌。交易员很紧张。\tECAT"])
  amazon = tmp_path / "amazon"
  write_lines(amazon / "fr.dvd.dev.tsv", ["Un bon film. Je le recommande !\tpos"])
  h = heldout.EvaluationHeldOut([], str(tmp_path / "data"),
                                {"mldoc": str(mldoc), "amazon_v1": str(amazon)})
  for text in ("Traders were nervous.", "Stocks fell on Monday.", "交易员很紧张。",
               "Je le recommande !", "Stocks fell on Monday. Traders were nervous."):
    assert not h.keeps(["unrelated", text]), text
  assert h.keeps(["Traders were calm.", "Un film."])


def test_training_skips_every_evaluation_dataset_the_user_supplies(tmp_path):
  """EMS §4.2: training skips the sentences of every evaluation dataset, not only Tatoeba:
  BUCC (the data directory's), and the ParaCrawl pools, MLDoc and Amazon files when their
  directories are given; an undrawn ParaCrawl line and other text are kept. A training
  source with that holdout drops the pairs, and ems.gin holds them all out."""
  from conftest import write_lines
  from tasks.parallel import held_out
  from vmx.errors import ConfigError
  from vmx.evaluation import heldout, paracrawl
  data = tmp_path / "data"
  write_lines(data / "eval/bucc2018/de-en/de-en.sample.de", ["de-1\tein bucc satz", "de-2\tx"])
  write_lines(data / "eval/bucc2018/de-en/de-en.sample.en", ["en-1\ta bucc sentence"])
  mldoc = tmp_path / "mldoc"
  write_lines(mldoc / "en.train.tsv", ["an mldoc document\tCCAT"])
  write_lines(mldoc / "de.test.tsv", ["ein mldoc dokument\tECAT"])
  amazon = tmp_path / "amazon"
  write_lines(amazon / "fr.dvd.dev.tsv", ["un avis\tpos"])
  pc = tmp_path / "paracrawl"
  n = paracrawl.N_CANDIDATES + 300
  write_lines(pc / "ParaCrawl.de-en.de", [f"de {i}" for i in range(n)])
  write_lines(pc / "ParaCrawl.de-en.en", [f"en {i}" for i in range(n)])
  _, _, drawn, _ = paracrawl.draw(pc / "ParaCrawl.de-en.de", pc / "ParaCrawl.de-en.en")
  undrawn = sorted(set(range(1, n + 1)) - set(drawn.tolist()))
  assert len(undrawn) == 300
  h, suffix = held_out(["bucc"], str(data), "tasks.parallel_mixture",
                       {"mldoc": str(mldoc), "amazon_v1": str(amazon), "paracrawl": str(pc),
                        "amazon_v2": None})
  assert h.names == ["bucc", "paracrawl", "mldoc", "amazon_v1"]
  assert suffix.startswith(".minus_bucc_paracrawl_mldoc_amazon_v1_")
  for text in ("ein bucc satz", " a bucc sentence ", "an mldoc document", "ein mldoc dokument",
               "un avis", f"de {drawn[0] - 1}", f"en {drawn[-1] - 1}"):
    assert not h.keeps(["unrelated", text]), text
  assert h.keeps([f"de {undrawn[0] - 1}", f"en {undrawn[0] - 1}"])
  assert h.keeps(["CCAT", "de-1"])                     # labels and ids are not sentences
  # the key changes with the user's files (another exclusion, another cache)
  key = h.key
  write_lines(mldoc / "en.dev.tsv", ["another mldoc document\tCCAT"])
  assert heldout.EvaluationHeldOut(["bucc"], str(data), {"mldoc": str(mldoc)}).key != key
  with pytest.raises(ConfigError, match="MLDOC_DIR"):
    held_out(["mldoc"], str(data), "tasks.parallel_mixture")
  with pytest.raises(ConfigError, match="no such directory"):
    held_out([], str(data), "x", {"mldoc": str(tmp_path / "nope")})
  assert held_out([], str(data), "x", {"mldoc": None}) == (None, "")
  # the training source drops the pairs with a held-out sentence
  from vmx.data import sources
  src = write_lines(tmp_path / "train.de", ["ein bucc satz", "neu", "un avis"])
  tgt = write_lines(tmp_path / "train.en", ["a", "new", "b"])
  h2, _ = held_out(["bucc"], str(data), "t", {"amazon_v1": str(amazon)})
  ds = sources.moses_source(str(src), str(tgt), validation_percent=0, holdout=h2)
  kept = [ex["inputs"].numpy().decode() for ex in ds.get_dataset("train", shuffle=False)]
  assert kept == ["neu"]
  import gin
  from vmx import experiment
  experiment.parse_gin(["ems.gin"], ["MODEL_DIR='/tmp/unused'", f"MLDOC_DIR='{mldoc}'"], "")
  assert gin.query_parameter("%HOLDOUT") == ["tatoeba", "bucc"]
  gin.clear_config()
