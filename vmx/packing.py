"""Packed token features inside the model: masks, positions, per-sentence pooling and sums.

vmx/data/packing.py lays several sentences into each row (SeqIO's `segment_ids` and
`positions`, plus where each example's sentence starts). A model reads a packed feature
as a `Packed` and gets from it what the unpacked layout gave it per row:

  attention_mask()      a token sees only its own sentence (causal within it for decoders)
  pool(hidden, method)  per-sentence mean / first token, in the examples' order
  sentence_sum(v)       per-token values summed per sentence (NLLs, token counts)
  per_token(v)          per-sentence values (language ids, conditioning) at each token

so the loss sees exactly the vectors, in exactly the order, of the unpacked batch.
`sentences` (the examples' shape, [B] or [B, V]) index the sentences; a free slot belongs
to none of them.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import flax
import jax
import jax.numpy as jnp

from vmx.errors import ConfigError

Array = jax.Array


@flax.struct.dataclass
class Packed:
  """One packed token feature (see the module docstring)."""
  tokens: Array        # [R, L] token ids, 0 in free and reserved slots
  segment_ids: Array   # [R, L] 1, 2, ... per sentence of a row; 0: a free slot
  positions: Array     # [R, L] position within the sentence
  starts: Array        # [*S] flat slot (row * L + column) of each sentence's first slot

  @classmethod
  def of(cls, batch: Mapping[str, Array], name: str) -> Optional["Packed"]:
    """The packed feature `name` of a batch, or None if the batch holds it unpacked."""
    if name + "_segment_ids" not in batch:
      return None
    return cls(batch[name], batch[name + "_segment_ids"], batch[name + "_positions"],
               batch[name + "_starts"])

  @classmethod
  def group(cls, batch: Mapping[str, Array], group: str,
            members: Sequence[str]) -> Optional["Packed"]:
    """The rows of packed group `group` (vmx/data/packing.py) holding the sentences of
    `members`: `starts` [N] are theirs one after the other (each flattened), so pooled
    vectors come out in that order. None if the batch is not packed so."""
    if group + "_segment_ids" not in batch:
      return None
    starts = jnp.concatenate([batch[m + "_starts"].reshape(-1) for m in members])
    return cls(batch[group], batch[group + "_segment_ids"], batch[group + "_positions"],
               starts)

  @property
  def length(self) -> int:
    return self.tokens.shape[1]

  @property
  def num_sentences(self) -> int:
    return int(self.starts.size)

  @property
  def valid(self) -> Array:
    """[R, L] slots holding a token."""
    return self.tokens > 0

  def owner(self) -> Array:
    """[R, L] int32: the flat index (into `starts`) of the sentence each slot belongs to;
    `num_sentences` for a free slot."""
    r, length = self.tokens.shape
    n = self.num_sentences
    at = jnp.full((r * length,), n, jnp.int32).at[self.starts.reshape(-1)].set(
        jnp.arange(n, dtype=jnp.int32))
    first = (jnp.arange(r, dtype=jnp.int32)[:, None] * length
             + jnp.arange(length, dtype=jnp.int32)[None] - self.positions)
    return jnp.where(self.segment_ids > 0, at[jnp.clip(first, 0, r * length - 1)], n)

  def attention_mask(self, causal: bool = False, keys_valid: Optional[Array] = None) -> Array:
    """[R, 1, L, L]: query q may attend to key k of its own sentence (`keys_valid`: which
    keys count, default the tokens; causal: k at or before q)."""
    seg = self.segment_ids
    keys = self.valid if keys_valid is None else keys_valid
    mask = (seg[:, None, :, None] == seg[:, None, None, :]) & (seg[:, None, :, None] > 0)
    mask = mask & keys[:, None, None, :]
    if causal:
      length = self.length
      mask = mask & jnp.tril(jnp.ones((length, length), bool))[None, None]
    return mask

  def sentence_sum(self, values: Array, owner: Optional[Array] = None) -> Array:
    """[*S, ...] the sum over each sentence's slots of `values` [R, L, ...] (float32 for
    floats; free slots add nowhere)."""
    owner = self.owner() if owner is None else owner
    n = self.num_sentences
    flat = values.reshape(-1, *values.shape[2:])
    if jnp.issubdtype(flat.dtype, jnp.floating):
      flat = flat.astype(jnp.float32)
    out = jax.ops.segment_sum(flat, owner.reshape(-1), num_segments=n + 1)[:n]
    return out.reshape(*self.starts.shape, *values.shape[2:])

  def per_token(self, values: Array, owner: Optional[Array] = None) -> Array:
    """[R, L, ...]: each slot's sentence's row of `values` [*S, ...] (free slots: row 0)."""
    owner = self.owner() if owner is None else owner
    flat = values.reshape(self.num_sentences, *values.shape[self.starts.ndim:])
    return jnp.take(flat, jnp.minimum(owner, self.num_sentences - 1), axis=0)

  def first(self, hidden_RxLxD: Array) -> Array:
    """[*S, D]: each sentence's first slot."""
    d = hidden_RxLxD.shape[-1]
    flat = hidden_RxLxD.reshape(-1, d)
    return jnp.take(flat, self.starts.reshape(-1), axis=0).reshape(*self.starts.shape, d)

  def lengths(self, owner: Optional[Array] = None) -> Array:
    """[*S] float32 tokens per sentence."""
    return self.sentence_sum(self.valid.astype(jnp.float32), owner)

  def pool(self, hidden_RxLxD: Array, method: str = "mean") -> Array:
    """[*S, D] float32 sentence vectors: the masked mean of each sentence's tokens (as
    `encoders.pool` over an unpacked row) or its first token."""
    if method == "first":
      return self.first(hidden_RxLxD).astype(jnp.float32)
    if method != "mean":
      raise ConfigError(f"pooling={method!r} of a packed feature; expected 'mean' or 'first'")
    owner = self.owner()
    w = self.valid.astype(jnp.float32)[..., None]
    total = self.sentence_sum(hidden_RxLxD.astype(jnp.float32) * w, owner)
    count = self.sentence_sum(w, owner)
    return total / jnp.maximum(count, 1.0)


Tokens = Union[Array, Packed]


PAIR = "pair"                              # the group of a pair's two sides
PAIR_FEATURES = ("left_tokens", "right_tokens")


def pair(batch: Mapping[str, Array], prefix: str = "") -> Optional[Packed]:
  """A pair's two sides packed into the same rows (`pair`: starts [2B], the left sentences
  then the right ones), or None."""
  if prefix + PAIR_FEATURES[0] + "_starts" not in batch:
    return None
  return Packed.group(batch, prefix + PAIR, [prefix + f for f in PAIR_FEATURES])


def tokens(batch: Mapping[str, Array], name: str) -> Tokens:
  """Feature `name` as the model reads it: a `Packed`, or the [B, L] rows."""
  return Packed.of(batch, name) or batch[name]


def is_packed(x) -> bool:
  return isinstance(x, Packed)


def num_sentences(x: Tokens) -> int:
  """Examples (rows of the unpacked layout) of a token feature."""
  return x.starts.shape[0] if isinstance(x, Packed) else x.shape[0]
