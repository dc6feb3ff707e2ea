"""A sequence classifier on any vmx encoder: fine-tuning for cross-lingual transfer
(InfoXLM §4.2 / Tables 1, 7, 10: XNLI; EMMA-X's XRETE: XNLI, AmericasNLI, PAWS-X).

The encoder (a `TransformerEncoder`, `encoder/...`, loaded from any vmx checkpoint or
imported Hugging Face encoder by vmx/finetune/) reads a sentence or a sentence pair
joined into one sequence (the tokenizer's `encode_pairs`, vmx/data/vocab.py: its own pair format,
`<s> a </s></s> b </s>` for XLM-R, `[CLS] a [SEP] b [SEP]` for BERT); its top layer is
pooled (`pooling`: the CLS for pretrained encoders, the mean for vmx's own vocabularies)
and a classification head maps it to the labels: dropout -> Dense(d) -> tanh -> dropout
-> Dense(labels), RoBERTa's sequence-classification head (BERT's pooler is the same dense
and tanh). Every parameter is trained (fine-tuning), the loss is the mean cross-entropy.

Batch features: `tokens` [B, L] int32 (0 = padding), `label` [B] int32.
The model is also a sentence encoder (`embed`: the pooled vector), so a fine-tuned model
directory opens with `Encoder.from_checkpoint` like any other.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, layers
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel


class SequenceClassifier(nn.Module):
  """Encoder + pooling + classification head (module docstring)."""
  encoder: encoders.TransformerEncoder
  num_labels: int
  pooling: str = "first"
  dropout_rate: float = 0.1

  def setup(self):
    d = self.encoder.emb_dim
    self.head_dropout = nn.Dropout(self.dropout_rate)
    self.head_dense = layers.Dense(d, ("embed", "mlp"), use_bias=True, dtype=self.encoder.dtype,
                                   kernel_init=nn.initializers.normal(0.02), name="head_dense")
    self.head_out = layers.Dense(self.num_labels, ("mlp", "labels"), use_bias=True,
                                 dtype=self.encoder.dtype,
                                 kernel_init=nn.initializers.normal(0.02), name="head_out")

  def pooled(self, tokens_BxL, deterministic: bool = True):
    """The encoder's top layer pooled, [B, D] float32."""
    hidden, valid = self.encoder(tokens_BxL, None, deterministic=deterministic)
    return self.encoder.pool(hidden, valid, self.pooling)

  def __call__(self, tokens_BxL, deterministic: bool = True):
    """Logits [B, num_labels] float32."""
    x = self.head_dropout(self.pooled(tokens_BxL, deterministic), deterministic=deterministic)
    x = jnp.tanh(self.head_dense(x))
    x = self.head_dropout(x, deterministic=deterministic)
    return self.head_out(x).astype(jnp.float32)


def classification_loss(logits_BxC, labels_B):
  """(mean cross-entropy, metrics: loss, accuracy) of logits against integer labels."""
  logp = jax.nn.log_softmax(logits_BxC.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels_B[:, None], axis=-1)[:, 0]
  loss = jnp.mean(nll)
  acc = jnp.mean(jnp.argmax(logits_BxC, axis=-1) == labels_B)
  return loss, {"loss": loss, "accuracy": acc}


class ClassifierModel(SentenceEncoderModel):
  """Cross-entropy of `SequenceClassifier`'s logits."""
  CONFIG_FIELDS = ("module",)

  def __init__(self, module: SequenceClassifier):
    super().__init__(module)
    if module.num_labels < 2:
      raise ConfigError(f"SequenceClassifier.num_labels={module.num_labels}: at least 2")
    if module.encoder.num_languages:
      raise ConfigError("ClassifierModel: the encoder must not read language ids "
                        "(TransformerEncoder.num_languages = 0)")

  def logits(self, params, tokens_BxL, dropout_rng=None):
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    return self.module.apply({"params": params}, tokens_BxL, dropout_rng is None, rngs=rngs)

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    loss, metrics = classification_loss(self.logits(params, batch["tokens"], dropout_rng),
                                        batch["label"])
    return loss, metrics, flax_mutables

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, True,
                             method=SequenceClassifier.pooled)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    shape = input_shapes.get("tokens", input_shapes.get("left_tokens"))
    return self.module.init({"params": rng}, jnp.ones(shape, jnp.int32), deterministic=True)
