"""The index reader's stream (vmx/data/stream.py): the example of a row of a step is a
function of (seed, step, row), whatever was read before and whichever rows a process
reads; every row once per epoch, at any size, with no table that grows with the rows;
batches draw from many blocks, and a process's rows from its own blocks; mixtures follow
their rates and are grain's interleave; states written before format 2 resume in their
own order; a resume with other data is refused saying what changed."""
import time

import numpy as np
import pytest

from conftest import toy_text_task, write_lines


def _pair_cfg(name, batch_size=8, **kw):
  from vmx.data import pipeline
  return pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=batch_size,
                                **kw)


def _fc():
  from vmx.data import feature_converters
  return feature_converters.PairFeatureConverter


def _stream(cfg, seed=0, **kw):
  from vmx.data import pipeline
  return pipeline.train_iterator(cfg, _fc(), seed, progress=False, **kw).streams[None]


class Rows:
  """A stand-in table of n rows whose row i reads as i (no data behind it)."""
  remote = False

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def take(self, indices):
    return {"row": np.asarray(indices, np.int64)}


def _synthetic(sizes, batch_size=2048, slots=None, window=1024, seed=0):
  from vmx.data import stream
  return stream.Stream([f"t{i}" for i in range(len(sizes))], [float(n) for n in sizes],
                       [Rows(n) for n in sizes], batch_size, seed,
                       order=stream.Order.default(batch_size, slots, window))


@pytest.fixture(scope="module")
def toy_mixture(toy_task, tmp_path_factory):
  """A mixture of the toy task (xx -> en, ~300 pairs) and a reverse task (en -> xx, its
  first 100), p ∝ n."""
  import tasks
  from vmx.data import registration
  name, vp, src, tgt = toy_task
  d = tmp_path_factory.mktemp("rev")
  s = write_lines(d / "rev.en", open(tgt).read().splitlines()[:100])
  t = write_lines(d / "rev.xx", open(src).read().splitlines()[:100])
  rev = tasks.moses_task("toy_en_xx", s, t, "en", "xx", vp, ["xx", "en"])
  return registration.register_mixture("toy_mix", [name, rev], alpha=1.0), vp


def test_any_step_and_any_rows_give_the_same_examples(toy_mixture):
  from vmx.data import pipeline
  name, _ = toy_mixture
  cfg = _pair_cfg(name, seed=5)
  whole = pipeline.train_iterator(cfg, _fc(), 0)
  stream = [next(whole) for _ in range(12)]
  halves = [pipeline.train_iterator(cfg, _fc(), 0, rows={None: r})
            for r in (np.arange(0, 4), np.arange(4, 8))]
  for step in range(12):
    got = [next(h) for h in halves]
    for k in stream[step]:
      np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), stream[step][k])
  assert [h.examples_read for h in halves] == [48, 48] and whole.examples_read == 96
  it = pipeline.train_iterator(cfg, _fc(), 0)
  it.restore(it.state_at(9))
  np.testing.assert_array_equal(next(it)["left_tokens"], stream[9]["left_tokens"])
  t0 = time.perf_counter()
  it.restore(it.state_at(10**9))          # far into the stream: arithmetic, not replay
  far = next(it)
  assert time.perf_counter() - t0 < 1.0 and far["left_tokens"].shape == (8, 8)
  other = pipeline.train_iterator(_pair_cfg(name, seed=6), _fc(), 0)
  assert not np.array_equal(next(other)["left_tokens"], stream[0]["left_tokens"])


def test_each_epoch_visits_every_example_once_reshuffled(toy_task):
  name, _, _, _ = toy_task
  stream = _stream(_pair_cfg(name, batch_size=1))
  n = len(stream.tables[0])
  assert 250 < n < 300              # the 1% validation split held out
  rows = stream.tables[0].take(np.arange(n))["left_tokens"]
  epochs = [np.concatenate([stream.rows(s, [0])["left_tokens"] for s in range(e * n, (e + 1) * n)])
            for e in range(2)]
  key = lambda a: sorted(map(bytes, a))  # noqa: E731
  assert key(epochs[0]) == key(rows) == key(epochs[1])
  assert not np.array_equal(epochs[0], epochs[1])       # a new order each epoch


def test_permute_is_a_bijection_for_every_size_and_key():
  from vmx.data import stream
  for m in [1, 2, 3, 5, 255, 256, 257, 1000, 4099]:
    for key in (0, 1, 2**63 + 5):
      out = stream.permute(np.arange(m), m, np.uint64(key))
      assert sorted(out.tolist()) == list(range(m)), (m, key)
  a = stream.permute(np.arange(4099), 4099, stream.key_of(7, 0))
  b = stream.permute(np.arange(4099), 4099, stream.key_of(7, 1))
  assert np.mean(a == b) < 0.01 and np.mean(a == np.arange(4099)) < 0.01
  keys = stream.key_of(np.arange(4099) % 3, 1)          # a key per element
  out = stream.permute(np.arange(4099), 4099, keys)
  for k in range(3):                                     # each key alone: still injective
    assert len(set(out[np.arange(4099) % 3 == k].tolist())) == len(out[np.arange(4099) % 3 == k])


@pytest.mark.parametrize("n,slots,window", [(100_003, 64, 1024), (5_000, 16, 256),
                                            (300, 64, 1024), (70_000, 1, 2048)])
def test_every_row_once_per_epoch_whatever_the_order(n, slots, window):
  """Any size (a window, several, a short last block), any number of slots: the draws of
  an epoch are a permutation of the task's rows, another one each epoch."""
  s = _synthetic([n], batch_size=slots * 2, slots=slots, window=window)
  zeros = np.zeros(n, np.int64)
  e0 = s.example_indices(zeros, np.arange(n))
  e1 = s.example_indices(zeros, np.arange(n, 2 * n))
  assert np.array_equal(np.sort(e0), np.arange(n)) and np.array_equal(np.sort(e1), np.arange(n))
  assert np.mean(e0 == e1) < 0.05


def test_batches_draw_from_many_blocks_and_a_process_from_its_own():
  """10^9 rows in 8 tasks, batch 2048: every batch draws from >= 64 distinct (task, block)
  pairs; the rows of process 0 of 2 and of process 1 come from disjoint blocks but for
  the few windows two lanes share; the tables hold nothing per row."""
  s = _synthetic([125_000_000] * 8)
  assert s.order.slots == 64
  for step in (0, 1, 777, 10**6):
    task, row = s.indices(step, np.arange(2048))
    assert len(np.unique(task * 10**9 + row // 256)) >= 64
  seen = [set(), set()]
  for step in range(200):
    for p in range(2):
      task, row = s.indices(step, np.arange(p * 1024, (p + 1) * 1024))
      seen[p] |= set((task * 10**9 + row // 256).tolist())
  shared = len(seen[0] & seen[1]) / len(seen[0] | seen[1])
  assert shared < 0.02, shared
  t0 = time.perf_counter()
  for step in range(20):
    s.indices(10**7 + step, np.arange(2048))
  assert time.perf_counter() - t0 < 1.0            # vectorized: well under 50 ms a batch


def test_a_mixture_follows_its_rates(toy_mixture, toy_task):
  name, _ = toy_mixture
  stream = _stream(_pair_cfg(name, batch_size=400))
  sizes = {n: len(tab) for n, tab in zip(stream.names, stream.tables)}
  langs = np.concatenate([stream.rows(s, np.arange(400))["left_lang"] for s in range(3)])
  share = float(np.mean(langs == 0))     # xx -> en, the toy task: p = n / (n + n_reverse)
  assert share == pytest.approx(sizes[toy_task[0]] / sum(sizes.values()), abs=0.01)


def test_nway_views_are_distinct_languages_of_the_group_and_a_function_of_the_position():
  from vmx.data import nway
  src = nway.NwaySource(["a", "b", "c", "d"], [["x", "", "y", "z"]] * 4, 2)
  stored = {"tokens": np.arange(4 * 3).reshape(1, 4, 3).repeat(3, 0),
            "present": np.array([[True, False, True, True]] * 3)}
  anchors = []
  for g in range(300):
    v = src.draw_views({k: a[:1] for k, a in stored.items()}, [(7, g)])["views"].reshape(2, 3)
    langs = [int(r[0]) // 3 for r in v]
    assert len(set(langs)) == 2 and 1 not in langs   # distinct, present
    anchors.append(langs[0])
  counts = np.bincount(anchors, minlength=4)
  assert counts[1] == 0 and min(counts[[0, 2, 3]]) > 70       # every present one anchors
  a = src.draw_views(stored, [(7, 5), (7, 6), (8, 5)])["views"]
  b = src.draw_views(stored, [(7, 5), (7, 6), (8, 5)])["views"]
  np.testing.assert_array_equal(a, b)


def test_a_resume_with_other_data_is_refused_saying_what_changed(toy_mixture, toy_task):
  from vmx.data import pipeline
  from vmx.errors import ConfigError
  name, _ = toy_mixture
  it = pipeline.train_iterator(_pair_cfg(name), _fc(), 0)
  state = it.state_at(4)
  bigger = pipeline.train_iterator(_pair_cfg(name, batch_size=16), _fc(), 0)
  with pytest.raises(ConfigError, match=r"batch_size 8 -> 16.*ALLOW_DATA_CHANGE"):
    bigger.restore(state)
  bigger.restore(state, allow_change=True)
  assert bigger.position == 4
  single = pipeline.train_iterator(_pair_cfg(toy_task[0]), _fc(), 0)
  with pytest.raises(ConfigError, match="mixture_or_task_name 'toy_mix' -> 'toy_xx_en'"):
    single.restore(state)
  window = pipeline.train_iterator(_pair_cfg(name, shuffle_window=2048), _fc(), 0)
  with pytest.raises(ConfigError, match="order .*'window_rows': 1024.* -> .*'window_rows': 2048"):
    window.restore(state)


def test_an_old_replay_position_resumes_by_replaying_with_a_warning(toy_task, capsys):
  from vmx.data import pipeline
  name, _, _, _ = toy_task
  seqio_it = pipeline.train_iterator(_pair_cfg(name, reader="seqio"), _fc(), 0)
  batches = [next(seqio_it) for _ in range(4)]
  it = pipeline.resume_iterator(_pair_cfg(name), _fc(), 0, {"position": 3})
  assert "replays them" in capsys.readouterr().out and it.reader == "seqio"
  np.testing.assert_array_equal(next(it)["left_tokens"], batches[3]["left_tokens"])


def test_multi_task_steps_read_each_tasks_rows(toy_task):
  from vmx.data import feature_converters as fcs, pipeline
  name, vp, _, _ = toy_task
  cfg = pipeline.MultiTaskConfig({
      "mono": pipeline.DatasetConfig(toy_text_task(vp), {"inputs": 6}, batch_size=4),
      "pair": pipeline.DatasetConfig(name, {"inputs": 5, "targets": 7}, batch_size=2)})
  conv = {"mono": fcs.MonolingualFeatureConverter, "pair": fcs.PairFeatureConverter}
  whole = next(pipeline.train_iterator(cfg, conv, 3))
  part = next(pipeline.train_iterator(cfg, conv, 3, rows={"mono": [1, 3], "pair": [1]}))
  np.testing.assert_array_equal(part["mono/tokens"], whole["mono/tokens"][[1, 3]])
  np.testing.assert_array_equal(part["pair/left_tokens"], whole["pair/left_tokens"][[1]])


def test_the_legacy_order_is_grains_interleave_and_shuffle(toy_mixture, monkeypatch):
  """The order of data states written before format 2: one slot, grain's
  `MapDataset.mix` interleave and, for tasks over the legacy window (2^17 rows; 10 here),
  range(n).shuffle(seed_t).repeat() within each: what TaskStream computed then."""
  import grain
  from grain._src.python.dataset.transformations import mix as grain_mix
  from vmx.data import stream as stream_lib
  monkeypatch.setattr(stream_lib, "LEGACY_WINDOW", 10)    # the toy tasks count as large
  name, _ = toy_mixture
  stream = _stream(_pair_cfg(name), seed=11, orders={None: stream_lib.Order.legacy_v1()})
  assert "order" not in stream.description()
  parts = [grain.MapDataset.range(len(tab)).shuffle(seed=s).repeat().map(
      lambda k, i=i: (i, k)) for i, (tab, s) in enumerate(zip(stream.tables, stream.task_seeds))]
  pipeline = grain.MapDataset.mix(parts, stream.rates)
  g = np.concatenate([np.arange(500), np.random.default_rng(0).integers(0, 10**12, 200)])
  task, draw = stream_lib.mix_select(g, stream.proportions)
  np.testing.assert_array_equal(np.stack(stream.mix(g)), np.stack([task, draw]))  # by period
  example = stream.example_indices(task, draw)
  for j, pos in enumerate(g.tolist()):
    assert (task[j], example[j]) == pipeline[pos]
  huge = np.array([2**61, 2**62 + 12345], np.int64)   # past int64 products: Python ints
  for pos, t, k in zip(huge.tolist(), *stream_lib.mix_select(huge, (300, 100, 7))):
    assert (t, k) == grain_mix._dataset_and_key_of_next_element(pos, (300, 100, 7))


def test_a_state_written_before_format_2_resumes_in_its_own_order(toy_mixture):
  """A data state without `order` (vmx before the sharded token cache) continues in the
  legacy order, uniform permutations per epoch as numpy drew them, without a refusal."""
  from vmx.data import pipeline, stream as stream_lib
  name, _ = toy_mixture
  legacy = pipeline.train_iterator(_pair_cfg(name), _fc(), 0,
                                   orders={None: stream_lib.Order.legacy_v1()})
  state = legacy.state_at(7)
  assert "order" not in state["stream"]["None"]
  resumed = pipeline.resume_iterator(_pair_cfg(name), _fc(), 0, state)
  legacy.restore(state)
  np.testing.assert_array_equal(next(resumed)["left_tokens"], next(legacy)["left_tokens"])
  s = legacy.streams[None]
  n = len(s.tables[0])     # the v1 rule: row = numpy's permutation of epoch e, at k mod n
  want = np.random.default_rng([s.task_seeds[0], 0]).permutation(n)[:50]
  np.testing.assert_array_equal(s.example_indices(np.zeros(50, np.int64), np.arange(50)), want)
