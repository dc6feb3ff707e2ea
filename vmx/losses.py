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
