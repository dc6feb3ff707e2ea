"""What a token cache is built from: its fingerprint, which names its directory.

The vocabulary (sha256 of its model), the source (its files' paths, sizes and content
hashes, filters and held-out dev sets), the source code and arguments of every
preprocessor, the feature converter and the lengths. A run with another vocabulary, other
sources or other preprocessing therefore never opens an old cache: it builds its own, or
is refused with what differs (`differences`).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
from typing import Mapping

import seqio

from vmx.data import seqio_vocab
from vmx.data.deferred import stand_in
from vmx.data.token_cache import disk_format
from vmx.data.token_cache.sources import CachedSource
from vmx.errors import ConfigError


@functools.lru_cache(maxsize=None)
def _code(obj) -> str:
  try:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
  except (OSError, TypeError):
    return getattr(obj, "__qualname__", type(obj).__qualname__)


def callable_fingerprint(fn) -> dict:
  """What a preprocessor (function, functools.partial, seqio placeholder) or a feature
  converter is: its qualified name, a hash of its source code, its arguments."""
  if isinstance(fn, functools.partial):
    return {**callable_fingerprint(fn.func), "args": stand_in(fn.args),
            "kwargs": stand_in(fn.keywords)}
  if isinstance(fn, seqio.CacheDatasetPlaceholder):
    return {"name": "CacheDatasetPlaceholder"}
  target = fn if inspect.isfunction(fn) or inspect.isclass(fn) else type(fn)
  out = {"name": f"{target.__module__}.{target.__qualname__}", "code": _code(target)}
  if not (inspect.isfunction(fn) or inspect.isclass(fn)):   # an instance: its settings
    out["settings"] = {k: stand_in(v) for k, v in sorted(vars(fn).items())
                       if isinstance(v, (int, float, bool, str, type(None)))}
  wrapped = getattr(fn, "__wrapped__", None)   # seqio.map_over_dataset
  if wrapped is not None:
    out["wraps"] = callable_fingerprint(wrapped)
  return out


def source_fingerprint(task: seqio.Task) -> str:
  """The source's own fingerprint (`fingerprint()`: vmx's sources hash their files);
  another source cannot be checked for changes, so the index path refuses it."""
  if not isinstance(task.source, CachedSource):
    raise ConfigError(
        f"task {task.name}: its source ({type(task.source).__name__}) cannot say when its "
        f"data change (no fingerprint()), so the index-based input cannot cache it; set "
        f"DatasetConfig.reader = 'seqio' for it")
  return task.source.fingerprint()


def parts(task: seqio.Task, split: str, lengths: Mapping[str, int], converter) -> dict:
  vocab = seqio_vocab.task_vocabulary(task)
  return {"format": disk_format.FORMAT, "task": task.name, "split": split,
          "vocabulary": vocab and seqio_vocab.fingerprint(vocab),
          "source": source_fingerprint(task),
          "source_code": callable_fingerprint(type(task.source)),
          "preprocessors": [callable_fingerprint(p) for p in task.preprocessors],
          "converter": callable_fingerprint(converter),
          "lengths": {k: int(v) for k, v in sorted(lengths.items())}}


def digest(p: dict) -> str:
  return hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()


_NAMES = {"vocabulary": "vocabulary", "source": "sources", "source_code": "source code",
          "preprocessors": "preprocessing", "converter": "feature converter",
          "lengths": "lengths", "format": "format"}


def differences(old: dict, new: dict) -> list[str]:
  """What differs between two fingerprints' parts, in words."""
  return [_NAMES[k] for k in _NAMES if old.get(k) != new.get(k)]
