"""Pure loss functions. Shapes are in the argument names (emb_BxD: [B, D]).

No TensorFlow, no model state: each function maps arrays to a scalar loss (and
a dict of scalar metrics). Tested against NumPy references in tests/test_losses.py.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from flax.linen import partitioning as nnp

Array = jax.Array


def l2_normalize(x_BxD: Array, eps: float = 1e-6) -> Array:
  x = x_BxD.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


def gather_global_batch(x_BxD: Array) -> Array:
  """All-gather a batch-sharded [B, D] array across data-parallel devices.

  Under `jax.jit` over a mesh the array is already global; this constraint makes
  every device hold all B rows so the B x B similarity is computed with the
  GLOBAL batch as negatives, whatever the number of devices.
  """
  return nnp.with_sharding_constraint(x_BxD, (None, "embed"))


_NEG = -1e30   # a logit that is no candidate (finite: no NaN gradients)


def token_row_key(tokens_BxL: Array) -> Array:
  """[B] uint32: a hash of each row of token ids (equal rows, equal keys; a collision of
  two different rows has probability 2^-32), computed where the batch is, so that equal
  sentences are recognized across devices, processes and GradCache chunks."""
  length = tokens_BxL.shape[-1]
  mult_L = (jnp.arange(1, length + 1, dtype=jnp.uint32) * jnp.uint32(0x9E3779B1)) | 1
  return jnp.sum(tokens_BxL.astype(jnp.uint32) * mult_L, axis=-1, dtype=jnp.uint32)


def duplicate_mask(key_B: Array) -> Array:
  """[B, B] bool: entry (i, j) True where j != i and rows i and j have the same key (the
  same sentence): j is no negative of i."""
  same = key_B[:, None] == key_B[None, :]
  return same & ~jnp.eye(key_B.shape[0], dtype=bool)


def in_batch_softmax_loss(left_BxD: Array, right_BxD: Array, temperature: float = 0.05,
                          bidirectional: bool = True, normalize: bool = True,
                          left_key_B: Optional[Array] = None,
                          right_key_B: Optional[Array] = None,
                          hard_negatives_BxHxD: Optional[Array] = None,
                          negative_key_BxH: Optional[Array] = None):
  """In-batch InfoNCE over the global batch (CONTRASTIVE baseline, VMSST §6.3).

  sim[i, j] = cos(left_i, right_j) / temperature (dot product if not `normalize`).
  loss = mean_i -log softmax_j(sim)[i, i]                    (log p(t|s))
         averaged with mean_j -log softmax_i(sim)[j, j]      (log p(s|t)) if bidirectional.

  False negatives masked (`token_row_key`s of the sentences): with `right_key_B`, a
  target j != i whose sentence equals row i's target is left out of row i's softmax
  (it is a translation of source i too); with `left_key_B`, a source i != j equal to
  row j's source is left out of column j's.

  `hard_negatives_BxHxD` (H a pair, e.g. mined: vmx/negatives.py): all B*H of the global
  batch join EVERY anchor's softmax, both directions' (a mined task's pairs come in either
  order), as supervised SimCSE counts every negative of the batch (Gao et al. 2021, Eq. 5).
  With `negative_key_BxH`, one equal to either sentence of pair i (by key) is left out of
  pair i's softmaxes. None (or H = 0): the loss above.

  Returns (loss, metrics): loss, in_batch_accuracy (row/column top-1 hits on the diagonal
  over every candidate); with hard negatives hard_negative_accuracy (the source's target
  scores above each of the pair's own negatives).
  """
  if normalize:
    left_BxD, right_BxD = l2_normalize(left_BxD), l2_normalize(right_BxD)
  left_BxD = nnp.with_sharding_constraint(left_BxD.astype(jnp.float32), ("batch", "embed"))
  right_all_BxD = gather_global_batch(right_BxD.astype(jnp.float32))
  sim_BxB = jnp.einsum("id,jd->ij", left_BxD, right_all_BxD) / temperature
  B = sim_BxB.shape[0]
  labels = jnp.arange(B)
  rows_BxB = (sim_BxB if right_key_B is None else
              jnp.where(duplicate_mask(right_key_B), _NEG, sim_BxB))
  # hard negatives: B*H more candidates (pair-major); `none_BxN`: equal to an anchor's pair
  H = 0 if hard_negatives_BxHxD is None else hard_negatives_BxHxD.shape[1]
  if hard_negatives_BxHxD is not None:
    if hard_negatives_BxHxD.ndim != 3 or hard_negatives_BxHxD.shape[::2] != left_BxD.shape:
      raise ValueError(f"hard_negatives_BxHxD has shape {hard_negatives_BxHxD.shape}; the "
                       f"pairs' vectors are {left_BxD.shape}: expected [B, H, D]")
    neg_NxD = hard_negatives_BxHxD.astype(jnp.float32).reshape(B * H, left_BxD.shape[1])
    neg_NxD = gather_global_batch(l2_normalize(neg_NxD) if normalize else neg_NxD)
    none_BxN = jnp.zeros((B, B * H), bool)
    if negative_key_BxH is not None:
      for key_B in (k for k in (left_key_B, right_key_B) if k is not None):
        none_BxN = none_BxN | (key_B[:, None] == negative_key_BxH.reshape(B * H)[None, :])
    neg_sim = lambda a_BxD: jnp.where(  # noqa: E731
        none_BxN, _NEG, jnp.einsum("id,nd->in", a_BxD, neg_NxD) / temperature)
    rows_BxC = jnp.concatenate([rows_BxB, neg_sim(left_BxD)], axis=1)
  else:
    rows_BxC = rows_BxB
  log_p_t_given_s = jax.nn.log_softmax(rows_BxC, axis=1)[labels, labels]
  acc = (jnp.argmax(rows_BxC, axis=1) == labels).mean()
  metrics = {}
  if H:
    own_BxN = (jnp.arange(B * H)[None, :] // H) == labels[:, None]
    metrics["hard_negative_accuracy"] = jnp.mean(
        rows_BxB[labels, labels] > jnp.max(jnp.where(own_BxN, rows_BxC[:, B:], _NEG), axis=1))
  if bidirectional:
    cols_BxB = (sim_BxB if left_key_B is None else
                jnp.where(duplicate_mask(left_key_B), _NEG, sim_BxB))
    if H:   # each target's column: the sources, then the hard negatives
      cols_CxB = jnp.concatenate([cols_BxB, neg_sim(right_all_BxD).T], axis=0)
    else:
      cols_CxB = cols_BxB
    log_p_s_given_t = jax.nn.log_softmax(cols_CxB, axis=0)[labels, labels]
    loss = -0.5 * (log_p_t_given_s.mean() + log_p_s_given_t.mean())
    acc = 0.5 * (acc + (jnp.argmax(cols_CxB, axis=0) == labels).mean())
  else:
    loss = -log_p_t_given_s.mean()
  return loss, {"loss": loss, "in_batch_accuracy": acc, **metrics}


def matryoshka(loss_fn: Callable, dims: Sequence[int], *embeddings_xD: Array):
  """Matryoshka representation learning (Kusupati et al. 2022; sentence-transformers'
  MatryoshkaLoss): `loss_fn` of the nested prefixes [..., :d] of every embedding array,
  for every d of `dims` and the full dimension, summed with weight 1 (each prefix is
  normalized inside `loss_fn`, as the vector an encoder gives at that size is).

  Returns (the sum, the full dimension's metrics with `loss` the sum and `loss_dim{d}`
  each prefix's loss)."""
  full = embeddings_xD[0].shape[-1]
  total, metrics = 0.0, {}
  for d in sorted(set(int(x) for x in dims) | {full}):
    loss, m = loss_fn(*(e[..., :d] for e in embeddings_xD))
    total = total + loss
    metrics[f"loss_dim{d}"] = loss
    if d == full:
      metrics = {**m, **metrics}
  return total, {**metrics, "loss": total}


def distillation_mse(student_BxD: Array, teacher_BxD: Array) -> Array:
  """Multilingual knowledge distillation (Reimers & Gurevych 2020): the mean over the
  batch and the dimensions of (student - teacher)^2, as torch's MSELoss; the teacher
  vector is a fixed target (no gradient)."""
  diff = student_BxD.astype(jnp.float32) - jax.lax.stop_gradient(
      teacher_BxD.astype(jnp.float32))
  return jnp.mean(diff * diff)


# ----------------------------------------------------------------------------
# Generative (VMSST / BITRANSLATION) terms.

def token_nll(logits_BxLxV: Array, targets_BxL: Array, mask_BxL: Array) -> Array:
  """-log p(token) per position [B, L] (0 where not `mask`)."""
  logits = logits_BxLxV.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  gold = jnp.take_along_axis(logits, targets_BxL[..., None], axis=-1)[..., 0]
  return (log_z - gold) * mask_BxL.astype(jnp.float32)


def sequence_nll(logits_BxLxV: Array, targets_BxL: Array, mask_BxL: Array) -> Array:
  """-log p(x) per sequence [B]: token cross-entropies summed over valid positions."""
  return jnp.sum(token_nll(logits_BxLxV, targets_BxL, mask_BxL), axis=-1)


def gaussian_kl(mean_BxZ: Array, logvar_BxZ: Array) -> Array:
  """KL( N(mean, diag exp(logvar)) || N(0, I) ) per row [B], in closed form:
  0.5 * sum_z (exp(logvar) + mean^2 - 1 - logvar)."""
  m, lv = mean_BxZ.astype(jnp.float32), logvar_BxZ.astype(jnp.float32)
  return 0.5 * jnp.sum(jnp.exp(lv) + m * m - 1.0 - lv, axis=-1)


def reparameterize(rng: Array, mean_BxZ: Array, logvar_BxZ: Array) -> Array:
  """z = mean + exp(logvar / 2) * eps, eps ~ N(0, I): a sample differentiable in mean/logvar."""
  eps = jax.random.normal(rng, mean_BxZ.shape, jnp.float32)
  return mean_BxZ.astype(jnp.float32) + jnp.exp(0.5 * logvar_BxZ.astype(jnp.float32)) * eps


def linear_anneal(step: Array, num_steps: int) -> Array:
  """KL weight schedule: min(1, step / num_steps) (num_steps <= 0: always 1)."""
  if num_steps <= 0:
    return jnp.ones((), jnp.float32)
  return jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / float(num_steps))


# ----------------------------------------------------------------------------
# EMS: cross-lingual token reconstruction (XTR).

def bag_of_tokens_kl(logits_BxV: Array, tokens_BxL: Array) -> Array:
  """KL(p || q) per row [B] (EMS's XTR loss), without materializing p.

  p = bag-of-tokens distribution of `tokens_BxL` (count of each token / number of
  non-padding tokens; id 0 is padding and ignored), q = softmax(logits_BxV).
  KL = sum_t p_t (log p_t - log q_t) = (1/n) sum_{positions l} [log(c_l / n) - log q(tok_l)],
  where c_l is how often tok_l occurs in the row. Rows without tokens give 0.
  """
  valid = (tokens_BxL > 0).astype(jnp.float32)
  n = jnp.maximum(valid.sum(axis=1), 1.0)                                       # [B]
  same = (tokens_BxL[:, :, None] == tokens_BxL[:, None, :]).astype(jnp.float32)
  counts = jnp.einsum("blm,bm->bl", same, valid)                                # c_l
  log_q = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  log_q_tok = jnp.take_along_axis(log_q, tokens_BxL, axis=-1)                   # [B, L]
  log_p_tok = jnp.log(jnp.maximum(counts, 1.0) / n[:, None])
  return jnp.sum(valid * (log_p_tok - log_q_tok), axis=1) / n


def bag_of_tokens_kl_packed(logits_BxV: Array, tokens_RxL: Array, segment_ids_RxL: Array,
                            owner_RxL: Array) -> Array:
  """`bag_of_tokens_kl` of sentences packed into rows [B]: sentence b's tokens are the
  slots with owner b (vmx/packing.py; `num_sentences` B for free slots), counted within
  their own segment. The same terms as over unpacked rows."""
  b = logits_BxV.shape[0]
  valid = (tokens_RxL > 0).astype(jnp.float32)
  seg = segment_ids_RxL
  same = ((tokens_RxL[:, :, None] == tokens_RxL[:, None, :])
          & (seg[:, :, None] == seg[:, None, :])).astype(jnp.float32)
  counts = jnp.einsum("rlm,rm->rl", same, valid)                              # c_l
  owner = owner_RxL.reshape(-1)
  n_B = jnp.maximum(jax.ops.segment_sum(valid.reshape(-1), owner, num_segments=b + 1)[:b],
                    1.0)
  n_tok = jnp.take(n_B, jnp.minimum(owner, b - 1)).reshape(tokens_RxL.shape)
  log_q = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  log_q_tok = log_q[jnp.minimum(owner, b - 1), tokens_RxL.reshape(-1)].reshape(
      tokens_RxL.shape)
  terms = valid * (jnp.log(jnp.maximum(counts, 1.0) / n_tok) - log_q_tok)
  return jax.ops.segment_sum(terms.reshape(-1), owner, num_segments=b + 1)[:b] / n_B


# ----------------------------------------------------------------------------
# MPCL: contrastive learning with several translated positives.

def minmax_rescale(sim_GxN: Array, mask_GxN: Array, temperature: float) -> Array:
  """Per row, map the similarities at `mask` linearly onto [-1/t, 1/t] (MPCL's option)."""
  big = jnp.finfo(jnp.float32).max
  lo = jnp.min(jnp.where(mask_GxN, sim_GxN, big), axis=1, keepdims=True)
  hi = jnp.max(jnp.where(mask_GxN, sim_GxN, -big), axis=1, keepdims=True)
  unit = (sim_GxN - lo) / jnp.maximum(hi - lo, 1e-6)
  return (2.0 * unit - 1.0) / temperature


ANCHORS = ("first", "all")
POSITIVES = ("all", "one")


def multi_positive_infonce(views_GxVxD: Array, temperature: float = 0.05,
                           rescale: bool = False, normalize: bool = True,
                           anchors: str = "first", positives: str = "all",
                           hard_negatives_GxHxD: Optional[Array] = None,
                           view_key_GxV: Optional[Array] = None):
  """MPCL's loss (Zhao et al., Eq. 2) over the GLOBAL batch.

  Group g holds V views: view 0 is the anchor h_g, views 1..V-1 its K = V-1
  translations (positives). With sim = cos / temperature over all G*V sentences,
    loss_g = -log( sum_k exp(sim(h_g, h_g^k)) / sum_{j != h_g} exp(sim(h_g, h_j)) ),
  the denominator running over every other sentence of the batch (its positives
  included). With V = 2 this is the single-positive InfoNCE with the same
  denominator (NT-Xent). `rescale`: similarities min-max rescaled per anchor into
  [-1/t, 1/t] (over the anchor's denominator) instead of dividing by t.

  Controls (the defaults are the paper's loss):
  * `anchors='all'`: every view of every group is an anchor in turn (G*V terms, the
    other views of its group its positives), not view 0 alone (G terms).
  * `positives='one'` (MPCL's "+Single", §3.5, on the very same sentences): the views are
    V/2 pairs (0-1, 2-3, ...; V even), and EVERY pair is a single-positive term, its
    first view the anchor (with `anchors='all'`, both views), its partner the one
    positive; the group's other views leave the anchor's denominator (translations,
    not negatives: the paper's pairs are separate examples, which rarely share a
    batch). G*V/2 terms (G*V with `anchors='all'`).

  `hard_negatives_GxHxD` (MPCL's "XLM-R w/ hard negative" variant, §3.5; H per group,
  the paper's 1): sentences of the batch that are nobody's positive and no anchor. All
  G*H of them join EVERY anchor's denominator (and its min-max range), as SimCSE's
  supervised loss counts every hard negative of the batch (Gao et al. 2021, Eq. 5):
    loss_g = -log( sum_k exp(sim(h_g, h_g^k)) /
                   (sum_{j != h_g} exp(sim(h_g, h_j)) + sum_{n <= G*H} exp(sim(h_g, h_n^-))) ).
  None (or H = 0) is the loss above.

  `view_key_GxV` (the views' `token_row_key`s): a sentence of another group equal to one
  of the anchor's own group is left out of its denominator (a false negative: the same
  sentence, or a translation of the anchor's).

  Returns (mean loss over anchors, metrics): loss, positive_accuracy (the anchor's
  nearest sentence in its denominator is one of its positives); with hard negatives also
  hard_negative_accuracy (the anchor's nearest positive is nearer than each of its own
  group's hard negatives).
  """
  G, V, D = views_GxVxD.shape
  if anchors not in ANCHORS or positives not in POSITIVES:
    raise ValueError(f"anchors={anchors!r}, positives={positives!r}: expected one of "
                     f"{ANCHORS} and one of {POSITIVES}")
  if positives == "one" and V % 2:
    raise ValueError(f"positives='one' pairs the views 0-1, 2-3, ...: V={V} is odd")
  if hard_negatives_GxHxD is not None and (hard_negatives_GxHxD.ndim != 3 or
                                           hard_negatives_GxHxD.shape[::2] != (G, D)):
    raise ValueError(f"hard_negatives_GxHxD has shape {hard_negatives_GxHxD.shape}; the "
                     f"views are {views_GxVxD.shape}: expected [{G}, H, {D}]")
  z = views_GxVxD.astype(jnp.float32)
  if normalize:
    z = l2_normalize(z.reshape(G * V, D)).reshape(G, V, D)
  if anchors == "all":
    anchor_idx = jnp.arange(G * V)
  elif positives == "one":   # every pair's first view: each pair its own term
    anchor_idx = (jnp.arange(G)[:, None] * V + jnp.arange(0, V, 2)[None, :]).reshape(-1)
  else:
    anchor_idx = jnp.arange(G) * V
  anchors_AxD = nnp.with_sharding_constraint(z.reshape(G * V, D)[anchor_idx],
                                             ("batch", "embed"))
  columns_NxD = z.reshape(G * V, D)
  H = 0 if hard_negatives_GxHxD is None else hard_negatives_GxHxD.shape[1]
  if hard_negatives_GxHxD is not None:   # columns G*V ... G*V + G*H - 1: group-major
    neg = hard_negatives_GxHxD.astype(jnp.float32).reshape(G * H, D)
    columns_NxD = jnp.concatenate([columns_NxD, l2_normalize(neg) if normalize else neg])
  all_NxD = gather_global_batch(columns_NxD)
  cos = jnp.einsum("ad,nd->an", anchors_AxD, all_NxD)                    # [A, G*V + G*H]
  col = jnp.arange(G * V + G * H)
  is_view = col < G * V
  own = is_view[None, :] & ((col // V)[None, :] == (anchor_idx // V)[:, None])
  is_self = col[None, :] == anchor_idx[:, None]
  if positives == "all":
    is_pos = own & ~is_self
    excluded = is_self
  else:
    is_pos = own & ((col % V)[None, :] == ((anchor_idx % V) ^ 1)[:, None])
    excluded = own & ~is_pos
  if view_key_GxV is not None:   # another group's copy of a sentence of the anchor's group
    key_N = view_key_GxV.reshape(G * V)
    in_group_GxN = jnp.any(key_N[None, None, :] == view_key_GxV[:, :, None], axis=1)
    in_group_GxN = jnp.pad(in_group_GxN, ((0, 0), (0, G * H)))   # (hard negatives: kept)
    excluded = excluded | (in_group_GxN[anchor_idx // V] & ~own)
  sim = minmax_rescale(cos, ~excluded, temperature) if rescale else cos / temperature
  log_num = jax.nn.logsumexp(jnp.where(is_pos, sim, _NEG), axis=1)
  log_den = jax.nn.logsumexp(jnp.where(excluded, _NEG, sim), axis=1)
  loss = jnp.mean(log_den - log_num)
  nearest = jnp.argmax(jnp.where(excluded, _NEG, sim), axis=1)
  acc = jnp.mean(jnp.take_along_axis(is_pos, nearest[:, None], axis=1))
  metrics = {"loss": loss, "positive_accuracy": acc}
  if H:
    own_neg = ~is_view[None, :] & (((col - G * V) // H)[None, :] == (anchor_idx // V)[:, None])
    best_pos = jnp.max(jnp.where(is_pos, sim, _NEG), axis=1)
    metrics["hard_negative_accuracy"] = jnp.mean(
        best_pos > jnp.max(jnp.where(own_neg, sim, _NEG), axis=1))
  return loss, metrics


# ----------------------------------------------------------------------------
# InfoXLM: masked language modelling and momentum contrast against a queue.

def masked_lm_loss(logits_BxLxV: Array, targets_BxL: Array, weights_BxL: Array):
  """Token cross-entropy averaged over the predicted positions (weights 1), as RoBERTa /
  InfoXLM's MMLM and TLM. Returns (loss, metrics): loss, accuracy over those positions."""
  logits = logits_BxLxV.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  gold = jnp.take_along_axis(logits, targets_BxL[..., None], axis=-1)[..., 0]
  w = weights_BxL.astype(jnp.float32)
  n = jnp.maximum(w.sum(), 1.0)
  loss = jnp.sum((log_z - gold) * w) / n
  acc = jnp.sum((jnp.argmax(logits, axis=-1) == targets_BxL) * w) / n
  return loss, {"loss": loss, "accuracy": acc}


def queue_infonce(query_BxD: Array, key_BxD: Array, queue_KxD: Array, queue_valid_K: Array,
                  temperature: float = 0.25):
  """MoCo / InfoXLM XLCO: each query against its own key (the positive) and the queue
  (the negatives; the other keys of the batch are not negatives), dot products / tau:
    loss_i = -log exp(q_i.k_i / t) / (exp(q_i.k_i / t) + sum_{n valid} exp(q_i.n / t)).
  No normalization here (InfoXLM's vectors are not normalized); invalid queue slots (not
  yet filled) are left out. Returns (mean loss, metrics): loss, accuracy (the key beats
  every valid negative).
  """
  q = nnp.with_sharding_constraint(query_BxD.astype(jnp.float32), ("batch", "embed"))
  pos_B = jnp.sum(q * key_BxD.astype(jnp.float32), axis=-1) / temperature
  neg_BxK = jnp.einsum("bd,kd->bk", q, queue_KxD.astype(jnp.float32)) / temperature
  neg_BxK = jnp.where(queue_valid_K[None, :], neg_BxK, _NEG)  # finite: no NaN grads
  log_den = jnp.logaddexp(pos_B, jax.nn.logsumexp(neg_BxK, axis=1))
  loss = jnp.mean(log_den - pos_B)
  acc = jnp.mean(pos_B > jnp.max(neg_BxK, axis=1))
  return loss, {"loss": loss, "accuracy": acc}


def paired_batch_infonce(left_BxD: Array, right_BxD: Array, temperature: float = 0.04,
                         left_key_B: Optional[Array] = None,
                         right_key_B: Optional[Array] = None):
  """InfoNCE over both sides of a batch of pairs (EMMA-X's Eq. 2 as its authors' code
  computes it): the 2B sentences z = [left; right] are all anchors; each one's
  translation is its positive and the other 2B - 2 sentences of either side its
  negatives, so sentences of one language are contrasted with each other too (a
  left -> right InfoNCE never does). Dot products / tau (normalize before):
    loss = mean_i -log exp(z_i.z_p(i) / t) / sum_{j != i} exp(z_i.z_j / t),
  p(i) = (i + B) mod 2B. With the sentences' `token_row_key`s, a sentence equal to
  z_i or to its translation z_p(i) is no negative of z_i (it is left out). Returns (loss,
  metrics): loss, in_batch_accuracy (the translation is the nearest of the 2B - 1
  others)."""
  z = jnp.concatenate([left_BxD, right_BxD], axis=0).astype(jnp.float32)
  z_all = gather_global_batch(z)
  n = z_all.shape[0]
  sim = jnp.einsum("id,jd->ij", z, z_all) / temperature                        # [2B, 2B]
  idx = jnp.arange(n)
  sim = jnp.where(idx[:, None] == idx[None, :], _NEG, sim)          # not itself
  partner = (idx + n // 2) % n
  if left_key_B is not None and right_key_B is not None:
    key = jnp.concatenate([left_key_B, right_key_B])
    same = (key[None, :] == key[:, None]) | (key[None, :] == key[partner][:, None])
    dup = same & (idx[None, :] != idx[:, None]) & (idx[None, :] != partner[:, None])
    sim = jnp.where(dup, _NEG, sim)
  log_p = jax.nn.log_softmax(sim, axis=1)[idx, partner]
  loss = -jnp.mean(log_p)
  acc = jnp.mean(jnp.argmax(sim, axis=1) == partner)
  return loss, {"loss": loss, "in_batch_accuracy": acc}
