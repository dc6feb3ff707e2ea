"""GradCache (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", RepL4NLP 2021): the gradients of a contrastive loss over a global batch
far larger than what fits in memory, equal to the uncached step's.

The loss of a contrastive model depends on the batch only through per-example embeddings
E (the model's `grad_cache_embed` / `grad_cache_loss` split, vmx/models/base.py), so

  1. embed the batch in `num_chunks` chunks, keeping no activations;
  2. compute the loss on all of E and its gradient dL/dE (cheap: [B, D]);
  3. per chunk, embed again with gradients and pull dL/dE_chunk back to the parameters
     (a vector-Jacobian product), summing over chunks.

Memory then grows with the chunk, not the batch; the price is a second forward pass.
Chunk j holds rows j, j + n, j + 2n, ... of the batch, so that a data-sharded batch keeps
an equal share of every chunk on every device; each chunk carries its rows' indices in
the global batch (`batch[GRAD_CACHE_ROW]`) for models whose per-example work depends on
them. With dropout (or sampled latents), each chunk draws its own mask (the same
distribution as the uncached step, other draws).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen import partitioning as nnp

from vmx.errors import ConfigError
from vmx.models.base import GRAD_CACHE_ROW


def check(model, num_chunks: int, batch_shapes: dict, data_parallel: int = 1):
  """ConfigError unless `model` can take GradCache with `num_chunks` on these batches."""
  if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
    raise ConfigError(f"train.grad_cache_chunks={num_chunks!r}: expected a positive integer")
  if num_chunks == 1:
    return
  if model.grad_cache_embed is None or model.grad_cache_loss is None:
    raise ConfigError(f"train.grad_cache_chunks={num_chunks}: {type(model).__name__} has no "
                      f"GradCache split (grad_cache_embed / grad_cache_loss); use 1")
  for name, shape in batch_shapes.items():
    if shape[0] % (num_chunks * data_parallel):
      raise ConfigError(f"train.grad_cache_chunks={num_chunks}: the global batch of {name!r} "
                        f"({shape[0]}) is not a multiple of chunks x data-parallel devices "
                        f"({num_chunks} x {data_parallel})")


def chunked(tree, n: int):
  """[B, ...] -> [n, B / n, ...], chunk j = rows j, j + n, ... (see the module docstring)."""
  def one(x):
    y = jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)
    return nnp.with_sharding_constraint(y, (None, "batch") + (None,) * (y.ndim - 2))
  return jax.tree.map(one, tree)


def unchunked(tree):
  """[n, b, ...] -> [n * b, ...] (chunk-major: the order `chunked` leaves the rows in)."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), tree)


def loss_and_grads(model, params, batch, dropout_rng, num_chunks: int, flax_mutables=None,
                   num_examples=None):
  """(loss, metrics, grads, new flax_mutables) of `model` on `batch` in `num_chunks`
  chunks; the loss and gradients equal value_and_grad of the whole-batch loss (without
  dropout exactly). A model with flax_mutables reads and updates them in its
  `grad_cache_loss` (once per step, on the whole batch); its embedding does not.
  `num_examples`: the batch's examples (default: the first feature's rows; a packed
  batch's rows are not examples). Packed features are laid out so that chunk j's rows
  (j, j + n, ...) hold chunk j's examples (vmx/data/packing.py)."""
  b = jax.tree.leaves(batch)[0].shape[0] if num_examples is None else num_examples
  chunks = chunked({**batch, GRAD_CACHE_ROW: jnp.arange(b, dtype=jnp.int32)}, num_chunks)
  training = dropout_rng is not None
  rngs = jax.random.split(dropout_rng if training else jax.random.PRNGKey(0), num_chunks)

  def embed(p, chunk, rng):
    return model.grad_cache_embed(p, chunk, rng if training else None)

  # 1. Embeddings, chunk by chunk, without gradients.
  embs = jax.lax.map(lambda xs: embed(jax.lax.stop_gradient(params), *xs), (chunks, rngs))
  # 2. The loss on the whole (reordered) batch and its gradient w.r.t. the embeddings.
  whole = unchunked(chunks)

  def loss_of(e):
    loss, metrics, new = model.grad_cache_loss(e, whole, flax_mutables)
    return loss, (metrics, new)
  (loss, (metrics, mutables)), d_emb = jax.value_and_grad(loss_of, has_aux=True)(
      unchunked(embs))
  d_chunks = jax.tree.map(lambda g: g.reshape(num_chunks, -1, *g.shape[1:]), d_emb)

  # 3. Per chunk: embed again with gradients, pull the cached gradient back.
  def body(acc, xs):
    chunk, rng, d = xs
    _, vjp = jax.vjp(lambda p: embed(p, chunk, rng), params)
    return jax.tree.map(jnp.add, acc, vjp(d)[0]), None
  grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params),
                          (chunks, rngs, d_chunks))
  return loss, metrics, grads, mutables
