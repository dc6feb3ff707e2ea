"""Two local processes (jax.distributed on localhost, CPU) train and evaluate the tiny
config with the same global batch as one process, each reading only its half of every
batch, and end with bitwise the same parameters. Elastic resume: a run on 1 device resumed
on 2 sees the same batches; (slow tier) a run of 2 processes resumed as 1 process with 2
devices ends bit for bit where the uninterrupted run ends."""
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import REPO, free_port, needs_data

STEPS = 8
ARGS = ["--gin_file=contrastive_tiny.gin", f"--gin.TRAIN_STEPS={STEPS}", "--gin.BATCH_SIZE=16",
        f"--gin.EVAL_PERIOD={STEPS}", f"--gin.CHECKPOINT_PERIOD={STEPS}", "--gin.LOG_PERIOD=4",
        "--gin.TRAIN_LANGUAGES=['deu', 'fra']", "--gin.LANGUAGES=['deu', 'fra', 'eng']",
        "--gin.EVAL_LANGUAGES=['deu', 'fra']", "--gin.VOCAB_SIZE=2000", "--gin.WARMUP_STEPS=2"]


def _env(devices):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.setdefault("VMX_HOST_MALLOC", "off")
  return env


def _params(model_dir):
  from vmx.inference import Encoder
  return jax.tree.map(np.asarray, Encoder.from_checkpoint(model_dir).params)


def _rows(model_dir):
  return [json.loads(l) for l in (model_dir / "metrics.jsonl").read_text().splitlines()]


def _one_process(model_dir):
  """The reference: one process with 2 devices, the same global batch."""
  proc = subprocess.run([sys.executable, "launch/train.py", *ARGS, f"--gin.MODEL_DIR={model_dir}"],
                        capture_output=True, text=True, env=_env(2), cwd=REPO, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return model_dir


@needs_data
def test_two_processes_equal_one(tmp_path):
  one = _one_process(tmp_path / "one")

  two = tmp_path / "two"
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, "launch/train.py", *ARGS, f"--gin.MODEL_DIR={two}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(1), cwd=REPO)
      for i in range(2)]
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  assert re.search(r"process 1 of 2 on .* \(coordinator 127.0.0.1:\d+\): 1 local / 2 devices",
                   outs[1][0])

  for i, (out, _) in enumerate(outs):   # each process read its half of every batch only
    assert f"process {i} of 2 read 8 rows per step" in out, out[-2000:]
  a, b = _params(one), _params(two)
  jax.tree.map(np.testing.assert_array_equal, a, b)

  ra, rb = _rows(one), _rows(two)
  assert [r["step"] for r in ra] == [r["step"] for r in rb]  # one row per step, process 0 only
  for x, y in zip(ra, rb):
    for k in x:
      if k.startswith("tatoeba/") or k == "train/loss":
        assert x[k] == pytest.approx(y[k], abs=1e-3), (k, x[k], y[k])


@needs_data
@pytest.mark.slow
def test_two_processes_stopped_resume_as_one_process_bitwise(tmp_path):
  """Elastic: 2 processes stopped at step 4, resumed as 1 process with 2 devices, end bit
  for bit where one uninterrupted process ends."""
  one = _one_process(tmp_path / "one")
  a = _params(one)
  elastic = tmp_path / "elastic"
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, "launch/train.py", *ARGS, f"--gin.MODEL_DIR={elastic}",
       "--gin.train.stop_at_step=4", f"--coordinator_address=127.0.0.1:{port}",
       "--num_processes=2", f"--process_id={i}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(1), cwd=REPO)
      for i in range(2)]
  for p, (_, err) in zip(procs, [p.communicate(timeout=900) for p in procs]):
    assert p.returncode == 0, err[-3000:]
  assert (elastic / "checkpoint_4").is_dir()
  proc = subprocess.run([sys.executable, "launch/train.py", *ARGS, f"--gin.MODEL_DIR={elastic}"],
                        capture_output=True, text=True, env=_env(2), cwd=REPO, timeout=900)
  assert proc.returncode == 0 and f"resumed from {elastic}/checkpoint_4" in proc.stdout, \
      proc.stderr[-3000:]
  jax.tree.map(np.testing.assert_array_equal, a, _params(elastic))


def _two_processes(model_dir, args, log_dir, name):
  port = free_port()
  logs = [open(log_dir / f"{name}{i}.log", "w") for i in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, "launch/train.py", *args, f"--gin.MODEL_DIR={model_dir}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      stdout=logs[i], stderr=subprocess.STDOUT, text=True, env=_env(1), cwd=REPO)
      for i in range(2)]
  return procs, [log_dir / f"{name}{i}.log" for i in range(2)]


@needs_data
@pytest.mark.slow
def test_sigterm_to_one_process_saves_the_same_step_on_both_and_resumes_bitwise(tmp_path):
  """SIGTERM to one process of a 2-process run: JAX's preemption sync point makes both
  save the same step and exit 75; the resumed run ends bit for bit as an uninterrupted one."""
  import time
  steps = 24
  args = [*ARGS, f"--gin.TRAIN_STEPS={steps}", "--gin.LOG_PERIOD=2", "--gin.EVAL_PERIOD=0",
          f"--gin.CHECKPOINT_PERIOD={steps}", "--gin.train.progress=False"]
  ref = tmp_path / "ref"
  procs, _ = _two_processes(ref, args, tmp_path, "ref")
  assert [p.wait(timeout=900) for p in procs] == [0, 0]

  run = tmp_path / "run"
  procs, logs = _two_processes(run, args, tmp_path, "run")
  deadline = time.time() + 600
  while "step 4:" not in logs[0].read_text() and time.time() < deadline:
    time.sleep(0.2)
  procs[1].send_signal(15)                      # SIGTERM to process 1 only
  rcs = [p.wait(timeout=600) for p in procs]
  texts = [l.read_text() for l in logs]
  assert rcs == [75, 75], texts[1][-2000:]
  saved = [re.search(r"preempted: SIGTERM at step (\d+): saved", t).group(1) for t in texts]
  assert saved[0] == saved[1] and 4 <= int(saved[0]) < steps
  assert (run / f"checkpoint_{saved[0]}").is_dir()

  procs, logs = _two_processes(run, args, tmp_path, "resume")
  assert [p.wait(timeout=900) for p in procs] == [0, 0]
  assert f"resumed from {run}/checkpoint_{saved[0]}" in logs[0].read_text()
  jax.tree.map(np.testing.assert_array_equal, _params(ref), _params(run))


def test_a_run_resumed_on_more_devices_sees_the_same_batches(tmp_path, toy_task,
                                                               monkeypatch):
  """1 device, stopped at step 4, resumed on 2 devices: every step's global batch is the
  one the uninterrupted 1-device run read, and the result agrees (to float rounding: a
  sum over 2 devices is added in another order)."""
  from conftest import toy_train
  from vmx.training import step as step_lib
  name, vp, _, _ = toy_task
  real = step_lib.TrainStep.step

  def recording(seen):
    def step(self, state, batch):
      seen.append({k: np.asarray(v) for k, v in batch.items()})
      return real(self, state, batch)
    return step
  whole, split = [], []
  monkeypatch.setattr(step_lib.TrainStep, "step", recording(whole))
  ref = toy_train(tmp_path / "ref", name, vp, total_steps=8, period=100, num_devices=1)
  monkeypatch.setattr(step_lib.TrainStep, "step", recording(split))
  toy_train(tmp_path / "run", name, vp, total_steps=8, period=4, num_devices=1, stop_at_step=4)
  got = toy_train(tmp_path / "run", name, vp, total_steps=8, period=4, num_devices=2)
  assert len(whole) == len(split) == 8
  for a, b in zip(whole, split):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-5),
               jax.tree.map(np.asarray, ref.params), jax.tree.map(np.asarray, got.params))

