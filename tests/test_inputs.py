"""The training loop's `Input` seam (vmx/training/inputs.py): an input the loop has never
seen plugs in through `Phase` / `train_dataset_cfg` alone, checkpoints its own data state
and resumes bit for bit; what is not an input is refused naming the binding."""
import json

import jax
import numpy as np
import pytest

from conftest import toy_train
from vmx.errors import ConfigError


class SeededPairs:
  """A user's own input: pairs of token rows made from (seed, step) alone, in memory (no
  SeqIO, no token cache). Its data state is its own: {"reader": "seeded", "step": s}."""
  name = "seeded pairs"

  def __init__(self, batch_size: int = 8, length: int = 8):
    self.batch_size, self.length = batch_size, length
    self.started = []   # the states start() was given

  def check(self, model, data_parallel_size):
    if self.batch_size % data_parallel_size:
      raise ConfigError("SeededPairs.batch_size: not a multiple of the devices")

  def batch_shapes(self, model):
    b, n = self.batch_size, self.length
    return {"left_tokens": (b, n), "right_tokens": (b, n), "left_lang": (b,),
            "right_lang": (b,)}

  def token_features(self, model):
    return ["left_tokens", "right_tokens"]

  def packed_features(self, model, shapes):
    return {}

  def token_lengths(self, model):
    return [self.length]

  def changes(self, state, seed):
    return []

  def start(self, model, seed, rows, state=None, allow_change=False, progress=True):
    self.started.append(state)
    return _Batches(self, seed, 0 if state is None else int(state["step"]))


class _Batches:
  rows = None   # every process reads the global batch

  def __init__(self, data, seed, position):
    self.data, self.seed, self.position = data, seed, position

  def __next__(self):
    rng = np.random.default_rng([self.seed, self.position])
    b, n = self.data.batch_size, self.data.length
    tokens = rng.integers(3, 64, size=(2, b, n), dtype=np.int32)
    tokens[:, :, rng.integers(2, n):] = 0      # padded ends
    self.position += 1
    return {"left_tokens": tokens[0], "right_tokens": tokens[1],
            "left_lang": np.zeros(b, np.int32), "right_lang": np.ones(b, np.int32)}

  def state_at(self, position):
    return {"reader": "seeded", "step": int(position)}


def test_a_users_own_input_trains_and_resumes_bit_for_bit(tmp_path, toy_task):
  _, vp, _, _ = toy_task
  full = toy_train(tmp_path / "full", "unused", vp, data=SeededPairs())
  data = SeededPairs()
  first = toy_train(tmp_path / "split", "unused", vp, data=data, stop_at_step=3)
  assert int(first.step) == 3 and data.started == [None]
  resumed = toy_train(tmp_path / "split", "unused", vp, data=data)
  assert data.started[1] == {"reader": "seeded", "step": 3}    # its own state, handed back
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.params, resumed.params)
  rows = [json.loads(l) for l in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
  speeds = [r["train/examples_per_sec"] for r in rows if "train/examples_per_sec" in r]
  assert speeds and all(s > 0 for s in speeds)     # the input's batch_size, logged


@pytest.mark.parametrize("data", [None, object(), "task_name"])
def test_what_is_not_an_input_is_refused_naming_the_phase(data):
  from vmx.training.phases import Phase
  with pytest.raises(ConfigError, match=r"Phase\('x'\)\.input = .*every phase needs data"):
    Phase("x", 3, data)


def test_a_phase_takes_its_input_or_gin_s_dataset_config_not_both():
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput
  from vmx.training.phases import Phase
  cfg = pipeline.DatasetConfig("unset", {"inputs": 8, "targets": 8}, 8)
  assert isinstance(Phase("x", 3, train_dataset_cfg=cfg).input, TokenCacheInput)
  assert isinstance(Phase("x", 3, cfg).input, TokenCacheInput)
  mine = SeededPairs()
  assert Phase("x", 3, mine).input is mine
  with pytest.raises(ConfigError, match="both input and train_dataset_cfg"):
    Phase("x", 3, mine, train_dataset_cfg=cfg)
