"""SeqIO feature converters: task features -> model features (what writes the token cache
and feeds the `seqio` reader). Their features and lengths are vmx/data/features.py's
layouts, which the trainer reads without SeqIO."""
from __future__ import annotations

import seqio
import tensorflow as tf

from vmx.data import features
from vmx.errors import ConfigError

FeatureSpec = seqio.FeatureConverter.FeatureSpec


def _specs(specs) -> dict:
  return {k: FeatureSpec(dtype=tf.as_dtype(s.dtype), rank=s.rank, sequence_dim=s.sequence_dim)
          for k, s in specs.items()}


class _Converter(seqio.FeatureConverter):
  """A converter whose features are its LAYOUT's; one row per example (no SeqIO packing:
  vmx packs after the cache, vmx/data/packing.py)."""
  LAYOUT = features.Layout
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, pack: bool = False, **kwargs):
    if pack:
      raise ConfigError(f"{type(self).__name__} does not pack in SeqIO: each row is one "
                        f"example (vmx packs its batches: PACKING)")
    super().__init__(pack=False, **kwargs)

  def layout(self) -> features.Layout:
    return self.LAYOUT()

  def get_model_feature_lengths(self, task_feature_lengths):
    return self.layout().model_lengths(task_feature_lengths)


class PairFeatureConverter(_Converter):
  """Translation pairs for dual encoders (and any model reading both sides): see
  features.PairLayout."""
  LAYOUT = features.PairLayout
  TASK_FEATURES = _specs(LAYOUT.TASK_FEATURES)
  MODEL_FEATURES = _specs(LAYOUT.MODEL_FEATURES)
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


class DistillFeatureConverter(PairFeatureConverter):
  """Pairs with the teacher's embedding of the pivot side: features.DistillLayout."""
  LAYOUT = features.DistillLayout
  TASK_FEATURES = _specs(LAYOUT.TASK_FEATURES)
  MODEL_FEATURES = _specs(LAYOUT.MODEL_FEATURES)

  def __call__(self, ds, task_feature_lengths):
    self.layout().model_lengths(task_feature_lengths)   # ConfigError without 'teacher'
    return super().__call__(ds, task_feature_lengths)

  def _convert_features(self, ds, task_feature_lengths):
    d = task_feature_lengths["teacher"]
    ds = seqio.utils.trim_and_pad_dataset(
        ds, {k: task_feature_lengths[k] for k in ("inputs", "targets")})
    return ds.map(lambda ex: {"left_tokens": ex["inputs"], "right_tokens": ex["targets"],
                              "left_lang": ex["inputs_lang"], "right_lang": ex["targets_lang"],
                              "teacher": tf.ensure_shape(ex["teacher"], [d])},
                  num_parallel_calls=tf.data.AUTOTUNE)


class MultiViewFeatureConverter(_Converter):
  """N-way examples for MPCL: views [V, L] (V translations, padded) -> views [V * L].

  The task pads/truncates each view to the task length L (`views` sequence
  dimension 1); the model reshapes [B, V * L] back to [B, V, L].
  """
  LAYOUT = features.MultiViewLayout
  TASK_FEATURES = _specs(LAYOUT.TASK_FEATURES)
  MODEL_FEATURES = _specs(LAYOUT.MODEL_FEATURES)
  hard_negatives = False   # vmx/data/pipeline.py checks it against the task's source

  def __init__(self, num_views: int = 2, pack: bool = False, **kwargs):
    self.num_views = num_views
    super().__init__(pack=pack, **kwargs)

  def layout(self) -> features.Layout:
    return self.LAYOUT(num_views=self.num_views)

  def _convert_features(self, ds, task_feature_lengths):
    v, length = self.num_views, task_feature_lengths["views"]

    def convert(ex):
      views = ex["views"]
      tf.debugging.assert_equal(tf.shape(views)[0], v,
                                message=f"examples must have num_views={v} views")
      return {"views": tf.reshape(views, [v * length])}
    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)


class MultiViewHardNegativeFeatureConverter(MultiViewFeatureConverter):
  """N-way examples with a hard negative (MPCL's hard-negative variant): the task's
  views [V + 1, L] hold the V views, then the hard negative
  (vmx.data.nway.NwayHardNegativeSource) -> views [V * L], hard_negative [L]."""
  LAYOUT = features.MultiViewHardNegativeLayout
  MODEL_FEATURES = _specs(LAYOUT.MODEL_FEATURES)
  hard_negatives = True

  def _convert_features(self, ds, task_feature_lengths):
    v, length = self.num_views, task_feature_lengths["views"]

    def convert(ex):
      rows = ex["views"]
      tf.debugging.assert_equal(tf.shape(rows)[0], v + 1,
                                message=f"examples must have num_views={v} views and a hard "
                                        f"negative")
      return {"views": tf.reshape(rows[:v], [v * length]), "hard_negative": rows[v]}
    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)


class MonolingualFeatureConverter(_Converter):
  """Single sentences (masked-LM text): inputs -> tokens [L] (zero-padded, truncated)."""
  LAYOUT = features.MonolingualLayout
  TASK_FEATURES = _specs(LAYOUT.TASK_FEATURES)
  MODEL_FEATURES = _specs(LAYOUT.MODEL_FEATURES)

  def _convert_features(self, ds, task_feature_lengths):
    ds = seqio.utils.trim_and_pad_dataset(ds, {"inputs": task_feature_lengths["inputs"]})
    return ds.map(lambda ex: {"tokens": ex["inputs"]}, num_parallel_calls=tf.data.AUTOTUNE)
