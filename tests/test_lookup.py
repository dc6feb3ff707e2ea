"""A run finds its built token caches by the record of its data description
(vmx/data/token_cache/lookup.py) without registering a task; anything that differs (an
input file, an argument, a missing cache) falls back to SeqIO, which proves the caches by
fingerprint and records them again. Feature layouts equal the SeqIO converters'."""
import os
import shutil

import numpy as np
import pytest

from conftest import toy_pairs, write_lines

LENGTHS = {"inputs": 8, "targets": 8}


@pytest.fixture
def toy_files(tmp_path):
  """Two aligned line files and a vocabulary of their words."""
  from vmx.data import vocab
  src, tgt = toy_pairs(3, 120, longest=5)
  s = write_lines(tmp_path / "data" / "a.xx", src)
  t = write_lines(tmp_path / "data" / "a.en", tgt)
  vp = vocab.train_sentencepiece([s, t], str(tmp_path / "toy.model"), 60, ["xx", "en"])
  return s, t, vp


def _call(s, t, vp, name="lookup_xx_en"):
  """What gin hands DatasetConfig for `@tasks.moses_task()`: the deferred call."""
  import tasks
  from vmx.data import deferred
  return deferred.Deferred(tasks.moses_task, dict(
      name=name, source_file=s, target_file=t, source_language="xx",
      target_language="en", vocabulary=vp, model_languages=["xx", "en"]))


def _batches(cfg, steps=3):
  from vmx.data import features, pipeline
  it = pipeline.train_iterator(cfg, features.PairLayout(), seed=0, progress=False)
  return [next(it) for _ in range(steps)]


def test_a_recorded_cache_is_found_without_registering_and_reads_the_same(toy_files,
                                                                          tmp_path,
                                                                          monkeypatch):
  from vmx.data import deferred, pipeline
  s, t, vp = toy_files
  root = str(tmp_path / "arrays")
  first = pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root)
  assert first.record is None and first.mixture_or_task_name == "lookup_xx_en"
  want, counted = _batches(first), pipeline.num_examples(first)
  assert list((tmp_path / "arrays" / "runs").glob("*.json"))

  calls = []
  monkeypatch.setattr(deferred.Deferred, "name", lambda self: calls.append(self) or "never")
  again = pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root)
  assert again.record is not None and again.mixture_or_task_name == "lookup_xx_en"
  got = _batches(again)
  assert not calls     # nothing registered
  for a, b in zip(want, got):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert pipeline.num_examples(again) == counted
  assert not calls


def test_a_changed_input_file_falls_back_to_seqio_and_reads_the_new_data(toy_files, tmp_path,
                                                                         capsys):
  from vmx.data import pipeline
  s, t, vp = toy_files
  root = str(tmp_path / "arrays")
  pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root)
  before = pipeline.num_examples(pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8,
                                                        token_cache_dir=root))
  _batches(pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root))
  with open(s, "a") as f:
    f.write("alpha beta\n")
  with open(t, "a") as f:
    f.write("ALPHA BETA\n")
  cfg = pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root)
  assert cfg.record is None
  assert "an input file changed" in capsys.readouterr().out
  _batches(cfg)
  assert pipeline.num_examples(cfg)[None] == before[None] + 1
  # ...and the record written then is found again
  assert pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root).record


def test_a_deleted_cache_is_rebuilt_through_seqio(toy_files, tmp_path):
  from vmx.data import pipeline
  s, t, vp = toy_files
  root = str(tmp_path / "arrays")
  want = _batches(pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root))
  cfg = pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root)
  assert cfg.record is not None
  shutil.rmtree(tmp_path / "arrays" / "lookup_xx_en")
  got = _batches(cfg)     # the record's table is gone: registered, rebuilt, recorded
  for a, b in zip(want, got):
    np.testing.assert_array_equal(a["left_tokens"], b["left_tokens"])
  assert (tmp_path / "arrays" / "lookup_xx_en").is_dir()


def test_another_argument_is_another_record(toy_files, tmp_path):
  from vmx.data import pipeline
  s, t, vp = toy_files
  root = str(tmp_path / "arrays")
  _batches(pipeline.DatasetConfig(_call(s, t, vp), LENGTHS, 8, token_cache_dir=root))
  other = pipeline.DatasetConfig(_call(s, t, vp, name="lookup_other"), LENGTHS, 8,
                                 token_cache_dir=root)
  assert other.record is None and other.mixture_or_task_name == "lookup_other"


def test_layouts_are_the_seqio_converters_features():
  import tensorflow as tf
  from vmx.data import feature_converters as fcs, features
  for name, layout_cls in features.LAYOUTS.items():
    conv = getattr(fcs, name)(num_views=3) if "MultiView" in name else getattr(fcs, name)()
    layout = features.layout(conv)
    assert type(layout) is layout_cls
    for specs, seqio_specs in ((layout.TASK_FEATURES, conv.TASK_FEATURES),
                               (layout.MODEL_FEATURES, conv.MODEL_FEATURES)):
      assert list(specs) == list(seqio_specs)
      for k, spec in specs.items():
        assert tf.as_dtype(spec.dtype) == seqio_specs[k].dtype
        assert spec.rank == seqio_specs[k].rank
    lengths = {"inputs": 7, "targets": 9, "views": 5, "teacher": 4}
    task_lengths = {k: v for k, v in lengths.items() if k in layout.TASK_FEATURES}
    assert layout.model_lengths(task_lengths) == conv.get_model_feature_lengths(task_lengths)
    assert features.layout(name if "MultiView" not in name
                           else (name, {"num_views": 3})).describe() == layout.describe()


def test_tensorboard_scalars_are_written_without_tensorflow(tmp_path):
  import subprocess
  import sys
  from conftest import REPO
  code = (
      "import sys\n"
      "from vmx.training import metrics\n"
      f"w = metrics.TensorBoardWriter({str(tmp_path / 'tb')!r})\n"
      "w.write_scalars(3, {'train/loss': 1.5})\n"
      "w.write_scalars(4, {'train/loss': 1.25})\n"
      "w.close()\n"
      "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
  acc.Reload()
  from tensorboard.util import tensor_util
  assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
          for e in acc.Tensors("train/loss")] == [(3, 1.5), (4, 1.25)]
  assert os.listdir(tmp_path / "tb")
