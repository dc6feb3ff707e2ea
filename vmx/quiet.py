"""A quiet start (`--verbose` or VMX_VERBOSE=1 turns it off).

`import vmx` makes TensorFlow's first import quiet (`quiet_tensorflow`): its C++ start-up
lines, written before it reads TF_CPP_MIN_LOG_LEVEL, go to a temporary file and only
other lines are passed on; TensorFlow is also kept off the GPUs (vmx uses it for tf.data
on the host; the accelerators are JAX's), which is where its CUDA probe would print.
Those lines are "All log messages before absl::InitializeLog()", "oneDNN custom operations
are on", "Could not find cuda drivers", "failed call to cuInit" and the CPU-feature note;
a subprocess that imports vmx (a Beam worker) is quiet the same way.

The launchers (`cli.run_main`, `install`) add: a Python warning is printed once per kind
(its category and the line that raised it), without its source line; at exit, how often
each repeated kind came; the object store clients' (gcsfs, fsspec) own log records of
failed requests are not shown (vmx's retry names the failure once).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile
import warnings

# TensorFlow's start-up lines: absl's `I0000 00:00:... <pid> <file>.cc:<line>]` prefix from
# these files, absl's pre-initialization notice and the CPU-feature note's second line.
_NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[IWE]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cuda_platform|cpu_feature_guard|cuda_dnn|"
    rb"cuda_fft|cuda_blas|computation_placer|cuda_executor|dso_loader)\.cc:\d+\]"
    rb"|To enable the following instructions: .*rebuild TensorFlow)")


def noise(line: bytes) -> bool:
  return bool(_NOISE.match(line))


class _WarningsOnce:
  """showwarning: each kind (category, file, line) printed once, repeats counted."""

  def __init__(self):
    self.seen: dict = {}
    self.previous = warnings.showwarning

  def __call__(self, message, category, filename, lineno, file=None, line=None):
    key = (category, filename, lineno)
    count = self.seen.get(key)
    self.seen[key] = (count or (str(message), 0))[0], (count[1] if count else 0) + 1
    if count is None:
      print(f"[vmx] warning: {message} ({category.__name__})", file=sys.stderr, flush=True)

  def summary(self):
    """Prints the repeats counted so far, once (at exit, or before a last line)."""
    for (category, _, _), (message, n) in self.seen.items():
      if n > 1:
        print(f"[vmx] the warning \"{message[:120]}\" ({category.__name__}) came {n} times",
              file=sys.stderr, flush=True)
    self.seen = {key: (message, 1) for key, (message, _) in self.seen.items()}


@contextlib.contextmanager
def _quiet_fd2():
  """fd 2 to a temporary file meanwhile; then what is not noise is written to fd 2."""
  try:
    sys.stderr.flush()
  except (OSError, ValueError):
    pass
  saved = os.dup(2)
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      try:
        sys.stderr.flush()
      except (OSError, ValueError):
        pass
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      kept = [l for l in tmp.read().split(b"\n") if l and not noise(l)]
      if kept:
        os.write(2, b"".join(l + b"\n" for l in kept))


class _QuietTensorflow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds `tensorflow` through the other finders and runs its import (and hides the GPUs
  from it) with fd 2 quieted."""

  def __init__(self):
    self.spec = None
    self._finding = False

  def find_spec(self, name, path, target=None):
    if name != "tensorflow" or self._finding or "tensorflow" in sys.modules:
      return None
    self._finding = True
    try:                                # the real finders' spec
      spec = importlib.util.find_spec(name)
    finally:
      self._finding = False
    if spec is None or spec.loader is None:
      return None
    self.spec = spec
    return importlib.util.spec_from_loader(name, self, origin=spec.origin,
                                           is_package=spec.submodule_search_locations
                                           is not None)

  def create_module(self, spec):
    return self.spec.loader.create_module(self.spec)

  def exec_module(self, module):
    module.__spec__ = self.spec
    module.__path__ = self.spec.submodule_search_locations
    module.__file__ = self.spec.origin
    module.__loader__ = self.spec.loader
    if self in sys.meta_path:   # once: later imports find tensorflow in sys.modules
      sys.meta_path.remove(self)
    with _quiet_fd2():
      self.spec.loader.exec_module(module)
      try:   # tf.data runs on the host; the accelerators are JAX's
        module.config.set_visible_devices([], "GPU")
      except Exception:  # noqa: BLE001  (no GPU support, devices already in use)
        pass


def quiet_tensorflow():
  """TensorFlow's first import, quiet (see the module docstring); a no-op once TensorFlow
  is imported or with VMX_VERBOSE=1."""
  if "tensorflow" in sys.modules or os.environ.get("VMX_VERBOSE") == "1":
    return
  if not any(isinstance(f, _QuietTensorflow) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietTensorflow())


_ONCE: list = []   # the installed _WarningsOnce (empty: not installed yet)


def warnings_summary():
  """The repeated warnings' counts, now rather than at exit: a launcher's `error:` or
  `preempted:` line must stay its last line on stderr."""
  for once in _ONCE:
    once.summary()


def install(verbose: bool):
  """The launchers' quiet start (once per process; nothing with `verbose`)."""
  if verbose:   # TensorFlow's lines too
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorflow)]
    return
  if _ONCE:
    return
  once = _WarningsOnce()
  warnings.showwarning = once
  atexit.register(once.summary)
  _ONCE[:] = [once]
  # The object store clients' own records of failed requests (gcsfs logs each retry, with
  # its traceback, at ERROR): vmx retries them itself and names the store's failure in one
  # line (vmx/data/token_cache/table.py), which must not drown among them. Beam's runner
  # relays its workers' logs and tracebacks the same way; a failed build is one line too
  # (vmx/beam_runs.py `worker_error`).
  for name in ("gcsfs", "fsspec", "apache_beam"):
    logging.getLogger(name).setLevel(logging.CRITICAL)
