"""SeqIO interop: stable task names, registration on `import tasks`, train/validation
splits, and seqio's offline cache (launch/cache_tasks.py, DatasetConfig.use_cached)."""
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, TOY_WORDS, write_lines
from vmx.errors import ConfigError, DataError

LANGS = ["deu", "fra"]


def _toy_pairs(rng, n):
  out = []
  for _ in range(n):
    ws = list(rng.choice(TOY_WORDS, size=rng.integers(2, 7)))
    out.append((" ".join(ws), " ".join(w.upper() for w in ws)))
  return out


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
  """A data dir in shared/data's layout with two Tatoeba-challenge languages (200 pairs
  each, some repeated), and two vocabularies over it."""
  from vmx.data import vocab
  d = tmp_path_factory.mktemp("seqio_data")
  rng = np.random.default_rng(0)
  files = []
  for lang in LANGS:
    pairs = _toy_pairs(rng, 180)
    pairs += pairs[:20]                       # repeated pairs: always on one side
    base = d / "train" / "tatoeba-challenge" / f"{lang}-eng"
    files.append(write_lines(base / f"train.{lang}.gz", [s for s, _ in pairs], gz=True))
    files.append(write_lines(base / "train.eng.gz", [t for _, t in pairs], gz=True))
  vocabs = [vocab.train_sentencepiece(files, str(d / f"v{n}.model"), n, LANGS + ["eng"])
            for n in (60, 70)]
  return str(d), vocabs


def _examples(name, split):
  import seqio
  ds = seqio.get_mixture_or_task(name).get_dataset(
      {"inputs": 32, "targets": 32}, split=split, shuffle=False, num_epochs=1)
  return [(ex["inputs_pretokenized"], ex["targets_pretokenized"])
          for ex in ds.as_numpy_iterator()]


def test_names_are_stable_and_do_not_name_the_vocabulary(toy_data):
  import seqio
  import tasks
  data_dir, (v1, v2) = toy_data
  names = [tasks.parallel_mixture("tatoeba-challenge", LANGS, v, LANGS + ["eng"],
                                  data_dir=data_dir) for v in (v1, v2)]
  assert names == ["tatoeba_challenge.mix_deu_fra_a0.3"] * 2
  mix = seqio.get_mixture_or_task(names[0])
  assert [t.name for t in mix.tasks] == ["tatoeba_challenge.deu_eng", "tatoeba_challenge.fra_eng"]
  # the last registration wins: the task now tokenizes with the second vocabulary
  assert mix.tasks[0].output_features["inputs"].vocabulary.sentencepiece_model_file == v2
  mono = tasks.monolingual_mixture("tatoeba-challenge", LANGS, v1, data_dir=data_dir,
                                   disjoint_pairs=True)
  assert mono == "tatoeba_challenge.mono_mix_deu_fra_disjoint_a0.7"
  assert sorted(t.name for t in seqio.get_mixture_or_task(mono).tasks) == [
      "tatoeba_challenge.mono_deu_even", "tatoeba_challenge.mono_eng.deu_fra_odd",
      "tatoeba_challenge.mono_fra_even"]
  every = tasks.corpus_languages("tatoeba-challenge")
  assert len(every) == 126 and tasks.languages_key(every, every) == "all"
  assert tasks.languages_key(every[:5], every).startswith("5langs_")


def test_validation_split_holds_out_pairs_by_content(toy_data):
  import seqio
  import tasks
  data_dir, (v1, _) = toy_data
  base = os.path.join(data_dir, "train", "tatoeba-challenge", "deu-eng")
  src, tgt = os.path.join(base, "train.deu.gz"), os.path.join(base, "train.eng.gz")
  name = tasks.moses_task("split_deu_eng", src, tgt, "deu", "eng", v1, LANGS + ["eng"],
                          validation_percent=10)
  task = seqio.get_mixture_or_task(name)
  train, valid = _examples(name, "train"), _examples(name, "validation")
  from vmx.data import readers
  every = [(s.encode(), t.encode()) for s, t in readers.read_parallel(src, tgt)]
  assert collections.Counter(train + valid) == collections.Counter(every)
  assert not set(train) & set(valid)                 # a repeated pair is on one side
  assert 0 < len(valid) < 0.25 * len(every)
  assert (task.num_input_examples("train"), task.num_input_examples("validation")) == (
      len(train), len(valid))
  # train keeps the file's order (the training stream shuffles with a seeded buffer)
  assert train == [p for p in every if p not in set(valid)]
  # percent 0: one split of everything; asking for `validation` is an error
  name0 = tasks.moses_task("split0_deu_eng", src, tgt, "deu", "eng", v1, LANGS + ["eng"],
                           validation_percent=0)
  assert seqio.get_mixture_or_task(name0).splits == ("train",)
  assert _examples(name0, "train") == every
  with pytest.raises(DataError, match="validation_percent=100"):
    tasks.moses_task("bad", src, tgt, "deu", "eng", v1, LANGS + ["eng"], validation_percent=100)


def test_validation_mixture_reads_every_task_to_its_end(toy_data):
  import seqio
  import tasks
  data_dir, (v1, _) = toy_data
  name = tasks.parallel_mixture("tatoeba-challenge", LANGS, v1, LANGS + ["eng"],
                                data_dir=data_dir, validation_percent=20)
  mix = seqio.get_mixture_or_task(name)
  ds = seqio.get_dataset(mixture_or_task_name=name, task_feature_lengths={"inputs": 32,
                         "targets": 32}, dataset_split="validation", shuffle=False,
                         num_epochs=1, feature_converter=seqio.PassThroughFeatureConverter())
  n = sum(1 for _ in ds.as_numpy_iterator())
  assert n == sum(t.num_input_examples("validation") for t in mix.tasks) > 0


def _env(data_dir, vocabulary, **extra):
  env = dict(os.environ, VMX_DATA_DIR=data_dir, VMX_VOCABULARY=vocabulary,
             PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  env.update(extra)
  return env


def test_import_tasks_registers_every_corpus_without_reading_files(toy_data, tmp_path):
  data_dir, (v1, _) = toy_data
  # a broken file: registration reads nothing, the first use names the file and line
  bad = tmp_path / "data"
  subprocess.run(["cp", "-r", data_dir, str(bad)], check=True)
  write_lines(bad / "train/tatoeba-challenge/fra-eng/train.fra.gz", ["ok"] * 199 + [""], gz=True)
  code = (
      "import json, seqio, tasks\n"
      "mix = seqio.get_mixture_or_task('tatoeba_challenge.mix_deu_fra_a0.3')\n"
      "t = seqio.get_mixture_or_task('tatoeba_challenge.deu_eng')\n"
      "print(json.dumps({'mixtures': tasks.DEFAULT_MIXTURES, 'splits': list(t.splits),\n"
      "  'tasks': [x.name for x in mix.tasks], 'langs': tasks.default_languages('wmt-newstest')}))\n"
      "try:\n"
      "  seqio.get_mixture_or_task('tatoeba_challenge.fra_eng').num_input_examples('train')\n"
      "except Exception as e:\n"
      "  print('ERROR', e)\n")
  out = subprocess.run([sys.executable, "-c", code], env=_env(str(bad), v1), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.splitlines()[0])
  assert got["mixtures"] == ["tatoeba_challenge.mix_deu_fra_a0.3",
                             "tatoeba_challenge.mono_mix_deu_fra_a0.7"]
  assert got["tasks"] == ["tatoeba_challenge.deu_eng", "tatoeba_challenge.fra_eng"]
  assert got["splits"] == ["train", "validation"]
  assert got["langs"][-1] == "en" and len(got["langs"]) == 24
  assert "train.fra.gz:200: empty line" in out.stdout.splitlines()[1]
  # a vocabulary that is not there is an error at import, naming the variable
  out = subprocess.run([sys.executable, "-c", "import tasks"], cwd=REPO, capture_output=True,
                       text=True, env=_env(data_dir, str(tmp_path / "nope.model")), timeout=300)
  assert out.returncode != 0 and "VMX_VOCABULARY=" in out.stderr and "no such file" in out.stderr


def test_cached_tasks_give_the_uncached_batches(toy_data, tmp_path):
  import seqio
  import tasks
  from vmx.data import feature_converters, pipeline, seqio_reader
  data_dir, (v1, v2) = toy_data
  cache_dir = str(tmp_path / "cache")
  out = subprocess.run([sys.executable, "launch/cache_tasks.py",
                        "--tasks=tatoeba_challenge.mix_deu_fra_a0.3",
                        f"--output_cache_dir={cache_dir}", "--no_progress"],
                       env=_env(data_dir, v1), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "tatoeba_challenge.fra_eng" in out.stdout

  before = list(seqio.utils.get_global_cache_dirs())
  seqio.add_global_cache_dirs([cache_dir])
  try:
    name = tasks.register_defaults(v1, data_dir)[0]
    fc = feature_converters.PairFeatureConverter

    def batches(use_cached, split="train", n=4, reader="seqio", root=None):
      cfg = pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8, seed=3,
                                   use_cached=use_cached, split=split, reader=reader,
                                   token_cache_dir=root)
      it = pipeline.train_iterator(cfg, fc, 0)
      return [next(it) for _ in range(n)]

    for reader in pipeline.READERS:   # index: its columns written from seqio's cache
      uncached = batches(False, reader=reader, root=str(tmp_path / "a1"))
      cached = batches(True, reader=reader, root=str(tmp_path / "a2"))
      for a, b in zip(uncached, cached):
        assert a.keys() == b.keys()
        for k in a:
          np.testing.assert_array_equal(a[k], b[k])
    assert batches(True, "validation", 1)[0]["left_tokens"].shape == (8, 8)

    # another vocabulary under the same task names: the cache is refused
    tasks.register_defaults(v2, data_dir)
    for reader in pipeline.READERS:
      with pytest.raises(ConfigError, match="another vocabulary"):
        batches(True, reader=reader, root=str(tmp_path / "a3"))
    # a task in no cache dir: the error says how to write one
    base = os.path.join(data_dir, "train", "tatoeba-challenge", "deu-eng")
    other = tasks.moses_task("uncached_deu_eng", os.path.join(base, "train.deu.gz"),
                             os.path.join(base, "train.eng.gz"), "deu", "eng", v1,
                             LANGS + ["eng"])
    cfg = pipeline.DatasetConfig(other, {"inputs": 8, "targets": 8}, batch_size=8,
                                 use_cached=True)
    with pytest.raises(ConfigError, match="launch/cache_tasks.py"):
      seqio_reader.get_dataset(cfg, fc(pack=False))
  finally:
    seqio.utils.set_global_cache_dirs(before)
