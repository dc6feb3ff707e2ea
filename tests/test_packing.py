"""Packing (vmx/data/packing.py, vmx/packing.py): several sentences a row is a layout only.

The packer lays out every sentence once, as a pure function of the batch; a packed batch's
loss and gradients equal the unpacked batch's for every family that packs (float32,
relative 1e-5; the gradients per parameter), on 1 and 8 devices and with GradCache chunks; a
token never sees another sentence of its row."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmx import decoders, encoders, losses
from vmx.data import packing
from vmx.models import (DualEncoder, DualEncoderModel, EMS, EMSModel, MPCLModel, VMSST,
                        VMSSTModel)
from vmx.packing import Packed
from vmx.training import optimizers, partitioning
from vmx.training.step import TrainStep

V = 50


def _rows(rng, b, length, lo=1, hi=None):
  """[b, length] token rows with lengths in [lo, hi] (hi: the full row, truncated)."""
  lens = rng.integers(lo, (hi or length) + 1, size=b)
  toks = rng.integers(3, V, size=(b, length))
  toks[np.arange(length)[None] >= lens[:, None]] = 0
  return toks.astype(np.int32)


def _pairs(b=16, length=12, seed=0, langs=3):
  rng = np.random.default_rng(seed)
  left, right = _rows(rng, b, length), _rows(rng, b, length)
  right[3] = right[5]                 # a repeated translation: duplicate masking applies
  return {"left_tokens": left, "right_tokens": right,
          "left_lang": rng.integers(0, langs, b).astype(np.int32),
          "right_lang": rng.integers(0, langs, b).astype(np.int32)}


# -- the packer ----------------------------------------------------------------------------

@pytest.mark.parametrize("reserve", [0, 1])
def test_every_sentence_is_laid_out_once_with_its_tokens_positions_and_key(reserve):
  rng = np.random.default_rng(1)
  b, length = 32, 10
  toks = _rows(rng, b, length, lo=0)             # empty and full (truncated) rows too
  f = packing.Feature("x", length, 1, reserve)
  packer = packing.Packer([f], b, 1, 1, [0], granule=3)
  out = packer({"x": toks, "y": np.arange(b)})
  np.testing.assert_array_equal(out["y"], np.arange(b))        # other features unchanged
  tok, seg, pos, starts = (out["x"], out["x_segment_ids"], out["x_positions"],
                           out["x_starts"])
  assert tok.shape[1] == length and tok.shape[0] % 3 == 0
  taken = np.zeros(tok.shape, bool)
  for i in range(b):
    n = int((toks[i] > 0).sum())
    slots = max(min(n + reserve, length), 1)
    r, c = divmod(int(starts[i]), length)
    assert c + slots <= length and not taken[r, c:c + slots].any()
    taken[r, c:c + slots] = True
    np.testing.assert_array_equal(tok[r, c:c + n], toks[i, :n])
    assert (tok[r, c + n:c + slots] == 0).all()                # the reserved slot
    np.testing.assert_array_equal(pos[r, c:c + slots], np.arange(slots))
    assert len(set(seg[r, c:c + slots])) == 1 and seg[r, c] > 0
  assert (seg[~taken] == 0).all() and (tok[~taken] == 0).all()
  np.testing.assert_array_equal(out["x_key"], np.asarray(losses.token_row_key(toks)))


def test_units_keep_their_shards_and_chunks_and_a_process_packs_what_the_whole_batch_does():
  rng = np.random.default_rng(2)
  b, length, shards, chunks = 32, 8, 4, 2
  toks = _rows(rng, b, length)
  f = packing.Feature("x", length)
  whole = packing.Packer([f], b, shards, chunks, range(shards))({"x": toks})
  rows = len(whole["x"]) // (shards * chunks)
  for e in range(b):
    p, c = divmod(e, b // shards)[0], e % chunks
    chunk_row = whole["x_starts"][e] // length                 # its row within chunk c
    assert chunk_row // rows == p
    global_row = chunk_row * chunks + c
    assert whole["x"][global_row, whole["x_starts"][e] % length] == toks[e, 0]
  # a process holding shards 1 and 3 (given the same row count) packs exactly their part
  part = packing.Packer([f], b, shards, chunks, [1, 3], agree=lambda n: [rows])
  mine = np.r_[8:16, 24:32]
  got = part({"x": toks[mine]})
  lookup = part.row_lookup(len(got["x"]))
  for g in np.flatnonzero(lookup >= 0):
    np.testing.assert_array_equal(got["x"][lookup[g]], whole["x"][g])
  np.testing.assert_array_equal(got["x_starts"], whole["x_starts"][mine])


def test_best_fit_fills_rows_and_row_counts_come_in_granules():
  rng = np.random.default_rng(3)
  sizes = rng.integers(3, 20, size=512)
  _, _, rows = packing.best_fit_decreasing(sizes, 32)
  assert rows <= np.ceil(sizes.sum() / 32) * 1.03 + 1
  p = packing.Packer([packing.Feature("x", 32)], 128, 1, 1, [0])
  assert p.granule == 128 // 32 and p.rows_for(45) == 48 and p.rows_for(48) == 48
  assert packing.Packer([packing.Feature("x", 32)], 16, 1, 1, [0]).granule == 4


# -- equal math ------------------------------------------------------------------------------

def _loss_and_grads(model, batch, devices=1, parts=1, chunks=1, pack=True):
  part = partitioning.Partitioner(num_partitions=parts, num_devices=devices)
  shapes = {k: v.shape for k, v in batch.items()}
  keys = {n.split("/", 1)[0] if "/" in n else None for n in shapes}
  packed = {k: packing.features_of(model, shapes, k) for k in keys} if pack else None
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part, shapes,
               grad_cache_chunks=chunks, packed=packed)
  state = tr.create_state(0)
  placed = tr.place(batch)
  fn = jax.jit(lambda s, b: tr._loss_and_grads(s, b, jax.random.PRNGKey(7)))
  with part.context():
    loss, metrics, grads, _ = fn(state, placed)
  return (float(loss), {k: float(v.compute()) for k, v in metrics.items()},
          jax.tree.map(np.asarray, grads))


# Gradients: the relative L2 error of each parameter's gradient (elementwise, a near-zero
# entry summed in another order has no meaningful relative error), with a floor of 1e-7 of
# the whole gradient's norm for the gradients that are 0 in exact arithmetic (a key bias).
GRAD_RTOL = 1e-5


def _assert_equal(model, batch, layouts=((1, 1, 1),)):
  """Packed == unpacked in each layout (devices, model partitions, GradCache chunks: its
  chunks draw their own noise, the same packed or not)."""
  for devices, parts, chunks in layouts:
    ref = _loss_and_grads(model, batch, devices, parts, chunks, pack=False)
    got = _loss_and_grads(model, batch, devices, parts, chunks)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for k in ref[1]:
      np.testing.assert_allclose(got[1][k], ref[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    total = np.sqrt(sum(np.sum(np.square(b)) for b in jax.tree.leaves(ref[2])))
    for path, a, b in zip(jax.tree_util.tree_flatten_with_path(got[2])[0],
                          jax.tree.leaves(got[2]), jax.tree.leaves(ref[2])):
      err = np.linalg.norm(a - b)
      assert err <= GRAD_RTOL * np.linalg.norm(b) + 1e-7 * total, (
          jax.tree_util.keystr(path[0]), err, np.linalg.norm(b))


def _encoder(length=12, layers=2, **kw):
  return encoders.TransformerEncoder(vocab_size=V, num_layers=layers, emb_dim=32, num_heads=4,
                                     mlp_dim=64, max_length=length, **kw)


LAYOUTS = ((1, 1, 1), (8, 2, 1), (8, 1, 2))   # devices, model partitions, GradCache chunks


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_contrastive_packed_equals_unpacked_on_1_and_8_devices_and_in_grad_cache_chunks():
  model = DualEncoderModel(DualEncoder(_encoder(), projection_dims=(16,)), temperature=0.1)
  _assert_equal(model, _pairs(), LAYOUTS)


@pytest.mark.parametrize("kw", [dict(num_languages=3, position_embedding="sinusoidal"),
                                dict(family="bert", position_offset=2, pooler=True),
                                dict(family="t5")], ids=["languages", "xlmr", "t5"])
def test_contrastive_packed_equals_unpacked_in_every_encoder_family(kw):
  pooling = "pooler" if kw.get("pooler") else "mean"
  model = DualEncoderModel(DualEncoder(_encoder(**kw), pooling=pooling), temperature=0.1)
  _assert_equal(model, _pairs())


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_ems_packed_equals_unpacked():
  enc = _encoder(layers=1)
  model = EMSModel(EMS(enc, num_languages=3, language_dim=8, contrastive_dims=(32, 16)))
  _assert_equal(model, _pairs(), ((1, 1, 1), (8, 1, 2)))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("hard", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_mpcl_packed_equals_unpacked(hard):
  rng = np.random.default_rng(4)
  b, v, length = 16, 3, 10
  batch = {"views": _rows(rng, b * v, length).reshape(b, v * length)}
  if hard:
    batch["hard_negative"] = _rows(rng, b, length)
  model = MPCLModel(DualEncoder(_encoder(length), pooling="first"), num_views=v,
                    hard_negatives=hard)
  _assert_equal(model, batch, LAYOUTS if hard else ((1, 1, 1),))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_contrastive_with_hard_negatives_packed_equals_unpacked():
  rng = np.random.default_rng(9)
  b, length = 16, 10
  batch = {"views": _rows(rng, b * 2, length).reshape(b, 2 * length),
           "hard_negative": _rows(rng, b, length)}
  batch["hard_negative"][3] = batch["views"][5, length:]   # a negative that is a positive
  model = DualEncoderModel(DualEncoder(_encoder(length)), temperature=0.1,
                           matryoshka_dims=(16,), hard_negatives=True)
  _assert_equal(model, batch, LAYOUTS)


def _vmsst(module_kw=None, model_kw=None, dec_kw=None, length=12):
  enc = _encoder(length, layers=1)
  dec = decoders.ConditionedDecoder(vocab_size=V, num_layers=1, emb_dim=32, num_heads=4,
                                    mlp_dim=64, max_length=length, **(dec_kw or {}))
  return VMSSTModel(VMSST(enc, dec, num_languages=3, **(module_kw or {})), **(model_kw or {}))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_vmsst_packed_equals_unpacked_with_sampled_latents():
  # the latents are drawn per example ([B, Z] in the examples' order): the same draws
  _assert_equal(_vmsst(), _pairs(), ((1, 1, 1), (8, 1, 2)))


@pytest.mark.parametrize("variant", ["bitranslation",
                                     pytest.param("contrastive_sum", marks=pytest.mark.slow),
                                     pytest.param("per_language_decoders",
                                                  marks=pytest.mark.slow),
                                     pytest.param("t5", marks=pytest.mark.slow),
                                     pytest.param("two_language_encoders",
                                                  marks=pytest.mark.slow)])
def test_vmsst_variants_packed_equal_unpacked(variant):
  kw = {"bitranslation": dict(module_kw=dict(language_latents=False),
                              model_kw=dict(elbo_weight=0.0)),
        "contrastive_sum": dict(model_kw=dict(contrastive_weight=0.01,
                                              contrastive_reduction="sum")),
        "t5": dict(dec_kw=dict(family="t5")),
        "per_language_decoders": dict(module_kw=dict(per_language_decoders=True)),
        "two_language_encoders": dict(module_kw=dict(num_language_encoders=2))}[variant]
  _assert_equal(_vmsst(**kw), _pairs())


def test_distillation_student_packed_equals_unpacked():
  from vmx.models.distill import DistillationModel
  batch = _pairs()
  batch["teacher"] = np.random.default_rng(5).normal(size=(16, 32)).astype(np.float32)
  model = DistillationModel(DualEncoder(_encoder()))
  _assert_equal(model, batch)


@pytest.mark.parametrize("stage", ["warmup", "em", "em_parallel"])
def test_emmax_packed_equals_unpacked(stage):
  from vmx.models.emmax import EmmaX, EmmaXModel
  rng = np.random.default_rng(8)
  enc = _encoder()
  if stage == "warmup":
    batch = _pairs()
  elif stage == "em":
    batch = {"tokens": _rows(rng, 16, 12)}
  else:
    batch = {"text/tokens": _rows(rng, 8, 12), **{f"pairs/{k}": v for k, v in
                                                 _pairs(8).items()}}
  model = EmmaXModel(EmmaX(enc), stage="warmup" if stage == "warmup" else "em",
                     queue_size=32, classifier_batch_size=24,
                     em_parallel=stage == "em_parallel")
  _assert_equal(model, batch)


# -- isolation -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["vmx", "t5"])
def test_a_changed_token_leaves_every_other_sentence_bitwise_equal(family):
  rng = np.random.default_rng(6)
  b, length = 24, 16
  toks = _rows(rng, b, length, hi=7)          # short: several sentences a row
  enc = _encoder(length, family=family)
  f = packing.Feature("x", length)
  params = enc.init(jax.random.PRNGKey(0), jnp.asarray(toks))["params"]
  vectors = jax.jit(lambda arrays: enc.apply({"params": params}, Packed.of(arrays, "x"),
                                             method=encoders.TransformerEncoder.sentences))

  def embed(t):
    out = packing.Packer([f], b, 1, 1, [0])({"x": t})
    return np.asarray(vectors({k: jnp.asarray(v) for k, v in out.items()})), out

  base, packed = embed(toks)
  assert packed["x_segment_ids"].max() >= 3    # rows really hold several sentences
  changed = toks.copy()
  changed[5, 1] = (changed[5, 1] + 1) % (V - 3) + 3
  other, packed2 = embed(changed)
  np.testing.assert_array_equal(packed["x_starts"], packed2["x_starts"])   # same layout
  keep = np.arange(b) != 5
  np.testing.assert_array_equal(base[keep], other[keep])
  assert np.abs(base[5] - other[5]).max() > 1e-6


def test_a_decoder_slot_sees_its_own_sentence_only():
  rng = np.random.default_rng(7)
  b, length = 12, 12
  model = _vmsst(length=length)
  batch = _pairs(b, length)
  batch["left_tokens"] = _rows(rng, b, length, hi=5)
  params = model.get_initial_variables(jax.random.PRNGKey(0),
                                       {k: v.shape for k, v in batch.items()})["params"]
  f = packing.features_of(model, {k: v.shape for k, v in batch.items()})

  def nll(left):
    out = packing.Packer(f, b, 1, 1, [0])({**batch, "left_tokens": left})
    pairs = model.per_pair(params, {k: jnp.asarray(v) for k, v in out.items()}, None)
    return np.asarray(pairs["nll"])

  base = nll(batch["left_tokens"])
  changed = batch["left_tokens"].copy()
  changed[4, 0] = (changed[4, 0] + 1) % (V - 3) + 3
  other = nll(changed)
  # passes 0 and 2 decode the left sentences: only pair 4's change (its own sentence; its
  # semantic vector feeds pair 4's right-side passes too)
  keep = np.arange(b) != 4
  np.testing.assert_array_equal(base[keep], other[keep])
  assert np.abs(base[4] - other[4]).max() > 1e-6


def test_a_family_that_cannot_pack_is_refused_naming_the_binding():
  from vmx.data import pipeline
  from vmx.errors import ConfigError
  model = DualEncoderModel(DualEncoder(_encoder()))
  model.packed_features = lambda: None          # a family that reads one sentence a row
  shapes = {k: v.shape for k, v in _pairs().items()}
  cfg = pipeline.DatasetConfig("t", {"inputs": 12, "targets": 12}, 16, pack=True)
  with pytest.raises(ConfigError, match=r"DatasetConfig.pack=True \(PACKING = True\).*"
                                        r"--gin.PACKING=False"):
    pipeline.packed_features(cfg, model, shapes)
  multi = pipeline.MultiTaskConfig({"a": pipeline.DatasetConfig("t", {"inputs": 12}, 16),
                                    "b": cfg})
  with pytest.raises(ConfigError, match=r"MultiTaskConfig.tasks\['b'\] DatasetConfig.pack"):
    pipeline.packed_features(multi, model, shapes)
  assert pipeline.packed_features(pipeline.DatasetConfig("t", {"inputs": 12}, 16), model,
                                  shapes) == {}
