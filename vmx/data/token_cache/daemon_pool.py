"""A thread pool whose workers do not hold the process at exit: remote fetches.

`concurrent.futures.ThreadPoolExecutor` joins its workers when the interpreter exits, and
cancelling queued work does not stop a request already in the store client's hands. A
fetch inside gcsfs's own retries against a store that died could so keep a job alive for
minutes after its error line (issue 57's dead-store probes: 150-540 s). These workers are
daemon threads: once the reader gives up (`shutdown`), the process ends when the main
thread does. What they fetch is verified bytes in memory, never a write, so stopping them
mid-request loses nothing. The interface is the part of ThreadPoolExecutor `Blocks` uses.
`call_by` runs one request the same way, waited for only until a deadline.
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time


class DaemonPool:
  """`submit(fn, *args) -> Future`, `shutdown()`: `threads` daemon workers, started as
  work arrives."""

  def __init__(self, threads: int, name: str = "vmx-fetch"):
    self._max, self._name = int(threads), name
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._threads: list = []
    self._lock = threading.Lock()
    self._closed = False

  def submit(self, fn, *args) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()
    with self._lock:
      if self._closed:
        raise RuntimeError("cannot schedule new futures after shutdown")
      self._queue.put((fut, fn, args))
      if len(self._threads) < self._max:
        t = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}",
                             daemon=True)
        self._threads.append(t)
        t.start()
    return fut

  def _work(self):
    while True:
      item = self._queue.get()
      if item is None:
        return
      fut, fn, args = item
      if not fut.set_running_or_notify_cancel():
        continue
      try:
        fut.set_result(fn(*args))
      except BaseException as e:  # noqa: BLE001  (handed to whoever waits on the future)
        fut.set_exception(e)

  def shutdown(self):
    """Cancels the queued work and lets the workers go (a running fetch is abandoned)."""
    with self._lock:
      self._closed = True
      while True:
        try:
          item = self._queue.get_nowait()
        except queue.Empty:
          break
        if item is not None:
          item[0].cancel()
      for _ in self._threads:
        self._queue.put(None)


class DeadlinePassed(Exception):
  """A request still running when its deadline came (`call_by`)."""


def call_by(deadline: float, fn, *args):
  """`fn(*args)`, given up at `deadline` (time.monotonic()): it runs on a daemon thread of
  its own, so a request inside the store client's own retries (gcsfs: six tries over about
  35 s) neither outlasts a retry budget nor holds the process at exit. `DeadlinePassed`
  when the deadline comes first."""
  done: concurrent.futures.Future = concurrent.futures.Future()

  def run():
    try:
      done.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001  (handed to the waiting thread)
      done.set_exception(e)
  threading.Thread(target=run, name="vmx-request", daemon=True).start()
  try:
    return done.result(timeout=max(0.0, deadline - time.monotonic()))
  except concurrent.futures.TimeoutError:
    if done.done():
      return done.result()      # (the request's own TimeoutError, raised again)
    raise DeadlinePassed() from None
