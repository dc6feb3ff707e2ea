"""Old import paths and command-line flags that users may have written: the modules are
kept as thin forwarders (the first name read through one warns once, DeprecationWarning,
with the new path), the flags as aliases (one warning line each, `flag`), until vmx
REMOVED_IN."""
from __future__ import annotations

import importlib
import sys
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


def flag(old: str, new: str):
  """One warning line on stderr for a command-line flag of an earlier release (once)."""
  if old in _WARNED:
    return
  _WARNED.add(old)
  print(f"[vmx] warning: {old} is deprecated and goes in vmx {REMOVED_IN}: use {new}",
        file=sys.stderr, flush=True)
