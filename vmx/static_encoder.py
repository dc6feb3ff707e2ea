"""A static sentence encoder: the (weighted) mean of token vectors, no attention.

The family sentence-transformers' `StaticEmbedding` and Model2Vec train or distil: a
sentence's vector is the mean of its tokens' rows of one table [V, D], optionally weighted
per token (`weighting`):
- 'none': the plain mean;
- 'learned': a weight exp(s_t) per vocabulary entry (s_t starts at 0: the plain mean),
  trained with the table, so frequent function pieces can learn to count less.
A step costs one gather and the loss's matmul, which is why it trains on a CPU (issue 58).

It stands where a `TransformerEncoder` stands (`encoder` of `DualEncoder` and the
contrastive models): the same `sentences` / `hidden` / `pool` calls, packed rows included
(a packed sentence's tokens are its own whatever the row: no attention to mask), the token
table at `encoder/token_embed/embedding` with axes (vocab, embed), so t5x's rules shard it
over the model axis on a pod (the table is the model). It has no layers (`num_layers` 0), no
positions and no language embedding; `max_length` only bounds the rows it is given.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, layers
from vmx.errors import ConfigError
from vmx.gin_utils import check_range, positive_int
from vmx.packing import Packed

WEIGHTINGS = ("none", "learned")


class StaticEncoder(nn.Module):
  """Token table -> (weighted) mean (module docstring)."""
  vocab_size: int
  emb_dim: int = 256
  max_length: int = 512
  weighting: str = "none"
  dtype: jnp.dtype = jnp.float32
  # What the model code reads of any encoder (a static one has none of it).
  num_layers: int = 0
  num_languages: int = 0
  family: str = "static"
  output_layer: Optional[int] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  shared_embedding: Optional[nn.Module] = None

  @property
  def depth(self) -> int:
    return 0

  def setup(self):
    for field in ("vocab_size", "emb_dim", "max_length"):
      check_range(positive_int(getattr(self, field)), "StaticEncoder", field,
                  getattr(self, field), "a positive integer")
    if self.weighting not in WEIGHTINGS:
      raise ConfigError(f"StaticEncoder.weighting={self.weighting!r}; expected one of "
                        f"{WEIGHTINGS}")
    if self.num_layers or self.num_languages:
      raise ConfigError("StaticEncoder has no layers and no language embedding "
                        "(num_layers = num_languages = 0)")
    self.token_embed = layers.Embed(self.vocab_size, self.emb_dim, dtype=self.dtype,
                                    embedding_init=nn.initializers.normal(1.0),
                                    name="token_embed")
    if self.weighting == "learned":
      self.token_weight = layers.Embed(self.vocab_size, 1, dtype=jnp.float32,
                                       axes=("vocab", "embed"),
                                       embedding_init=nn.initializers.zeros,
                                       name="token_weight")

  def __call__(self, tokens_BxL, lang_B=None, deterministic: bool = True,
               depth: Optional[int] = None, segment_ids_BxL=None, positions_BxL=None):
    """(token vectors [B, L, D'], validity [B, L]); with learned weights D' = D + 1: each
    vector times its weight, and the weight itself last, so that any mean pooling of the
    rows (plain or packed) divided by the last column is the weighted mean (`_finish`)."""
    del lang_B, deterministic, depth, segment_ids_BxL, positions_BxL
    if tokens_BxL.shape[1] > self.max_length:
      raise ValueError(f"sequence length {tokens_BxL.shape[1]} > max_length {self.max_length}")
    x = self.token_embed(tokens_BxL)
    if self.weighting == "learned":
      w = jnp.exp(self.token_weight(tokens_BxL).astype(jnp.float32))        # [B, L, 1]
      x = jnp.concatenate([x.astype(jnp.float32) * w, w], axis=-1)
    return x, tokens_BxL > 0

  def _finish(self, pooled_xD):
    if self.weighting != "learned":
      return pooled_xD.astype(jnp.float32)
    return pooled_xD[..., :-1] / jnp.maximum(pooled_xD[..., -1:], 1e-9)

  def pool(self, hidden, valid, method: str = "mean"):
    if method != "mean":
      raise ConfigError(f"StaticEncoder pools by the mean of its token vectors, not "
                        f"pooling={method!r}")
    return self._finish(encoders.pool(hidden, valid, "mean"))

  def hidden(self, x, lang=None, deterministic: bool = True, depth: Optional[int] = None):
    return self(x.tokens if isinstance(x, Packed) else x)

  def sentences(self, x, lang=None, deterministic: bool = True, method: str = "mean",
                depth: Optional[int] = None):
    """Sentence vectors (float32) of token rows [B, L] -> [B, D], or of a packed feature ->
    [*S, D] in the examples' order (the same vectors)."""
    hidden, valid = self.hidden(x)
    if not isinstance(x, Packed):
      return self.pool(hidden, valid, method)
    if method != "mean":
      raise ConfigError(f"StaticEncoder pools by the mean, not pooling={method!r}")
    return self._finish(x.pool(hidden, "mean"))
