"""InfoXLM: MMLM/TLM/XLCO losses against NumPy, masking statistics, the queue, the
momentum encoder, device-count equivalence, resume, and the start-up checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import initial_variables, toy_train
from vmx import encoders, losses, masked_lm
from vmx.errors import ConfigError
from vmx.models.infoxlm import InfoXLM, InfoXLMModel, key_params, momentum_coefficient

B, L, V = 8, 10, 50


def _encoder(**kw):
  args = dict(vocab_size=V, num_layers=3, emb_dim=16, num_heads=2, mlp_dim=32,
              max_length=2 * L)
  args.update(kw)
  return encoders.TransformerEncoder(**args)


def _model(**kw):
  args = dict(mask_id=1, random_low=3, queue_size=2 * B, momentum=0.9, temperature=0.2)
  args.update(kw)
  universal = args.pop("universal_layer", 2)
  return InfoXLMModel(InfoXLM(_encoder(), universal_layer=universal), **args)


def _tokens(rng, b=B, length=L, low=3):
  lens = rng.integers(2, length + 1, size=b)
  t = rng.integers(low, V, size=(b, length))
  t[np.arange(length)[None] >= lens[:, None]] = 0
  return t.astype(np.int32)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  out = {"mmlm/tokens": _tokens(rng)}
  for task in ("tlm", "xlco"):
    out.update({f"{task}/left_tokens": _tokens(rng), f"{task}/right_tokens": _tokens(rng),
                f"{task}/left_lang": np.zeros(B, np.int32),
                f"{task}/right_lang": np.ones(B, np.int32)})
  return out


def _init(model, batch):
  v = initial_variables(model, {k: x.shape for k, x in batch.items()})
  mutables = model.derive_mutables(v["params"], {k: v[k] for k in ("momentum", "queue")})
  return v["params"], mutables


# --- losses against NumPy ---

def test_masked_lm_loss_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(3, 5))
  weights = (rng.random((3, 5)) < 0.4).astype(np.float32)
  weights[0, 0] = 1.0
  loss, m = losses.masked_lm_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(loss), (nll * weights).sum() / weights.sum(), rtol=1e-5)
  acc = ((logits.argmax(-1) == targets) * weights).sum() / weights.sum()
  np.testing.assert_allclose(float(m["accuracy"]), acc, rtol=1e-6)


def test_queue_infonce_matches_numpy():
  rng = np.random.default_rng(1)
  q, k = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
  queue = rng.normal(size=(10, 6))
  valid = np.arange(10) < 7               # the last 3 slots are not filled yet
  t = 0.3
  loss, _ = losses.queue_infonce(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                                 jnp.asarray(queue, jnp.float32), jnp.asarray(valid), t)
  pos = (q * k).sum(1) / t
  neg = q @ queue[valid].T / t
  ref = -(pos - np.log(np.exp(pos) + np.exp(neg).sum(1)))
  np.testing.assert_allclose(float(loss), ref.mean(), rtol=1e-5)


# --- masking and joining ---

def test_masking_statistics():
  rng = np.random.default_rng(0)
  tokens = _tokens(rng, b=512, length=64)
  tokens[:, 0] = np.where(tokens[:, 0] > 0, 2, 0)     # id 2: a special token, never masked
  inputs, targets, weights = jax.jit(lambda r, t: masked_lm.mask_tokens(
      r, t, mask_id=1, vocab_size=V, special_ids=(2,), random_low=3))(
          jax.random.PRNGKey(3), jnp.asarray(tokens))
  inputs, targets, w = map(np.asarray, (inputs, targets, weights))
  np.testing.assert_array_equal(targets, tokens)
  picked = w > 0
  maskable = (tokens > 0) & (tokens != 2)
  assert not picked[~maskable].any()                  # padding and specials are never picked
  n = maskable.sum(1)
  count = picked.sum(1)
  assert np.all((count >= np.floor(0.15 * n)) & (count <= np.floor(0.15 * n) + 1))
  assert abs(count.sum() / n.sum() - 0.15) < 0.005
  np.testing.assert_array_equal(inputs[~picked], tokens[~picked])
  as_mask = (inputs == 1)[picked].mean()
  as_self = (inputs == tokens)[picked].mean()
  as_random = 1 - as_mask - as_self
  assert abs(as_mask - 0.8) < 0.02 and abs(as_random - 0.1 * (1 - 1 / (V - 3))) < 0.015
  assert abs(as_self - 0.1) < 0.015
  assert inputs[picked].min() >= 1 and inputs.max() < V


def test_join_padded():
  a = np.array([[5, 6, 0, 0], [7, 8, 9, 4]], np.int32)
  b = np.array([[3, 4, 4, 0], [3, 0, 0, 0]], np.int32)
  np.testing.assert_array_equal(masked_lm.join_padded(jnp.asarray(a), jnp.asarray(b)),
                                [[5, 6, 3, 4, 4, 0, 0, 0], [7, 8, 9, 4, 3, 0, 0, 0]])
  np.testing.assert_array_equal(masked_lm.join_padded(jnp.asarray(a), jnp.asarray(b), True),
                                [[5, 6, 4, 4, 0, 0, 0, 0], [7, 8, 9, 4, 0, 0, 0, 0]])


# --- queue, momentum ---

def test_queue_is_fifo_with_wrap_around_and_xlco_waits_until_full():
  model, batch = _model(), _batch()
  params, mutables = _init(model, batch)
  assert mutables["queue"]["keys"].shape == (2, B, 16)
  fn = jax.jit(lambda p, b, m, r: model.compute_loss(p, b, r, m))
  seen = []
  for step in range(3):
    loss, m, new = fn(params, _batch(step), mutables, jax.random.PRNGKey(step))
    # XLCO counts only once the queue is full (after 2 steps of keys)
    assert float(m["xlco_active"]) == (1.0 if step >= 2 else 0.0)
    rest = float(m["mmlm_loss"] + m["tlm_loss"])
    np.testing.assert_allclose(float(loss), rest + float(m["xlco_active"] * m["xlco_loss"]),
                               rtol=1e-5)
    slot = step % 2
    assert int(mutables["queue"]["next"]) == slot
    others = np.delete(np.asarray(new["queue"]["keys"]), slot, axis=0)
    np.testing.assert_array_equal(others, np.delete(np.asarray(mutables["queue"]["keys"]),
                                                    slot, axis=0))
    seen.append(np.asarray(new["queue"]["keys"][slot]))
    mutables = new
  assert int(mutables["queue"]["filled"]) == 2 and int(mutables["queue"]["next"]) == 1
  np.testing.assert_array_equal(mutables["queue"]["keys"][0], seen[2])   # wrapped around
  np.testing.assert_array_equal(mutables["queue"]["keys"][1], seen[1])


def test_momentum_update_formula_and_no_gradient_to_keys():
  model, batch = _model(), _batch()
  params, mutables = _init(model, batch)
  # the key encoder: the encoder up to the universal layer + the projection
  assert sorted(k for k in mutables["momentum"]["params"]["encoder"] if "layers" in k) == \
      ["layers_0", "layers_1"]
  new_params = jax.tree.map(lambda x: x + 1.0, params)
  out = model.after_update(new_params, mutables, jnp.int32(5))
  jax.tree.map(lambda k, k0, q: np.testing.assert_allclose(k, 0.9 * k0 + 0.1 * q, atol=1e-7),
               out["momentum"]["params"], mutables["momentum"]["params"],
               key_params(new_params, 2))
  for t in (1, 10, 1000, 10 ** 7):
    np.testing.assert_allclose(momentum_coefficient("infoxlm15", 0.0, t),
                               min(1 - t ** -0.51, 0.9995), rtol=1e-6)
  # the loss has no gradient with respect to the key encoder (and the queue)
  full = dict(mutables, queue=dict(mutables["queue"], filled=jnp.int32(2)))
  g = jax.jit(jax.grad(lambda m: model.compute_loss(params, batch, jax.random.PRNGKey(0), m)[0],
                       allow_int=True))(full)
  assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g["momentum"]))
  assert float(jnp.abs(g["queue"]["keys"]).max()) == 0.0


def test_trainer_step_updates_the_key_encoder_with_the_new_parameters():
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  model, batch = _model(), _batch()
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-2), partitioning.Partitioner(
      num_devices=1), {k: v.shape for k, v in batch.items()})
  s0 = jax.device_get(tr.create_state(0))
  # the key encoder starts as a copy of the query encoder
  jax.tree.map(np.testing.assert_array_equal, s0.flax_mutables["momentum"]["params"],
               key_params(s0.params, 2))
  s1, _ = tr.step(tr.create_state(0), batch)
  s1 = jax.device_get(s1)
  jax.tree.map(lambda k, k0, q: np.testing.assert_allclose(k, 0.9 * k0 + 0.1 * q, rtol=1e-5,
                                                           atol=1e-7),
               s1.flax_mutables["momentum"]["params"], s0.flax_mutables["momentum"]["params"],
               key_params(s1.params, 2))
  assert int(s1.flax_mutables["queue"]["filled"]) == 1


# --- devices, resume ---

@pytest.mark.slow   # 100 s cold; the fast tier: test_step's and test_packing's 1 vs 8 devices
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_loss_and_state_equal_on_1_and_8_devices():
  from conftest import assert_same_loss_and_grads_on_1_and_8_devices
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  model, batch = _model(), _batch()
  params, mutables = _init(model, batch)
  full = dict(mutables, queue=dict(mutables["queue"], filled=jnp.int32(2),
                                   keys=jax.random.normal(jax.random.PRNGKey(1), (2, B, 16))))
  rng = jax.random.PRNGKey(4)
  assert_same_loss_and_grads_on_1_and_8_devices(
      model, batch, lambda p, b: model.compute_loss(p, b, rng, full)[0])
  # a whole train step: the queue is split along 'data', the result does not depend on it
  out = []
  for n in (1, 8):
    part = partitioning.Partitioner(num_devices=n)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-2), part,
                 {k: v.shape for k, v in batch.items()})
    state = tr.create_state(0)
    for _ in range(3):
      state, _ = tr.step(state, batch)
    if n == 8:
      spec = tr.state_shardings.flax_mutables["queue"]["keys"].spec
      assert tuple(spec)[:2] == (None, "data")
      assert state.flax_mutables["queue"]["keys"].addressable_shards[0].data.shape[1] == B // 8
    out.append(jax.device_get(state))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
               out[0].flax_mutables, out[1].flax_mutables)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
               out[0].params, out[1].params)


def test_the_queue_is_filled_before_step_1(tmp_path, toy_task, capsys):
  """§4.1: the key encoder fills the queue forward-only before the first update, so XLCO
  is on from step 1 and the data stream has moved by the batches it read."""
  import json
  name, vp, _, _ = toy_task
  state = toy_train(tmp_path / "run", name, vp, kind="infoxlm", total_steps=2, period=2)
  assert "filling the model state before step 1: 2 batches" in capsys.readouterr().out
  rows = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["train/xlco_active"] for r in rows if "train/xlco_active" in r] == [1.0]  # 1-2
  assert int(state.flax_mutables["queue"]["filled"]) == 2
  data = json.loads((tmp_path / "run" / "checkpoint_2" / "data" / "metadata").read_text())
  assert data["step"] == 2 + 2          # 2 prefill batches, then 2 steps' batches


def test_resume_with_a_non_empty_queue_equals_uninterrupted(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  full = toy_train(tmp_path / "full", name, vp, kind="infoxlm")
  first = toy_train(tmp_path / "split", name, vp, kind="infoxlm", stop_at_step=3)
  assert int(first.flax_mutables["queue"]["filled"]) == 2     # queue full at the stop
  resumed = toy_train(tmp_path / "split", name, vp, kind="infoxlm")
  assert int(resumed.step) == 6 and int(resumed.flax_mutables["queue"]["next"]) == 0
  for part in ("params", "opt_state", "flax_mutables"):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 getattr(full, part), getattr(resumed, part))
  from vmx.inference import Encoder
  v = Encoder.from_checkpoint(tmp_path / "split").encode(["alpha beta", "GAMMA"])
  assert v.shape == (2, 16)


# --- start-up checks ---

def test_bad_settings_fail_at_start_up():
  batch = _batch()
  shapes = {k: v.shape for k, v in batch.items()}
  with pytest.raises(ConfigError, match="queue_size=20 is not a multiple of the global XLCO "
                                        "batch 8"):
    _model(queue_size=20).get_initial_variables(jax.random.PRNGKey(0), shapes)
  with pytest.raises(ConfigError, match="universal_layer=4: the encoder has 3 layers"):
    _model(universal_layer=4)
  with pytest.raises(ConfigError, match="needs TransformerEncoder.scan_boundaries = \\[2\\]"):
    InfoXLMModel(InfoXLM(_encoder(scan_layers=True), universal_layer=2))
  with pytest.raises(ConfigError, match="max_length=10 must be at least 20"):
    InfoXLMModel(InfoXLM(_encoder(max_length=L), universal_layer=2)).get_initial_variables(
        jax.random.PRNGKey(0), shapes)


def test_a_task_mix_without_monolingual_data_is_refused():
  from vmx.data import pipeline
  model = _model()
  pair = pipeline.DatasetConfig("any", {"inputs": L, "targets": L}, batch_size=B)
  cfg = pipeline.MultiTaskConfig({"tlm": pair, "xlco": pair})
  with pytest.raises(ConfigError, match=r"missing: \['mmlm'\]"):
    pipeline.model_feature_shapes(cfg, model.FEATURE_CONVERTER_CLS)
  with pytest.raises(ConfigError, match="use MultiTaskConfig"):
    pipeline.model_feature_shapes(pair, model.FEATURE_CONVERTER_CLS)
  # the MMLM-only control reads one task: mmlm
  assert list(_model(tlm_weight=0.0, xlco_weight=0.0).FEATURE_CONVERTER_CLS) == ["mmlm"]


@pytest.mark.slow   # 60 s cold: a base-size step on CPU
def test_infoxlm_base_config_builds_and_steps_from_xlmr_ids():
  """infoxlm_base.gin (bert family, XLM-R ids, joined `<s> x </s> y </s>`) at tiny sizes."""
  from conftest import build_and_step
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput

  def make_batch(model, b):
    rng = np.random.default_rng(0)
    uniform = pipeline.uniform_config(model.FEATURE_CONVERTER_CLS, b, 6)
    shapes = TokenCacheInput(uniform).batch_shapes(model)
    out = {}
    for k, s in shapes.items():
      if len(s) == 1:
        out[k] = np.zeros(s, np.int32)
        continue
      t = rng.integers(4, 300, size=s)
      t[:, 0], t[:, -1], t[:, -2:] = 1, 2, 0     # <s> ... </s>, padding
      t[:, -3] = 2
      out[k] = t.astype(np.int32)
    return out

  model, state, metrics = build_and_step(
      "infoxlm_base.gin", ["NUM_LAYERS = 3", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32",
                           "VOCAB_SIZE = 300", "MASK_ID = 299", "MAX_POSITIONS = 16",
                           "MAX_LENGTH = 6", "BATCH_SIZE = 4", "QUEUE_SIZE = 8",
                           "UNIVERSAL_LAYER = 2", "RETRIEVAL_LAYER = 1",
                           "RETRIEVAL_POOLING = 'mean'",
                           "SCAN_BOUNDARIES = [1, 2]"], make_batch)
  assert model.module.encoder.family == "bert" and model.joined_drops_first
  assert model.module.encoder.scan_layers       # three scanned segments: layers 0, 1, 2
  assert (model.module.retrieval_layer, model.module.retrieval_pooling) == (1, "mean")
  assert sorted(model.FEATURE_CONVERTER_CLS) == ["mmlm", "tlm", "xlco"]
  assert all(np.isfinite(float(v.compute())) for v in metrics.values())
  assert int(state.flax_mutables["queue"]["filled"]) == 1


def test_scanned_segments_equal_unscanned_layers_and_load_from_them():
  """scan_boundaries=[2]: layers 0-1 and 2 as two scans; per-layer parameters (an imported
  XLM-R) load into the segments, and every depth gives the unscanned encoder's output."""
  from flax import traverse_util
  from vmx.training import initial_checkpoint
  plain = _encoder()
  scanned = _encoder(scan_layers=True, scan_boundaries=(2,))
  tokens = jnp.asarray(_tokens(np.random.default_rng(0)))
  p_plain = plain.init(jax.random.PRNGKey(0), tokens)["params"]
  shapes = jax.eval_shape(lambda: scanned.init(jax.random.PRNGKey(1), tokens))["params"]
  target = {k: v.shape for k, v in initial_checkpoint.flatten(shapes).items()}
  assert target["layers_from_0/attention/key"][0] == 2 and \
      target["layers_from_2/attention/key"][0] == 1
  loaded, new, ignored = initial_checkpoint.assign(target, initial_checkpoint.flatten(p_plain))
  assert not new and not ignored
  p_scanned = traverse_util.unflatten_dict(loaded, sep="/")
  for depth in (2, 3):
    a, _ = plain.apply({"params": p_plain}, tokens, depth=depth)
    b, _ = scanned.apply({"params": p_scanned}, tokens, depth=depth)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  with pytest.raises(ConfigError, match="scan_boundaries to include 1"):
    scanned.apply({"params": p_scanned}, tokens, depth=1)
  # the key encoder of a scanned InfoXLM keeps the segment below the universal layer
  assert sorted(k for k in key_params({"encoder": p_scanned}, 2)["encoder"]
                if k.startswith("layers")) == ["layers_from_0"]


def test_multi_task_batches_have_each_tasks_share_and_resume(toy_task):
  """Several tasks a step: `task/feature` names, each task's own batch size (the mix
  proportions) and converter; a restored position gives the same next batch."""
  from conftest import toy_text_task
  from vmx.data import feature_converters as fcs, pipeline
  name, vp, _, _ = toy_task
  cfg = pipeline.MultiTaskConfig({
      "mono": pipeline.DatasetConfig(toy_text_task(vp), {"inputs": 6}, batch_size=4),
      "pair": pipeline.DatasetConfig(name, {"inputs": 5, "targets": 7}, batch_size=2)})
  converters = {"mono": fcs.MonolingualFeatureConverter, "pair": fcs.PairFeatureConverter}
  assert pipeline.model_feature_shapes(cfg, converters) == {
      "mono/tokens": (4, 6), "pair/left_tokens": (2, 5), "pair/right_tokens": (2, 7),
      "pair/left_lang": (2,), "pair/right_lang": (2,)}
  it = pipeline.train_iterator(cfg, converters, seed=3)
  batches = [next(it) for _ in range(3)]
  assert {k: v.shape for k, v in batches[0].items()} == pipeline.model_feature_shapes(
      cfg, converters)
  again = pipeline.train_iterator(cfg, converters, seed=3)
  again.restore(again.state_at(2))
  for k, v in next(again).items():
    np.testing.assert_array_equal(v, batches[2][k])


def test_xlco_starts_after_the_key_encoder_warm_up():
  """App. B (from scratch): XLCO is enabled after `xlco_start` updates; before, the full
  queue is filled and the key encoder follows, but the XLCO term is off."""
  model = _model(xlco_start=3)
  batch = _batch()
  v = initial_variables(model, {k: x.shape for k, x in batch.items()})
  params = v["params"]
  mutables = model.derive_mutables(params, {k: v[k] for k in ("momentum", "queue", "updates")})
  for _ in range(model.prefill_batches(mutables)):
    mutables = model.prefill(params, batch, mutables)
  active = []
  for step in (1, 2, 3, 4):
    _, m, mutables = model.compute_loss(params, batch, jax.random.PRNGKey(step), mutables)
    active.append(float(m["xlco_active"]))
    mutables = model.after_update(params, mutables, jnp.asarray(step))
  assert active == [0.0, 0.0, 0.0, 1.0]     # updates 0, 1, 2 before; 3 from the 4th step
  assert "updates" not in _model().get_initial_variables(
      jax.random.PRNGKey(0), {k: x.shape for k, x in batch.items()})


def test_the_retrieval_vector_can_be_the_mean_of_a_middle_layer():
  """§4.2: InfoXLM's Tatoeba vector is the mean of layer 7 (base); `retrieval_layer` and
  `retrieval_pooling` make inference embed that instead of the universal layer's CLS."""
  batch = _batch()
  base = _model()
  v = initial_variables(base, {k: x.shape for k, x in batch.items()})
  tokens = batch["mmlm/tokens"]
  mid = InfoXLMModel(InfoXLM(_encoder(), universal_layer=2, retrieval_layer=1,
                             retrieval_pooling="mean"), mask_id=1, random_low=3,
                     queue_size=2 * B)
  got = np.asarray(mid.embed(v["params"], tokens))
  hidden, valid = base.module.apply({"params": v["params"]}, tokens, None, True, 1,
                                    method=lambda m, *a: m.encoder(*a[:2], deterministic=a[2],
                                                                   depth=a[3]))
  h, w = np.asarray(hidden, np.float64), np.asarray(valid, np.float64)[..., None]
  np.testing.assert_allclose(got, (h * w).sum(1) / w.sum(1), rtol=1e-4, atol=1e-5)
  assert not np.allclose(got, np.asarray(base.embed(v["params"], tokens)), atol=1e-3)


def test_mixup_partners_come_from_another_language_pair():
  """§3.3: each pair is concatenated with a pair from another parallel corpus: the next row
  whose (unordered) language pair differs; the next row where all rows share one pair."""
  from vmx.models.infoxlm import InfoXLMModel, mixup_partners
  left = jnp.asarray([0, 0, 1, 0, 2, 2], jnp.int32)
  right = jnp.asarray([1, 1, 0, 3, 0, 0], jnp.int32)
  pairs = InfoXLMModel.xlco_pairs({"xlco/left_lang": left, "xlco/right_lang": right})
  got = np.asarray(mixup_partners(pairs, 6))
  # pairs: {0,1} {0,1} {0,1} {0,3} {0,2} {0,2}
  assert got.tolist() == [3, 3, 3, 4, 0, 0]
  for i, j in enumerate(got.tolist()):
    assert int(pairs[i]) != int(pairs[j])
  same = jnp.zeros((4,), jnp.int32)
  assert np.asarray(mixup_partners(same, 4)).tolist() == [1, 2, 3, 0]
  assert np.asarray(mixup_partners(None, 4)).tolist() == [1, 2, 3, 0]


def test_from_scratch_initialization_is_uniform_0_02():
  """App. B: from scratch, "randomly initialized from U[-0.02, 0.02]": every weight matrix
  and embedding (query/key/value/out, MLP and head kernels, token and position tables) is
  drawn from it; biases stay 0 and norm scales 1; the key encoder starts as a copy; the
  draw is seeded; infoxlm_scratch.gin sets it, the pretrained files do not."""
  from flax import traverse_util
  from vmx import experiment
  import gin
  batch = _batch()
  shapes = {k: x.shape for k, x in batch.items()}
  v = initial_variables(_model(uniform_init=0.02), shapes)
  flat = traverse_util.flatten_dict(v["params"], sep="/")
  weights = {k: np.asarray(a) for k, a in flat.items() if k.rsplit("/", 1)[-1] in
             ("kernel", "embedding", "query", "key", "value", "out")}
  assert len(weights) >= 10 and "encoder/token_embed/embedding" in weights
  for k, a in weights.items():
    assert np.abs(a).max() <= 0.02, k
  allw = np.concatenate([a.ravel() for a in weights.values()])
  assert allw.std() == pytest.approx(0.02 / np.sqrt(3), rel=0.02)     # uniform's std
  assert abs(allw.mean()) < 5e-4
  for k, a in flat.items():
    if k.endswith("/scale"):
      np.testing.assert_array_equal(np.asarray(a), 1.0)
    elif k.endswith("bias"):
      np.testing.assert_array_equal(np.asarray(a), 0.0)
  mom = traverse_util.flatten_dict(v["momentum"]["params"], sep="/")
  for k, a in mom.items():
    np.testing.assert_array_equal(np.asarray(a), np.asarray(flat[f"encoder/{k}"]
                                                            if f"encoder/{k}" in flat else flat[k]))
  again = initial_variables(_model(uniform_init=0.02), shapes)
  np.testing.assert_array_equal(np.asarray(again["params"]["encoder"]["token_embed"]["embedding"]),
                                weights["encoder/token_embed/embedding"])
  default = initial_variables(_model(), shapes)
  wi = default["params"]["encoder"]["layers_0"]["mlp"]["wi"]["kernel"]
  assert np.abs(np.asarray(wi)).max() > 0.02
  with pytest.raises(ConfigError, match="uniform_init"):
    _model(uniform_init=0.0)
  for name, want in (("infoxlm_scratch.gin", 0.02), ("infoxlm_base.gin", None)):
    gin.clear_config()
    try:
      model = experiment.build_experiment([name], ["EMB_DIM = 16",
                                                   "NUM_HEADS = 2", "MLP_DIM = 32"])[0]
    finally:
      gin.clear_config()
    assert model.uniform_init == want, name


@pytest.mark.parametrize("gin_file", [
    "infoxlm_base.gin", "infoxlm_large.gin", "infoxlm15.gin", "infoxlm_scratch.gin",
    "ablations/infoxlm_no_tlm.gin", "ablations/infoxlm_scratch_no_tlm.gin"])
def test_paper_files_use_eqs_5_6_without_a_temperature(gin_file):
  """Eqs. 5-6 score exp(g_Q(c1) . g_K(c2)) with no temperature: the files named after the
  paper (and the ablations on them) bind InfoXLMModel.temperature to 1.0; the authors'
  0.25 is a flag (docs/departures.md)."""
  import importlib.util  # noqa: F401  (gin-config 0.5 gotcha)
  import gin
  from vmx import experiment
  gin.clear_config()
  try:
    experiment.parse_experiment([gin_file], ["INITIAL_CHECKPOINT_PATH = '/x'"])
    assert gin.query_parameter("%TEMPERATURE") == 1.0
  finally:
    gin.clear_config()
