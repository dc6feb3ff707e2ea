"""Old import paths users may have written (vmx/_deprecated.py): they still give the same
objects, and say once that they are deprecated."""
import importlib
import sys
import warnings

import pytest


@pytest.mark.parametrize("old,new,name", [
    ("vmx.checkpoint_import", "vmx.modeldir.hf_import", "import_checkpoint"),
    ("vmx.checkpoint_export", "vmx.modeldir.hf_export", "export_sentence_transformers"),
])
def test_an_old_path_forwards_and_warns_once(old, new, name):
  from vmx import _deprecated
  _deprecated._WARNED.discard(old)
  sys.modules.pop(old, None)
  module = importlib.import_module(old)
  assert module is not importlib.import_module(new)          # a module of its own: no swap
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = getattr(module, name)
    again = getattr(module, name)
  assert first is again is getattr(importlib.import_module(new), name)
  deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
  assert len(deprecations) == 1 and f"import {new} instead" in str(deprecations[0].message)
  with pytest.raises(AttributeError):
    getattr(module, "no_such_name_here")


def test_no_module_is_swapped_in_sys_modules():
  import pathlib
  root = pathlib.Path(__file__).resolve().parents[1] / "vmx"
  assert not [p for p in root.rglob("*.py") if "sys.modules[" in p.read_text()]
