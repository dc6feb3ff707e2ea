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
