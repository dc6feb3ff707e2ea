"""MODEL_DIR on gs://, end to end against a GCS emulator (gcp-storage-emulator on
127.0.0.1, tests/gcs_emulator.py), reached only through the standard variables: STORAGE_EMULATOR_HOST (gcsfs),
TENSORSTORE_GCS_HTTP_URL (tensorstore, orbax's array store) and EPATH_USE_TF=false (etils
then reaches gs:// through gcsfs; TensorFlow's GCS filesystem has no endpoint override).
The same code talks to real GCS with those unset.

launch/train.py trains to gs://, is killed (SIGKILL) after a checkpoint, resumes from
gs://, and ends bit for bit where an uninterrupted local run ends; the bucket holds the
checkpoints with their checksum manifests, metrics.jsonl (one row per step), TensorBoard
events, config.gin, vmx_model.json and the vocabulary; Encoder.from_checkpoint('gs://...')
encodes as the local run's encoder; the evaluation harness writes its results to gs://.
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO

pytest.importorskip("gcsfs", reason="gcsfs (test extra) is not installed")
pytest.importorskip("gcp_storage_emulator",
                    reason="gcp-storage-emulator (test extra) is not installed")
BUCKET = "vmx-test"
STEPS, PERIOD = 60, 20


def _kill_campaign():
  spec = importlib.util.spec_from_file_location("kill_campaign",
                                                REPO / "benchmarks" / "kill_campaign.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """An in-memory GCS emulator with one bucket; the variables that point clients at it."""
  port = _free_port()
  log = open(tmp_path_factory.mktemp("gcs") / "emulator.log", "w")
  proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcs_emulator.py"), str(port),
                           BUCKET], stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + 30
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      break
    except OSError:
      if time.time() > deadline or proc.poll() is not None:
        proc.kill()
        pytest.fail(f"the GCS emulator did not start (see {log.name})")
      time.sleep(0.2)
  url = f"http://127.0.0.1:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "EPATH_USE_TF": "false",
         # gcsfs's probe for zonal buckets needs real credentials: off (no warning a call)
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  yield env
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  proc.kill()
  proc.wait()
  log.close()


def test_train_kill_resume_encode_on_gcs(gcs, tmp_path):
  from etils import epath

  from vmx.evaluation import harness
  from vmx.inference import Encoder
  kc = _kill_campaign()
  gin_file = kc.write_task(tmp_path, steps=STEPS, checkpoint_period=PERIOD, keep=2)
  env = {**kc.train_env(None), **gcs}
  remote = f"gs://{BUCKET}/runs/contrastive"
  cmd = lambda model_dir: [sys.executable, "launch/train.py", f"--gin_file={gin_file}",  # noqa: E731
                           f"--gin.MODEL_DIR={model_dir}", "--gin.LOG_PERIOD=5"]

  # An uninterrupted local run: the reference.
  local = tmp_path / "local"
  out = subprocess.run(cmd(local), env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

  # The same run on gs://, killed once its first checkpoint (and manifest) is in the bucket.
  first = epath.Path(remote) / f"checkpoint_{PERIOD}" / "vmx_checksums.json"
  log = open(tmp_path / "killed.log", "w")
  proc = subprocess.Popen(cmd(remote), env=env, cwd=REPO, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
  deadline = time.time() + 300
  while not first.exists():
    assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
    assert time.time() < deadline, "no checkpoint in the bucket after 300 s"
    time.sleep(0.05)
  os.killpg(proc.pid, 9)
  proc.wait()
  log.close()
  assert proc.returncode == -9        # killed, not finished

  out = subprocess.run(cmd(remote), env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  resumed = [int(s) for s in kc.RESUMED_RE.findall(out.stdout)]
  assert resumed and PERIOD <= resumed[0] < STEPS, out.stdout[-2000:]

  # What the bucket holds.
  d = epath.Path(remote)
  names = {p.name for p in d.iterdir()}
  assert {"config.gin", "vmx_model.json", "vocab.model", "metrics.jsonl", "train",
          f"checkpoint_{STEPS - PERIOD}", f"checkpoint_{STEPS}"} <= names, names
  assert not any(n.startswith("checkpoint_") and n not in
                 (f"checkpoint_{STEPS - PERIOD}", f"checkpoint_{STEPS}") for n in names)
  for s in (STEPS - PERIOD, STEPS):
    manifest = json.loads((d / f"checkpoint_{s}" / "vmx_checksums.json").read_text())
    assert any(k.startswith("params/") for k in manifest["files"])
  rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
  loss_steps = [r["step"] for r in rows if "train/loss" in r]
  assert loss_steps == list(range(5, STEPS + 1, 5))    # one row a logged step, none twice
  events = [p for p in (d / "train").iterdir() if p.name.startswith("events.out.tfevents")]
  assert len(events) == 2                               # the killed run's and the resumed one's
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  tb = tmp_path / "tb"
  tb.mkdir()
  for e in events:
    (tb / e.name).write_bytes(e.read_bytes())
  acc = EventAccumulator(str(tb))
  acc.Reload()
  assert STEPS in {ev.step for ev in acc.Tensors("train/loss")}

  # The resumed gs:// run ends where the uninterrupted local one does, bit for bit.
  enc_remote = Encoder.from_checkpoint(remote)
  enc_local = Encoder.from_checkpoint(local)
  assert enc_remote.revision == enc_local.revision == f"checkpoint_{STEPS}"
  assert enc_remote.name == "contrastive"
  import jax
  jax.tree.map(np.testing.assert_array_equal, enc_remote.params, enc_local.params)
  texts = ["alpha beta gamma", "DELTA EPSILON"]
  np.testing.assert_array_equal(enc_remote.encode(texts), enc_local.encode(texts))

  # The evaluation harness writes its results (JSON, summary, plot) to gs://.
  tat = tmp_path / "eval_data" / "eval" / "tatoeba" / "v1"
  tat.mkdir(parents=True)
  words = ["alpha beta", "gamma delta", "epsilon zeta eta", "theta iota", "kappa lambda mu"]
  (tat / "tatoeba.xx-eng.xx").write_text("".join(w + "\n" for w in words))
  (tat / "tatoeba.xx-eng.eng").write_text("".join(w.upper() + "\n" for w in words))
  cfg = harness.EvalConfig(data_dir=str(tmp_path / "eval_data"), tatoeba_languages=["xx"],
                           progress=False)
  res = harness.run(enc_remote, tasks=["tatoeba"], output_dir=f"{remote}/eval", config=cfg)
  saved = json.loads((d / "eval" / "tatoeba.json").read_text())
  assert saved["main_score"] == pytest.approx(res["tatoeba"]["main_score"])
  assert (d / "eval" / "summary.md").read_text().startswith("# vmx evaluation")
  assert (d / "eval" / "tatoeba_languages.png").read_bytes()[:4] == b"\x89PNG"
