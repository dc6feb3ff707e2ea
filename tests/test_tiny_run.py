"""A short tiny CONTRASTIVE run on real data lifts Tatoeba far above a random-init model;
its checkpoint is usable through launch/eval.py and Encoder without TensorFlow."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, needs_data

STEPS = 400


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("tiny_run")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the real CLI on the real (1-device) CPU
  proc = subprocess.run(
      [sys.executable, str(REPO / "launch/train.py"), "--gin_file=contrastive_tiny.gin",
       f"--gin.MODEL_DIR={model_dir}", f"--gin.TRAIN_STEPS={STEPS}",
       f"--gin.EVAL_PERIOD={STEPS}", f"--gin.CHECKPOINT_PERIOD={STEPS}"],
      capture_output=True, text=True, env=env, cwd=REPO, timeout=1500)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(l) for l in (model_dir / "metrics.jsonl").read_text().splitlines()]
  return model_dir, rows


@needs_data
def test_tiny_run_lifts_tatoeba(tiny_run):
  model_dir, rows = tiny_run
  init = next(r for r in rows if r["step"] == 0 and "tatoeba/mean" in r)
  final = [r for r in rows if r["step"] == STEPS and "tatoeba/mean" in r][-1]
  langs = [k for k in init if k.startswith("tatoeba/") and k != "tatoeba/mean"]
  lifted = [k for k in langs if final[k] >= 3 * init[k] and final[k] >= init[k] + 10]
  assert len(lifted) >= 5, {k: (init[k], final[k]) for k in langs}
  assert final["tatoeba/mean"] >= 3 * init["tatoeba/mean"]
  train_losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert train_losses[-1] < train_losses[0]
  assert (model_dir / "train").is_dir()  # TensorBoard events
  assert (model_dir / f"checkpoint_{STEPS}").is_dir()


@needs_data
def test_eval_cli_and_encoder_need_no_tensorflow(tiny_run):
  model_dir, rows = tiny_run
  final = [r for r in rows if r["step"] == STEPS and "tatoeba/mean" in r][-1]
  out = model_dir / "eval.json"
  code = (
      "import sys, runpy\n"
      f"sys.argv = ['eval.py', '--checkpoint_dir={model_dir}', '--tasks=tatoeba',"
      f" '--languages=deu,fra', '--output={out}']\n"
      f"runpy.run_path('{REPO}/launch/eval.py', run_name='__main__')\n"
      "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
      "assert 'seqio' not in sys.modules\n")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=env, cwd=REPO, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "deu" in proc.stdout and "mean" in proc.stdout
  res = json.loads(out.read_text())
  for lang in ("deu", "fra"):
    assert abs(res["languages"][lang]["mean"] - final[f"tatoeba/{lang}"]) < 0.2
