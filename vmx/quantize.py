"""int8 and binary sentence vectors, calibrated once per model (sentence-transformers'
`quantize_embeddings`; Shakir, Aarsen & Lee 2024, "Binary and Scalar Embedding
Quantization for Significantly Faster & Cheaper Retrieval").

- **int8**: each dimension's range [lo, hi] over a calibration corpus's vectors is cut into
  256 equal bins: q = floor((x - lo) / (hi - lo) * 256) - 128, clipped to [-128, 127] (1/4
  of float32's bytes; a value outside the calibration's range goes to the end bin). The ranges are stored beside the model (MODEL_DIR/quantization.json,
  one entry a vector size: `launch/calibrate.py`), so every call, machine and corpus
  quantizes alike; sentence-transformers computes them from each call's own vectors unless
  given them, which makes a vector depend on its batch.
- **binary** / **ubinary**: each dimension's sign, 8 to a byte (`np.packbits`: 1/32 of
  float32's bytes), as sentence-transformers gives them: ubinary the packed bytes (uint8),
  binary the same minus 128 (int8); no calibration.

`dequantize` maps them back to float vectors, whose geometry the scores then use: an
int8 value to the centre of its bin; a bit to +1 / -1 (the cosine of two +-1 vectors is
1 - 2 hamming / D, so a cosine search on them is a Hamming search).
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from vmx import storage
from vmx.errors import InputError

PRECISIONS = ("float32", "int8", "binary", "ubinary")
FILE = "quantization.json"


def calibrate(emb_NxD: np.ndarray) -> dict:
  """The int8 ranges of these vectors: {"min": [D], "max": [D], "sentences": N}."""
  emb = np.asarray(emb_NxD, np.float32)
  if emb.ndim != 2 or len(emb) < 2:
    raise InputError(f"calibration needs [N >= 2, D] vectors, got shape {emb.shape}")
  return {"min": emb.min(0).tolist(), "max": emb.max(0).tolist(), "sentences": len(emb)}


def save(model_dir, ranges: dict):
  """Adds `ranges` (for vectors of their size) to MODEL_DIR/quantization.json."""
  path = storage.path(model_dir) / FILE
  table = json.loads(path.read_text()) if path.exists() else {}
  table[str(len(ranges["min"]))] = ranges
  storage.write_atomic(path, json.dumps(table))


def load(model_dir) -> dict:
  """{vector size: ranges} of MODEL_DIR/quantization.json ({} when there is none)."""
  path = storage.path(model_dir) / FILE
  if not path.exists():
    return {}
  return {int(k): v for k, v in json.loads(path.read_text()).items()}


def _bins(ranges: dict):
  """(lo [D], the bin width [D])."""
  lo = np.asarray(ranges["min"], np.float64)
  width = np.maximum(np.asarray(ranges["max"], np.float64) - lo, 1e-12)
  return lo, width / 256.0


def quantize(emb_NxD: np.ndarray, precision: str, ranges: Optional[dict] = None):
  """float32 rows as `precision`: int8 [N, D] (needs `ranges`); ubinary uint8 [N, D/8],
  binary the same as int8 (minus 128)."""
  emb = np.asarray(emb_NxD, np.float32)
  if precision == "float32":
    return emb
  if precision in ("binary", "ubinary"):
    packed = np.packbits(emb > 0, axis=-1)
    return packed if precision == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
  if precision != "int8":
    raise InputError(f"precision={precision!r}: expected one of {PRECISIONS}")
  if ranges is None:
    raise InputError("int8 vectors need the model's calibration (MODEL_DIR/quantization.json:"
                     " python launch/calibrate.py --checkpoint_dir=DIR --corpus=FILE)")
  if len(ranges["min"]) != emb.shape[-1]:
    raise InputError(f"the int8 calibration is for {len(ranges['min'])}-dimensional vectors, "
                     f"these have {emb.shape[-1]} (calibrate this size)")
  lo, step = _bins(ranges)
  return (np.clip(np.floor((emb - lo) / step), 0, 255) - 128).astype(np.int8)


def dequantize(q: np.ndarray, precision: str, dim: int, ranges: Optional[dict] = None):
  """Float32 [N, dim] rows of quantized vectors, unit length (see the module's docstring)."""
  if precision == "float32":
    out = np.asarray(q, np.float32)
  elif precision in ("binary", "ubinary"):
    packed = (np.asarray(q, np.uint8) if precision == "ubinary" else
              (np.asarray(q, np.int16) + 128).astype(np.uint8))
    out = np.unpackbits(packed, axis=-1)[:, :dim].astype(np.float32) * 2 - 1
  else:
    lo, step = _bins(ranges)
    out = ((np.asarray(q, np.float64) + 128.5) * step + lo).astype(np.float32)
  return out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
