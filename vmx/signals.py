"""One signal contract for a whole launcher process: SIGTERM (preemption: Cloud TPU, SLURM,
Kubernetes) or SIGINT (Ctrl-C) at any moment ends the process with `Preempted`, exit
status 75 (EX_TEMPFAIL: rerun the same command to continue), and one `preempted:` line
saying what it was doing and what was saved.

- Before the training loop (parsing, building the vocabulary or the token cache,
  restoring, compiling), `install()`'s handler raises `Interrupted` at once in the main
  thread (a BaseException, so no `except Exception` on the way swallows it; the
  launcher exits with it as with `Preempted`). Nothing half-written is ever used: every
  file vmx writes appears whole (a temporary name and a rename, or one upload), the
  unfinished one is removed on the way out, and what was finished (the vocabulary, the
  cache's finished shards, checkpoints) is kept, so the rerun continues where this one
  stopped. A long call into C (training
  a SentencePiece model) takes the signal when it returns.
- In the training loop and its final save, the trainer's `PreemptionWatch`
  (vmx/training/preemption.py) takes over: the signal is noted, the step finishes and a
  checkpoint is saved, then `Preempted` says which.
- A signal whose exception Python could not deliver (the handler ran inside a
  garbage-collector callback, e.g. JAX's, where an exception is printed as "Exception
  ignored" and dropped) is kept (`pending`): the next `activity` boundary raises it again,
  and the training loop saves at its first step boundary as for a signal in the loop.
- Work outside the main thread that the way out would wait for registers how to end it
  (`stopping`): a Beam run's worker processes are killed before the exception is raised.
- A second signal ends the process at once.

`activity(what)` names what the process is doing, for the message. Several processes
(`jax.distributed`): JAX's preemption service owns SIGTERM there; `install()` leaves it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from vmx.errors import Interrupted

_DOING = ["starting"]
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
NOTHING_SAVED = ("no training step had run, nothing needed saving; what was finished is "
                 "kept (vocabulary, token cache shards, checkpoints); rerun the same "
                 "command to continue")
_SAVED = [NOTHING_SAVED]
_PENDING: list = []   # the signal taken, once one is
_STOPS: list = []     # what the first signal ends before its exception (`stopping`)


@contextlib.contextmanager
def activity(what: str):
  """Names what the process does meanwhile (the `preempted:` line says it); a signal whose
  exception was swallowed (`pending`) is raised again on the way in and out."""
  check()
  _DOING.append(what)
  try:
    yield
  finally:
    _DOING.pop()
  check()


@contextlib.contextmanager
def stopping(stop):
  """While inside, the first signal calls `stop()` before its exception is raised: for work
  running outside this thread that the way out would wait for (a Beam run's worker
  processes: the runner's shutdown waits for them, and with a signal mid-stage they never
  end). A `stop` that fails does not keep the `preempted:` line from being said."""
  _STOPS.append(stop)
  try:
    yield
  finally:
    _STOPS.remove(stop)


def child_processes(pid: int | None = None) -> list[int]:
  """Every descendant of process `pid` (default this one), parents before their children.
  Linux (/proc); elsewhere []."""
  from vmx import storage   # lazy: etils (this module is imported before any work starts)
  kids: dict[int, list[int]] = {}
  for entry in os.listdir("/proc") if os.path.isdir("/proc/self") else []:
    fields = storage.process_stat(entry) if entry.isdigit() else None
    if fields:          # (None or []: not a process, or one that ended meanwhile)
      kids.setdefault(int(fields[1]), []).append(int(entry))
  found, todo = [], [os.getpid() if pid is None else pid]
  while todo:
    for child in kids.get(todo.pop(0), []):
      found.append(child)
      todo.append(child)
  return found


def end_child_processes(timeout_s: float = 10.0) -> list[int]:
  """SIGKILLs every descendant of this process (deepest first) and waits up to `timeout_s`
  until each is gone or a zombie; returns their pids. Linux (/proc); elsewhere nothing.
  A killed child's temporary files are a dead writer's (`storage.remove_leftovers`)."""
  from vmx import storage   # lazy: etils (this module is imported before any work starts)
  found = child_processes()
  for pid in reversed(found):
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  deadline = time.monotonic() + timeout_s
  while any(storage.pid_alive(pid) for pid in found) and time.monotonic() < deadline:
    time.sleep(0.05)
  return found


def doing() -> str:
  return _DOING[-1]


def leaves(what: str):
  """What a signal from now on would leave behind, said before the work starts (a
  command whose output appears whole or not at all: 'nothing was written ...')."""
  _SAVED[0] = what


def saved(what: str):
  """What a signal from now on would leave behind, for its message (the trainer says it
  once its final checkpoint is written)."""
  _SAVED[0] = what
  _DOING[0] = "finishing"


def _handler(signum, frame):
  del frame
  name = signal.Signals(signum).name
  _PENDING[:] = _PENDING or [name]
  for sig in _SIGNALS:   # a second signal: the default action, at once
    signal.signal(sig, _second)
  for stop in reversed(_STOPS):
    try:
      stop()
    except Exception:   # noqa: BLE001  (best effort: the line below says what matters)
      pass
  check()


def pending():
  """The name of a signal the handler took ('SIGTERM'), None before one. Its exception
  normally ends the process; while the process still runs, the exception was taken where
  none can propagate: the handler ran inside a garbage-collector callback or a `__del__`
  (Python prints "Exception ignored in ..." and goes on), so the next `activity` boundary
  and the training loop's `PreemptionWatch` act on it instead."""
  return _PENDING[0] if _PENDING else None


def check():
  """Raises `Interrupted` if a signal was taken (`pending`)."""
  if _PENDING:
    raise Interrupted(f"{_PENDING[0]} while {doing()}: {_SAVED[0]}")


def _second(signum, frame):
  del frame
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def install():
  """The process-wide handlers (main thread only; a no-op elsewhere)."""
  if threading.current_thread() is threading.main_thread():
    for sig in _SIGNALS:
      signal.signal(sig, _handler)


def installed() -> bool:
  return signal.getsignal(signal.SIGTERM) is _handler
