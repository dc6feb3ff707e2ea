"""Old import paths that users may have written, kept as thin forwarding modules: the
first name read through one warns once (DeprecationWarning) with the new path."""
from __future__ import annotations

import importlib
import warnings

_WARNED: set = set()
REMOVED_IN = "0.2.0"   # the release that drops the old paths (said in every warning)


def forward(old: str, new: str):
  """A module `__getattr__` for module `old` that reads names from module `new`."""
  def __getattr__(name: str):
    if name.startswith("__"):
      raise AttributeError(name)
    if old not in _WARNED:
      _WARNED.add(old)
      warnings.warn(f"{old} is deprecated and goes in vmx {REMOVED_IN}: import {new} instead",
                    DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(new), name)
  return __getattr__
