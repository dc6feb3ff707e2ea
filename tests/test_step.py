"""Loss and gradients do not depend on the number of devices (global-batch negatives)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmx import encoders
from vmx.models import DualEncoder, DualEncoderModel
from vmx.training import optimizers, partitioning
from vmx.training.step import TrainStep

B, L = 16, 12


def _model(scan=False):
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=2, emb_dim=32, num_heads=4,
                                    mlp_dim=64, max_length=L, scan_layers=scan)
  return DualEncoderModel(DualEncoder(enc, projection_dims=(16,)), temperature=0.1)


def _batch():
  rng = np.random.default_rng(0)
  lens = rng.integers(3, L, size=(2, B))
  toks = rng.integers(3, 64, size=(2, B, L))
  toks[0][np.arange(L)[None] >= lens[0][:, None]] = 0
  toks[1][np.arange(L)[None] >= lens[1][:, None]] = 0
  return {"left_tokens": toks[0].astype(np.int32), "right_tokens": toks[1].astype(np.int32),
          "left_lang": np.zeros(B, np.int32), "right_lang": np.ones(B, np.int32)}


def _loss_and_grads(num_devices, num_partitions=1, scan=False):
  model = _model(scan)
  part = partitioning.Partitioner(num_partitions=num_partitions, num_devices=num_devices)
  shapes = {k: v.shape for k, v in _batch().items()}
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part, shapes)
  state = tr.create_state(0)
  batch = part.global_batch(_batch(), tr.batch_shardings)
  fn = jax.jit(jax.value_and_grad(lambda p, b: model.compute_loss(p, b, None, None)[0]))
  with part.context():
    loss, grads = fn(state.params, batch)
  return float(loss), jax.tree.map(np.asarray, grads), tr, state, batch


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("num_partitions,scan", [(1, False), (2, True)])
def test_loss_and_grads_equal_on_1_and_8_devices(num_partitions, scan):
  l1, g1, *_ = _loss_and_grads(1, 1, scan)
  l8, g8, tr8, state8, batch8 = _loss_and_grads(8, num_partitions, scan)
  np.testing.assert_allclose(l1, l8, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), g1, g8)
  # The batch really is split over the 8 devices.
  assert len(batch8["left_tokens"].sharding.device_set) == 8
  assert batch8["left_tokens"].addressable_shards[0].data.shape[0] == B // (8 // num_partitions)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_train_step_equal_on_1_and_8_devices():
  out = []
  for n in (1, 8):
    *_, tr, state, batch = _loss_and_grads(n)
    for _ in range(2):
      state, metrics = tr.step(state, _batch())
    out.append((jax.tree.map(np.asarray, state.params), float(metrics["loss"].compute())))
  np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               out[0][0], out[1][0])


def test_params_carry_t5x_logical_axes():
  model = _model()
  v = model.get_initial_variables(jax.random.PRNGKey(0), {"left_tokens": (2, L),
                                                          "right_tokens": (2, L)})
  from flax.linen import partitioning as nnp
  names = {tuple(s) for s in jax.tree.leaves(
      nnp.get_axis_names(v["params_axes"]),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))}
  assert ("vocab", "embed") in names and ("embed", "heads", "kv") in names
  assert ("embed", "mlp") in names and ("heads", "kv", "embed") in names


def test_scan_and_unrolled_layers_compute_the_same_function():
  b = {k: jnp.asarray(v) for k, v in _batch().items()}
  unrolled, scanned = _model(False), _model(True)
  p = unrolled.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in b.items()})
  p = jax.tree.map(np.asarray, p["params"])
  enc = p["encoder"]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *[enc[f"layers_{i}"] for i in range(2)])
  ps = {**p, "encoder": {**{k: v for k, v in enc.items() if not k.startswith("layers_")},
                         "layers": stacked}}
  np.testing.assert_allclose(unrolled.encode_tokens(p, b["left_tokens"], b.get("left_lang")),
                             scanned.encode_tokens(ps, b["left_tokens"], b.get("left_lang")),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan,policy", [(True, "full"),
                                         pytest.param(False, "dots", marks=pytest.mark.slow)])
def test_remat_with_dropout_gives_the_same_loss_and_grads(scan, policy):
  """Gradient checkpointing changes memory, not math, also with dropout on (the
  `deterministic` flag must stay static under remat)."""
  from vmx import decoders
  kw = dict(vocab_size=50, num_layers=2, emb_dim=16, num_heads=2, mlp_dim=32, max_length=8,
            dropout_rate=0.1, attention_dropout_rate=0.1, scan_layers=scan)
  toks = jnp.asarray(np.random.default_rng(0).integers(3, 50, size=(4, 8)), jnp.int32)
  cond = jnp.ones((4, 16))
  rngs = {"dropout": jax.random.PRNGKey(1)}
  for cls, args in ((encoders.TransformerEncoder, (toks,)),
                    (decoders.ConditionedDecoder, (toks, None, cond))):
    plain, rematted = cls(**kw), cls(**kw, remat_policy=policy)
    params = plain.init(jax.random.PRNGKey(0), *args)

    def loss(module, p):
      out = module.apply(p, *args, deterministic=False, rngs=rngs)
      return jnp.sum(jnp.square(out[0] if isinstance(out, tuple) else out))

    # jitted: eagerly, every primitive is compiled on its own (hundreds of compiles)
    l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(plain, p)))(params)
    l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(rematted, p)))(params)
    np.testing.assert_allclose(l0, l1, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g0, g1)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_parameter_subset_optimizers_leave_the_other_subset_untouched():
  """multi_optimizer: the projection head trains with its own optimizer, the 'frozen'
  encoder never changes; the state is sharded like the parameters on 8 devices."""
  from vmx.errors import ConfigError
  tx = optimizers.multi_optimizer({"head": optimizers.create_optimizer("adam", 1e-2)},
                                  [("^projection/", "head"), ("^encoder/", "frozen")])
  model = _model()
  part = partitioning.Partitioner(num_partitions=2, num_devices=8)
  tr = TrainStep(model, tx, part, {k: v.shape for k, v in _batch().items()})
  state = tr.create_state(0)
  before = jax.device_get(state.params)
  for _ in range(2):
    state, metrics = tr.step(state, _batch())
  after = jax.device_get(state.params)
  jax.tree.map(np.testing.assert_array_equal, before["encoder"], after["encoder"])
  assert not np.allclose(before["projection"]["dense_0"]["kernel"],
                         after["projection"]["dense_0"]["kernel"])
  assert float(metrics["grad_norm"].compute()) > 0
  with pytest.raises(ConfigError, match="match no rule .*encoder/"):
    TrainStep(model, optimizers.multi_optimizer({"head": optax_sgd()}, [("^projection/", "head")]),
            part, {k: v.shape for k, v in _batch().items()})
  with pytest.raises(ConfigError, match=r"subsets \['other'\]"):
    optimizers.multi_optimizer({"head": optax_sgd()}, [(".*", "other")])


def optax_sgd():
  import optax
  return optax.sgd(0.1)


def test_bfloat16_activations_match_float32_within_tolerance():
  """ACTIVATION_DTYPE='bfloat16' (mixed precision: float32 parameters, bfloat16 compute,
  float32 losses) gives the float32 loss and gradients within bfloat16's precision."""
  def build(dtype):
    enc = encoders.TransformerEncoder(vocab_size=64, num_layers=2, emb_dim=32, num_heads=4,
                                      mlp_dim=64, max_length=L, dtype=dtype)
    return DualEncoderModel(DualEncoder(enc, projection_dims=(16,)), temperature=0.1)
  f32, bf16 = build("float32"), build("bfloat16")
  batch = jax.tree.map(jnp.asarray, _batch())
  params = f32.get_initial_variables(jax.random.PRNGKey(0),
                                     {k: v.shape for k, v in batch.items()})["params"]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(
      bf16.get_initial_variables(jax.random.PRNGKey(0),
                                 {k: v.shape for k, v in batch.items()})["params"]))
  out = {}
  for name, m in (("f32", f32), ("bf16", bf16)):
    loss, grads = jax.jit(jax.value_and_grad(
        lambda p, m=m: m.compute_loss(p, batch, None, None)[0]))(
        params)
    assert loss.dtype == jnp.float32
    out[name] = (float(loss), np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)]))
  assert out["bf16"][0] != out["f32"][0]                  # the switch does compute in bf16
  assert out["bf16"][0] == pytest.approx(out["f32"][0], rel=2e-2)
  g32, g16 = out["f32"][1], out["bf16"][1]
  cos = float(g32 @ g16 / (np.linalg.norm(g32) * np.linalg.norm(g16)))
  assert cos > 0.99, cos


@pytest.mark.parametrize("num_devices,chunks", [pytest.param(1, 4, marks=pytest.mark.slow),
                                                (8, 2)])
def test_grad_cache_equals_the_uncached_step(num_devices, chunks):
  """GradCache (train.grad_cache_chunks): the same loss, gradients and trained parameters
  as the whole-batch step, on 1 device and with the chunks split over 8."""
  from vmx.training import grad_cache
  if jax.device_count() < num_devices:
    pytest.skip("needs 8 (simulated) devices")
  l1, g1, tr1, state1, _ = _loss_and_grads(1)
  model = _model()
  part = partitioning.Partitioner(num_devices=num_devices)
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part,
               {k: v.shape for k, v in _batch().items()}, grad_cache_chunks=chunks)
  state = tr.create_state(0)
  batch = part.global_batch(_batch(), tr.batch_shardings)
  fn = jax.jit(lambda p, b: grad_cache.loss_and_grads(model, p, b, None, chunks))
  with part.context():
    loss, metrics, grads, _ = fn(state.params, batch)
  np.testing.assert_allclose(float(loss), l1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
               g1, jax.tree.map(np.asarray, grads))
  for _ in range(2):     # dropout is 0 here: the steps are the same function
    state1, m1 = tr1.step(state1, _batch())
    state, m = tr.step(state, _batch())
  np.testing.assert_allclose(float(m["loss"].compute()), float(m1["loss"].compute()), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.tree.map(np.asarray, state1.params), jax.tree.map(np.asarray, state.params))


def test_grad_cache_refuses_what_it_cannot_chunk():
  from vmx.errors import ConfigError
  from vmx.models.emmax import EmmaX, EmmaXModel
  shapes = {k: v.shape for k, v in _batch().items()}
  adam = optimizers.create_optimizer("adam", 1e-3)
  with pytest.raises(ConfigError, match="not a multiple of chunks"):
    TrainStep(_model(), adam, partitioning.Partitioner(num_devices=1), shapes, grad_cache_chunks=3)
  with pytest.raises(ConfigError, match="positive integer"):
    TrainStep(_model(), adam, partitioning.Partitioner(num_devices=1), shapes, grad_cache_chunks=0)
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=L)
  with pytest.raises(ConfigError, match="EmmaXModel has no GradCache split"):
    TrainStep(EmmaXModel(EmmaX(enc), queue_size=16), adam,
            partitioning.Partitioner(num_devices=1), {"tokens": (B, L)}, grad_cache_chunks=2)

  class NoSplit(DualEncoderModel):
    grad_cache_embed = None
  with pytest.raises(ConfigError, match="NoSplit has no GradCache split"):
    TrainStep(NoSplit(DualEncoder(enc)), adam, partitioning.Partitioner(num_devices=1), shapes,
            grad_cache_chunks=2)
