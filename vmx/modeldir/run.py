"""A run directory's rules: one writer, and the stored config as the contract of a restart.

* `RunLock`: a trainer holds MODEL_DIR/vmx.lock ({host, pid, start time, token}) from
  before it writes anything until it exits. A second trainer on the directory is a
  `RunLockedError` (exit 2) naming the holder. A lock whose holder is gone (same host, the
  pid no longer runs) is taken over with a warning; a lock from another host is trusted
  until it is older than `stale_after` seconds without a refresh (the holder rewrites it at
  every checkpoint). Local disks: an exclusive create (O_EXCL). Object stores (gs://) have
  no exclusive create through epath: the lock is written and read back (a later writer's
  token wins), which closes the window to one round trip, not to zero.
* `check_restart`: before a restart writes anything, the new experiment is compared with
  the run's `config.gin` (the operative config it was started with) and `vmx_model.json`.
  A different model (parameter shapes) is always refused; other differing bindings are
  refused unless they are run-length or bookkeeping settings (`FREE_BINDINGS`) or the run
  says `ALLOW_CONFIG_CHANGE = True`. The error lists the bindings that differ.
* `move_aside`: `--fresh` moves an earlier run's files to MODEL_DIR.previous-<time>/
  (never deletes them).
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import re
import socket
import sys
import time
import uuid
from typing import Optional

from gin import config as gin_config
from gin import config_parser

from vmx import gin_utils, storage
from vmx.data.vocab import differs_from_stored
from vmx.models.base import model_from_config, to_config
from vmx.errors import CheckpointError, ConfigError, VmxError
from vmx.modeldir.layout import (CHECKPOINT_PREFIX, CONFIG_FILE, LOCK_FILE, METRICS_FILE,
                                 MODEL_INFO_FILE, PREVIOUS_SUFFIX,
                                 read_model_info)


class RunLockedError(VmxError):
  """Another trainer writes this MODEL_DIR."""


class RunLock:
  """MODEL_DIR/vmx.lock, held by one trainer (see the module docstring)."""

  def __init__(self, model_dir, stale_after: float = 3600.0):
    self.path = storage.path(model_dir) / LOCK_FILE
    self.stale_after = stale_after
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "token": uuid.uuid4().hex}
    self.held = False

  def _text(self) -> str:
    return json.dumps({**self.record, "refreshed": time.time()})

  def _read(self) -> Optional[dict]:
    try:
      return json.loads(self.path.read_text())
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}                      # unreadable: treat as stale

  def _stale(self, other: dict) -> Optional[str]:
    """Why the holder is gone (None: it may still run)."""
    if not other:
      return "an unreadable lock file"
    return storage.writer_gone(other.get("host"), other.get("pid"), other.get("refreshed", 0),
                               self.stale_after)

  def _create(self) -> bool:
    """Exclusive create; False if the file exists."""
    if storage.is_remote(self.path):
      if self.path.exists():
        return False
      storage.write_atomic(self.path, self._text())
      return (self._read() or {}).get("token") == self.record["token"]
    try:
      fd = os.open(os.fspath(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(self._text())
    return True

  def acquire(self) -> "RunLock":
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      return self._acquire()
    except OSError as e:
      raise CheckpointError(f"{self.path.parent}: cannot write the run directory "
                            f"({e.strerror or e}); check its permissions and free space, or "
                            f"use another MODEL_DIR") from None

  def _acquire(self) -> "RunLock":
    for _ in range(3):
      if self._create():
        self.held = True
        return self
      other = self._read()
      if other is None:              # released meanwhile
        continue
      why = self._stale(other)
      if why is None:
        raise RunLockedError(
            f"{self.path.parent} is being written by another trainer (host "
            f"{other.get('host')}, pid {other.get('pid')}, started {other.get('started')}); "
            f"wait for it, stop it, or use another MODEL_DIR (a holder that is gone: remove "
            f"{self.path})")
      print(f"[vmx] taking over the lock of {self.path.parent} ({why}; it was held by host "
            f"{other.get('host')}, pid {other.get('pid')})", file=sys.stderr, flush=True)
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass
    raise RunLockedError(f"{self.path}: could not take the lock (another trainer keeps "
                         "taking it)")

  def refresh(self):
    """Rewrites the lock (its `refreshed` time): what another host's staleness test reads."""
    if self.held:
      storage.write_atomic(self.path, self._text())

  def release(self):
    if not self.held:
      return
    self.held = False
    other = self._read()
    if other and other.get("token") == self.record["token"]:
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


# ----------------------------------------------------------------------------
# The stored config as the contract of a restart.

# Bindings that may change between the invocations of one run without a flag: how long it
# runs and how it is watched, not what it trains on or what it trains.
FREE_BINDINGS = re.compile(
    r"^(TRAIN_STEPS|train\.total_steps|train\.stop_at_step|EVAL_PERIOD|train\.eval_period|"
    r"LOG_PERIOD|train\.log_period|train\.progress|CHECKPOINT_PERIOD|CHECKPOINTS_TO_KEEP|"
    r"CheckpointConfig\.\w+|MODEL_DIR|train\.model_dir|DATA_DIR|.*\.data_dir|"
    r"INITIAL_CHECKPOINT_PATH|train\.initial_checkpoint_path|ALLOW_CONFIG_CHANGE|"
    r"train\.allow_config_change|ALLOW_DATA_CHANGE|train\.allow_data_change|"
    r".*DatasetConfig\.(token|array)_cache_dir|train\.fresh|BEST_METRIC|train\.best_metric|"
    r"train\.best_mode|EVAL_\w+|DEV_\w+|TatoebaEvalConfig\.\w+|HarnessEvalConfig\.\w+|"
    r"train\.eval_cfg|learning_rate_schedule\.total_steps|steps_for_epochs\.epochs|"
    r"train\.prefetch_batches|"
    r"finetune\.(stop_at_step|progress|eval_period|log_period|prefetch_batches))$")


def _canonical(value) -> str:
  """A binding's value as text, references included (gin's repr of an unknown
  configurable's reference has no text of its own)."""
  if isinstance(value, gin_config.ConfigurableReference):
    return repr(value)
  if hasattr(value, "selector") and hasattr(value, "evaluate"):
    return f"@{value.selector}{'()' if value.evaluate else ''}"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{_canonical(k)}: {_canonical(v)}" for k, v in value.items()) + "}"
  if isinstance(value, (list, tuple)):
    inner = ", ".join(_canonical(v) for v in value)
    return f"[{inner}]" if isinstance(value, list) else f"({inner})"
  return repr(value)


def parse_bindings(text: str, where: str = "config") -> dict:
  """{binding: value as text} of a gin config (an operative config), by gin's parser."""
  out = {}
  try:
    for st in config_parser.ConfigParser(text, gin_config.ParserDelegate(skip_unknown=True)):
      if isinstance(st, config_parser.BindingStatement):
        key = "/".join(filter(None, [st.scope, st.selector]))
        out[f"{key}.{st.arg_name}" if st.arg_name else key] = _canonical(st.value)
  except (SyntaxError, ValueError) as e:
    raise ConfigError(f"{where}: not a readable gin config ({gin_utils.one_line(e)})") from None
  return out


def _is_default(binding: str, value: str) -> bool:
  """Whether `value` is the default of the configurable parameter `binding`
  (`[scope/]selector.arg`): a parameter the stored run's vmx did not have yet."""
  selector, _, arg = binding.rpartition(".")
  try:
    configurable = gin_config._REGISTRY.get_match(selector.rpartition("/")[2])  # noqa: SLF001
    param = inspect.signature(configurable.wrapped).parameters[arg]
  except (KeyError, TypeError, ValueError, AttributeError):
    return False
  if param.default is inspect.Parameter.empty:
    return False
  try:   # [] binds a parameter whose default is () alike (gin writes lists)
    return _as_lists(ast.literal_eval(value)) == _as_lists(param.default)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return repr(param.default) == value


def _as_lists(value):
  if isinstance(value, (list, tuple)):
    return [_as_lists(v) for v in value]
  if isinstance(value, dict):
    return {k: _as_lists(v) for k, v in value.items()}
  return value


def _resolved(bindings: dict, value: str) -> str:
  """`value` with macro references (`%NAME`) followed to the macro's value."""
  seen = set()
  while value.startswith("%") and value[1:] in bindings and value not in seen:
    seen.add(value)
    value = bindings[value[1:]]
  return value


def _added_at_default(binding: str, old: dict, new: dict) -> bool:
  """Whether `binding`, absent from the old config, is a parameter vmx added since, at
  its default (directly, or through a macro), or a macro that only such parameters use."""
  if binding in old:
    return False
  if _is_default(binding, _resolved(new, new[binding])):
    return True
  users = [k for k, v in new.items() if v == f"%{binding}"]
  return bool(users) and all(k not in old and _is_default(k, _resolved(new, new[k]))
                             for k in users)


def config_differences(old: str, new: str, where: str = "config"
                       ) -> list[tuple[str, Optional[str], Optional[str]]]:
  """(binding, old value, new value) of every binding that differs (None: absent). A
  binding absent from the old config whose new value is its parameter's default is no
  difference: the parameter was added to vmx since (the run ran as with its default);
  so is such a parameter bound to a new macro at that default, and the macro itself
  (`X.y = %NEW_SWITCH` with `NEW_SWITCH = None`)."""
  a, b = parse_bindings(old, where), parse_bindings(new)
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
          and not _added_at_default(k, a, b)]


def _describe(diffs) -> str:
  parts = [f"{k} {'(unset)' if o is None else o} -> {'(unset)' if n is None else n}"
           for k, o, n in diffs[:6]]
  return "; ".join(parts) + (f" (+{len(diffs) - 6} more)" if len(diffs) > 6 else "")


def same_model(stored: dict, current: dict) -> bool:
  """Whether a stored model config (vmx_model.json) describes the current model: compared
  after rebuilding it with today's code, so a field vmx added since (at its default) is
  no change."""
  if stored == current:
    return True
  try:
    rebuilt = json.loads(json.dumps(to_config(model_from_config(stored))))
  except Exception:  # noqa: BLE001  (a config today's code cannot rebuild differs)
    return False
  return rebuilt == current


def check_restart(model_dir, model, operative_config: str, allow_change: bool = False,
                  data_changes=None, allow_data_change: bool = False,
                  vocabulary: Optional[str] = None) -> list:
  """ConfigError (nothing written) if this experiment may not continue the run stored in
  `model_dir`; returns the accepted differences [(binding, old, new)]. A directory with
  no stored config (a new run, or one written before config.gin existed) passes.
  `data_changes()`: how the training data stream would change ([str]), so that one
  refusal names both changes and both flags. `vocabulary`: the run's vocabulary now,
  which must be the one the run was trained with."""
  d = storage.path(model_dir)
  stored = d / CONFIG_FILE
  if not stored.exists():
    return []
  diffs = config_differences(stored.read_text(), operative_config, str(stored))
  model_changed = False
  if (d / MODEL_INFO_FILE).exists():
    model_changed = not same_model(read_model_info(model_dir).get("model"),
                                   json.loads(json.dumps(model.get_config())))
  bound = [x for x in diffs if not FREE_BINDINGS.match(x[0])]
  stored_vocab = (read_model_info(model_dir).get("vocabulary", "vocab.model")
                  if (d / MODEL_INFO_FILE).exists() else None)
  if vocabulary and stored_vocab and differs_from_stored(vocabulary, model_dir, stored_vocab):
    raise ConfigError(
        f"the vocabulary of this run ({vocabulary}) is not the one MODEL_DIR={model_dir} was "
        f"trained with ({stored_vocab}): the files it is built from changed since, or "
        f"VOCAB_PATH names another one. Continue with the run's own: "
        f"--gin.VOCAB_PATH='{storage.path(model_dir) / stored_vocab}', or start anew with "
        f"--fresh (nothing was written)")
  if model_changed:
    shown = bound + [x for x in diffs if x not in bound]
    raise ConfigError(
        f"MODEL_DIR={model_dir} holds a run of another model (its parameters would not fit "
        f"this one): {_describe(shown) or 'the model config differs'}. Restore those "
        f"bindings to continue the run, or use another MODEL_DIR (nothing was written)")
  if bound and not allow_change:
    data = [] if allow_data_change or data_changes is None else data_changes()
    flags = "--gin.ALLOW_CONFIG_CHANGE=True" + (" --gin.ALLOW_DATA_CHANGE=True" if data else "")
    # a run trained before packing existed: the same examples and loss, another layout
    unpacked = any(k.endswith("DatasetConfig.pack") and o in (None, "False") for k, o, _ in bound)
    raise ConfigError(
        f"MODEL_DIR={model_dir} holds a run started with other settings: {_describe(bound)}"
        + (f"; the training data change with them: {'; '.join(data)}" if data else "")
        + f". Restore them to continue the run"
        + (" (a run trained unpacked continues as it was with --gin.PACKING=False)"
           if unpacked else "")
        + f", pass {flags} if the change is meant, or use another MODEL_DIR (nothing was "
        f"written)")
  return diffs


def move_aside(model_dir, keep=(LOCK_FILE,)) -> Optional[str]:
  """Moves every entry of `model_dir` but `keep` to MODEL_DIR.previous-<UTC time>/ and
  returns that directory (None: nothing to move)."""
  d = storage.path(model_dir)
  if not d.exists():
    return None
  entries = [e for e in d.iterdir() if e.name not in keep]
  if not entries:
    return None
  dest = storage.path(f"{os.fspath(d).rstrip('/')}{PREVIOUS_SUFFIX}"
                      f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
  dest.mkdir(parents=True, exist_ok=False)
  for e in entries:
    if e.is_dir():
      storage.move_tree(e, dest / e.name)
    else:
      storage.copy_file(e, dest / e.name)
      e.unlink()
  return os.fspath(dest)


def has_history(model_dir) -> bool:
  """Whether `model_dir` holds training history (checkpoints or metrics rows)."""
  d = storage.path(model_dir)
  if not d.exists():
    return False
  return any(e.name.startswith(f"{CHECKPOINT_PREFIX}_") or e.name == METRICS_FILE
             for e in d.iterdir())


def open_run(model_dir, model, operative_config: str, allow_change: bool = False,
             fresh: bool = False, primary: bool = True, data_changes=None,
             allow_data_change: bool = False,
             vocabulary: Optional[str] = None) -> Optional[RunLock]:
  """Takes the run's lock (the primary process), moves an earlier run aside if `fresh`,
  and checks that this experiment may continue the run stored there (`check_restart`),
  all before anything else is written. Returns the lock (None on other processes)."""
  lock = RunLock(model_dir).acquire() if primary else None
  try:
    if fresh and primary:
      moved = move_aside(model_dir)
      if moved:
        print(f"[vmx] --fresh: the earlier run in {model_dir} was moved to {moved}",
              flush=True)
    if not fresh and has_history(model_dir):
      accepted = check_restart(model_dir, model, operative_config, allow_change, data_changes,
                               allow_data_change, vocabulary)
      if accepted:
        print(f"[vmx] continuing the run in {model_dir} with changed settings: "
              f"{_describe(accepted)}", flush=True)
  except BaseException:
    if lock is not None:
      lock.release()
    raise
  return lock
