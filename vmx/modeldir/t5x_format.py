"""t5x's own checkpoints, read without t5x: the parameters (`target`) of a
`checkpoint_<step>` directory written by t5x's trainer, in its Orbax layout
(`checkpoint_<step>/state/`, t5x's default) or its legacy one (`checkpoint_<step>/
checkpoint`: msgpack with arrays in TensorStore zarr directories). `Encoder.from_checkpoint`
and `restore_params` open a t5x run's MODEL_DIR through this module.
"""
from __future__ import annotations

import os
from typing import Mapping

import absl.logging
import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from flax import serialization

from vmx import storage
from vmx.errors import CheckpointError
from vmx.modeldir.layout import T5X_LEGACY_FILE, T5X_STATE_DIR


def is_t5x_checkpoint(step_dir) -> bool:
  d = storage.path(step_dir)
  return (d / T5X_STATE_DIR).is_dir() or (d / T5X_LEGACY_FILE).is_file()


def read_t5x_params(step_dir) -> dict:
  """The parameters (`target`) of a t5x checkpoint directory `checkpoint_<step>`, as a
  nested dict of numpy arrays (the vmx model's `params` tree)."""
  d = storage.path(step_dir)
  if (d / T5X_STATE_DIR).is_dir():
    level = absl.logging.get_verbosity()   # t5x writes no per-item metadata: orbax warns
    absl.logging.set_verbosity(absl.logging.ERROR)
    try:
      return _read_orbax(d)
    finally:
      absl.logging.set_verbosity(level)
  if (d / T5X_LEGACY_FILE).is_file():
    return _read_legacy(d)
  raise CheckpointError(f"{d}: neither a t5x Orbax checkpoint ({T5X_STATE_DIR}/) nor a "
                        f"legacy one ({T5X_LEGACY_FILE})")


def _read_orbax(d) -> dict:
  with ocp.PyTreeCheckpointer() as ckptr:
    meta = ckptr.metadata(d / T5X_STATE_DIR)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta
    if "target" not in tree:
      raise CheckpointError(f"{d / T5X_STATE_DIR}: no 'target' (a t5x checkpoint holds "
                            f"the parameters there; found {sorted(tree)[:6]})")
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                tree["target"])
    state = ckptr.restore(d / T5X_STATE_DIR, args=ocp.args.PyTreeRestore(
        item={"target": tree["target"]}, restore_args={"target": restore_args},
        partial_restore=True))
  return jax.tree.map(np.asarray, state["target"])


def _read_legacy(d) -> dict:
  """t5x's msgpack checkpoint: {'version', 'optimizer': {'target': ..., 'state': ...}};
  arrays stored apart are TensorStore specs (a dict with 'driver' and 'kvstore') whose
  path is relative to the checkpoint directory."""
  state = serialization.msgpack_restore((d / T5X_LEGACY_FILE).read_bytes())
  try:
    target = state["optimizer"]["target"]
  except (KeyError, TypeError):
    raise CheckpointError(f"{d / T5X_LEGACY_FILE}: no optimizer/target in this msgpack "
                          "(not a t5x checkpoint?)") from None

  def load(x):
    if isinstance(x, Mapping) and "driver" in x and "kvstore" in x:
      spec = dict(x)
      kv = dict(spec["kvstore"]) if isinstance(spec["kvstore"], Mapping) else {}
      rel = kv.get("path") or spec.pop("path", None)
      if storage.is_remote(d):
        bucket, _, prefix = os.fspath(d).split("://", 1)[1].partition("/")
        kv = {"driver": "gcs", "bucket": bucket, "path": f"{prefix}/{rel}"}
      else:
        kv = {"driver": "file", "path": os.path.join(os.fspath(d), rel)}
      spec["kvstore"] = kv
      return np.asarray(ts.open(spec, open=True, read=True).result().read().result())
    if isinstance(x, Mapping):
      return {k: load(v) for k, v in x.items()}
    return np.asarray(x)
  return load(target)
