"""CONTRASTIVE's hard-negative variant (issue 56: the N-way task of self-mined negatives
that CONTRASTIVE and MPCL train on): `losses.in_batch_softmax_loss` with hard negatives
against a NumPy loop reference (both directions, false negatives left out by their keys),
the plain loss without them, and the model on the mined task's rows (its loss is the
loss of its vectors; the pairs' order does not matter; refused without a hard negative)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmx import encoders, losses
from vmx.errors import ConfigError
from vmx.models.dual_encoder import DualEncoder, DualEncoderModel


def _np_loss(left, right, negs, t, bidirectional, left_key=None, right_key=None,
             neg_key=None):
  """(loss, hard_negative_accuracy) by loops: every hard negative of the batch in every
  anchor's softmax, except those equal (by key) to one of the anchor's pair."""
  B, H, _ = negs.shape
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  l, r, n = unit(left), unit(right), unit(negs).reshape(B * H, -1)
  nk = None if neg_key is None else neg_key.reshape(-1)

  def term(anchor, own, others, other_keys, key, i):
    cand = [anchor @ own] + [anchor @ o for j, o in enumerate(others) if j != i and
                             (key is None or other_keys[j] != key[i])]
    cand += [anchor @ n[m] for m in range(B * H)
             if nk is None or (nk[m] != left_key[i] and nk[m] != right_key[i])]
    s = np.array(cand) / t
    return np.log(np.exp(s).sum()) - s[0]

  fwd = [term(l[i], r[i], r, right_key, right_key, i) for i in range(B)]
  loss = np.mean(fwd)
  if bidirectional:
    bwd = [term(r[j], l[j], l, left_key, left_key, j) for j in range(B)]
    loss = 0.5 * (np.mean(fwd) + np.mean(bwd))
  hits = []
  for i in range(B):
    own = [l[i] @ n[m] for m in range(i * H, (i + 1) * H)
           if nk is None or (nk[m] != left_key[i] and nk[m] != right_key[i])]
    hits.append(not own or l[i] @ r[i] > max(own))
  return float(loss), float(np.mean(hits))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("h", [1, 2])
@pytest.mark.parametrize("keys", [False, True])
def test_hard_negative_loss_matches_numpy(bidirectional, h, keys):
  rng = np.random.default_rng(5)
  B, D = 6, 8
  left, right = rng.normal(size=(B, D)), rng.normal(size=(B, D))
  negs = rng.normal(size=(B, h, D))
  negs[1, 0] = right[1] + 0.1 * negs[1, 0]      # close to its own pair's target
  kw, ref_kw = {}, {}
  if keys:
    lk, rk = np.arange(B, dtype=np.uint32), np.arange(100, 100 + B, dtype=np.uint32)
    rk[4] = rk[3]                                # two pairs share a target
    nk = np.arange(200, 200 + B * h, dtype=np.uint32).reshape(B, h)
    nk[0, 0] = rk[2]                             # a negative equal to pair 2's target,
    nk[2, h - 1] = lk[5]                         # one equal to pair 5's source
    kw = dict(left_key_B=jnp.asarray(lk), right_key_B=jnp.asarray(rk),
              negative_key_BxH=jnp.asarray(nk))
    ref_kw = dict(left_key=lk, right_key=rk, neg_key=nk)
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  loss, m = losses.in_batch_softmax_loss(f32(left), f32(right), 0.05, bidirectional,
                                         hard_negatives_BxHxD=f32(negs), **kw)
  ref, hit = _np_loss(left, right, negs, 0.05, bidirectional, **ref_kw)
  assert float(loss) == pytest.approx(ref, rel=1e-4)
  assert float(m["hard_negative_accuracy"]) == pytest.approx(hit)
  # the negatives cost something: the loss without them is lower
  plain, _ = losses.in_batch_softmax_loss(
      f32(left), f32(right), 0.05, bidirectional,
      **{k: v for k, v in kw.items() if k != "negative_key_BxH"})
  assert float(plain) < float(loss)


def test_no_hard_negatives_is_the_plain_loss():
  rng = np.random.default_rng(6)
  left, right = (jnp.asarray(rng.normal(size=(5, 8)), jnp.float32) for _ in range(2))
  plain, m0 = losses.in_batch_softmax_loss(left, right)
  none, m1 = losses.in_batch_softmax_loss(left, right, hard_negatives_BxHxD=jnp.zeros((5, 0, 8)))
  assert float(none) == pytest.approx(float(plain), rel=1e-6) and m0.keys() == m1.keys()
  with pytest.raises(ValueError, match=r"expected \[B, H, D\]"):
    losses.in_batch_softmax_loss(left, right, hard_negatives_BxHxD=jnp.zeros((4, 1, 8)))


def _model(**kw):
  enc = encoders.TransformerEncoder(vocab_size=150, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, **kw.pop("enc", {}))
  return DualEncoderModel(DualEncoder(encoder=enc, **kw.pop("dual", {})), hard_negatives=True,
                          **kw)


def _batch(b=6, seed=0):
  rng = np.random.default_rng(seed)
  batch = {"views": rng.integers(1, 150, size=(b, 16)).astype(np.int32),
           "hard_negative": rng.integers(1, 150, size=(b, 8)).astype(np.int32)}
  batch["hard_negative"][2] = batch["views"][3, 8:]    # pair 3's target as pair 2's negative
  return batch


def test_the_model_reads_the_mined_rows_and_its_loss_is_its_vectors_loss():
  model = _model(matryoshka_dims=(8,))
  assert model.feature_converter() == ("MultiViewHardNegativeFeatureConverter",
                                       {"num_views": 2})
  batch = _batch()
  params = model.get_initial_variables(jax.random.PRNGKey(0),
                                      {k: v.shape for k, v in batch.items()})["params"]
  (loss, m), grads = jax.jit(jax.value_and_grad(
      lambda p: model.compute_loss(p, batch, None)[:2], has_aux=True))(params)
  left, right, neg = jax.jit(lambda p: model._apply(p, batch, None))(params)
  views = batch["views"].reshape(6, 2, 8)
  key = lambda x: losses.token_row_key(jnp.asarray(x))  # noqa: E731
  ref, _ = losses.matryoshka(
      lambda l, r, n: losses.in_batch_softmax_loss(
          l, r, hard_negatives_BxHxD=n, left_key_B=key(views[:, 0]),
          right_key_B=key(views[:, 1]), negative_key_BxH=key(batch["hard_negative"])[:, None]),
      (8,), left, right, neg)
  assert float(loss) == pytest.approx(float(ref), rel=1e-6)
  assert {"hard_negative_accuracy", "loss_dim8", "loss_dim16"} <= set(m)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  # a task's pairs come in either order: swapping every pair's two views is the same loss
  swapped = {**batch, "views": views[:, ::-1].reshape(6, 16)}
  assert float(model.compute_loss(params, swapped, None)[0]) == pytest.approx(float(loss),
                                                                              rel=1e-5)
  with pytest.raises(ConfigError, match="DualEncoderModel.hard_negatives=True but the batch "
                                        "has no 'hard_negative' feature"):
    model.compute_loss(params, {"views": batch["views"]}, None)


def test_the_variant_needs_one_encoder_without_language_ids():
  for kw in (dict(dual=dict(share_encoders=False)), dict(enc=dict(num_languages=3))):
    with pytest.raises(ConfigError, match="one shared encoder"):
      _model(**kw)
