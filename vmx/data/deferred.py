"""A SeqIO task or mixture as what it is made from, registered only when it must be.

The `tasks` package's functions that register a task or mixture and return its name
(`tasks.parallel_mixture`, ...) are gin-configured through `configurable`: in a gin run,
`DatasetConfig.mixture_or_task_name = @tasks.parallel_mixture()` receives a `Deferred`,
the function and its arguments, not yet called. `DatasetConfig` resolves it: a run whose
token cache was built finds it by this description (vmx/data/token_cache/lookup.py) and
trains without importing SeqIO or TensorFlow; otherwise `name()` calls the function,
which registers the tasks with SeqIO as it always did. Called from Python, the functions
are what they were: they register and return the name.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Callable, Mapping

import gin

from vmx.data import download
from vmx.errors import ConfigError

# What a cache's examples are made of besides the arguments: the code that reads, filters,
# tokenizes and converts them (the `tasks` package and vmx/data, registry included).
_CODE_DIRS = (Path(__file__).resolve().parent,
              Path(__file__).resolve().parent.parent.parent / "tasks")


def stand_in(v):
  """A JSON-able stand-in for an argument (a nested Deferred: its description); what a
  record's key and a token cache's fingerprint (fingerprint.py) hash."""
  if isinstance(v, Deferred):
    return v.description()
  if isinstance(v, (int, float, bool, type(None), str)):
    return v
  if isinstance(v, (list, tuple)):
    return [stand_in(x) for x in v]
  if isinstance(v, Mapping):
    return {str(k): stand_in(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
  return repr(v)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
  """sha256 of the source files that make the examples (any edit: another digest)."""
  h = hashlib.sha256()
  for d in _CODE_DIRS:
    for p in sorted(list(d.rglob("*.py")) + list(d.glob("*.tsv"))):
      if "__pycache__" in p.parts:
        continue
      h.update(f"{p.relative_to(d.parent)}\0".encode())
      h.update(p.read_bytes())
  return h.hexdigest()


class Deferred:
  """`fn(**arguments)`, a function that registers a task or mixture and returns its name,
  not called yet (`name()` calls it, once)."""

  def __init__(self, fn: Callable, arguments: Mapping):
    self.fn, self.arguments = fn, dict(arguments)
    self._name = None

  @property
  def qualname(self) -> str:
    return f"{self.fn.__module__}.{self.fn.__qualname__}"

  def description(self) -> dict:
    return {"fn": self.qualname, "arguments": stand_in(self.arguments)}

  def key(self) -> str:
    """sha256 of the description, the data directory it resolves paths in and the code
    that makes the examples."""
    return hashlib.sha256(json.dumps({"description": self.description(),
                                      "data_dir": str(download.configured_data_dir(None)),
                                      "code": code_digest()},
                                     sort_keys=True).encode()).hexdigest()

  def name(self) -> str:
    """Registers the task or mixture with SeqIO (imports it) and returns its name."""
    if self._name is None:
      missing = [m for m in ("seqio", "tensorflow") if importlib.util.find_spec(m) is None]
      if missing:
        raise ConfigError(
            f"{self!r}: no recorded token cache of this data matches, and registering its "
            f"tasks to build one needs {' and '.join(missing)}: pip install 'vmx[train]' "
            f"(in a checkout: pip install -e '.[train]'), or build the cache where they are "
            f"installed (launch/cache_tasks.py --gin_file=...) into the same "
            f"DatasetConfig.token_cache_dir")
      self._name = self.fn(**self.arguments)
    return self._name

  def __repr__(self):
    return f"@{self.qualname}(...)"


def configurable(fn: Callable, module: str = "tasks"):
  """Registers `fn` with gin under its own name, as a function returning `Deferred`."""
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def deferred(*args, **kwargs) -> Deferred:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return Deferred(fn, bound.arguments)
  return gin.external_configurable(deferred, name=fn.__name__, module=module)
