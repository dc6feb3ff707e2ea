"""The tokenized cache of the index-based input path (vmx/data/index.py).

For each task a run reads (and each split, feature lengths and feature converter), the
cache holds the task's examples exactly as its SeqIO pipeline yields them after every
preprocessor and the model's feature converter, in file order: one fixed-shape column per
model feature, `<feature>.bin` (raw little-endian values, [count, *shape]) plus
`arrays.json` (the count, each column's dtype and shape, and what the cache was built
from), written last. Reading example i of a column is an offset into a memory-mapped
file, so any example is at hand in constant time and no history is replayed.

SeqIO stays where the preprocessing is defined: the cache is written by running the
registered task (`task.get_dataset(shuffle=False, num_epochs=1)`, then the converter).
N-way tasks (MPCL) draw their views at random per draw; their cache holds every
language of each group, tokenized ([N, L] ids), and the views are drawn when read
(`vmx.data.tasks.NwaySource`).

What a cache was built from is its fingerprint: the vocabulary (sha256 of its model),
the source (its files' paths, sizes and content hashes, filters and held-out dev sets),
the source code and arguments of every preprocessor, the converter and the lengths. The
directory is named by that fingerprint, `<root>/<task>/<split>.<fingerprint 16>`, so a
run with another vocabulary, other sources or other preprocessing never opens an old
cache: it builds its own (a local root), or is refused with what differs and the
command that builds it (a remote root, e.g. gs://, written by `launch/cache_tasks.py`).
A truncated or damaged column is a DataError naming the file.

Bigger corpora: `launch/cache_tasks.py --gin_file=...` writes the same layout for an
experiment from SeqIO's offline cache when the tasks are cached there
(`DatasetConfig.use_cached=True`, written by seqio's Beam `cache_tasks_main`), so the
tokenizing runs on Beam and this step only converts; see docs/data.md.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import socket
import time
from typing import Mapping, Optional

import numpy as np
import seqio
from tqdm.auto import tqdm

from vmx import storage
from vmx.data import cache as seqio_cache
from vmx.errors import ConfigError, DataError

FORMAT = 1
INFO = "arrays.json"


def default_root() -> str:
  """`VMX_CACHE_DIR`'s parent /arrays (beside the vocabularies and teacher caches)."""
  return str(storage.cache_dir().parent / "arrays")


@functools.lru_cache(maxsize=None)
def _code(obj) -> str:
  try:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
  except (OSError, TypeError):
    return getattr(obj, "__qualname__", type(obj).__qualname__)


def _value(v):
  """A JSON-able stand-in for an argument (paths of existing files by their content)."""
  if isinstance(v, (int, float, bool, type(None))):
    return v
  if isinstance(v, str):
    return v
  if isinstance(v, (list, tuple)):
    return [_value(x) for x in v]
  if isinstance(v, Mapping):
    return {str(k): _value(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
  return repr(v)


def callable_fingerprint(fn) -> dict:
  """What a preprocessor (function, functools.partial, seqio placeholder) or a feature
  converter is: its qualified name, a hash of its source code, its arguments."""
  if isinstance(fn, functools.partial):
    return {**callable_fingerprint(fn.func), "args": _value(fn.args),
            "kwargs": _value(fn.keywords)}
  if isinstance(fn, seqio.CacheDatasetPlaceholder):
    return {"name": "CacheDatasetPlaceholder"}
  target = fn if inspect.isfunction(fn) or inspect.isclass(fn) else type(fn)
  out = {"name": f"{target.__module__}.{target.__qualname__}", "code": _code(target)}
  if not (inspect.isfunction(fn) or inspect.isclass(fn)):   # an instance: its settings
    out["settings"] = {k: _value(v) for k, v in sorted(vars(fn).items())
                       if isinstance(v, (int, float, bool, str, type(None)))}
  wrapped = getattr(fn, "__wrapped__", None)   # seqio.map_over_dataset
  if wrapped is not None:
    out["wraps"] = callable_fingerprint(wrapped)
  return out


def source_fingerprint(task: seqio.Task) -> str:
  """The source's own fingerprint (`fingerprint()`: vmx's sources hash their files);
  another source cannot be checked for changes, so the index path refuses it."""
  fp = getattr(task.source, "fingerprint", None)
  if fp is None:
    raise ConfigError(
        f"task {task.name}: its source ({type(task.source).__name__}) cannot say when its "
        f"data change (no fingerprint()), so the index-based input cannot cache it; set "
        f"DatasetConfig.reader = 'seqio' for it")
  return fp()


def fingerprint_parts(task: seqio.Task, split: str, lengths: Mapping[str, int],
                      converter) -> dict:
  vocab = seqio_cache.task_vocabulary(task)
  return {"format": FORMAT, "task": task.name, "split": split,
          "vocabulary": vocab and seqio_cache.vocabulary_fingerprint(vocab),
          "source": source_fingerprint(task),
          "source_code": callable_fingerprint(type(task.source)),
          "preprocessors": [callable_fingerprint(p) for p in task.preprocessors],
          "converter": callable_fingerprint(converter),
          "lengths": {k: int(v) for k, v in sorted(lengths.items())}}


def _digest(parts: dict) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class Table:
  """The columns of one built cache: `len(table)` examples, `take(indices)` gathers."""

  def __init__(self, directory):
    self.dir = storage.path(directory)
    try:
      self.info = json.loads((self.dir / INFO).read_text())
    except (OSError, ValueError) as e:
      raise DataError(f"{self.dir / INFO}: unreadable ({e}); delete {self.dir} and run "
                      f"again (a local cache is rebuilt)") from None
    self.count = int(self.info["count"])
    self.columns = {}
    for name, spec in self.info["features"].items():
      f = self.dir / f"{name}.bin"
      dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
      want = self.count * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
      have = f.stat().length if storage.is_remote(f) else (
          os.path.getsize(f) if os.path.exists(f) else -1)
      if have != want:
        raise DataError(
            f"{f}: {'missing' if have < 0 else f'{have} bytes'}, expected {want} "
            f"({self.count} examples of {dtype.name}{list(shape)}): the cache is truncated "
            f"or damaged; delete {self.dir} (a local cache is rebuilt on the next run) or "
            f"write it again with launch/cache_tasks.py")
      if storage.is_remote(f):
        data = np.frombuffer(f.read_bytes(), dtype)
      else:
        # a plain ndarray over the mapping: numpy's memmap subclass costs per index
        data = np.asarray(np.memmap(f, dtype, mode="r")) if want else np.zeros(0, dtype)
      self.columns[name] = data.reshape((self.count, *shape))

  def __len__(self) -> int:
    return self.count

  def take(self, indices) -> dict:
    return {k: v[indices] for k, v in self.columns.items()}


def _examples(task: seqio.Task, split: str, lengths, converter, use_cached: bool):
  """Numpy batches of the task's examples as the run reads them, in file order."""
  source = task.source
  if hasattr(source, "stored_examples"):   # N-way groups: views are drawn when read
    return source.stored_examples(task, split, lengths)
  ds = task.get_dataset(sequence_length=dict(lengths), split=split, shuffle=False,
                        num_epochs=1, use_cached=use_cached, seed=None)
  ds = converter(ds, dict(lengths))
  return ds.batch(4096).prefetch(2).as_numpy_iterator()


def build(task: seqio.Task, split: str, lengths, converter, directory, parts: dict,
          use_cached: bool = False, progress: bool = True) -> str:
  """Writes the cache of `task` into `directory` (columns first, `arrays.json` last; a
  local directory appears whole, by a rename)."""
  final = storage.path(directory)
  remote = storage.is_remote(final)
  out = final if remote else storage.path(
      f"{final}.tmp.{socket.gethostname()}.{os.getpid()}")
  out.mkdir(parents=True, exist_ok=True)
  total = task.num_input_examples(split) if not hasattr(task.source, "stored_examples") \
      else None
  bar = tqdm(total=total, desc=f"[vmx] caching {task.name}:{split}", unit=" ex",
             disable=not progress, leave=False)
  files, specs, count = {}, {}, 0
  try:
    for batch in _examples(task, split, lengths, converter, use_cached):
      for k, v in batch.items():
        v = np.ascontiguousarray(v)
        if k not in files:
          files[k] = (out / f"{k}.bin").open("wb")
          specs[k] = {"dtype": v.dtype.name, "shape": list(v.shape[1:])}
        files[k].write(v.tobytes())
      n = len(next(iter(batch.values())))
      count += n
      bar.update(n)
  except BaseException:
    for f in files.values():
      f.close()
    if not remote:   # a failed or interrupted build leaves nothing behind
      shutil.rmtree(out, ignore_errors=True)
    raise
  finally:
    bar.close()
  for f in files.values():
    f.close()
  if not count:
    if not remote:
      shutil.rmtree(out, ignore_errors=True)
    raise ConfigError(f"task {task.name}: split {split!r} has no examples to train on")
  info = {"count": count, "features": specs, "fingerprint": _digest(parts),
          "built_at": time.time(), "built_from": parts}
  storage.write_atomic(out / INFO, json.dumps(info, indent=1))
  if not remote:
    try:
      os.rename(out, final)
    except OSError:   # another process built it first (the same bytes): keep theirs
      shutil.rmtree(out, ignore_errors=True)
  return str(final)


def _differences(old: dict, new: dict) -> list[str]:
  names = {"vocabulary": "vocabulary", "source": "sources", "source_code": "source code",
           "preprocessors": "preprocessing",
           "converter": "feature converter", "lengths": "lengths", "format": "format"}
  return [names[k] for k in names if old.get(k) != new.get(k)]


def open_table(task: seqio.Task, split: str, lengths, converter, root: Optional[str] = None,
               use_cached: bool = False, progress: bool = True,
               build_missing: Optional[bool] = None) -> Table:
  """The cache of `task` under `root` (default `default_root()`), built first where it is
  missing and `build_missing` (default: where the root is local; a remote root must hold
  it already, written by launch/cache_tasks.py)."""
  root = root or default_root()
  parts = fingerprint_parts(task, split, lengths, converter)
  digest = _digest(parts)
  task_dir = storage.path(root) / seqio.utils.get_task_dir_from_name(task.name)
  directory = task_dir / f"{split}.{digest[:16]}"
  if (directory / INFO).exists():
    table = Table(directory)
    if table.info.get("fingerprint") != digest:
      raise DataError(f"{directory / INFO}: built from other inputs than its name says; "
                      f"delete {directory}")
    return table
  others = [p for p in task_dir.glob(f"{split}.*") if (p / INFO).exists()] \
      if task_dir.exists() else []
  differs = ""
  if others:   # the newest one: what the previous run of this task read
    infos = {p: json.loads((p / INFO).read_text()) for p in others}
    last = max(others, key=lambda p: infos[p].get("built_at", 0))
    old = infos[last].get("built_from", {})
    differs = (f"; the cache at {last} was built with other "
               f"{', '.join(_differences(old, parts)) or 'inputs'}")
  if build_missing is None:
    build_missing = not storage.is_remote(root)
  if not build_missing:
    raise ConfigError(
        f"task {task.name}: no tokenized cache for this run under {root}{differs}; write it "
        f"with `python launch/cache_tasks.py --gin_file=<the run's gin files> "
        f"--array_cache_dir={root}`")
  if differs:
    print(f"[vmx] task {task.name}: building a new tokenized cache{differs}", flush=True)
  build(task, split, lengths, converter, directory, parts, use_cached, progress)
  return Table(directory)
