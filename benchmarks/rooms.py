#!/usr/bin/env python
r"""Rooms: the modules of this repository a reader opens to follow a command from its
launcher to a target (issue 53 sets a bar of 8 from `launch/eval.py --tasks=tatoeba` to
the encoder, and from `launch/finetune.py` to the training loop; the figures measured
are in docs/configuration.md).

The launcher's `main(argv)` runs in this process under a profile hook. The first time
a function of the target module is called (outside an import), the Python stack is read:
the distinct modules of the repository on it (launch/, vmx/, tasks/), outermost first,
are the rooms.
Library frames (jax, flax, seqio, ...) are not rooms: a reader of vmx does not open them.
The launcher's `main` is called directly (not through vmx/cli.py's `run_main`), and the
run stops at the target: nothing is trained or scored.

  python benchmarks/rooms.py eval --checkpoint_dir=DIR --tasks=tatoeba --languages=deu
  python benchmarks/rooms.py finetune --gin_file=finetune/xnli_tiny.gin \
      --gin.INITIAL_CHECKPOINT_PATH=DIR --gin.XNLI_DIR=DIR --gin.MODEL_DIR=OUT
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# command -> (launcher, the target module, what the target is, a module the path passes)
COMMANDS = {"eval": ("launch/eval.py", "vmx/encoders.py", "the encoder scoring Tatoeba",
                     "vmx/evaluation/tatoeba.py"),
            "finetune": ("launch/finetune.py", "vmx/training/loop.py", "the training loop",
                         None)}
ROOTS = ("launch/", "vmx/", "tasks/")


class Reached(BaseException):
  """Raised out of the profile hook's caller once the target is entered (not an
  Exception: no handler of the code under test catches it)."""


def _module(filename: str):
  rel = os.path.relpath(os.path.abspath(filename), REPO)
  return rel if rel.startswith(ROOTS) else None


def _importing(frame) -> bool:
  """Whether `frame` runs as part of an import (a module's or a class body's code)."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      return True
    frame = frame.f_back
  return False


def rooms_on_stack(frame) -> list[str]:
  """The repository's modules on the stack of `frame`, outermost first, each once."""
  frames = []
  while frame is not None:
    frames.append(frame)
    frame = frame.f_back
  out = []
  for f in reversed(frames):   # outermost first; a module entered again counts once
    m = _module(f.f_code.co_filename)
    if m and m not in out:
      out.append(m)
  return out


def trace(main: Callable, argv: Sequence[str], target: str,
          via: Optional[str] = None) -> list[str]:
  """The rooms from `main(argv)` to the first call into module `target` (a path relative
  to the repository) whose stack passes module `via`; AssertionError if the run ends
  without reaching it."""
  found = []

  def hook(frame, event, arg):
    if (event == "call" and _module(frame.f_code.co_filename) == target
        and not _importing(frame)):
      rooms = rooms_on_stack(frame)
      if via is None or via in rooms:
        found.extend(rooms)
        sys.setprofile(None)
        raise Reached

  sys.setprofile(hook)
  try:
    main(list(argv))
  except Reached:
    pass
  finally:
    sys.setprofile(None)
  assert found, f"{target} was not reached"
  return found


def load_main(launcher: str) -> Callable:
  spec = importlib.util.spec_from_file_location(
      "vmx_rooms_" + os.path.basename(launcher)[:-3], os.path.join(REPO, launcher))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


def main(argv):
  if not argv or argv[0] not in COMMANDS:
    sys.exit(f"usage: rooms.py {{{','.join(COMMANDS)}}} <the launcher's flags>")
  launcher, target, what, via = COMMANDS[argv[0]]
  rooms = trace(load_main(launcher), argv[1:], target, via)
  print(f"{launcher} to {what} ({target}): {len(rooms)} rooms")
  for r in rooms:
    print(f"  {r}")


if __name__ == "__main__":
  main(sys.argv[1:])
