"""A run directory loses nothing (issue 35): one writer (the lock), a restart with another
model refused before anything is written, intact checkpoints never quarantined for a
config that does not fit them, and SIGTERM / SIGINT saving at the next step boundary."""
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import toy_train
from vmx.errors import CheckpointError, ConfigError
from vmx.modeldir import run as run_lib
from vmx.training import step as step_lib
from vmx.errors import EXIT_PREEMPTED, Preempted


def _snapshot(d):
  """{relative path: sha256} of every file under d."""
  out = {}
  for root, _, names in os.walk(d):
    for n in names:
      p = os.path.join(root, n)
      out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
  return out


def _same_params(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a.params),
               jax.tree.map(np.asarray, b.params))


def test_a_restart_with_another_model_is_refused_and_changes_nothing(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  d = tmp_path / "run"
  toy_train(d, name, vp, stop_at_step=3)
  before = _snapshot(d)
  with pytest.raises(ConfigError, match=r"holds a run of another model.*nothing was written"):
    toy_train(d, name, vp, kind="vmsst")
  assert _snapshot(d) == before                  # no quarantine, no rewritten model files
  assert not (d / "damaged").exists() and not (d / "vmx.lock").exists()
  toy_train(d, name, vp)                         # the original run resumes
  assert (d / "checkpoint_6").is_dir()


def test_an_intact_checkpoint_that_does_not_fit_is_not_moved(tmp_path, toy_task):
  from vmx.modeldir import checkpoints
  name, vp, _, _ = toy_task
  d = tmp_path / "run"
  toy_train(d, name, vp, stop_at_step=3)

  def restore(step):
    raise ValueError("shape (16, 64) != (8, 64)")
  with pytest.raises(CheckpointError, match=r"intact .* does not fit this model"):
    checkpoints.restore_intact(d, [3], restore, quarantine=True)
  assert (d / "checkpoint_3").is_dir() and not (d / "damaged").exists()
  with pytest.raises(CheckpointError, match=r"no checkpoint_999 \(existing steps: 3\)"):
    checkpoints.restore_intact(d, [3], restore, step=999)
  (d / "checkpoint_6.orbax-checkpoint-tmp-1795").mkdir()     # a save in progress
  with pytest.raises(CheckpointError, match=r"checkpoint_6 is still being written "
                                            r"\(checkpoint_6.orbax-checkpoint-tmp-1795\); "
                                            r"wait until the run has saved it, or choose an "
                                            r"existing step \(3\)"):
    checkpoints.restore_intact(d, [3], restore, step=6)


def test_other_settings_need_allow_config_change(tmp_path):
  old = "MODEL_DIR = '/r'\nTRAIN_STEPS = 10\nLEARNING_RATE = 0.001\nx.y = [1,\n  2]\n"
  new = "MODEL_DIR = '/r'\nTRAIN_STEPS = 20\nLEARNING_RATE = 0.002\nx.y = [1, 2]\n"
  assert run_lib.parse_bindings(old)["x.y"] == "[1, 2]"
  assert run_lib.config_differences(old, new) == [("LEARNING_RATE", "0.001", "0.002"),
                                                  ("TRAIN_STEPS", "10", "20")]
  d = tmp_path / "r"
  d.mkdir()
  (d / "config.gin").write_text(old)

  class Model:
    def get_config(self):
      return {}
  with pytest.raises(ConfigError, match=r"other settings: LEARNING_RATE 0.001 -> 0.002\. "
                                        r".*ALLOW_CONFIG_CHANGE=True"):
    run_lib.check_restart(d, Model(), new)
  assert len(run_lib.check_restart(d, Model(), new, allow_change=True)) == 2
  assert run_lib.check_restart(d, Model(), old.replace("10", "30")) == [
      ("TRAIN_STEPS", "10", "30")]             # run length: free


def test_a_change_of_settings_and_data_is_refused_once_naming_both_flags(tmp_path, toy_task):
  """A batch-size change is a config change and a data change: one refusal names both and
  both flags (the data change read from the newest checkpoint, before anything is built)."""
  from vmx.data import pipeline
  from vmx.training import trainer
  from vmx.training.phases import resolve_phases
  name, vp, _, _ = toy_task
  d = tmp_path / "r"
  toy_train(d, name, vp, total_steps=4, period=2)
  cfg = pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=16)
  phases = resolve_phases(None, object(), cfg, None, None, 4)
  changes = trainer.data_changes(d, phases, 1)
  assert changes == ["batch_size 8 -> 16", "order {'slots': 8, 'window_rows': 1024} -> "
                                           "{'slots': 16, 'window_rows': 1024}"]
  same = resolve_phases(None, object(), pipeline.DatasetConfig(
      name, {"inputs": 8, "targets": 8}, batch_size=8), None, None, 4)
  assert trainer.data_changes(d, same, 1) == []
  d = tmp_path / "r2"
  d.mkdir()
  (d / "config.gin").write_text("BATCH_SIZE = 8\n")

  class Model:
    def get_config(self):
      return {}
  with pytest.raises(ConfigError, match=r"other settings: BATCH_SIZE 8 -> 16; the training "
                                        r"data change with them: batch_size 8 -> 16.*pass "
                                        r"--gin.ALLOW_CONFIG_CHANGE=True "
                                        r"--gin.ALLOW_DATA_CHANGE=True if"):
    run_lib.check_restart(d, Model(), "BATCH_SIZE = 16\n", data_changes=lambda: changes)


def test_a_parameter_added_since_the_run_started_is_no_change_at_its_default():
  import vmx.configurables  # noqa: F401  (registers DatasetConfig)
  old = "train/DatasetConfig.batch_size = 8\n"
  new = old + "train/DatasetConfig.reader = 'index'\n"
  assert run_lib.config_differences(old, new) == []
  assert run_lib.config_differences(old, old + "train/DatasetConfig.reader = 'seqio'\n") == [
      ("train/DatasetConfig.reader", None, "'seqio'")]
  assert run_lib.config_differences(new, old) == [   # a binding that went away: a change
      ("train/DatasetConfig.reader", "'index'", None)]
  # a new switch as gin files add it, through a macro (MMLM_BLOCK_LENGTH): at its default
  # nothing changed; set, both the binding and the macro say so
  switch = ("mmlm/DatasetConfig.block_length = %MMLM_BLOCK_LENGTH\n"
            "MMLM_BLOCK_LENGTH = {}\n")
  assert run_lib.config_differences(old, old + switch.format("None")) == []
  assert run_lib.config_differences(old, old + switch.format("512")) == [
      ("MMLM_BLOCK_LENGTH", None, "512"),
      ("mmlm/DatasetConfig.block_length", None, "%MMLM_BLOCK_LENGTH")]


def test_one_writer_per_run_directory(tmp_path, toy_task, capfd):
  name, vp, _, _ = toy_task
  d = tmp_path / "run"
  d.mkdir()
  holder = {"host": socket.gethostname(), "pid": os.getppid(), "started": "then",
            "token": "x", "refreshed": 0}
  (d / "vmx.lock").write_text(json.dumps(holder))
  with pytest.raises(run_lib.RunLockedError, match=rf"another trainer .*pid {os.getppid()}"):
    toy_train(d, name, vp)
  assert sorted(os.listdir(d)) == ["vmx.lock"]   # nothing written
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()
  (d / "vmx.lock").write_text(json.dumps({**holder, "pid": gone.pid}))
  toy_train(d, name, vp, total_steps=2, period=2)   # a stale lock is taken over
  assert "taking over the lock" in capfd.readouterr().err
  assert not (d / "vmx.lock").exists()           # released at the end


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_at_the_next_step_and_the_resume_is_bit_exact(tmp_path, toy_task,
                                                                     monkeypatch, sig):
  name, vp, _, _ = toy_task
  whole = toy_train(tmp_path / "whole", name, vp, total_steps=8, period=100)
  real_step, calls = step_lib.TrainStep.step, []

  def step(self, state, batch):                  # the signal arrives during step 4
    calls.append(1)
    if len(calls) == 4:
      os.kill(os.getpid(), sig)
    return real_step(self, state, batch)
  monkeypatch.setattr(step_lib.TrainStep, "step", step)
  d = tmp_path / "run"
  handler = signal.getsignal(sig)
  with pytest.raises(Preempted, match=rf"{sig.name} at step 4: saved .*checkpoint_4"):
    toy_train(d, name, vp, total_steps=8, period=100)
  assert Preempted.exit_code == EXIT_PREEMPTED
  assert max(int(p.name.split("_")[1]) for p in d.glob("checkpoint_*")) == 4
  assert not (d / "vmx.lock").exists()
  assert signal.getsignal(sig) == handler       # the trainer's handlers are gone
  monkeypatch.setattr(step_lib.TrainStep, "step", real_step)
  _same_params(toy_train(d, name, vp, total_steps=8, period=100), whole)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_exception_python_dropped_is_saved_at_the_first_step(
    tmp_path, toy_task, monkeypatch):
  """The start-up handler (vmx/signals.py) ran inside a garbage-collector callback (JAX
  registers one), where Python prints its exception as "Exception ignored" and drops it:
  the signal is kept: the next activity boundary raises it again, and the loop saves at
  its first step boundary and ends Preempted."""
  import gc
  from vmx import signals
  from vmx.errors import Interrupted
  name, vp, _, _ = toy_task
  toy_train(tmp_path / "first", name, vp, total_steps=1, period=100)   # the cache is built
  for attr, value in (("_PENDING", []), ("_DOING", ["starting"]),
                      ("_SAVED", [signals.NOTHING_SAVED])):
    monkeypatch.setattr(signals, attr, value)
  old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

  def callback(phase, info):
    del info
    if phase == "start" and callback in gc.callbacks:
      gc.callbacks.remove(callback)
      signals._handler(signal.SIGTERM, None)   # as Python runs it when SIGTERM comes here
  try:
    signals.install()
    gc.callbacks.append(callback)
    gc.collect()
    assert signals.pending() == "SIGTERM"        # the process goes on, the signal is kept
    with pytest.raises(Interrupted, match="SIGTERM while starting: no training step"):
      with signals.activity("building"):
        pass
    with pytest.raises(Preempted, match=r"SIGTERM at step 1: saved .*checkpoint_1"):
      toy_train(tmp_path / "run", name, vp, total_steps=8, period=100)
  finally:
    for s, h in old.items():
      signal.signal(s, h)


def test_a_store_that_stops_answering_mid_run_saves_and_the_resume_is_bit_exact(
    tmp_path, toy_task, monkeypatch):
  """The next batch cannot be read (a remote token cache that no longer answers, after
  its retries): the run saves the state it has, ends with one DataError saying so, and
  the rerun ends where an uninterrupted run ends."""
  from vmx.data import stream
  from vmx.errors import DataError
  name, vp, _, _ = toy_task
  whole = toy_train(tmp_path / "whole", name, vp, total_steps=8, period=100)
  real = stream.Stream.rows

  def rows(self, step, rows_R):
    if step == 5:
      raise DataError("gs://b/cache/rows-00000-of-00001.bin: the store did not answer for "
                      "600 s")
    return real(self, step, rows_R)
  monkeypatch.setattr(stream.Stream, "rows", rows)
  d = tmp_path / "run"
  with pytest.raises(DataError, match=r"did not answer for 600 s; saved .*checkpoint_5; rerun"):
    toy_train(d, name, vp, total_steps=8, period=100)
  assert max(int(p.name.split("_")[1]) for p in d.glob("checkpoint_*")) == 5
  monkeypatch.setattr(stream.Stream, "rows", real)
  _same_params(toy_train(d, name, vp, total_steps=8, period=100), whole)


def test_a_failed_save_is_one_error_and_leaves_nothing_partial(tmp_path, toy_task,
                                                               monkeypatch):
  import orbax.checkpoint as ocp
  name, vp, _, _ = toy_task
  d = tmp_path / "run"
  toy_train(d, name, vp, stop_at_step=3)
  real = ocp.CheckpointManager.save

  def full_disk(self, step, *a, **kw):
    (d / f"checkpoint_{step}.orbax-checkpoint-tmp-123").mkdir()
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
  with pytest.raises(CheckpointError, match=r"saving .*checkpoint_6 failed \(OSError: .*No "
                                            r"space left.*latest: 3"):
    toy_train(d, name, vp)
  assert sorted(p.name for p in d.glob("checkpoint_*")) == ["checkpoint_1", "checkpoint_3"]
  assert not (d / "vmx.lock").exists()
  monkeypatch.setattr(ocp.CheckpointManager, "save", real)
  toy_train(d, name, vp)


def test_the_validation_cache_follows_the_content(tmp_path):
  from vmx.data import readers
  f = tmp_path / "c.txt"
  f.write_text("one\ntwo\n")
  st = os.stat(f)
  assert readers.validate_text(str(f)) == 2
  f.write_bytes(b"one\ntw\xff\n")                # corrupted in place, size and mtime kept
  os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert os.stat(f).st_size == st.st_size
  from vmx.errors import DataError
  with pytest.raises(DataError, match=r"c.txt:2: invalid UTF-8"):
    readers.validate_text(str(f))


def test_sentences_of_unknown_pieces_warn_and_bad_unicode_is_one_error(toy_encoder):
  encoder = toy_encoder
  from vmx.errors import InputError
  with pytest.warns(UserWarning, match=r"2 of 3 sentences have no token the vocabulary "
                                       r"knows .*sentences\[0\]"):
    v = encoder.encode(["😀", "alpha", "🙈"], lang="xx")
  np.testing.assert_allclose(v[0], v[2])        # why it matters: the same vector
  with pytest.raises(InputError, match=r"sentences\[1\] .*not valid Unicode.*surrogate"):
    encoder.encode(["alpha", "bad \udce9"], lang="xx")


def test_a_model_field_added_since_the_run_started_is_no_model_change():
  """vmx_model.json written before a module field existed (here InfoXLM's retrieval
  options) still describes the same model: it is rebuilt with today's defaults."""
  import json as json_
  from vmx import encoders
  from vmx.models.infoxlm import InfoXLM, InfoXLMModel
  enc = encoders.TransformerEncoder(vocab_size=32, num_layers=2, emb_dim=8, num_heads=2,
                                    mlp_dim=16, max_length=16)
  model = InfoXLMModel(InfoXLM(enc, universal_layer=1), queue_size=8)
  current = json_.loads(json_.dumps(model.get_config()))
  old = json_.loads(json_.dumps(current))
  for field in ("retrieval_layer", "retrieval_pooling"):
    del old["module"][field]
  assert old != current and run_lib.same_model(old, current)
  old["module"]["universal_layer"] = 2
  assert not run_lib.same_model(old, current)
