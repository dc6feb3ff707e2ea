"""Input that overlaps with the step: the next batches are read and placed on the devices
by a background thread while the current step runs (the trainer measures how long each
step still waited for its input: `train/input_wait_fraction` in the metrics).

`Prefetcher(data, place, depth)` wraps a data iterator (vmx/data/pipeline.py: numpy
batches, a `position` and `state_at(position)`): a thread reads `depth` batches ahead
(one more waits to be queued), `place`s them (the trainer's sharded `jax.Array`s: each
process puts its own rows on its own devices) and queues them. Its `state()` is the position of the batches the trainer *consumed*, not of
those read ahead, so a checkpoint resumes at the right batch and the batches (and so the
results) are the same with and without prefetching. `depth=0` reads and places in the
caller's thread. An exception in the thread (the data ran out, a bad file) is raised by
the `next()` that would have returned that batch.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable


class _Raised:
  def __init__(self, error: BaseException):
    self.error = error


class Prefetcher:

  def __init__(self, data, place: Callable[[dict], dict], depth: int = 2):
    self.data, self.place, self.depth = data, place, depth
    self.position = data.position          # batches handed to the trainer
    self._stop = threading.Event()
    self._queue = queue.Queue(maxsize=max(depth, 1))
    self._thread = None
    if depth > 0:
      self._thread = threading.Thread(target=self._fill, name="vmx-prefetch", daemon=True)
      self._thread.start()

  def _fill(self):
    while not self._stop.is_set():
      try:
        item = self.place(next(self.data))
      except BaseException as e:  # noqa: BLE001  (handed to the consumer, raised there)
        item = _Raised(e)
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if isinstance(item, _Raised):
        return

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    item = self.place(next(self.data)) if self._thread is None else self._queue.get()
    if isinstance(item, _Raised):
      raise item.error
    self.position += 1
    return item

  def state(self) -> dict:
    return self.data.state_at(self.position)

  def close(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
