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
from vmx.models.base import SentenceEncoderModel, SentenceVector, row_key


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


# N-way rows (MPCL; CONTRASTIVE on a mined task): `views` [B, V * L] and, with hard
# negatives, `hard_negative` [B, L] (vmx.data.features.MultiView[HardNegative]Layout),
# read by one shared encoder.

def view_rows(batch, num_views: int, hard_negatives: bool, owner: str):
  """[B, R, L] token rows: the V views, then (hard_negatives) the hard negative (R = V + 1).
  `owner` names the model's binding in the error of a batch without a hard negative."""
  b, n = batch["views"].shape
  if n % num_views:
    raise ValueError(f"views has length {n}, not a multiple of num_views={num_views}")
  views = batch["views"].reshape(b, num_views, n // num_views)
  if not hard_negatives:
    return views
  if "hard_negative" not in batch:
    raise ConfigError(f"{owner}.hard_negatives=True but the batch has no 'hard_negative' "
                      "feature: train on a hard-negative task (e.g. tasks.xnli_mt_task, "
                      "tasks.mined_negatives_task)")
  return jnp.concatenate([views, batch["hard_negative"][:, None]], axis=1)


def embed_view_rows(module: DualEncoder, params, batch, num_views: int, hard_negatives: bool,
                    owner: str, dropout_rng=None):
  """[B, R, D]: the vectors of `view_rows`, from token rows or from the packed group
  "views" (vmx/packing.py: the views and the hard negative share rows)."""
  rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
  members = ("views", "hard_negative") if hard_negatives else ("views",)
  rows = packing.Packed.group(batch, "views", members)
  if rows is None:
    rows_BxRxL = view_rows(batch, num_views, hard_negatives, owner)
    b, r, length = rows_BxRxL.shape
    emb = module.apply({"params": params}, rows_BxRxL.reshape(b * r, length), None,
                       dropout_rng is None, "left", method=DualEncoder.encode, rngs=rngs)
    return emb.reshape(b, r, -1)
  emb = module.apply({"params": params}, rows, None, dropout_rng is None, "left",
                     method=DualEncoder.encode, rngs=rngs)    # [B V (+ B), D]
  b = batch["views_starts"].shape[0]
  views = emb[:b * num_views].reshape(b, num_views, -1)
  if hard_negatives:
    views = jnp.concatenate([views, emb[b * num_views:][:, None]], axis=1)
  return views


def view_keys(batch, num_views: int):
  """[B, V] `losses.token_row_key` of every view (the unpacked views' keys in a packed
  batch: vmx/data/packing.py)."""
  if "views_key" in batch:
    return batch["views_key"].astype(jnp.uint32)
  return losses.token_row_key(view_rows(batch, num_views, False, ""))


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
  an embedding of its own (`Encoder.encode(..., dim=32)`); recorded in vmx_model.json.
  `hard_negatives` (CONTRASTIVE's hard-negative variant; contrastive_mined_negatives_tiny.gin):
  the model reads a task of pairs with a hard negative each (tasks.mined_negatives_task:
  N-way rows of two views, either sentence first, and the negative: MultiViewHardNegative
  FeatureConverter) and every hard negative of the batch joins every anchor's softmax
  (`losses.in_batch_softmax_loss`). One shared encoder without language ids reads them."""
  FEATURE_CONVERTER = "PairFeatureConverter"
  CONFIG_FIELDS = ("module", "temperature", "bidirectional", "matryoshka_dims",
                   "hard_negatives")

  def __init__(self, module: DualEncoder, temperature: float = 0.05,
               bidirectional: bool = True, normalize: bool = True,
               mask_duplicates: bool = True, matryoshka_dims: Sequence[int] = (),
               hard_negatives: bool = False):
    super().__init__(module)
    self.temperature = temperature
    self.bidirectional = bidirectional
    self.normalize = normalize
    self.mask_duplicates = mask_duplicates
    self.set_matryoshka_dims(matryoshka_dims)
    self.hard_negatives = bool(hard_negatives)
    if self.hard_negatives and (not module.share_encoders or module.encoder.num_languages):
      raise ConfigError(f"{type(self).__name__}.hard_negatives=True reads a mined task's "
                        "pairs in either order: it needs one shared encoder "
                        "(DualEncoder.share_encoders=True) without language ids "
                        "(TransformerEncoder.num_languages=0)")

  def feature_converter(self):
    if self.hard_negatives:   # two views (the pair) and the hard negative
      return "MultiViewHardNegativeFeatureConverter", {"num_views": 2}
    return super().feature_converter()

  def packed_features(self):
    if self.hard_negatives:
      return {"views": 0, "hard_negative": 0}
    return {"left_tokens": 0, "right_tokens": 0}

  def sentences_per_example(self, feature: str) -> int:
    return 2 if self.hard_negatives and feature == "views" else 1

  def sentence_vector(self) -> SentenceVector:
    return dual_encoder_vector(self.module)

  def pooled_encoder(self):
    return dual_encoder_pooled(self.module)

  @property
  def uses_languages(self) -> bool:
    return bool(self.module.encoder.num_languages)

  def packed_groups(self):
    # one encoder reads both sides: they share rows (one row count, full rows)
    if self.hard_negatives:
      return {"views": ("views", "hard_negative")}
    return {packing.PAIR: packing.PAIR_FEATURES} if self.module.share_encoders else {}

  def _apply(self, params, batch, dropout_rng):
    """(left [B, D], right [B, D]), and with hard negatives their [B, 1, D]."""
    if self.hard_negatives:
      emb_BxRxD = embed_view_rows(self.module, params, batch, 2, True, type(self).__name__,
                                  dropout_rng)
      return emb_BxRxD[:, 0], emb_BxRxD[:, 1], emb_BxRxD[:, 2:]
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
    keys = self.duplicate_keys(batch)
    loss_fn = lambda l, r, *neg: losses.in_batch_softmax_loss(  # noqa: E731
        l, r, self.temperature, self.bidirectional, self.normalize,
        hard_negatives_BxHxD=neg[0] if neg else None, **keys)
    loss, metrics = self.matryoshka_loss(loss_fn, *embeddings)
    return loss, metrics, flax_mutables

  def duplicate_keys(self, batch) -> dict:
    if not (self.hard_negatives and self.mask_duplicates):
      return super().duplicate_keys(batch)
    keys_Bx2 = view_keys(batch, 2)
    return {"left_key_B": keys_Bx2[:, 0], "right_key_B": keys_Bx2[:, 1],
            "negative_key_BxH": row_key(batch, "hard_negative")[:, None]}

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, lang_B, True, side,
                             method=DualEncoder.encode)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    input_types = input_types or {}
    if "views" in input_shapes:   # hard negatives: two views of length L a row
      b, n = input_shapes["views"]
      input_shapes = {"left_tokens": (b, n // 2), "right_tokens": (b, n // 2)}
    dummy = {k: jnp.ones(s, input_types.get(k, jnp.int32)) for k, s in input_shapes.items()}
    return self.module.init({"params": rng}, dummy["left_tokens"], dummy["right_tokens"],
                            dummy.get("left_lang"), dummy.get("right_lang"),
                            deterministic=True)
