"""MPCL (Zhao, Wu, Cai, Tsuruoka: "Leveraging Multi-lingual Positive Instances in
Contrastive Learning to Improve Sentence Embedding"): contrastive learning where each
anchor has K translations as positives.

Data: N-way groups (one sentence in many languages; vmx.data.registration.register_nway_task).
Each example holds V = K + 1 views drawn from the group's languages at random, so every
language is equally likely to be the anchor (view 0); the others are its positives.
One shared encoder (vmx.models.dual_encoder.DualEncoder: CLS or mean pooling) embeds
all G x V sentences of the batch; the loss is `losses.multi_positive_infonce`
(their Eq. 2: positives in the numerator, every other sentence of the GLOBAL batch in
the denominator; optional min-max rescaling of the similarities).

Schedule: the first `single_positive_steps` updates use the single-positive loss on
views 0 and 1 only (their warm-up, 2000 steps in the paper), then MPCL; the update
counter is model state (`flax_mutables['phase']`), checkpointed with the run. The
learning-rate change between the phases is the schedule's `scale_at`
(runs/train.gin: LR_SCALE_AT). The "+Single" control (§3.5: a group of six becomes three
random language pairs, each sentence once) is, on the very same sentences,
`positives='one'`: the views paired 0-1, 2-3, 4-5, every pair its own single-positive
term anchored at its first view (`losses.multi_positive_infonce`; the group's other views
leave the denominator), throughout training (its warm-up is the same loss); or the same
data with V = 2 (twice the groups for the same sentences a step). `anchors='all'` makes
every view an anchor in turn (with `positives='one'`: both views of every pair).

`hard_negatives` (their "XLM-R w/ hard negative" variant, §3.5): each example also
holds one hard negative, a contradiction hypothesis of the group's sentence in a random
language (vmx.data.nway.NwayHardNegativeSource; XNLI-MT: tasks/xnli_mt.py). It is
embedded with the views and every hard negative of the batch joins every anchor's
denominator (`losses.multi_positive_infonce`'s `hard_negatives_GxHxD`), in the
single-positive warm-up too.

Batch features: `views` [B, V * L] (MultiViewFeatureConverter): the V token rows of
each example, concatenated; with hard negatives also `hard_negative` [B, L]
(MultiViewHardNegativeFeatureConverter).
"""
from __future__ import annotations

import jax.numpy as jnp

from vmx import losses
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel, SentenceVector
from vmx.models.dual_encoder import (DualEncoder, dual_encoder_pooled, dual_encoder_vector,
                                    embed_view_rows, view_keys)


class MPCLModel(SentenceEncoderModel):
  """MPCL: multi-positive InfoNCE over N-way groups."""
  CONFIG_FIELDS = ("module", "num_views", "temperature", "rescale", "single_positive_steps",
                   "anchors", "positives", "hard_negatives", "matryoshka_dims")

  def sentence_vector(self) -> SentenceVector:
    return dual_encoder_vector(self.module)

  def pooled_encoder(self):
    return dual_encoder_pooled(self.module)

  def __init__(self, module: DualEncoder, num_views: int = 4, temperature: float = 0.05,
               rescale: bool = True, single_positive_steps: int = 0, anchors: str = "first",
               positives: str = "all", hard_negatives: bool = False,
               mask_duplicates: bool = True, matryoshka_dims=()):
    super().__init__(module)
    self.set_matryoshka_dims(matryoshka_dims)   # MATRYOSHKA_DIMS: the loss over prefixes too
    self.mask_duplicates = mask_duplicates   # a group's sentence in another group (§3 silent)
    if num_views < 2:
      raise ConfigError(f"MPCLModel.num_views={num_views}: need an anchor and >= 1 positive")
    if anchors not in losses.ANCHORS:
      raise ConfigError(f"MPCLModel.anchors={anchors!r}: expected one of {losses.ANCHORS}")
    if positives not in losses.POSITIVES or (positives == "one" and num_views % 2):
      raise ConfigError(f"MPCLModel.positives={positives!r} with num_views={num_views}: "
                        f"expected one of {losses.POSITIVES} ('one' pairs the views 0-1, 2-3, "
                        f"...: an even num_views)")
    if module.encoder.num_languages:
      raise ConfigError("MPCLModel: the encoder must not read language ids "
                        "(TransformerEncoder.num_languages = 0)")
    self.num_views = num_views
    self.temperature = temperature
    self.rescale = rescale
    self.single_positive_steps = single_positive_steps
    self.anchors, self.positives = anchors, positives
    self.hard_negatives = bool(hard_negatives)

  def feature_converter(self):
    return ("MultiViewHardNegativeFeatureConverter" if self.hard_negatives
            else "MultiViewFeatureConverter", {"num_views": self.num_views})

  def packed_features(self):
    return {"views": 0, **({"hard_negative": 0} if self.hard_negatives else {})}

  def packed_groups(self):
    # the views and the hard negative share rows (one encoder, one row count)
    return {"views": tuple(self.packed_features())}

  def sentences_per_example(self, feature: str) -> int:
    return self.num_views if feature == "views" else 1

  def _embed(self, params, batch, dropout_rng=None):
    """[B, R, D]: the views' vectors, then (hard_negatives) the hard negative's."""
    return embed_view_rows(self.module, params, batch, self.num_views, self.hard_negatives,
                           "MPCLModel", dropout_rng)

  def embed_views(self, params, batch, dropout_rng=None):
    """[B, V, D] sentence vectors of every view."""
    return self._embed(params, batch, dropout_rng)[:, :self.num_views]

  def view_keys(self, batch):
    """[B, V] `losses.token_row_key` of every view (None: duplicates not masked)."""
    return view_keys(batch, self.num_views) if self.mask_duplicates else None

  def objective(self, emb_BxRxD, multi, view_key_BxV=None):
    """`_objective`, with `matryoshka_dims` summed over the vectors' prefixes."""
    return self.matryoshka_loss(lambda e: self._objective(e, multi, view_key_BxV), emb_BxRxD)

  def _objective(self, emb_BxRxD, multi, view_key_BxV=None):
    """(loss, metrics): the run's loss (MPCL, or +Single with `positives='one'`) when `multi`
    (a bool array), else the warm-up's single-positive loss: Eq. 1 on views 0, 1 (MPCL), the
    +Single loss itself (+Single trains with one positive throughout). `emb_BxRxD`: the
    views' vectors, then (hard_negatives) the hard negative's; `view_key_BxV`: the views'
    keys (another group's copy of a sentence of the anchor's group is no negative)."""
    emb_BxVxD = emb_BxRxD[:, :self.num_views]
    neg_BxHxD = emb_BxRxD[:, self.num_views:] if self.hard_negatives else None
    mp, mm = losses.multi_positive_infonce(emb_BxVxD, self.temperature, self.rescale,
                                           anchors=self.anchors, positives=self.positives,
                                           hard_negatives_GxHxD=neg_BxHxD,
                                           view_key_GxV=view_key_BxV)
    if self.positives == "one":
      sp = mp
    else:
      sp, _ = losses.multi_positive_infonce(
          emb_BxVxD[:, :2], self.temperature, self.rescale, anchors=self.anchors,
          hard_negatives_GxHxD=neg_BxHxD,
          view_key_GxV=None if view_key_BxV is None else view_key_BxV[:, :2])
    loss = jnp.where(multi, mp, sp)
    extra = ({"hard_negative_accuracy": mm["hard_negative_accuracy"]} if self.hard_negatives
             else {})
    return loss, {"loss": loss, "mpcl_loss": mp, "single_positive_loss": sp,
                  "positive_accuracy": mm["positive_accuracy"],
                  "multi_positive_phase": multi.astype(jnp.float32), **extra}

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    if flax_mutables is None:   # evaluation: the MPCL loss
      loss, m = self.objective(self._embed(params, batch), jnp.bool_(True),
                               self.view_keys(batch))
      return loss, m, None
    return self.grad_cache_loss(self.grad_cache_embed(params, batch, dropout_rng), batch,
                                flax_mutables)

  # GradCache split (train.grad_cache_chunks): the loss reads the batch only through the
  # embeddings of its rows (views, hard negative); the update counter is advanced by the
  # loss, once a step.
  def grad_cache_embed(self, params, batch, dropout_rng):
    return self._embed(params, batch, dropout_rng)

  def grad_cache_loss(self, emb_BxRxD, batch, flax_mutables):
    updates = flax_mutables["phase"]["updates"]
    loss, m = self.objective(emb_BxRxD, updates >= self.single_positive_steps,
                             self.view_keys(batch))
    return loss, m, {**flax_mutables, "phase": {"updates": updates + 1}}

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, None, True, side,
                             method=DualEncoder.encode)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    if "views" in input_shapes:
      b, n = input_shapes["views"]
      shape = (b, n // self.num_views)
    else:
      shape = input_shapes["left_tokens"]
    tokens = jnp.ones(shape, jnp.int32)
    variables = self.module.init({"params": rng}, tokens, tokens, deterministic=True)
    return {**variables, "phase": {"updates": jnp.zeros((), jnp.int32)}}
