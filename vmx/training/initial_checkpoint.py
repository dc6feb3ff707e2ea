"""Starting a run from pretrained parameters (t5x's `INITIAL_CHECKPOINT_PATH`).

At step 0 of a new run (MODEL_DIR has no checkpoint), the parameters of
`initial_checkpoint_path` (a vmx model directory: a finished run, or one written by
launch/import_checkpoint.py) that the model also has are loaded; the model's other
parameters (a VMSST decoder, language embeddings, an EMS XTR head, projections) keep
their fresh initialization, and the optimizer state is new. A table of loaded, new
and ignored parameters is printed. A restarted run resumes from MODEL_DIR's own
checkpoints and never reads the initial one again (vmx/training/trainer.py).

Names: a target parameter path (e.g. `semantic_encoder/layers_0/attention/query`) is
looked up under the name that the first matching rule of `assignment` gives
(`(regex, replacement)` pairs, full match, as in t5x's `assignment_map`), then under
its own name (so a finished run of the same model loads as itself). Models declare their
default rules in `INITIAL_CHECKPOINT_ASSIGNMENT`, so an imported dual encoder's `encoder/...` fills VMSST's semantic and language
encoders and EMS's sentence encoder. Scanned and unscanned layer stacks convert
both ways (`layers/x` [N, ...] <-> `layers_<i>/x`), and into scanned segments
(`layers_from_<s>/x` [n, ...] <- `layers_<s..s+n-1>/x` or rows s..s+n-1 of `layers/x`).
An imported model directory's T5 / mT5 decoder (`decoder/`, launch/import_checkpoint.py
--decoder) and masked-LM head (`mlm_head/`, XLM-R's lm_head) are read with it, under the
names `decoder/...` and `mlm_head/...`.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Optional, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from vmx import storage
from vmx.errors import CheckpointError, ConfigError
from vmx.modeldir.checkpoints import flatten, read_only_manager, restore_intact
from vmx.modeldir.layout import PRETRAINED_DECODER_DIR, PRETRAINED_MLM_HEAD_DIR

_LAYER = re.compile(r"(^|/)layers_(\d+)(/|$)")
_SEGMENT = re.compile(r"(^|/)layers_from_(\d+)(/|$)")


def load(state_params, shardings, path, assignment: Sequence[tuple[str, str]] = ()):
  """`state_params` with every parameter found in the vmx model directory `path` replaced
  (placed with `shardings`, on any number of processes); prints the summary table."""
  source, step = read_params(path)
  target = flatten(state_params)
  loaded, new, ignored = assign({k: v.shape for k, v in target.items()}, source, assignment)
  print(f"[vmx] initial parameters from {path} (checkpoint_{step}):\n"
        + summary_table(loaded, new, ignored, source), flush=True)
  if not loaded:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH={str(path)!r}: none of its {len(source)} "
                      f"arrays is a parameter of this model (names: {', '.join(list(source)[:3])}"
                      f"…); set the model's INITIAL_CHECKPOINT_ASSIGNMENT rules")
  sh = flatten(shardings)
  for k, a in loaded.items():
    a = np.asarray(a, target[k].dtype)
    target[k] = jax.make_array_from_callback(a.shape, sh[k], lambda idx, a=a: a[idx])
  return traverse_util.unflatten_dict(target, sep="/")


def read_params(model_dir) -> tuple[dict, int]:
  """(flat {path: numpy array}, step) of the newest intact checkpoint of a vmx model
  directory, on the host, whatever mesh it was saved from."""

  model_dir = storage.path(model_dir)
  if not model_dir.is_dir():
    raise CheckpointError(f"INITIAL_CHECKPOINT_PATH={str(model_dir)!r}: no such directory")
  mngr = read_only_manager(model_dir)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])

  def restore(step):
    meta = mngr.item_metadata(step)["params"]
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          meta)
    return mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(target)))["params"]

  try:
    step, params = restore_intact(model_dir, mngr.all_steps(), restore)
  finally:
    mngr.close()
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  for part in (PRETRAINED_DECODER_DIR, PRETRAINED_MLM_HEAD_DIR):
    if (model_dir / part).is_dir():
      sub, _ = read_params(model_dir / part)
      flat.update({f"{part}/{k}": v for k, v in sub.items()})
  return flat, step


def source_name(path: str, assignment: Sequence[tuple[str, str]]) -> str:
  for pattern, replacement in assignment:
    if re.fullmatch(pattern, path):
      return re.sub(pattern, replacement, path)
  return path


def lookup(name: str, shape: tuple, source: dict) -> Optional[tuple[np.ndarray, list[str]]]:
  """(array, source paths used) for `name` in `source`, converting between scanned and
  unscanned layer stacks; None if absent."""
  if name in source:
    return source[name], [name]
  if re.search(r"(^|/)layers(/|$)", name):                # target scanned, source per layer
    names = [re.sub(r"(^|/)layers(/|$)", rf"\1layers_{i}\2", name, count=1)
             for i in range(shape[0])]
    if all(n in source for n in names):
      return np.stack([source[n] for n in names]), names
  seg = _SEGMENT.search(name)
  if seg:                     # target: a scanned segment (layers start .. start + n - 1)
    start, n = int(seg.group(2)), shape[0]
    names = [name[:seg.start()] + f"{seg.group(1)}layers_{start + i}{seg.group(3)}" +
             name[seg.end():] for i in range(n)]
    if all(x in source for x in names):
      return np.stack([source[x] for x in names]), names
    stacked = name[:seg.start()] + f"{seg.group(1)}layers{seg.group(3)}" + name[seg.end():]
    if stacked in source and source[stacked].shape[0] >= start + n:
      return source[stacked][start:start + n], [stacked]
  m = _LAYER.search(name)
  if m:                                                   # target per layer, source scanned
    stacked = name[:m.start()] + f"{m.group(1)}layers{m.group(3)}" + name[m.end():]
    if stacked in source and source[stacked].shape[0] > int(m.group(2)):
      return source[stacked][int(m.group(2))], [stacked]
  return None


def assign(target_shapes: dict, source: dict, assignment: Sequence[tuple[str, str]] = ()
           ) -> tuple[dict, list[str], list[str]]:
  """({target path: array} loaded, target paths left new, source paths ignored).

  Each target is looked up under its rule's name, then under its own: a rule cannot keep
  a parameter fresh that the source holds under the parameter's own name.

  A parameter found under its source name with another shape is a ConfigError (a
  different architecture or vocabulary), listing all of them.
  """
  loaded, new, used, wrong = {}, [], set(), []
  for path, shape in target_shapes.items():
    hit = None
    for name in dict.fromkeys((source_name(path, assignment), path)):
      hit = lookup(name, tuple(shape), source)
      if hit is not None:
        break
    if hit is None:
      new.append(path)
      continue
    array, names = hit
    if tuple(array.shape) != tuple(shape):
      wrong.append(f"{path} {tuple(shape)} <- {names[0]} {tuple(array.shape)}")
      continue
    loaded[path] = array
    used.update(names)
  if wrong:
    raise ConfigError(f"the initial checkpoint's parameters do not fit the model "
                      f"({len(wrong)}): {'; '.join(wrong[:6])}{' …' if len(wrong) > 6 else ''}"
                      f". Same architecture sizes and vocabulary (VOCABULARY = its "
                      f"tokenizer) as the initial checkpoint?")
  ignored = sorted(set(source) - used)
  return loaded, new, ignored


def summary_table(loaded: dict, new: Sequence[str], ignored: Sequence[str], source: dict
                  ) -> str:
  """One row per parameter group (layer indices folded into `layers_*`)."""
  rows = defaultdict(lambda: [0, 0])
  for label, paths in (("loaded", loaded), ("new", new), ("ignored", ignored)):
    for p in paths:
      row = rows[(label, _LAYER.sub(r"\1layers_*\3", p))]
      row[0] += 1
      row[1] += {"loaded": loaded, "ignored": source}.get(label, {}).get(p, np.zeros(0)).size
  lines = [f"{'':8} {'parameter':64} {'arrays':>6} {'values':>12}"]
  for (label, name), (n, size) in sorted(rows.items()):
    lines.append(f"{label:8} {name:64} {n:6d} {size if size else '':>12}")
  return "\n".join(lines)
