"""Extractive question answering on any vmx encoder: a span head (InfoXLM §4.2 / Table 4:
MLQA, "the fine-tuning method introduced in (Devlin et al., 2019) that concatenates the
question-passage pair as the input").

The encoder (a `TransformerEncoder`, `encoder/...`, loaded from any vmx checkpoint or
imported encoder by vmx/finetune/) reads a question and a window of its passage joined in
the tokenizer's pair format (vmx/finetune/qa.py); one dense layer maps each position's
top-layer vector to a start and an end logit (BERT's SQuAD head). The loss is the mean of
the start and the end positions' cross-entropies over the row's tokens (padding excluded);
a window without the answer points both at position 0 (BERT's choice). Every parameter is
trained.

Batch features: `tokens` [B, L] int32 (0 = padding), `start`, `end` [B] int32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, layers
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel


class SpanExtractor(nn.Module):
  """Encoder + per-position start / end logits (module docstring). `pooling` is only the
  sentence vector of `embed` (a fine-tuned directory still opens as a sentence encoder)."""
  encoder: encoders.TransformerEncoder
  pooling: str = "first"

  def setup(self):
    self.span_out = layers.Dense(2, ("embed", "labels"), use_bias=True,
                                 dtype=self.encoder.dtype,
                                 kernel_init=nn.initializers.normal(0.02), name="span_out")

  def pooled(self, tokens_BxL):
    hidden, valid = self.encoder(tokens_BxL, None, deterministic=True)
    return self.encoder.pool(hidden, valid, self.pooling)

  def __call__(self, tokens_BxL, deterministic: bool = True):
    """(start logits, end logits), each [B, L] float32, padding at -1e9."""
    hidden, _ = self.encoder(tokens_BxL, None, deterministic=deterministic)
    logits = self.span_out(hidden).astype(jnp.float32)
    pad = tokens_BxL == 0
    return (jnp.where(pad, -1e9, logits[..., 0]), jnp.where(pad, -1e9, logits[..., 1]))


def span_loss(start_BxL, end_BxL, start_B, end_B):
  """(mean of the start and end cross-entropies, metrics: loss, the fraction of rows whose
  start and end are both the arg-max)."""
  def nll(logits_BxL, target_B):
    logp = jax.nn.log_softmax(logits_BxL, axis=-1)
    return -jnp.take_along_axis(logp, target_B[:, None], axis=-1)[:, 0]
  loss = jnp.mean(0.5 * (nll(start_BxL, start_B) + nll(end_BxL, end_B)))
  hit = ((jnp.argmax(start_BxL, -1) == start_B) & (jnp.argmax(end_BxL, -1) == end_B))
  return loss, {"loss": loss, "span_accuracy": jnp.mean(hit)}


class SpanModel(SentenceEncoderModel):
  """`span_loss` of `SpanExtractor`'s logits."""
  CONFIG_FIELDS = ("module",)

  def __init__(self, module: SpanExtractor):
    super().__init__(module)
    if module.encoder.num_languages:
      raise ConfigError("SpanModel: the encoder must not read language ids "
                        "(TransformerEncoder.num_languages = 0)")

  def logits(self, params, tokens_BxL, dropout_rng=None):
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    return self.module.apply({"params": params}, tokens_BxL, dropout_rng is None, rngs=rngs)

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    start, end = self.logits(params, batch["tokens"], dropout_rng)
    loss, metrics = span_loss(start, end, batch["start"], batch["end"])
    return loss, metrics, flax_mutables

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, method=SpanExtractor.pooled)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    shape = input_shapes.get("tokens", input_shapes.get("left_tokens"))
    return self.module.init({"params": rng}, jnp.ones(shape, jnp.int32), deterministic=True)
