"""Dual encoders: the CONTRASTIVE baseline (VMSST paper §6.3).

One Transformer encoder (shared by both sides unless `share_encoders=False`),
a pooler (mean / first token, from a chosen layer) and an optional projection
head give sentence vectors for the two sides of a translation pair; the loss is
bidirectional in-batch InfoNCE over the GLOBAL batch (vmx.losses).

Batch features (vmx.data.feature_converters.PairFeatureConverter):
  left_tokens [B, L] int32, right_tokens [B, L] int32, left_lang [B], right_lang [B].
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, losses, packing
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel, SentenceVector


class DualEncoder(nn.Module):
  """Encoder(s) + pooler + projection head for pairs of sentences."""
  encoder: encoders.TransformerEncoder
  pooling: str = "mean"
  projection_dims: Sequence[int] = ()
  share_encoders: bool = True

  def setup(self):
    self.left_encoder = self.encoder
    self.right_encoder = (self.encoder if self.share_encoders
                          else self.encoder.clone(parent=self, name="right_encoder"))
    self.left_head = encoders.ProjectionHead(tuple(self.projection_dims), name="projection")
    self.right_head = (self.left_head if self.share_encoders else
                       encoders.ProjectionHead(tuple(self.projection_dims),
                                               name="right_projection"))

  def encode(self, tokens_BxL, lang_B=None, deterministic: bool = True, side: str = "left"):
    """Sentence vectors [B, D] of token rows, or [*S, D] of a packed feature (vmx/packing.py)."""
    enc, head = ((self.left_encoder, self.left_head) if side == "left"
                 else (self.right_encoder, self.right_head))
    return head(enc.sentences(tokens_BxL, lang_B, deterministic, self.pooling))

  def __call__(self, left_tokens, right_tokens, left_lang=None, right_lang=None,
               deterministic: bool = True):
    return (self.encode(left_tokens, left_lang, deterministic, "left"),
            self.encode(right_tokens, right_lang, deterministic, "right"))


def dual_encoder_vector(module: DualEncoder) -> SentenceVector:
  """A DualEncoder's sentence vector: its (left) encoder's pooled top layer, then its
  projection head where it has one (CONTRASTIVE, distillation, MPCL)."""
  enc, dims = module.encoder, tuple(module.projection_dims or ())
  then = f"then a projection head ({' -> '.join(map(str, dims))})" if dims else ""
  return SentenceVector(enc, module.pooling, enc.depth, then)


def dual_encoder_pooled(module: DualEncoder):
  """`pooled_encoder()` of a model over a DualEncoder: its shared encoder and pooling;
  ConfigError for two encoders or a projection head (the vector is more than a pooling)."""
  if not module.share_encoders or module.projection_dims:
    raise ConfigError("a dual encoder with two encoders or a projection head cannot be "
                      "exported to sentence-transformers (one shared encoder, no projection)")
  return module.encoder, module.pooling


class DualEncoderModel(SentenceEncoderModel):
  """Dual encoders trained with in-batch InfoNCE.

  `normalize` (training only): cosine similarities / temperature (vmx's default), or
  False: raw dot products, exp(s . t) with temperature 1 as the VMSST paper writes the
  CONTRASTIVE baseline (§6.3; ablations/contrastive_dot_product.gin).
  `mask_duplicates` (training only, default on: the paper is silent): a pair whose
  target sentence equals another pair's target is no negative of it (nor one whose
  source equals another's source, the other way): the same translation is not pushed
  away from itself (`duplicate_keys`, `losses.in_batch_softmax_loss`; docs/departures.md).
  `matryoshka_dims` (MATRYOSHKA_DIMS, e.g. (32, 64)): the loss is summed over those
  prefixes of the sentence vector and the whole (`losses.matryoshka`), so each prefix is
  an embedding of its own (`Encoder.encode(..., dim=32)`); recorded in vmx_model.json."""
  FEATURE_CONVERTER = "PairFeatureConverter"
  CONFIG_FIELDS = ("module", "temperature", "bidirectional", "matryoshka_dims")

  def __init__(self, module: DualEncoder, temperature: float = 0.05,
               bidirectional: bool = True, normalize: bool = True,
               mask_duplicates: bool = True, matryoshka_dims: Sequence[int] = ()):
    super().__init__(module)
    self.temperature = temperature
    self.bidirectional = bidirectional
    self.normalize = normalize
    self.mask_duplicates = mask_duplicates
    self.set_matryoshka_dims(matryoshka_dims)

  def packed_features(self):
    return {"left_tokens": 0, "right_tokens": 0}

  def sentence_vector(self) -> SentenceVector:
    return dual_encoder_vector(self.module)

  def pooled_encoder(self):
    return dual_encoder_pooled(self.module)

  @property
  def uses_languages(self) -> bool:
    return bool(self.module.encoder.num_languages)

  def packed_groups(self):
    # one encoder reads both sides: they share rows (one row count, full rows)
    return {packing.PAIR: packing.PAIR_FEATURES} if self.module.share_encoders else {}

  def _apply(self, params, batch, dropout_rng):
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    pair = packing.pair(batch)
    if pair is not None:   # both sides in one pass over their shared rows
      b = batch["left_tokens_starts"].shape[0]
      langs = (jnp.concatenate([batch["left_lang"], batch["right_lang"]])
               if self.module.encoder.num_languages else None)
      vectors = self.module.apply({"params": params}, pair, langs, dropout_rng is None,
                                  "left", method=DualEncoder.encode, rngs=rngs)
      return vectors[:b], vectors[b:]
    return self.module.apply(
        {"params": params}, packing.tokens(batch, "left_tokens"),
        packing.tokens(batch, "right_tokens"),
        batch.get("left_lang"), batch.get("right_lang"),
        deterministic=dropout_rng is None, rngs=rngs)

  def compute_loss(self, params, batch, dropout_rng, flax_mutables=None):
    return self.grad_cache_loss(self.grad_cache_embed(params, batch, dropout_rng), batch,
                                flax_mutables)

  # GradCache split: the loss depends on the batch only through the sentence vectors.
  def grad_cache_embed(self, params, batch, dropout_rng):
    return self._apply(params, batch, dropout_rng)

  def grad_cache_loss(self, embeddings, batch, flax_mutables=None):
    left, right = embeddings
    keys = self.duplicate_keys(batch)
    loss_fn = lambda l, r: losses.in_batch_softmax_loss(l, r, self.temperature,
                                                        self.bidirectional, self.normalize,
                                                        **keys)
    loss, metrics = self.matryoshka_loss(loss_fn, left, right)
    return loss, metrics, flax_mutables

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, lang_B, True, side,
                             method=DualEncoder.encode)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    input_types = input_types or {}
    dummy = {k: jnp.ones(s, input_types.get(k, jnp.int32)) for k, s in input_shapes.items()}
    return self.module.init({"params": rng}, dummy["left_tokens"], dummy["right_tokens"],
                            dummy.get("left_lang"), dummy.get("right_lang"),
                            deterministic=True)
