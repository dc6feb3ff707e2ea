"""Which sentence vector an encoder gives: what every result file and protocol figure names
(`"vector": "layer 7, mean"`, `"CLS of the last layer"`, ...).

Papers score different vectors of the same network (InfoXLM §4.2 retrieves with the mean
of layer 7, its XLCO trains layer 8's CLS; EMMA-X and MPCL use the last layer's CLS), so a
figure without its vector cannot be compared. `describe(encoder)` reads it off a vmx
`Encoder`'s model (its `sentence_vector()`): the pooled layer (an intermediate one as
`layer k, <pooling>`, the top one as `<pooling> of the last layer`), the pooling (`CLS`,
`mean`, BERT's `pooler`), and what follows it (a projection head, VMSST's Gaussian head). Any other encoder (an object
with `encode()`) is named as such: vmx cannot see inside it.
"""
from __future__ import annotations

from vmx.errors import ConfigError
from vmx.evaluation import layerwise
from vmx.models.base import BaseModel

POOLING_NAMES = {"first": "CLS", "mean": "mean", "pooler": "pooler (tanh dense on the CLS)"}
OTHER_ENCODER = "the encoder's own vector (its encode(); not a vmx model)"


def name(layer: int, num_layers: int, pooling: str, then: str = "") -> str:
  """`layer k, mean` below the top, `CLS of the last layer` at it; `then`: what follows."""
  pool = POOLING_NAMES.get(pooling, pooling)
  base = f"{pool} of the last layer" if layer == num_layers else f"layer {layer}, {pool}"
  return f"{base}, {then}" if then else base


def of_model(model) -> str:
  """The retrieval vector of a vmx model (what its `encode_tokens` returns, normalized):
  the model's own account of it (`sentence_vector()`, vmx/models/base.py)."""
  if not isinstance(model, (BaseModel, layerwise.LayerModel)):
    return f"the retrieval vector of {type(model).__name__}"
  try:
    v = model.sentence_vector()
  except ConfigError:
    return f"the retrieval vector of {type(model).__name__}"
  if v.encoder.family == "static":    # vmx/static_encoder.py: no layers
    base = f"{POOLING_NAMES.get(v.pooling, v.pooling)} of the static token vectors"
    return f"{base}, {v.then}" if v.then else base
  return name(v.layer, v.encoder.num_layers, v.pooling, v.then)


def describe(encoder) -> str:
  """The sentence vector `encoder` gives (a vmx `Encoder`, or any object with `encode`)."""
  model = getattr(encoder, "model", None)
  if model is None or not hasattr(model, "encode_tokens"):
    return OTHER_ENCODER
  dim = getattr(encoder, "dim", None)   # a vmx Encoder serving a Matryoshka prefix
  quantized = getattr(encoder, "quantized", None)   # ... or its int8 / binary geometry
  return (of_model(model) + (f", its first {dim} dimensions renormalized" if dim else "")
          + (f", quantized to {quantized} and mapped back (vmx/quantize.py)" if quantized
             else ""))
