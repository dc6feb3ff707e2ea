"""t5x-compatible model interface and (de)serialization of model configs.

A vmx model wraps a Flax linen module and exposes t5x's `BaseModel` methods:
  loss_fn(params, batch, dropout_rng) -> (loss, metrics)
  eval_fn(params, batch) -> (loss, metrics)
  score_batch(params, batch, return_intermediates=False) -> scores [B]
  predict_batch_with_aux(params, batch, rng=None) -> (predictions, aux)
  get_initial_variables(rng, input_shapes, input_types=None) -> variables
  FEATURE_CONVERTER_CLS
Metrics are clu metric objects (t5x's convention). Models with state that is
not trained by gradients (momentum encoders, queues of past embeddings) set
`HAS_MUTABLES = True`, keep that state in the `flax_mutables` of the train
state, and implement `loss_fn(params, batch, dropout_rng, flax_mutables)`
returning `(loss, (metrics, new_flax_mutables))`, t5x's flax_mutables path.

`FEATURE_CONVERTER_CLS` is resolved lazily, so that importing a model (for
inference) never imports seqio/TensorFlow.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn


class _LazyClass:
  """Descriptor resolving 'module:Name' on first access (keeps seqio out of imports)."""

  def __init__(self, path: str):
    self.path = path

  def __get__(self, obj, owner):
    mod, name = self.path.split(":")
    return getattr(importlib.import_module(mod), name)


class BaseModel(abc.ABC):
  FEATURE_CONVERTER_CLS: Any = None
  HAS_MUTABLES = False
  # Whether the model reads language ids (then inference must be told the language).
  uses_languages = False
  # (regex, replacement) rules naming, for each parameter path of this model, the path
  # to load it from in an initial checkpoint (a dual encoder's `encoder/...`, e.g. an
  # imported Hugging Face checkpoint); see vmx/training/initial_checkpoint.py.
  INITIAL_CHECKPOINT_ASSIGNMENT: tuple = ()

  def __init__(self, module: nn.Module):
    self.module = module

  @abc.abstractmethod
  def loss_fn(self, params, batch: Mapping[str, jax.Array], dropout_rng):
    ...

  def eval_fn(self, params, batch: Mapping[str, jax.Array]):
    return self.loss_fn(params, batch, None)

  @abc.abstractmethod
  def score_batch(self, params, batch, return_intermediates: bool = False):
    ...

  @abc.abstractmethod
  def predict_batch_with_aux(self, params, batch, rng=None, **kwargs):
    ...

  def predict_batch(self, params, batch, rng=None, **kwargs):
    return self.predict_batch_with_aux(params, batch, rng=rng, **kwargs)[0]

  @abc.abstractmethod
  def get_initial_variables(self, rng, input_shapes: Mapping[str, tuple],
                            input_types: Mapping[str, Any] | None = None):
    ...

  def get_config(self) -> dict:
    """JSON-serializable description that `model_from_config` rebuilds."""
    return to_config(self)


# ----------------------------------------------------------------------------
# Config (de)serialization: objects whose constructor arguments are their
# dataclass fields (linen modules) or listed in CONFIG_FIELDS (model classes).

_SKIP_FIELDS = ("parent", "name")


def _qualname(obj) -> str:
  cls = type(obj)
  return f"{cls.__module__}:{cls.__qualname__}"


def to_config(obj):
  if isinstance(obj, (str, int, float, bool)) or obj is None:
    return obj
  if isinstance(obj, (list, tuple)):
    return [to_config(x) for x in obj]
  if isinstance(obj, dict):
    return {k: to_config(v) for k, v in obj.items()}
  if isinstance(obj, type):  # jnp.float32, jnp.bfloat16, ...
    return {"__dtype__": jnp.dtype(obj).name}
  if hasattr(obj, "CONFIG_FIELDS"):
    fields = {f: getattr(obj, f) for f in obj.CONFIG_FIELDS}
  elif dataclasses.is_dataclass(obj):
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
              if f.name not in _SKIP_FIELDS and f.init}
  else:
    raise TypeError(f"cannot serialize {obj!r} into a model config")
  return {"__class__": _qualname(obj), **{k: to_config(v) for k, v in fields.items()}}


def model_from_config(cfg):
  if isinstance(cfg, list):
    return tuple(model_from_config(x) for x in cfg)
  if not isinstance(cfg, dict):
    return cfg
  if "__dtype__" in cfg:
    return jnp.dtype(cfg["__dtype__"]).type
  if "__class__" not in cfg:
    return {k: model_from_config(v) for k, v in cfg.items()}
  mod, name = cfg["__class__"].split(":")
  cls = getattr(importlib.import_module(mod), name)
  kwargs = {k: model_from_config(v) for k, v in cfg.items() if k != "__class__"}
  return cls(**kwargs)
