"""MPCL (Zhao, Wu, Cai, Tsuruoka: "Leveraging Multi-lingual Positive Instances in
Contrastive Learning to Improve Sentence Embedding"): contrastive learning where each
anchor has K translations as positives.

Data: N-way groups (one sentence in many languages; vmx.data.tasks.register_nway_task).
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
(runs/train.gin: LR_SCALE_AT). The "+Single" control is the same data with V = 2
(twice the groups for the same sentences a step), or, on the very same sentences,
`positives='one'` (views paired 0-1, 2-3; the group's other views leave the
denominator). `anchors='all'` makes every view an anchor in turn.

Batch feature: `views` [B, V * L] (MultiViewFeatureConverter): the V token rows of
each example, concatenated.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp

from vmx import losses
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel
from vmx.models.dual_encoder import DualEncoder


class MPCLModel(SentenceEncoderModel):
  """t5x-style model: multi-positive InfoNCE over N-way groups."""
  CONFIG_FIELDS = ("module", "num_views", "temperature", "rescale", "single_positive_steps",
                   "anchors", "positives")
  HAS_MUTABLES = True

  def __init__(self, module: DualEncoder, num_views: int = 4, temperature: float = 0.05,
               rescale: bool = True, single_positive_steps: int = 0, anchors: str = "first",
               positives: str = "all"):
    super().__init__(module)
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

  @property
  def FEATURE_CONVERTER_CLS(self):  # noqa: N802  (t5x's attribute name)
    from vmx.data.feature_converters import MultiViewFeatureConverter  # lazy: seqio (TensorFlow), kept off the inference path
    return functools.partial(MultiViewFeatureConverter, num_views=self.num_views)

  def _views(self, batch):
    b, n = batch["views"].shape
    if n % self.num_views:
      raise ValueError(f"views has length {n}, not a multiple of num_views={self.num_views}")
    return batch["views"].reshape(b, self.num_views, n // self.num_views)

  def embed_views(self, params, batch, dropout_rng=None):
    """[B, V, D] sentence vectors of every view."""
    views = self._views(batch)
    b, v, length = views.shape
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    emb = self.module.apply({"params": params}, views.reshape(b * v, length), None,
                            dropout_rng is None, "left", method=DualEncoder.encode, rngs=rngs)
    return emb.reshape(b, v, -1)

  def objective(self, emb_BxVxD, multi):
    """(loss, metrics): MPCL when `multi` (a bool array), else single-positive on views 0, 1."""
    mp, mm = losses.multi_positive_infonce(emb_BxVxD, self.temperature, self.rescale,
                                           anchors=self.anchors, positives=self.positives)
    sp, sm = losses.multi_positive_infonce(emb_BxVxD[:, :2], self.temperature, self.rescale,
                                           anchors=self.anchors)
    loss = jnp.where(multi, mp, sp)
    return loss, {"loss": loss, "mpcl_loss": mp, "single_positive_loss": sp,
                  "positive_accuracy": mm["positive_accuracy"],
                  "multi_positive_phase": multi.astype(jnp.float32)}

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    if flax_mutables is None:   # evaluation: the MPCL loss
      loss, m = self.objective(self.embed_views(params, batch), jnp.bool_(True))
      return loss, m, None
    return self.grad_cache_loss(self.grad_cache_embed(params, batch, dropout_rng), batch,
                                flax_mutables)

  # GradCache split (train.grad_cache_chunks): the loss reads the batch only through the
  # view embeddings; the update counter is advanced by the loss, once a step.
  def grad_cache_embed(self, params, batch, dropout_rng):
    return self.embed_views(params, batch, dropout_rng)

  def grad_cache_loss(self, emb_BxVxD, batch, flax_mutables):
    del batch
    updates = flax_mutables["phase"]["updates"]
    loss, m = self.objective(emb_BxVxD, updates >= self.single_positive_steps)
    return loss, m, {**flax_mutables, "phase": {"updates": updates + 1}}

  def score_batch(self, params, batch, return_intermediates: bool = False):
    """Cosine similarity of each example's anchor with each positive: [B, V - 1]
    (pair batches: left with right, [B])."""
    if "views" not in batch:
      return super().score_batch(params, batch, return_intermediates)
    emb = losses.l2_normalize(self.embed_views(params, batch))
    scores = jnp.einsum("bd,bkd->bk", emb[:, 0], emb[:, 1:])
    return (scores, {"embeddings": emb}) if return_intermediates else scores

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
