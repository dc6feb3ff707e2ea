"""Multilingual knowledge distillation (Reimers & Gurevych 2020, "Making Monolingual
Sentence Embeddings Multilingual using Knowledge Distillation"; "SBERT-distill", the
baseline of the EMS paper).

A teacher M (e.g. the English all-MiniLM-L6-v2) embeds the English side s of each pair
once (vmx.data.teacher caches M(s)); the student M̂ (a vmx dual encoder, shared weights)
learns to map both sides to it:

  loss = MSE(M̂(s), M(s)) + MSE(M̂(t), M(s))                       (paper Eq. 1)
         + contrastive_weight · InfoNCE(M̂(t), M̂(s))                (optional)

with MSE the mean over the batch and the dimensions (`losses.distillation_mse`). The
student's sentence vector must have the teacher's size: `DualEncoder.projection_dims =
[TEACHER_DIM]` when the encoder width differs.

Batch features (vmx.data.feature_converters.DistillFeatureConverter): the pair features
(left_tokens = the translation t, right_tokens = the pivot s, languages) + teacher [B, D].
"""
from __future__ import annotations

import jax.numpy as jnp

from vmx import losses
from vmx.errors import ConfigError
from vmx.models.dual_encoder import DualEncoderModel


class DistillationModel(DualEncoderModel):
  """A dual-encoder student trained towards cached teacher embeddings (see module doc)."""
  FEATURE_CONVERTER = "DistillFeatureConverter"
  CONFIG_FIELDS = ("module", "temperature", "bidirectional", "contrastive_weight")

  def __init__(self, module, temperature: float = 0.05, bidirectional: bool = True,
               contrastive_weight: float = 0.0, mask_duplicates: bool = True):
    super().__init__(module, temperature, bidirectional, mask_duplicates=mask_duplicates)
    if not (isinstance(contrastive_weight, (int, float)) and contrastive_weight >= 0):
      raise ConfigError(f"DistillationModel.contrastive_weight={contrastive_weight!r}: "
                        f"expected a number >= 0")
    self.contrastive_weight = float(contrastive_weight)

  def grad_cache_loss(self, embeddings, batch, flax_mutables=None):
    translation_BxD, pivot_BxD = embeddings
    teacher_BxD = batch["teacher"]
    if translation_BxD.shape[-1] != teacher_BxD.shape[-1]:
      raise ConfigError(
          f"the student's sentence vectors have {translation_BxD.shape[-1]} dimensions, the "
          f"teacher's {teacher_BxD.shape[-1]}: set DualEncoder.projection_dims = "
          f"[{teacher_BxD.shape[-1]}] (or the encoder width to the teacher's)")
    mse_pivot = losses.distillation_mse(pivot_BxD, teacher_BxD)
    mse_translation = losses.distillation_mse(translation_BxD, teacher_BxD)
    loss = mse_pivot + mse_translation
    cos = jnp.mean(jnp.sum(losses.l2_normalize(translation_BxD)
                           * losses.l2_normalize(teacher_BxD), axis=-1))
    metrics = {"mse_pivot": mse_pivot, "mse_translation": mse_translation,
               "teacher_cosine_translation": cos}
    if self.contrastive_weight:
      c_loss, c_metrics = losses.in_batch_softmax_loss(
          translation_BxD, pivot_BxD, self.temperature, self.bidirectional,
          **self.duplicate_keys(batch))
      loss = loss + self.contrastive_weight * c_loss
      metrics.update(contrastive_loss=c_loss, in_batch_accuracy=c_metrics["in_batch_accuracy"])
    metrics["loss"] = loss
    return loss, metrics, flax_mutables
