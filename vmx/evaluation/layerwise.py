"""Sentence vectors from one layer of a checkpoint's encoder (InfoXLM Fig. 1, §4.2).

InfoXLM's Fig. 1 scores Tatoeba (xx->en, its 14 languages with parallel data) with the
averaged hidden states of each layer of the encoder. `layer_encoder(encoder, k)` is a vmx
`Encoder` over the SAME parameters whose vector is the mean over the valid tokens of layer
k's hidden states (L2-normalized), whatever the model's own retrieval vector is: the model
is wrapped (`LayerModel`: the two things `Encoder` asks a model for, `encode_tokens` and
`uses_languages`), nothing is re-loaded or copied.

Layer k is the output of the encoder's first k layers as `TransformerEncoder.__call__(...,
depth=k)` gives it: below the top it is taken before any final norm; layer N (the top)
after it, so a model whose own vector is the mean of its last layer gives the same vectors
at k = N. The encoder read is the model module's `encoder` field with its parameters at
`params['encoder']` (InfoXLM, EMMA-X, the dual encoders); a model that keeps its encoder
elsewhere is refused with a ConfigError saying so. A scanned stack (one `layers` array
per parameter, or `layers_from_<s>` segments) is read unscanned: the wrapper's encoder
runs per-layer modules over the stacked arrays' rows (`unscanned_params`), so any layer
can be read whatever the run's `scan_boundaries`.
"""
from __future__ import annotations

import re

from flax import traverse_util

from vmx import encoders
from vmx.errors import ConfigError
from vmx.losses import l2_normalize
from vmx.models.base import BaseModel, SentenceVector

_STACK = re.compile(r"^(layers|layers_from_(\d+))$")


def unscanned_params(params: dict) -> dict:
  """An encoder's parameters with each scanned stack (`layers/x` [N, ...] or
  `layers_from_<s>/x` [n, ...]) as per-layer modules `layers_<i>/x`."""
  out = {}
  for path, a in traverse_util.flatten_dict(params).items():
    m = _STACK.match(path[0])
    if not m:
      out[path] = a
      continue
    start = int(m.group(2) or 0)
    for i in range(a.shape[0]):
      out[(f"layers_{start + i}",) + path[1:]] = a[i]
  return traverse_util.unflatten_dict(out)


def encoder_module(model) -> encoders.TransformerEncoder:
  """The TransformerEncoder of `model`'s sentence vector (its `sentence_vector()`)."""
  try:
    enc = model.sentence_vector().encoder if isinstance(model, BaseModel) else None
  except ConfigError:
    enc = None
  if not isinstance(enc, encoders.TransformerEncoder):
    raise ConfigError(f"per-layer evaluation reads the encoder of the model's sentence "
                      f"vector (a TransformerEncoder); {type(model).__name__} has none")
  return enc


class LayerModel:
  """The model-side interface `Encoder` uses, with the sentence vector of layer `layer`
  of `model`'s encoder pooled by `pooling` (default the mean, as InfoXLM §4.2)."""

  def __init__(self, model, layer: int, pooling: str = "mean"):
    enc = encoder_module(model)
    if not isinstance(layer, int) or isinstance(layer, bool) or not 1 <= layer <= enc.depth:
      raise ConfigError(f"layer={layer!r}: the encoder has layers 1 .. {enc.depth}")
    self.model, self.layer, self.pooling = model, layer, pooling
    self.encoder = enc.clone(parent=None, scan_layers=False, scan_boundaries=(),
                             remat_policy="none")
    self.uses_languages = model.uses_languages

  def sentence_vector(self) -> SentenceVector:
    return SentenceVector(self.encoder, self.pooling, self.layer)

  def check_params(self, params):
    """ConfigError unless `params` keep the encoder at params['encoder']."""
    if params is not None and "encoder" not in params:
      raise ConfigError(f"per-layer evaluation reads the encoder's parameters at "
                        f"params['encoder']; this {type(self.model).__name__} keeps them "
                        f"under {sorted(params)}")

  def token_sum_table(self, params):
    """None: a layer's vector comes through attention, not a sum of token rows (`Encoder`
    takes its jitted path; vmx/models/base.py)."""
    del params
    return None

  def encode_tokens(self, params, tokens_BxL, lang_B):
    self.check_params(params)
    # (traced under Encoder's jit: the per-layer views of the stacked arrays are slices)
    hidden, valid = self.encoder.apply({"params": unscanned_params(params["encoder"])},
                                       tokens_BxL,
                                       lang_B if self.encoder.num_languages else None,
                                       depth=self.layer)
    return l2_normalize(encoders.pool(hidden, valid, self.pooling))


def num_layers(encoder) -> int:
  """How many layers `encoder` (a vmx Encoder) runs: the layers Fig. 1 can read."""
  return encoder_module(_model_of(encoder)).depth


def _model_of(encoder):
  model = getattr(encoder, "model", None)
  if model is None or not hasattr(encoder, "params"):
    raise ConfigError(f"per-layer evaluation needs a vmx Encoder (Encoder.from_checkpoint), "
                      f"got {type(encoder).__name__}")
  return model


def layer_encoder(encoder, layer: int, pooling: str = "mean"):
  """A vmx `Encoder` like `encoder` (same parameters, tokenizer, languages, max length,
  batch size) whose vectors are layer `layer` pooled with `pooling`."""
  layer_model = LayerModel(_model_of(encoder), layer, pooling)
  layer_model.check_params(encoder.params)
  enc = type(encoder)(layer_model, encoder.params,
                      encoder.tokenizer, encoder.languages, encoder.max_length,
                      encoder.batch_size)
  enc.name = f"{getattr(encoder, 'name', type(encoder).__name__)}@layer{layer}"
  enc.revision = getattr(encoder, "revision", None)
  return enc
