"""The index reader (vmx/data/index.py over vmx/data/arrays.py): the example of a row of a
step is a function of (seed, step, row), whatever was read before and whichever rows a
process reads; epochs visit every example once; mixtures follow their rates; the cache
is rebuilt or refused when what it was built from changes, and a damaged one is named;
a resume with other data is refused saying what changed; an old replay position resumes."""
import time

import numpy as np
import pytest

from conftest import needs_data, toy_text_task, write_lines


def _pair_cfg(name, batch_size=8, **kw):
  from vmx.data import pipeline
  return pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=batch_size,
                                **kw)


def _fc():
  from vmx.data import feature_converters
  return feature_converters.PairFeatureConverter


@pytest.fixture(scope="module")
def toy_mixture(toy_task, tmp_path_factory):
  """A mixture of the toy task (xx -> en, ~300 pairs) and a reverse task (en -> xx, its
  first 100), p ∝ n."""
  import tasks
  from vmx.data import tasks as vtasks
  name, vp, src, tgt = toy_task
  d = tmp_path_factory.mktemp("rev")
  s = write_lines(d / "rev.en", open(tgt).read().splitlines()[:100])
  t = write_lines(d / "rev.xx", open(src).read().splitlines()[:100])
  rev = tasks.moses_task("toy_en_xx", s, t, "en", "xx", vp, ["xx", "en"])
  return vtasks.register_mixture("toy_mix", [name, rev], alpha=1.0), vp


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
  from vmx.data import index
  name, _, _, _ = toy_task
  cfg = _pair_cfg(name, batch_size=1)
  stream = index.TaskStream(cfg, _fc()(), seed=0)
  n = len(stream.tables[0])
  assert 250 < n < 300              # the 1% validation split held out
  rows = stream.tables[0].take(np.arange(n))["left_tokens"]
  epochs = [np.concatenate([stream.rows(s, [0])["left_tokens"] for s in range(e * n, (e + 1) * n)])
            for e in range(2)]
  key = lambda a: sorted(map(bytes, a))  # noqa: E731
  assert key(epochs[0]) == key(rows) == key(epochs[1])
  assert not np.array_equal(epochs[0], epochs[1])       # a new order each epoch


def test_a_mixture_follows_its_rates(toy_mixture, toy_task):
  from vmx.data import index
  name, _ = toy_mixture
  stream = index.TaskStream(_pair_cfg(name, batch_size=400), _fc()(), seed=0)
  sizes = {t.name: len(tab) for t, tab in zip(stream.tasks, stream.tables)}
  langs = stream.rows(3, np.arange(400))["left_lang"]
  share = float(np.mean(langs == 0))     # xx -> en, the toy task: p = n / (n + n_reverse)
  assert share == pytest.approx(sizes[toy_task[0]] / sum(sizes.values()), abs=0.01)


def test_nway_views_are_distinct_languages_of_the_group_and_a_function_of_the_position():
  from vmx.data import tasks as vtasks
  src = vtasks.NwaySource(["a", "b", "c", "d"], [["x", "", "y", "z"]] * 4, 2)
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


def test_the_cache_is_rebuilt_or_refused_when_its_inputs_change(toy_task, tmp_path):
  import tasks
  from vmx.data import arrays, vocab
  from vmx.errors import ConfigError
  _, vp, src, tgt = toy_task
  s = write_lines(tmp_path / "c.xx", open(src).read().splitlines()[:50])
  t = write_lines(tmp_path / "c.en", open(tgt).read().splitlines()[:50])
  root = str(tmp_path / "arrays")
  name = tasks.moses_task("toy_changing", s, t, "xx", "en", vp, ["xx", "en"])

  def table(build=None):
    import seqio
    return arrays.open_table(seqio.get_mixture_or_task(name), "train", {"inputs": 8,
                             "targets": 8}, _fc()(), root, progress=False,
                             build_missing=build)
  first = table()
  assert table(False).dir == first.dir                         # found, not rebuilt
  vp2 = vocab.train_sentencepiece([src, tgt], str(tmp_path / "v2.model"), 50, ["xx", "en"])
  tasks.moses_task("toy_changing", s, t, "xx", "en", vp2, ["xx", "en"])
  with pytest.raises(ConfigError, match="other vocabulary"):
    table(False)
  assert table().dir != first.dir                              # a new cache, by its name
  write_lines(t, [l + " X" for l in open(t).read().splitlines()])
  tasks.moses_task("toy_changing", s, t, "xx", "en", vp2, ["xx", "en"])
  with pytest.raises(ConfigError, match="other sources.*launch/cache_tasks.py"):
    table(False)


def test_a_damaged_cache_is_a_data_error_naming_the_file(toy_task, tmp_path):
  import seqio
  from vmx.data import arrays
  from vmx.errors import DataError
  name, _, _, _ = toy_task
  task = seqio.get_mixture_or_task(name)
  t = arrays.open_table(task, "train", {"inputs": 8, "targets": 8}, _fc()(),
                        str(tmp_path), progress=False)
  col = t.dir / "right_tokens.bin"
  col.write_bytes(col.read_bytes()[:-5])
  with pytest.raises(DataError, match=f"{col}: .* truncated or damaged"):
    arrays.Table(t.dir)


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


@needs_data
def test_cache_tasks_builds_an_experiments_cache_that_a_run_then_finds(tmp_path):
  """launch/cache_tasks.py --gin_file writes every task of the run; opening it without
  building finds them all."""
  import subprocess
  import sys
  from conftest import REPO
  root = str(tmp_path / "arrays")
  args = ["--gin_file=contrastive_tiny.gin", "--gin.TRAIN_LANGUAGES=['deu', 'fra']",
          "--gin.LANGUAGES=['deu', 'fra', 'eng']", "--gin.VOCAB_SIZE=2000"]
  out = subprocess.run([sys.executable, "launch/cache_tasks.py", *args,
                        f"--array_cache_dir={root}", "--no_progress"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "train: 2 task(s)" in out.stdout and root in out.stdout
  from vmx import experiment
  from vmx.data import index
  _, model, cfg, _ = experiment.training_inputs(
      ["contrastive_tiny.gin"], [a[len("--gin."):] for a in args[1:]])[0]
  cfg.array_cache_dir = root
  tasks, _, tables = index.open_tables(cfg, model.FEATURE_CONVERTER_CLS(), progress=False,
                                       build=False)
  assert len(tables) == 2 and all(len(t) > 1000 for t in tables)


def test_the_mixing_is_grains_and_large_tasks_shuffle_as_grain_does(toy_mixture, monkeypatch):
  """TaskStream computes for whole batches what grain's MapDataset pipeline gives one
  position at a time: the tasks mixed by rates (MapDataset.mix) and, for tasks over
  EPOCH_TABLE_MAX, range(n).shuffle(seed_t).repeat() within each."""
  import grain
  from grain._src.python.dataset.transformations import mix as grain_mix
  from vmx.data import index
  monkeypatch.setattr(index, "EPOCH_TABLE_MAX", 10)    # the toy tasks count as large
  name, _ = toy_mixture
  stream = index.TaskStream(_pair_cfg(name), _fc()(), seed=11)
  parts = [grain.MapDataset.range(len(tab)).shuffle(seed=s).repeat().map(
      lambda k, i=i: (i, k)) for i, (tab, s) in enumerate(zip(stream.tables, stream.task_seeds))]
  pipeline = grain.MapDataset.mix(parts, stream.rates)
  g = np.concatenate([np.arange(500), np.random.default_rng(0).integers(0, 10**12, 200)])
  task, draw = index.mix_select(g, stream.proportions)
  np.testing.assert_array_equal(np.stack(stream.mix(g)), np.stack([task, draw]))  # by period
  example = stream.example_indices(task, draw)
  for j, pos in enumerate(g.tolist()):
    assert (task[j], example[j]) == pipeline[pos]
  huge = np.array([2**61, 2**62 + 12345], np.int64)   # past int64 products: Python ints
  for pos, t, k in zip(huge.tolist(), *index.mix_select(huge, (300, 100, 7))):
    assert (t, k) == grain_mix._dataset_and_key_of_next_element(pos, (300, 100, 7))
