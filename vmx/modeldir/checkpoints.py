"""Orbax checkpoints in t5x's layout: MODEL_DIR/checkpoint_<step>/{params,train_state,data}
(names: vmx/modeldir/layout.py).

`params` alone is what inference restores; `train_state` holds step, optimizer
state, flax_mutables and the RNG key; `data` is the input position (JSON).

Integrity: once a checkpoint is committed, process 0 writes
`checkpoint_<step>/vmx_checksums.json` (sha256 and size of every file in it).
Restoring verifies it: a damaged checkpoint (a flipped bit, a truncated or missing
file, or one orbax cannot read) is reported, moved to `MODEL_DIR/damaged/` (kept,
never deleted) and the previous intact checkpoint is used; with none intact, a
`CheckpointError`. A checkpoint without the file (a kill between orbax's commit and
the manifest) is restored unverified, with a warning. Saves are synchronous, so
the manifest follows the commit at once.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, Callable, Optional

import absl.logging
import flax
import gin
import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from vmx import storage
from vmx.errors import CheckpointError, ConfigError, NonFiniteError
from vmx.gin_utils import check_range, positive_int
from vmx.modeldir import t5x_format
from vmx.modeldir.layout import (BEST_RECORD, CHECKPOINT_ITEMS, CHECKPOINT_PREFIX, DAMAGED_DIR,
                                 LOCK_FILE, MANIFEST, best_dir, step_dir)

@gin.configurable
@dataclasses.dataclass
class CheckpointConfig:
  period: int = 1000           # save every `period` steps (and at the end)
  keep: Optional[int] = 3      # newest checkpoints kept (None: all)
  restore: bool = True         # resume from the latest checkpoint in model_dir

  def __post_init__(self):
    check_range(positive_int(self.period), "CheckpointConfig", "period", self.period,
                "a positive number of steps")
    check_range(self.keep is None or positive_int(self.keep), "CheckpointConfig", "keep",
                self.keep, "None (keep all) or a positive integer")


# ----------------------------------------------------------------------------
# Checksum manifests.

def read_only_manager(model_dir, item_names=("params",)):
  """An orbax CheckpointManager that reads a vmx model_dir's checkpoints, without orbax's
  warnings that a read-only manager is read-only (noise in every Encoder and notebook)."""
  level = absl.logging.get_verbosity()
  absl.logging.set_verbosity(absl.logging.ERROR)
  try:
    return ocp.CheckpointManager(storage.path(model_dir), item_names=item_names,
                                 options=ocp.CheckpointManagerOptions(
                                     step_prefix=CHECKPOINT_PREFIX, read_only=True))
  finally:
    absl.logging.set_verbosity(level)


def write_manifest(directory):
  """sha256 + size of every file under a committed checkpoint directory (atomic write)."""
  files = {rel: {"bytes": p.stat().length, "sha256": storage.sha256(p)}
           for rel, p in storage.files_under(directory) if p.name != MANIFEST}
  return storage.write_atomic(storage.path(directory) / MANIFEST,
                              json.dumps({"files": files}, indent=0, sort_keys=True))


def verify(directory) -> Optional[str]:
  """None if the checkpoint matches its manifest; 'unverified' without one; else what
  is wrong (first few files)."""
  directory = storage.path(directory)
  path = directory / MANIFEST
  if not directory.is_dir():
    return f"{directory} is not a directory"
  if not path.exists():
    return "unverified"
  try:
    files = json.loads(path.read_text())["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"{path}: unreadable checksum manifest ({e})"
  problems = []
  for rel, want in sorted(files.items()):
    p = directory / rel
    if not p.is_file():
      problems.append(f"{rel} missing")
    elif p.stat().length != want["bytes"]:
      problems.append(f"{rel} has {p.stat().length} bytes, expected {want['bytes']}")
    elif storage.sha256(p) != want["sha256"]:
      problems.append(f"{rel} checksum mismatch")
  if problems:
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more
  return None


def _warn(msg: str):
  print(f"[vmx] {msg}", file=sys.stderr, flush=True)


def _live_writer(model_dir) -> Optional[str]:
  """The trainer that holds MODEL_DIR's lock and still runs ("host pid N"), or None."""
  try:
    lock = json.loads((storage.path(model_dir) / LOCK_FILE).read_text())
  except (OSError, ValueError):
    return None
  if storage.writer_gone(lock.get("host"), lock.get("pid"), lock.get("refreshed", 0)):
    return None
  return f"{lock.get('host')} pid {lock.get('pid')}"


MANIFEST_WAIT_S = 60.0


def _await_manifest(model_dir, d) -> Optional[str]:
  """A checkpoint without its manifest: while a live trainer holds the run, it is being
  committed (the manifest follows the commit): wait for it. verify()'s answer after."""
  writer = _live_writer(model_dir)
  problem = "unverified"
  if writer is not None:
    _warn(f"{d}: being committed by a live trainer ({writer}); waiting for its {MANIFEST}")
    deadline = time.time() + MANIFEST_WAIT_S
    while problem == "unverified" and time.time() < deadline:
      time.sleep(0.5)
      problem = verify(d)
  if problem == "unverified":
    why = (f"its trainer ({writer}) has not written it in {MANIFEST_WAIT_S:.0f} s" if writer
           else "its trainer stopped between the commit and the manifest")
    _warn(f"{d}: no {MANIFEST} ({why}): restoring unverified")
  return problem


def restore_intact(model_dir, steps, restore_fn: Callable[[int], Any], step: Optional[int] = None,
                   quarantine: bool = False):
  """restore_fn(step) for the newest intact checkpoint among `steps` (or exactly `step`).

  A damaged one (its bytes fail verification, or an unverified one that cannot be read)
  is reported (and, with `quarantine`, moved to MODEL_DIR/damaged/ so that the run can
  write that step again); the next older is tried. A verified checkpoint that does not fit
  the model is a CheckpointError: it is not damaged, and nothing is moved. Returns
  (step, result).
  """
  if step is not None and steps is not None and step not in list(steps):
    have = ", ".join(str(x) for x in sorted(steps)[-8:]) or "none"
    d = storage.path(model_dir)
    writing = sorted(e.name for e in d.iterdir() if e.name.startswith(
        f"{CHECKPOINT_PREFIX}_{step}.")) if d.exists() else []
    if writing:   # orbax writes a step under a temporary name, renamed when complete
      raise CheckpointError(f"{model_dir}: {CHECKPOINT_PREFIX}_{step} is still being written "
                            f"({writing[0]}); wait until the run has saved it, or choose "
                            f"an existing step ({have})")
    raise CheckpointError(f"{model_dir}: no {CHECKPOINT_PREFIX}_{step} (existing steps: "
                          f"{have})")
  candidates = [step] if step is not None else sorted(steps, reverse=True)
  if not candidates:
    raise CheckpointError(f"{model_dir}: no {CHECKPOINT_PREFIX}_<step> directory")
  problems = []
  for s in candidates:
    d = step_dir(model_dir, s)
    problem = verify(d)
    if problem == "unverified":
      problem = _await_manifest(model_dir, d)
    if problem is None or problem == "unverified":
      try:
        return s, restore_fn(s)
      except Exception as e:  # noqa: BLE001  (orbax/tensorstore raise many kinds)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else \
            type(e).__name__
        if problem is None:
          # Its bytes are what was saved: the model asked for does not fit it. Nothing is
          # moved (older checkpoints would not fit either).
          raise CheckpointError(f"{d} is intact (its checksums verify) but does not fit this "
                                f"model ({why}); was the run started with another config? "
                                f"(nothing was moved)") from None
        problem = f"unreadable ({why})"
    problems.append(f"{d.name}: {problem}")
    where = ""
    if quarantine:
      dest = storage.path(model_dir) / DAMAGED_DIR / d.name
      dest.parent.mkdir(exist_ok=True)
      if dest.exists():
        dest.rmtree()
      storage.move_tree(d, dest)
      where = f"; moved to {dest}"
    _warn(f"damaged checkpoint {d}: {problem}{where}")
  if step is not None:
    raise CheckpointError(f"{step_dir(model_dir, step)} is damaged: {problems[0]}")
  raise CheckpointError(f"{model_dir}: no intact checkpoint ({'; '.join(problems)}); "
                        f"the damaged ones are kept (start a new MODEL_DIR, or restore a copy)")


# ----------------------------------------------------------------------------
# The training run's checkpointer.

class Checkpointer:

  def __init__(self, model_dir, cfg: CheckpointConfig):
    self.cfg, self.model_dir = cfg, storage.path(model_dir)
    self._primary = jax.process_index() == 0
    self.manager = ocp.CheckpointManager(
        self.model_dir,
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                             save_interval_steps=cfg.period,
                                             step_prefix=CHECKPOINT_PREFIX, create=True,
                                             enable_async_checkpointing=False),
        item_names=CHECKPOINT_ITEMS)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def due(self, step: int, force: bool = False) -> bool:
    """Whether `save(step)` would write (a Python int: no device->host sync)."""
    return force or self.manager.should_save(step)

  def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
    """Saves if `step` is due (or `force`), then writes its checksum manifest."""
    if not self.due(step, force):
      return False
    rest = {"step": state.step, "opt_state": state.opt_state,
            "flax_mutables": state.flax_mutables, "rng": state.rng}
    try:
      saved = self.manager.save(step, args=ocp.args.Composite(
          params=ocp.args.StandardSave(state.params), train_state=ocp.args.StandardSave(rest),
          data=ocp.args.JsonSave(data_state)), force=force)
      if saved:
        self.manager.wait_until_finished()
        if self._primary:
          write_manifest(step_dir(self.model_dir, step))
    except Exception as e:  # noqa: BLE001  (orbax/tensorstore raise many kinds: disk full, ...)
      self._remove_partial(step)
      why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
      good = [x for x in self.manager.all_steps(read=True) if x != step]
      raise CheckpointError(
          f"saving {step_dir(self.model_dir, step)} failed ({type(e).__name__}: {why}); its "
          f"partial files were removed, the earlier checkpoints are untouched (latest: "
          f"{max(good) if good else 'none'}); fix the cause (disk space, permissions) and "
          f"rerun to resume") from None
    return saved

  def _remove_partial(self, step: int):
    """A failed save's temporary directory (and a checkpoint directory without its
    manifest): nothing partial is left behind."""
    if not self._primary:
      return
    name = f"{CHECKPOINT_PREFIX}_{step}"
    for entry in self.model_dir.iterdir():
      partial = entry.name.startswith(f"{name}.orbax-checkpoint-tmp") or (
          entry.name == name and not (entry / MANIFEST).exists())
      if partial:
        try:
          entry.rmtree() if entry.is_dir() else entry.unlink()
        except OSError:
          pass

  def restore_latest(self, abstract_state) -> Optional[tuple[int, Any, dict]]:
    """(step, state, data_state) of the newest intact checkpoint, or None if there is none
    at all. Damaged ones are moved to MODEL_DIR/damaged/ (process 0) and reported.
    `abstract_state`: the TrainState to restore into, or a function of the step giving it
    (a phased run's state depends on the phase)."""
    steps = self.manager.all_steps()
    if not steps:
      return None
    step, (state, data) = restore_intact(self.model_dir, steps,
                                         lambda s: self.restore(
                                             s, abstract_state(s) if callable(abstract_state)
                                             else abstract_state),
                                         quarantine=self._primary)
    self.manager.reload()
    return step, state, data

  def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
    """abstract_state: TrainState of jax.ShapeDtypeStruct with shardings."""
    rest = {"step": abstract_state.step, "opt_state": abstract_state.opt_state,
            "flax_mutables": abstract_state.flax_mutables, "rng": abstract_state.rng}
    r = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        train_state=ocp.args.StandardRestore(rest), data=ocp.args.JsonRestore()))
    t = r["train_state"]
    state = abstract_state.replace(step=t["step"], params=r["params"], opt_state=t["opt_state"],
                                   flax_mutables=t["flax_mutables"], rng=t["rng"])
    return state, r["data"]

  def close(self):
    self.manager.close()


def latest_data_state(model_dir) -> Optional[tuple[int, dict]]:
  """(step, data state) of the newest checkpoint that has a manifest (its JSON item
  alone, nothing else restored); None when there is none or it cannot be read."""
  d = storage.path(model_dir)
  if not d.exists():
    return None
  steps = sorted((int(e.name.split("_")[1]) for e in d.iterdir()
                  if e.name.startswith(f"{CHECKPOINT_PREFIX}_")
                  and e.name.split("_")[1].isdigit() and (e / MANIFEST).exists()),
                 reverse=True)
  for step in steps:
    try:
      with ocp.CheckpointManager(d, item_names=("data",), options=ocp.CheckpointManagerOptions(
          step_prefix=CHECKPOINT_PREFIX, create=False)) as m:
        return step, m.restore(step, args=ocp.args.Composite(
            data=ocp.args.JsonRestore()))["data"]
    except Exception:  # noqa: BLE001  (a damaged one: the restore will say)
      continue
  return None


# ----------------------------------------------------------------------------
# The best checkpoint by a dev metric: MODEL_DIR/best/checkpoint_<step>/params.

BEST_MODES = ("max", "min")


class BestCheckpointer:
  """Keeps the parameters of the step with the best value of one evaluation metric in
  MODEL_DIR/best/ (`first`: train.best_metric's first metric; each other one in
  MODEL_DIR/best-<metric>/, layout.best_dir), params only, with a checksum manifest, as
  the regular checkpoints, and <dir>/best.json = {metric, mode, step, value}. A resumed
  run continues from that record: only a strictly better value replaces it.
  `Encoder.from_checkpoint(dir, step="best")` (or "best:<metric>") and `launch/eval.py
  --step=best` read it."""

  def __init__(self, model_dir, metric: str, mode: str = "max", first: bool = True):
    """Reads and checks an existing record (a resumed run); writes nothing until the first
    `update`, so a run stopped by a later start-up error leaves no best/ behind."""
    if mode not in BEST_MODES:
      raise ConfigError(f"train.best_mode={mode!r}: expected one of {BEST_MODES}")
    self.metric, self.mode = metric, mode
    self.dir = best_dir(model_dir, metric, first)
    self._primary = jax.process_index() == 0
    self._manager = None
    self.record = None
    path = self.dir / BEST_RECORD
    if path.exists():
      try:
        self.record = json.loads(path.read_text())
        float(self.record["value"]), int(self.record["step"])
      except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: unreadable best-checkpoint record ({e}); remove "
                              f"{self.dir} to start a new one") from None
      if (self.record.get("metric"), self.record.get("mode")) != (metric, mode):
        raise ConfigError(
            f"{self.dir} keeps the best step by {self.record.get('metric')!r} "
            f"({self.record.get('mode')}), but this run asks for {metric!r} ({mode}): bind "
            f"train.best_metric to that metric, or move {self.dir} away to start anew")

  @property
  def manager(self):
    if self._manager is None:
      self._manager = ocp.CheckpointManager(
          self.dir, item_names=("params",),
          options=ocp.CheckpointManagerOptions(max_to_keep=1, step_prefix=CHECKPOINT_PREFIX,
                                               create=True, enable_async_checkpointing=False))
    return self._manager

  def is_better(self, value: float) -> bool:
    if self.record is None:
      return True
    best = float(self.record["value"])
    return value > best if self.mode == "max" else value < best

  def update(self, step: int, value: float, params) -> bool:
    """Saves `params` as the best if `value` beats the record; returns whether it did."""
    if not self.is_better(value):
      return False
    if step in self.manager.all_steps():   # redone by a resumed run: same step, same params
      self.manager.delete(step)
    self.manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)),
                      force=True)
    self.manager.wait_until_finished()
    self.record = {"metric": self.metric, "mode": self.mode, "step": int(step),
                   "value": float(value)}
    if self._primary:
      write_manifest(step_dir(self.dir, step))
      storage.write_atomic(self.dir / BEST_RECORD, json.dumps(self.record, indent=1) + "\n")
    return True

  def close(self):
    if self._manager is not None:
      self._manager.close()


# ----------------------------------------------------------------------------
# Parameters for inference and conversion (no train state).

def flatten(tree) -> dict:
  """{'a/b/c': leaf} of a nested parameter dict."""
  return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def nonfinite_leaves(tree) -> list[str]:
  """Paths of the array leaves of `tree` holding NaN or Inf."""
  bad = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    a = np.asarray(leaf)
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
      bad.append(jax.tree_util.keystr(path))
  return bad


def restore_params(model_dir, model, step: Optional[int] = None, max_length: int = 8):
  """Parameters of checkpoint `step` (default: the newest intact one) on this process's
  first device (with several processes, each reads its own copy).

  The target tree is the model's (`model.abstract_params(max_length)`). A damaged latest
  checkpoint is reported and the previous intact one used; an explicit damaged `step` is
  a CheckpointError. Non-finite parameters are a NonFiniteError. A t5x run's checkpoint
  (vmx/modeldir/t5x_format.py) is read in its own format.
  """
  mngr = read_only_manager(model_dir)
  shapes = model.abstract_params(max_length)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                        shapes)
  steps = mngr.all_steps()
  newest = step if step is not None else (max(steps) if steps else None)
  if newest is not None and t5x_format.is_t5x_checkpoint(step_dir(model_dir, newest)):
    params, step = t5x_format.read_t5x_params(step_dir(model_dir, newest)), newest
    check_param_shapes(params, shapes, step_dir(model_dir, step))
    params = jax.device_put(jax.tree.map(lambda a, s: np.asarray(a, s.dtype), params,
                                         flax.core.unfreeze(shapes)), device)
  else:
    step, restored = restore_intact(
        model_dir, steps, step=step,
        restore_fn=lambda s: mngr.restore(s, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target))))
    params = restored["params"]
  bad = nonfinite_leaves(params)
  if bad:
    raise NonFiniteError(f"{model_dir}/{CHECKPOINT_PREFIX}_{step} has non-finite parameters "
                         f"({len(bad)} arrays, e.g. {', '.join(bad[:3])})")
  return params, step


def check_param_shapes(params, shapes, where):
  """CheckpointError naming the differences between a parameter tree and the model's."""
  got = {"/".join(k): np.shape(v) for k, v in traverse_util.flatten_dict(params).items()}
  want = {"/".join(k): tuple(v.shape)
          for k, v in traverse_util.flatten_dict(flax.core.unfreeze(shapes)).items()}
  problems = [f"{k} missing" for k in sorted(set(want) - set(got))]
  problems += [f"{k} not in the model" for k in sorted(set(got) - set(want))]
  problems += [f"{k} has shape {got[k]}, the model {want[k]}"
               for k in sorted(set(got) & set(want)) if tuple(got[k]) != want[k]]
  if problems:
    more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
    raise CheckpointError(f"{where}: parameters do not fit this model's config: "
                          + "; ".join(problems[:4]) + more)


def save_params(model_dir, step: int, params):
  """Writes `params` as checkpoint_<step>/params with its checksum manifest (an imported
  checkpoint: no train state)."""
  mngr = ocp.CheckpointManager(storage.path(model_dir), options=ocp.CheckpointManagerOptions(
      step_prefix=CHECKPOINT_PREFIX, create=True, enable_async_checkpointing=False),
      item_names=("params",))
  mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
  mngr.wait_until_finished()
  mngr.close()
  write_manifest(step_dir(model_dir, step))
