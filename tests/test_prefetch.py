"""The prefetch thread (vmx/training/prefetch.py) hands the trainer the same batches, in the
same order, as reading in the loop; its position counts consumed batches only; an error of
the data is raised where its batch would have been."""
import time

import numpy as np
import pytest

from vmx.training.prefetch import Prefetcher


class Numbers:
  """A DataIterator stand-in: batch i is {'x': [i]}; fails at `fail_at`, ends at `end`."""

  def __init__(self, position=0, end=50, fail_at=None):
    self.position, self.end, self.fail_at = position, end, fail_at

  def __next__(self):
    if self.position == self.fail_at:
      raise ValueError(f"bad batch {self.position}")
    if self.position >= self.end:
      raise StopIteration
    self.position += 1
    time.sleep(0.001)
    return {"x": np.array([self.position - 1])}

  def state_at(self, position):
    return {"position": position}


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_same_batches_and_a_consumed_position(depth):
  placed = []
  p = Prefetcher(Numbers(position=5), lambda b: placed.append(b) or {"x": b["x"] * 10}, depth)
  got = [int(next(p)["x"][0]) for _ in range(10)]
  assert got == [10 * i for i in range(5, 15)]
  time.sleep(0.05)                               # the thread reads ahead ...
  assert p.state() == {"position": 15}           # ... the checkpointed position does not
  assert len(placed) <= 10 + depth + 1         # queued, and one waiting to be queued
  p.close()


def test_errors_and_the_end_of_the_data_reach_the_consumer():
  p = Prefetcher(Numbers(fail_at=3), lambda b: b, 2)
  assert [int(next(p)["x"][0]) for _ in range(3)] == [0, 1, 2]
  with pytest.raises(ValueError, match="bad batch 3"):
    next(p)
  assert p.state() == {"position": 3}
  p.close()
  p = Prefetcher(Numbers(end=2), lambda b: b, 2)
  assert len(list(p)) == 2
  p.close()
