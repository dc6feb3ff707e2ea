"""InfoNCE against a NumPy reference."""
import jax.numpy as jnp
import numpy as np
import pytest

from vmx import losses


def _np_logsoftmax(x, axis):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def np_infonce(a, b, t, bidirectional):
  a = a / np.linalg.norm(a, axis=1, keepdims=True)
  b = b / np.linalg.norm(b, axis=1, keepdims=True)
  s = a @ b.T / t
  i = np.arange(len(a))
  fwd = -_np_logsoftmax(s, 1)[i, i].mean()
  if not bidirectional:
    return fwd
  return 0.5 * (fwd - _np_logsoftmax(s, 0)[i, i].mean())


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_in_batch_softmax_matches_numpy(bidirectional, temperature):
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
  loss, metrics = losses.in_batch_softmax_loss(jnp.asarray(a), jnp.asarray(b), temperature,
                                               bidirectional)
  np.testing.assert_allclose(float(loss), np_infonce(a, b, temperature, bidirectional),
                             rtol=1e-5)
  assert float(metrics["loss"]) == float(loss)


def np_masked_infonce(a, b, t, src_ids, tgt_ids):
  """NumPy reference: row i's softmax leaves out targets j != i with tgt_ids[j] ==
  tgt_ids[i]; column j's leaves out sources i != j with src_ids[i] == src_ids[j]."""
  a = a / np.linalg.norm(a, axis=1, keepdims=True)
  b = b / np.linalg.norm(b, axis=1, keepdims=True)
  s = a @ b.T / t
  n = len(a)
  rows, cols = [], []
  for i in range(n):
    keep = [j for j in range(n) if j == i or tgt_ids[j] != tgt_ids[i]]
    rows.append(s[i, i] - np.log(np.sum(np.exp(s[i, keep]))))
  for j in range(n):
    keep = [i for i in range(n) if i == j or src_ids[i] != src_ids[j]]
    cols.append(s[j, j] - np.log(np.sum(np.exp(s[keep, j]))))
  return -0.5 * (np.mean(rows) + np.mean(cols))


def test_duplicate_sentences_are_no_negatives_of_each_other():
  """Rows 0, 2 and 5 share a target sentence, rows 1 and 4 a source sentence: equal
  token rows have equal keys, and the loss leaves them out of each other's softmax as the
  NumPy reference does; without keys it is the plain loss."""
  rng = np.random.default_rng(3)
  a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  src = np.array([[5, 6, 0], [7, 8, 9], [3, 4, 0], [9, 9, 0], [7, 8, 9], [4, 0, 0]], np.int32)
  tgt = np.array([[1, 2, 0], [2, 2, 0], [1, 2, 0], [3, 0, 0], [5, 5, 5], [1, 2, 0]], np.int32)
  sk, tk = losses.token_row_key(jnp.asarray(src)), losses.token_row_key(jnp.asarray(tgt))
  assert len(set(np.asarray(tk).tolist())) == 4 and len(set(np.asarray(sk).tolist())) == 5
  src_ids = [bytes(r) for r in src]
  tgt_ids = [bytes(r) for r in tgt]
  loss, m = losses.in_batch_softmax_loss(jnp.asarray(a), jnp.asarray(b), 0.1,
                                         left_key_B=sk, right_key_B=tk)
  np.testing.assert_allclose(float(loss), np_masked_infonce(a, b, 0.1, src_ids, tgt_ids),
                             rtol=1e-5)
  plain, _ = losses.in_batch_softmax_loss(jnp.asarray(a), jnp.asarray(b), 0.1)
  np.testing.assert_allclose(float(plain), np_infonce(a, b, 0.1, True), rtol=1e-5)
  assert float(loss) < float(plain)                   # fewer (false) negatives
  perm = rng.permutation(6)                           # keys follow the rows
  np.testing.assert_array_equal(np.asarray(losses.token_row_key(jnp.asarray(tgt[perm]))),
                                np.asarray(tk)[perm])


def test_perfect_alignment_has_low_loss_and_full_accuracy():
  x = jnp.eye(6) * 3.0
  loss, m = losses.in_batch_softmax_loss(x, x, 0.05)
  assert float(loss) < 1e-3 and float(m["in_batch_accuracy"]) == 1.0


def test_loss_is_asymmetric_unless_bidirectional():
  rng = np.random.default_rng(1)
  a, b = jnp.asarray(rng.normal(size=(5, 4))), jnp.asarray(rng.normal(size=(5, 4)))
  l_ab, _ = losses.in_batch_softmax_loss(a, b, 0.1, bidirectional=True)
  l_ba, _ = losses.in_batch_softmax_loss(b, a, 0.1, bidirectional=True)
  np.testing.assert_allclose(float(l_ab), float(l_ba), rtol=1e-6)


def test_paired_and_multi_positive_losses_leave_out_copies_of_a_groups_sentences():
  """EMMA-X's paired InfoNCE and MPCL's multi-positive loss with the sentences' keys: a
  sentence elsewhere in the batch equal to the anchor or to one of its positives is no
  negative (NumPy references by loops)."""
  rng = np.random.default_rng(4)
  # paired: 5 pairs; pair 3's target repeats pair 0's, pair 4's source repeats pair 1's
  x, y = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
  lk = np.array([10, 11, 12, 13, 11], np.uint32)
  rk = np.array([20, 21, 22, 20, 24], np.uint32)
  got, _ = losses.paired_batch_infonce(jnp.asarray(x), jnp.asarray(y), 0.5,
                                       jnp.asarray(lk), jnp.asarray(rk))
  z, key, n = np.concatenate([x, y]), np.concatenate([lk, rk]), 10
  terms = []
  for i in range(n):
    p = (i + 5) % n
    keep = [j for j in range(n) if j != i and (j == p or key[j] not in (key[i], key[p]))]
    s = z[i] @ z.T / 0.5
    terms.append(np.log(np.sum(np.exp(s[keep]))) - s[p])
  np.testing.assert_allclose(float(got), np.mean(terms), rtol=1e-5)
  plain, _ = losses.paired_batch_infonce(jnp.asarray(x), jnp.asarray(y), 0.5)
  assert float(plain) != pytest.approx(float(got))
  # multi-positive: 4 groups of 3 views; group 2's view 1 repeats group 0's view 2
  views = rng.normal(size=(4, 3, 6)).astype(np.float32)
  vk = np.arange(12, dtype=np.uint32).reshape(4, 3)
  vk[2, 1] = vk[0, 2]
  got, _ = losses.multi_positive_infonce(jnp.asarray(views), 0.05, view_key_GxV=jnp.asarray(vk))
  flat = (views / np.linalg.norm(views, axis=-1, keepdims=True)).reshape(12, 6)
  terms = []
  for g in range(4):
    i = g * 3
    own = set(range(g * 3, g * 3 + 3))
    mine = {int(k) for k in vk[g]}
    keep = [j for j in range(12) if j != i and (j in own or int(vk.reshape(-1)[j]) not in mine)]
    s = flat[i] @ flat.T / 0.05
    pos = [j for j in own if j != i]
    terms.append(np.log(np.sum(np.exp(s[keep]))) - np.log(np.sum(np.exp(s[pos]))))
  np.testing.assert_allclose(float(got), np.mean(terms), rtol=1e-4)


def test_matryoshka_sums_infonce_over_normalized_prefixes():
  """losses.matryoshka: InfoNCE of each prefix [:, :d] (renormalized) and of the whole,
  summed; the full dimension's accuracy; each prefix's loss as loss_dim{d}."""
  rng = np.random.default_rng(1)
  a, b = rng.normal(size=(9, 12)), rng.normal(size=(9, 12))
  fn = lambda l, r: losses.in_batch_softmax_loss(l, r, 0.1, True)
  loss, m = losses.matryoshka(fn, (4, 8, 4), jnp.asarray(a), jnp.asarray(b))
  ref = {d: np_infonce(a[:, :d], b[:, :d], 0.1, True) for d in (4, 8, 12)}
  np.testing.assert_allclose(float(loss), sum(ref.values()), rtol=1e-5)
  for d, v in ref.items():
    np.testing.assert_allclose(float(m[f"loss_dim{d}"]), v, rtol=1e-5)
  assert float(m["loss"]) == float(loss) and set(m) == {
      "loss", "in_batch_accuracy", "loss_dim4", "loss_dim8", "loss_dim12"}
  _, full = fn(jnp.asarray(a), jnp.asarray(b))
  assert float(m["in_batch_accuracy"]) == float(full["in_batch_accuracy"])
  # the full dimension named in dims is counted once
  again, _ = losses.matryoshka(fn, (4, 8, 12), jnp.asarray(a), jnp.asarray(b))
  assert float(again) == float(loss)
