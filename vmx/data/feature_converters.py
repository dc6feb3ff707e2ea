"""SeqIO feature converters: task features -> model features."""
from __future__ import annotations

import seqio
import tensorflow as tf

from vmx.errors import ConfigError

FeatureSpec = seqio.FeatureConverter.FeatureSpec


class PairFeatureConverter(seqio.FeatureConverter):
  """Translation pairs for dual encoders (and any model reading both sides).

  inputs, targets, inputs_lang, targets_lang ->
  left_tokens [L_in], right_tokens [L_tgt] (zero-padded, truncated), left_lang, right_lang.
  """
  TASK_FEATURES = {
      "inputs": FeatureSpec(dtype=tf.int32),
      "targets": FeatureSpec(dtype=tf.int32),
      "inputs_lang": FeatureSpec(dtype=tf.int32, rank=0),
      "targets_lang": FeatureSpec(dtype=tf.int32, rank=0),
  }
  MODEL_FEATURES = {
      "left_tokens": FeatureSpec(dtype=tf.int32),
      "right_tokens": FeatureSpec(dtype=tf.int32),
      "left_lang": FeatureSpec(dtype=tf.int32, rank=0),
      "right_lang": FeatureSpec(dtype=tf.int32, rank=0),
  }
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, pack: bool = False, **kwargs):
    if pack:
      raise ConfigError("PairFeatureConverter does not pack: each row is one sentence")
    super().__init__(pack=False, **kwargs)

  SCALAR_FEATURES = ("inputs_lang", "targets_lang")

  def __call__(self, ds, task_feature_lengths):
    # Scalars have no length, but seqio's checks want a key for every feature.
    lengths = {**task_feature_lengths, **{k: 1 for k in self.SCALAR_FEATURES}}
    return super().__call__(ds, lengths)

  def _convert_features(self, ds, task_feature_lengths):
    ds = seqio.utils.trim_and_pad_dataset(
        ds, {k: task_feature_lengths[k] for k in ("inputs", "targets")})
    return ds.map(lambda ex: {"left_tokens": ex["inputs"], "right_tokens": ex["targets"],
                              "left_lang": ex["inputs_lang"], "right_lang": ex["targets_lang"]},
                  num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {"left_tokens": task_feature_lengths["inputs"],
            "right_tokens": task_feature_lengths["targets"], "left_lang": 1, "right_lang": 1}


class DistillFeatureConverter(PairFeatureConverter):
  """Pairs with the teacher's embedding of the pivot side (multilingual distillation):
  PairFeatureConverter's features + teacher [D] float32 (task feature length D)."""
  TASK_FEATURES = {**PairFeatureConverter.TASK_FEATURES,
                   "teacher": FeatureSpec(dtype=tf.float32)}
  MODEL_FEATURES = {**PairFeatureConverter.MODEL_FEATURES,
                    "teacher": FeatureSpec(dtype=tf.float32)}

  def __call__(self, ds, task_feature_lengths):
    if "teacher" not in task_feature_lengths:
      raise ConfigError("DistillFeatureConverter: task_feature_lengths needs 'teacher' (the "
                        "teacher's embedding size, TEACHER_DIM)")
    return super().__call__(ds, task_feature_lengths)

  def _convert_features(self, ds, task_feature_lengths):
    d = task_feature_lengths["teacher"]
    ds = seqio.utils.trim_and_pad_dataset(
        ds, {k: task_feature_lengths[k] for k in ("inputs", "targets")})
    return ds.map(lambda ex: {"left_tokens": ex["inputs"], "right_tokens": ex["targets"],
                              "left_lang": ex["inputs_lang"], "right_lang": ex["targets_lang"],
                              "teacher": tf.ensure_shape(ex["teacher"], [d])},
                  num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {**super().get_model_feature_lengths(task_feature_lengths),
            "teacher": task_feature_lengths["teacher"]}


class MultiViewFeatureConverter(seqio.FeatureConverter):
  """N-way examples for MPCL: views [V, L] (V translations, padded) -> views [V * L].

  The task pads/truncates each view to the task length L (`views` sequence
  dimension 1); the model reshapes [B, V * L] back to [B, V, L].
  """
  TASK_FEATURES = {"views": FeatureSpec(dtype=tf.int32, rank=2, sequence_dim=1)}
  MODEL_FEATURES = {"views": FeatureSpec(dtype=tf.int32)}
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, num_views: int = 2, pack: bool = False, **kwargs):
    if pack:
      raise ConfigError("MultiViewFeatureConverter does not pack")
    self.num_views = num_views
    super().__init__(pack=False, **kwargs)

  def _convert_features(self, ds, task_feature_lengths):
    v, length = self.num_views, task_feature_lengths["views"]

    def convert(ex):
      views = ex["views"]
      tf.debugging.assert_equal(tf.shape(views)[0], v,
                                message=f"examples must have num_views={v} views")
      return {"views": tf.reshape(views, [v * length])}
    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {"views": self.num_views * task_feature_lengths["views"]}


class MultiViewHardNegativeFeatureConverter(MultiViewFeatureConverter):
  """N-way examples with a hard negative (MPCL's hard-negative variant): the task's
  views [V + 1, L] hold the V views, then the hard negative
  (vmx.data.nway.NwayHardNegativeSource) -> views [V * L], hard_negative [L]."""
  MODEL_FEATURES = {"views": FeatureSpec(dtype=tf.int32),
                    "hard_negative": FeatureSpec(dtype=tf.int32)}
  hard_negatives = True   # vmx/data/pipeline.py checks it against the task's source

  def _convert_features(self, ds, task_feature_lengths):
    v, length = self.num_views, task_feature_lengths["views"]

    def convert(ex):
      rows = ex["views"]
      tf.debugging.assert_equal(tf.shape(rows)[0], v + 1,
                                message=f"examples must have num_views={v} views and a hard "
                                        f"negative")
      return {"views": tf.reshape(rows[:v], [v * length]), "hard_negative": rows[v]}
    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {**super().get_model_feature_lengths(task_feature_lengths),
            "hard_negative": task_feature_lengths["views"]}


class MonolingualFeatureConverter(seqio.FeatureConverter):
  """Single sentences (masked-LM text): inputs -> tokens [L] (zero-padded, truncated)."""
  TASK_FEATURES = {"inputs": FeatureSpec(dtype=tf.int32)}
  MODEL_FEATURES = {"tokens": FeatureSpec(dtype=tf.int32)}
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, pack: bool = False, **kwargs):
    if pack:
      raise ConfigError("MonolingualFeatureConverter does not pack: each row is one sentence")
    super().__init__(pack=False, **kwargs)

  def _convert_features(self, ds, task_feature_lengths):
    ds = seqio.utils.trim_and_pad_dataset(ds, {"inputs": task_feature_lengths["inputs"]})
    return ds.map(lambda ex: {"tokens": ex["inputs"]}, num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {"tokens": task_feature_lengths["inputs"]}
