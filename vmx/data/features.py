"""What a model's batches hold, without SeqIO: each feature converter's layout.

A `Layout` names the task features a converter reads and the model features it writes
(dtype, rank), and the model features' lengths for given task lengths. The trainer, the
token-cache reader and the benchmarks need only this, so a run whose token cache is built
never imports SeqIO or TensorFlow (vmx/data/pipeline.py); the SeqIO converters that write
the cache (vmx/data/feature_converters.py) take their specs from here: one place.

Models name their converter (`BaseModel.feature_converter()`, e.g. "PairFeatureConverter"
or ("MultiViewFeatureConverter", {"num_views": 4})); `layout(spec)` is its layout and
`Layout.converter()` the SeqIO converter, imported on use.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Mapping

import numpy as np

from vmx.errors import ConfigError

FEATURE_CONVERTERS = "vmx.data.feature_converters"


@dataclasses.dataclass(frozen=True)
class Spec:
  """One feature: numpy dtype name, rank (0 scalar, 1 sequence, 2 [views, length]) and, for
  rank 2, which dimension the task length applies to (SeqIO's `sequence_dim`)."""
  dtype: str = "int32"
  rank: int = 1
  sequence_dim: int = 0

  @property
  def np_dtype(self) -> np.dtype:
    return np.dtype(self.dtype)


class Layout:
  """A converter's features. Subclasses set NAME (the class in vmx.data.feature_converters),
  TASK_FEATURES, MODEL_FEATURES and `model_lengths`."""
  NAME = ""
  TASK_FEATURES: Mapping[str, Spec] = {}
  MODEL_FEATURES: Mapping[str, Spec] = {}
  num_views = None          # N-way layouts: the views a model reads
  hard_negatives = False    # ... and whether with a hard negative

  def __init__(self, **settings):
    self.settings = dict(settings)

  def model_lengths(self, task_lengths: Mapping[str, int]) -> dict:
    raise NotImplementedError

  def token_features(self) -> list[str]:
    """The model features that are token sequences (int32, rank 1): what packs."""
    return [k for k, s in self.MODEL_FEATURES.items() if s.dtype == "int32" and s.rank == 1]

  def converter_cls(self):
    """The SeqIO converter class that writes these features (a functools.partial with
    the layout's settings, if any; imports SeqIO and TensorFlow): FEATURE_CONVERTER_CLS."""
    cls = getattr(importlib.import_module(FEATURE_CONVERTERS), self.NAME)
    return functools.partial(cls, **self.settings) if self.settings else cls

  def converter(self):
    """An instance of `converter_cls()`."""
    return self.converter_cls()(pack=False)

  def describe(self) -> dict:
    return {"name": self.NAME, "settings": dict(sorted(self.settings.items()))}

  def __repr__(self):
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.settings.items()))
    return f"{type(self).__name__}({args})"


class PairLayout(Layout):
  """inputs, targets, inputs_lang, targets_lang -> left_tokens [L_in], right_tokens [L_tgt]
  (zero-padded, cut), left_lang, right_lang."""
  NAME = "PairFeatureConverter"
  TASK_FEATURES = {"inputs": Spec(), "targets": Spec(),
                   "inputs_lang": Spec(rank=0), "targets_lang": Spec(rank=0)}
  MODEL_FEATURES = {"left_tokens": Spec(), "right_tokens": Spec(),
                    "left_lang": Spec(rank=0), "right_lang": Spec(rank=0)}

  def model_lengths(self, task_lengths):
    return {"left_tokens": task_lengths["inputs"], "right_tokens": task_lengths["targets"],
            "left_lang": 1, "right_lang": 1}


class DistillLayout(PairLayout):
  """The pair features + teacher [D] float32 (task length D: the teacher's dimension)."""
  NAME = "DistillFeatureConverter"
  TASK_FEATURES = {**PairLayout.TASK_FEATURES, "teacher": Spec("float32")}
  MODEL_FEATURES = {**PairLayout.MODEL_FEATURES, "teacher": Spec("float32")}

  def model_lengths(self, task_lengths):
    if "teacher" not in task_lengths:
      raise ConfigError("DistillFeatureConverter: task_feature_lengths needs 'teacher' (the "
                        "teacher's embedding size, TEACHER_DIM)")
    return {**super().model_lengths(task_lengths), "teacher": task_lengths["teacher"]}


class MultiViewLayout(Layout):
  """N-way groups: views [V, L] -> views [V * L] (the model reshapes it back)."""
  NAME = "MultiViewFeatureConverter"
  TASK_FEATURES = {"views": Spec(rank=2, sequence_dim=1)}
  MODEL_FEATURES = {"views": Spec()}
  hard_negatives = False

  def __init__(self, num_views: int = 2):
    super().__init__(num_views=int(num_views))
    self.num_views = int(num_views)

  def model_lengths(self, task_lengths):
    return {"views": self.num_views * task_lengths["views"]}


class MultiViewHardNegativeLayout(MultiViewLayout):
  """N-way groups with a hard negative: views [V + 1, L] -> views [V * L],
  hard_negative [L]."""
  NAME = "MultiViewHardNegativeFeatureConverter"
  MODEL_FEATURES = {"views": Spec(), "hard_negative": Spec()}
  hard_negatives = True

  def model_lengths(self, task_lengths):
    return {**super().model_lengths(task_lengths), "hard_negative": task_lengths["views"]}


class MonolingualLayout(Layout):
  """Single sentences: inputs -> tokens [L] (zero-padded, cut)."""
  NAME = "MonolingualFeatureConverter"
  TASK_FEATURES = {"inputs": Spec()}
  MODEL_FEATURES = {"tokens": Spec()}

  def model_lengths(self, task_lengths):
    return {"tokens": task_lengths["inputs"]}


LAYOUTS = {c.NAME: c for c in (PairLayout, DistillLayout, MultiViewLayout,
                               MultiViewHardNegativeLayout, MonolingualLayout)}


def layout(spec) -> Layout:
  """The layout of a converter spec (its name, or (name, {keyword arguments})), of a
  layout, or of a SeqIO converter class, instance or functools.partial of one (what
  `FEATURE_CONVERTER_CLS` gives: vmx's converters name their layout as LAYOUT)."""
  if isinstance(spec, Layout):
    return spec
  if isinstance(spec, str) or isinstance(spec, tuple):
    name, kwargs = (spec, {}) if isinstance(spec, str) else spec
    if name not in LAYOUTS:
      raise ConfigError(f"unknown feature converter {name!r}; known: {sorted(LAYOUTS)}")
    return LAYOUTS[name](**kwargs)
  if isinstance(spec, functools.partial):
    return spec.func.LAYOUT(**spec.keywords)
  if isinstance(spec, type):
    return spec.LAYOUT()
  return spec.layout()   # a converter instance


def layouts(spec):
  """`layout` of one spec, or {task key: layout} of a model reading several tasks."""
  if isinstance(spec, Mapping):
    return {k: layout(v) for k, v in spec.items()}
  return layout(spec)
