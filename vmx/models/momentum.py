"""The momentum key encoder and the queue of past keys (MoCo, He et al. 2020), shared by
InfoXLM (§3.2: XLCO's key encoder and its queue of negatives) and EMMA-X (§3.1: the
momentum keys and queue of the EM step).

Both keep their state in the train state's flax_mutables:
  momentum/params   the key encoder: a copy of (part of) the parameters, following them as
                    k <- m k + (1 - m) q after every optimizer update (`ema`: the
                    trainer's `after_update` hook calls it with the NEW parameters);
  queue             {keys, next, filled}: keys [K, D] (`new_queue(K, D)`, filled a row at a
                    time) or [S, B, D] (`new_queue(S, D, rows=B)`: S slots of one step's B
                    keys, split along 'data' on the B axis); next: where the next keys go;
                    filled: how many rows (slots) hold keys. The oldest keys leave first.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import optax


def ema(online, key, momentum):
  """The key encoder after one update: momentum * key + (1 - momentum) * online."""
  return optax.incremental_update(online, key, 1.0 - momentum)


def new_queue(size: int, dim: int, rows: Optional[int] = None) -> dict:
  """An empty queue of `size` keys [size, dim], or of `size` slots of `rows` keys each
  [size, rows, dim]."""
  shape = (size, dim) if rows is None else (size, rows, dim)
  return {"keys": jnp.zeros(shape, jnp.float32), "next": jnp.zeros((), jnp.int32),
          "filled": jnp.zeros((), jnp.int32)}


def enqueue(queue: dict, keys_BxD) -> dict:
  """`queue` with the B keys written at `next` (a [K, D] queue: B rows; a slotted queue:
  one slot of B), the oldest overwritten once it is full."""
  keys_BxD = keys_BxD.astype(queue["keys"].dtype)
  if queue["keys"].ndim == 3:            # [S, B, D]: one slot per step
    size, step = queue["keys"].shape[0], 1
    keys = jax.lax.dynamic_update_index_in_dim(queue["keys"], keys_BxD, queue["next"], axis=0)
  else:                                  # [K, D]: B rows
    size, step = queue["keys"].shape[0], keys_BxD.shape[0]
    keys = jax.lax.dynamic_update_slice_in_dim(queue["keys"], keys_BxD, queue["next"], axis=0)
  return {"keys": keys, "next": (queue["next"] + step) % size,
          "filled": jnp.minimum(queue["filled"] + step, size)}


def queued_keys(queue: dict):
  """(keys [K, D] as rows, valid [K] bool: rows that hold keys), without gradients."""
  keys = queue["keys"]
  if keys.ndim == 3:
    slots, b, d = keys.shape
    valid = jnp.repeat(jnp.arange(slots) < queue["filled"], b)
    keys = keys.reshape(slots * b, d)
  else:
    valid = jnp.arange(keys.shape[0]) < queue["filled"]
  return jax.lax.stop_gradient(keys), valid


def is_full(queue: dict):
  return queue["filled"] >= queue["keys"].shape[0]
