"""Masked language modelling: BERT/RoBERTa masking, the tied output head, joined pairs.

Shared by InfoXLM's MMLM and TLM (vmx/models/infoxlm.py) and any model that predicts
masked tokens. Pure jax functions of token arrays (id 0 = padding) and one linen
module; no TensorFlow.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nnp

from vmx import layers

Array = jax.Array
MASK_RATE = 0.15


def mask_tokens(rng: Array, tokens_BxL: Array, *, mask_id: int, vocab_size: int,
                special_ids: Sequence[int] = (), mask_rate: float = MASK_RATE,
                random_rate: float = 0.1, keep_rate: float = 0.1, random_low: int = 1):
  """fairseq's MaskTokensDataset (RoBERTa, XLM-R, InfoXLM) on a padded batch.

  Per row, round(mask_rate * n + u) positions (u ~ U[0, 1): probabilistic rounding, n =
  the row's maskable tokens: not padding, not `special_ids`) are picked uniformly; of
  those, `random_rate` get a token drawn uniformly from [random_low, vocab_size),
  `keep_rate` keep their token and the rest (80%) become `mask_id`.

  Returns (inputs_BxL, targets_BxL, weights_BxL): the corrupted tokens, the original
  tokens, and 1.0 at the picked positions (the ones the loss predicts), else 0.0.
  """
  k_count, k_pick, k_kind, k_random = jax.random.split(rng, 4)
  maskable = tokens_BxL > 0
  for s in special_ids:
    maskable &= tokens_BxL != s
  n = maskable.sum(axis=1)                                                     # [B]
  u = jax.random.uniform(k_count, n.shape)
  count = jnp.floor(mask_rate * n + u).astype(jnp.int32)                       # [B]
  # The `count` maskable positions with the largest random scores are picked.
  scores = jnp.where(maskable, jax.random.uniform(k_pick, tokens_BxL.shape), -1.0)
  rank = jnp.argsort(jnp.argsort(-scores, axis=1), axis=1)                     # 0 = largest
  picked = maskable & (rank < count[:, None])
  kind = jax.random.uniform(k_kind, tokens_BxL.shape)
  use_random = picked & (kind < random_rate)
  use_mask = picked & (kind >= random_rate + keep_rate)
  random_tokens = jax.random.randint(k_random, tokens_BxL.shape, random_low, vocab_size,
                                     dtype=tokens_BxL.dtype)
  inputs = jnp.where(use_mask, jnp.asarray(mask_id, tokens_BxL.dtype),
                     jnp.where(use_random, random_tokens, tokens_BxL))
  return inputs, tokens_BxL, picked.astype(jnp.float32)


def join_padded(first_BxL: Array, second_BxM: Array, drop_first_of_second: bool = False
                ) -> Array:
  """Rows `first + second` with the padding between them removed: [B, L + M] (zero-padded).

  `drop_first_of_second`: the second row loses its first token (its <s>/[CLS]), giving
  fairseq's `<s> a </s> b </s>` from `<s> a </s>` and `<s> b </s>`. Positions run on
  through the second sentence (no reset), as in XLM-R and InfoXLM's TLM.
  """
  if drop_first_of_second:
    second_BxM = jnp.concatenate([second_BxM[:, 1:], jnp.zeros_like(second_BxM[:, :1])], 1)
  b, l_first = first_BxL.shape
  m = second_BxM.shape[1]
  n_first = (first_BxL > 0).sum(axis=1, keepdims=True)                         # [B, 1]
  t = jnp.arange(l_first + m)[None, :]                                         # [1, L+M]
  first = jnp.concatenate([first_BxL, jnp.zeros((b, m), first_BxL.dtype)], 1)
  idx = jnp.clip(t - n_first, 0, m - 1)
  second = jnp.where(t >= n_first, jnp.take_along_axis(second_BxM, idx, axis=1), 0)
  return jnp.where(t < n_first, first, second)


class MlmHead(nn.Module):
  """RoBERTa's LM head: Dense(d) -> GELU -> LayerNorm -> logits tied to the token table
  (`embedding.attend`) + an output bias [V]. `scale_logits` divides the tied logits by
  sqrt(d), t5x's convention for token tables initialized with std 1 (vmx's own and T5's
  families; BERT/XLM-R tables have std 0.02 and are used as they are)."""
  vocab_size: int
  emb_dim: int
  norm_epsilon: float = 1e-5
  scale_logits: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, hidden_BxLxD: Array, embedding: layers.Embed) -> Array:
    h = layers.Dense(self.emb_dim, ("embed", "mlp"), use_bias=True, dtype=self.dtype,
                     name="dense")(hidden_BxLxD)
    h = layers.LayerNorm(self.norm_epsilon, self.dtype, name="layer_norm")(
        layers.activation("gelu_exact")(h))
    bias = nnp.param_with_axes("bias", nn.initializers.zeros, (self.vocab_size,),
                               jnp.float32, axes=("vocab",))
    logits = embedding.attend(h).astype(jnp.float32)
    if self.scale_logits:
      logits = logits / jnp.sqrt(jnp.float32(self.emb_dim))
    return logits + bias
