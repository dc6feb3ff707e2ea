"""Pure loss functions. Shapes are in the argument names (emb_BxD: [B, D]).

No TensorFlow, no model state: each function maps arrays to a scalar loss (and
a dict of scalar metrics). Tested against NumPy references in tests/test_losses.py.
"""
from __future__ import annotations

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


def in_batch_softmax_loss(left_BxD: Array, right_BxD: Array, temperature: float = 0.05,
                          bidirectional: bool = True, normalize: bool = True):
  """In-batch InfoNCE over the global batch (CONTRASTIVE baseline, VMSST §6.3).

  sim[i, j] = cos(left_i, right_j) / temperature (dot product if not `normalize`).
  loss = mean_i -log softmax_j(sim)[i, i]                    (log p(t|s))
         averaged with mean_j -log softmax_i(sim)[j, j]      (log p(s|t)) if bidirectional.

  Returns (loss, metrics) with metrics: loss, accuracy (mean of row/column
  top-1 hits on the diagonal).
  """
  if normalize:
    left_BxD, right_BxD = l2_normalize(left_BxD), l2_normalize(right_BxD)
  left_BxD = nnp.with_sharding_constraint(left_BxD.astype(jnp.float32), ("batch", "embed"))
  right_all_BxD = gather_global_batch(right_BxD.astype(jnp.float32))
  sim_BxB = jnp.einsum("id,jd->ij", left_BxD, right_all_BxD) / temperature
  labels = jnp.arange(sim_BxB.shape[0])
  log_p_t_given_s = jax.nn.log_softmax(sim_BxB, axis=1)[labels, labels]
  acc = (jnp.argmax(sim_BxB, axis=1) == labels).mean()
  if bidirectional:
    log_p_s_given_t = jax.nn.log_softmax(sim_BxB, axis=0)[labels, labels]
    loss = -0.5 * (log_p_t_given_s.mean() + log_p_s_given_t.mean())
    acc = 0.5 * (acc + (jnp.argmax(sim_BxB, axis=0) == labels).mean())
  else:
    loss = -log_p_t_given_s.mean()
  return loss, {"loss": loss, "in_batch_accuracy": acc}


# ----------------------------------------------------------------------------
# Generative (VMSST / BITRANSLATION) terms.

def sequence_nll(logits_BxLxV: Array, targets_BxL: Array, mask_BxL: Array) -> Array:
  """-log p(x) per sequence [B]: token cross-entropies summed over valid positions."""
  logits = logits_BxLxV.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  gold = jnp.take_along_axis(logits, targets_BxL[..., None], axis=-1)[..., 0]
  return jnp.sum((log_z - gold) * mask_BxL.astype(jnp.float32), axis=-1)


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


# ----------------------------------------------------------------------------
# MPCL: contrastive learning with several translated positives.

def minmax_rescale(sim_GxN: Array, mask_GxN: Array, temperature: float) -> Array:
  """Per row, map the similarities at `mask` linearly onto [-1/t, 1/t] (MPCL's option)."""
  big = jnp.finfo(jnp.float32).max
  lo = jnp.min(jnp.where(mask_GxN, sim_GxN, big), axis=1, keepdims=True)
  hi = jnp.max(jnp.where(mask_GxN, sim_GxN, -big), axis=1, keepdims=True)
  unit = (sim_GxN - lo) / jnp.maximum(hi - lo, 1e-6)
  return (2.0 * unit - 1.0) / temperature


def multi_positive_infonce(views_GxVxD: Array, temperature: float = 0.05,
                           rescale: bool = False, normalize: bool = True):
  """MPCL's loss (Zhao et al., Eq. 2) over the GLOBAL batch.

  Group g holds V views: view 0 is the anchor h_g, views 1..V-1 its K = V-1
  translations (positives). With sim = cos / temperature over all G*V sentences,
    loss_g = -log( sum_k exp(sim(h_g, h_g^k)) / sum_{j != h_g} exp(sim(h_g, h_j)) ),
  the denominator running over every other sentence of the batch (its positives
  included). With V = 2 this is the single-positive InfoNCE with the same
  denominator (NT-Xent). `rescale`: similarities min-max rescaled per anchor into
  [-1/t, 1/t] (over j != anchor) instead of dividing by t.

  Returns (mean loss, metrics): loss, positive_accuracy (the anchor's nearest other
  sentence is one of its positives).
  """
  G, V, D = views_GxVxD.shape
  z = views_GxVxD.astype(jnp.float32)
  if normalize:
    z = l2_normalize(z.reshape(G * V, D)).reshape(G, V, D)
  anchors_GxD = nnp.with_sharding_constraint(z[:, 0], ("batch", "embed"))
  all_NxD = gather_global_batch(z.reshape(G * V, D))
  cos = jnp.einsum("gd,nd->gn", anchors_GxD, all_NxD)                    # [G, G*V]
  col_group = jnp.arange(G * V) // V
  col_view = jnp.arange(G * V) % V
  own = col_group[None, :] == jnp.arange(G)[:, None]
  is_self = own & (col_view[None, :] == 0)
  is_pos = own & (col_view[None, :] > 0)
  sim = minmax_rescale(cos, ~is_self, temperature) if rescale else cos / temperature
  neg_inf = jnp.float32(-1e30)
  log_num = jax.nn.logsumexp(jnp.where(is_pos, sim, neg_inf), axis=1)
  log_den = jax.nn.logsumexp(jnp.where(is_self, neg_inf, sim), axis=1)
  loss = jnp.mean(log_den - log_num)
  nearest = jnp.argmax(jnp.where(is_self, neg_inf, sim), axis=1)
  acc = jnp.mean(jnp.take_along_axis(is_pos, nearest[:, None], axis=1))
  return loss, {"loss": loss, "positive_accuracy": acc}


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
  neg_BxK = jnp.where(queue_valid_K[None, :], neg_BxK, jnp.float32(-1e30))  # finite: no NaN grads
  log_den = jnp.logaddexp(pos_B, jax.nn.logsumexp(neg_BxK, axis=1))
  loss = jnp.mean(log_den - pos_B)
  acc = jnp.mean(pos_B > jnp.max(neg_BxK, axis=1))
  return loss, {"loss": loss, "accuracy": acc}
