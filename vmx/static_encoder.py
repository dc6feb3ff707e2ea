"""A static sentence encoder: the (weighted) mean of token vectors, no attention.

The family sentence-transformers' `StaticEmbedding` and Model2Vec train or distil: a
sentence's vector is the mean of its tokens' rows of one table [V, D], optionally weighted
per token (`weighting`):
- 'none': the plain mean;
- 'learned': a weight exp(s_t) per vocabulary entry (s_t starts at 0: the plain mean),
  trained with the table, so frequent function pieces can learn to count less;
- 'frequency': fixed weights, SIF's a / (a + p(t)) (Arora et al. 2017; Model2Vec's, and
  distillation's here, static_distill.py) with a = `sif_a` and p(t) the piece's probability
  in `vocabulary` (a SentencePiece unigram model's own; Zipf's law by rank otherwise). They
  are read when the parameters are initialized (on the host, inside the jitted init), kept
  beside the table as `token_weight` (log a / (a + p)) and never trained: no gradient reaches
  them (an optimizer's weight decay still would: use none with them).
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

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from vmx import encoders, layers
from vmx.errors import ConfigError
from vmx.gin_utils import check_range, positive_int
from vmx.packing import Packed

WEIGHTINGS = ("none", "learned", "frequency")


def probabilities(tokenizer, ids: np.ndarray) -> tuple[np.ndarray, str]:
  """(p(t) of each id, where it came from): a vmx SentencePiece vocabulary's unigram
  probabilities, else Zipf's law from the id's rank (Model2Vec's assumption: ids in
  frequency order). A unigram model scores its pieces by log-probability; its special
  pieces (end of sentence, unknown, the `<2xx>` language tags) score 0, are not in the
  distribution and get p = 0 (the weight of the rarest piece)."""
  logp = tokenizer.unigram_scores(ids)
  if logp is not None:
    normal = logp < 0
    if normal.any():
      p = np.where(normal, np.exp(np.minimum(logp, 0.0)), 0.0)
      return p / p.sum(), "the SentencePiece model's unigram probabilities"
  rank = np.arange(1, len(ids) + 1, dtype=np.float64)
  p = 1.0 / rank
  return p / p.sum(), "Zipf's law from the id's rank"


def sif_log_weights(vocabulary: str, size: int, a: float) -> np.ndarray:
  """[size, 1] float32 log(a / (a + p(t))) of ids 0..size-1 in `vocabulary` (0 for padding
  and for ids past the vocabulary's end: weight 1)."""
  from vmx.data.vocab import load_tokenizer   # lazy: only a frequency-weighted init reads it
  tokenizer = load_tokenizer(vocabulary)
  ids = np.arange(1, min(size, tokenizer.vocab_size), dtype=np.int32)
  p, _ = probabilities(tokenizer, ids)
  out = np.zeros((size, 1), np.float32)
  out[ids, 0] = np.log(a / (a + p))
  return out


class StaticEncoder(nn.Module):
  """Token table -> (weighted) mean (module docstring)."""
  vocab_size: int
  emb_dim: int = 256
  max_length: int = 512
  weighting: str = "none"
  vocabulary: Optional[str] = None     # 'frequency': whose piece probabilities weigh
  sif_a: float = 1e-4                  # 'frequency': SIF's a (Model2Vec's default)
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
    if self.weighting == "frequency" and not self.vocabulary:
      raise ConfigError("StaticEncoder.weighting='frequency' needs StaticEncoder.vocabulary, "
                        "the vocabulary whose piece probabilities weigh the tokens: bind "
                        "--gin.StaticEncoder.vocabulary=%VOCABULARY")
    check_range(isinstance(self.sif_a, (int, float)) and self.sif_a > 0, "StaticEncoder",
                "sif_a", self.sif_a, "a positive number")
    if self.num_layers or self.num_languages:
      raise ConfigError("StaticEncoder has no layers and no language embedding "
                        "(num_layers = num_languages = 0)")
    self.token_embed = layers.Embed(self.vocab_size, self.emb_dim, dtype=self.dtype,
                                    embedding_init=nn.initializers.normal(1.0),
                                    name="token_embed")
    if self.weighting != "none":
      self.token_weight = layers.Embed(self.vocab_size, 1, dtype=jnp.float32,
                                       axes=("vocab", "embed"),
                                       embedding_init=(self._sif_init
                                                       if self.weighting == "frequency"
                                                       else nn.initializers.zeros),
                                       name="token_weight")

  def _sif_init(self, key, shape, dtype):
    """SIF's log weights, read on the host when the values are made (an abstract init,
    as inference's, reads nothing)."""
    del key
    return jax.pure_callback(
        lambda: sif_log_weights(self.vocabulary, shape[0], self.sif_a).astype(dtype),
        jax.ShapeDtypeStruct(shape, dtype))

  def __call__(self, tokens_BxL, lang_B=None, deterministic: bool = True,
               depth: Optional[int] = None, segment_ids_BxL=None, positions_BxL=None):
    """(token vectors [B, L, D'], validity [B, L]); with weights D' = D + 1: each
    vector times its weight, and the weight itself last, so that any mean pooling of the
    rows (plain or packed) divided by the last column is the weighted mean (`_finish`)."""
    del lang_B, deterministic, depth, segment_ids_BxL, positions_BxL
    if tokens_BxL.shape[1] > self.max_length:
      raise ValueError(f"sequence length {tokens_BxL.shape[1]} > max_length {self.max_length}")
    x = self.token_embed(tokens_BxL)
    if self.weighting != "none":
      s = self.token_weight(tokens_BxL).astype(jnp.float32)                 # [B, L, 1]
      w = jnp.exp(jax.lax.stop_gradient(s) if self.weighting == "frequency" else s)
      x = jnp.concatenate([x.astype(jnp.float32) * w, w], axis=-1)
    return x, tokens_BxL > 0

  def token_sum_table(self, params) -> np.ndarray:
    """[V, D] float32 rows whose sum over a sentence's tokens, L2-normalized, is its
    normalized sentence vector: the table with each row times its weight exp(s_t)
    (the weighted mean is that sum over a positive number, which the normalization drops).
    `params`: this encoder's ({"token_embed": ..., "token_weight": ...}). What a
    sentence-transformers `StaticEmbedding` export holds, and what `Encoder` sums on the host
    (one sparse product for all sentences instead of a device call per batch)."""
    table = np.asarray(params["token_embed"]["embedding"], np.float32)
    if self.weighting != "none":
      table = table * np.exp(np.asarray(params["token_weight"]["embedding"], np.float32))
    return table

  def _finish(self, pooled_xD):
    if self.weighting == "none":
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
