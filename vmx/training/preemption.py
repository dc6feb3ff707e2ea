"""Save on preemption: SIGTERM (what Cloud TPU preemption, SLURM and Kubernetes send) and
SIGINT (Ctrl-C) make the trainer save a checkpoint at the next step boundary and exit with
`Preempted` (exit status 75, EX_TEMPFAIL: rerun the same command to resume). A second
signal exits at once.

One process: Python signal handlers set a flag that the loop reads after every step.
Several processes (`jax.distributed.initialize`): JAX's preemption service takes SIGTERM on
any process, propagates it and picks one step at which every process saves
(`multihost_utils.reached_preemption_sync_point`, called after every step by all of
them), so they all save the same step; SIGINT keeps Python's default there (a Ctrl-C on one
process of a job cannot be agreed on without a collective every step).
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Optional

import jax
from jax.experimental import multihost_utils

from vmx import signals


class PreemptionWatch:
  """`install()` sets the handlers (main thread only), `uninstall()` restores the previous
  ones; `requested(step)` is asked after every step."""

  def __init__(self):
    # A signal taken before the loop whose exception was dropped (vmx/signals.py, pending):
    # acted on at the first step boundary, as one that arrives in the loop.
    self.signal: Optional[str] = signals.pending()
    self._old = {}
    self._multi = jax.process_count() > 1 and jax.distributed.is_initialized()

  def _handler(self, signum, frame):
    del frame
    if self.signal is not None:            # the second signal: exit at once
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.signal = signal.Signals(signum).name
    print(f"[vmx] {self.signal}: saving a checkpoint at the end of this step (send it again "
          f"to stop at once)", flush=True)

  def install(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (() if self._multi else (signal.SIGTERM, signal.SIGINT)):
        self._old[sig] = signal.signal(sig, self._handler)

  def uninstall(self):
    for sig, old in self._old.items():
      signal.signal(sig, old)
    self._old = {}

  def requested(self, step: int) -> bool:
    """Whether to save and stop after `step` (every process gets the same answer; call it
    after every step on every process)."""
    if self._multi:
      if multihost_utils.reached_preemption_sync_point(step):
        self.signal = self.signal or "SIGTERM"
        return True
      return False
    return self.signal is not None
