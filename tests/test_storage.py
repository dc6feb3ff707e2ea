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
Everything that touches gs:// runs in subprocesses started with those variables (etils
reads EPATH_USE_TF once per process); the test itself asks the emulator's JSON API.
"""
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from benchmarks import common
from conftest import GCS_BUCKET as BUCKET, REPO

pytest.importorskip("gcsfs", reason="gcsfs (test extra) is not installed")
pytest.importorskip("gcp_storage_emulator",
                    reason="gcp-storage-emulator (test extra) is not installed")
STEPS, PERIOD = 60, 20


@pytest.fixture(scope="module")
def gcs(gcs_emulator):
  return gcs_emulator


def _object_exists(url: str, name: str) -> bool:
  try:
    with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o/"
                                f"{urllib.parse.quote(name, safe='')}", timeout=5):
      return True
  except urllib.error.HTTPError as e:
    if e.code == 404:
      return False
    raise


# Run with the emulator's variables: reads the gs:// run back through vmx (and etils) and
# prints what the test checks.
CHECK = r"""
import json, sys
import jax, numpy as np
from etils import epath
from vmx.evaluation import harness
from vmx.inference import Encoder
remote, local, data_dir, tb_dir = sys.argv[1:5]
er, el = Encoder.from_checkpoint(remote), Encoder.from_checkpoint(local)
texts = ["alpha beta gamma", "DELTA EPSILON"]
d = epath.Path(remote)
out = {"revisions": [er.revision, el.revision], "name": er.name,
       "same_params": all(np.array_equal(a, b) for a, b in
                          zip(jax.tree.leaves(er.params), jax.tree.leaves(el.params))),
       "same_encodings": bool(np.array_equal(er.encode(texts), el.encode(texts))),
       "names": sorted(p.name for p in d.iterdir()),
       "metrics": (d / "metrics.jsonl").read_text(),
       "manifests": {p.name: sorted(json.loads((p / "vmx_checksums.json").read_text())["files"])
                     for p in d.iterdir() if p.name.startswith("checkpoint_")}}
events = [p for p in (d / "train").iterdir() if p.name.startswith("events.out.tfevents")]
for e in events:
  epath.Path(tb_dir, e.name).write_bytes(e.read_bytes())
out["events"] = len(events)
cfg = harness.EvalConfig(data_dir=data_dir, tatoeba_languages=["xx"], progress=False)
res = harness.run(er, tasks=["tatoeba"], output_dir=remote + "/eval", config=cfg)
out["eval_score"] = res["tatoeba"]["main_score"]
out["eval_saved"] = json.loads((d / "eval" / "tatoeba.json").read_text())["main_score"]
out["summary"] = (d / "eval" / "summary.md").read_text()
out["png"] = (d / "eval" / "tatoeba_languages.png").read_bytes()[:4].hex()
print("RESULT " + json.dumps(out))
"""


def test_train_kill_resume_encode_on_gcs(gcs, tmp_path):
  url, gcs_env = gcs
  kc = common
  gin_file = kc.write_task(tmp_path, steps=STEPS, checkpoint_period=PERIOD, keep=2)
  env = {**kc.train_env(None), **gcs_env}
  prefix = "runs/contrastive"
  remote = f"gs://{BUCKET}/{prefix}"
  cmd = lambda model_dir: common.train_command(gin_file, model_dir,  # noqa: E731
                                              "--gin.LOG_PERIOD=5")

  # An uninterrupted local run: the reference.
  local = tmp_path / "local"
  out = subprocess.run(cmd(local), env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

  # The same run on gs://, killed once its first checkpoint (and manifest) is in the bucket.
  log = open(tmp_path / "killed.log", "w")
  proc = subprocess.Popen(cmd(remote), env=env, cwd=REPO, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
  deadline = time.time() + 300
  while not _object_exists(url, f"{prefix}/checkpoint_{PERIOD}/vmx_checksums.json"):
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

  # Read back through vmx in a process of its own (the emulator's variables set).
  tat = tmp_path / "eval_data" / "eval" / "tatoeba" / "v1"
  tat.mkdir(parents=True)
  words = ["alpha beta", "gamma delta", "epsilon zeta eta", "theta iota", "kappa lambda mu"]
  (tat / "tatoeba.xx-eng.xx").write_text("".join(w + "\n" for w in words))
  (tat / "tatoeba.xx-eng.eng").write_text("".join(w.upper() + "\n" for w in words))
  tb = tmp_path / "tb"
  tb.mkdir()
  out = subprocess.run([sys.executable, "-c", CHECK, remote, str(local),
                        str(tmp_path / "eval_data"), str(tb)],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  r = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))[7:])

  # The bucket holds the run: the two newest checkpoints with their manifests, metrics
  # with one row a logged step (none twice after the resume), TensorBoard events of both
  # processes, config, model info and vocabulary.
  assert {"config.gin", "vmx_model.json", "vocab.model", "metrics.jsonl", "train",
          f"checkpoint_{STEPS - PERIOD}", f"checkpoint_{STEPS}"} <= set(r["names"]), r["names"]
  assert sorted(r["manifests"]) == [f"checkpoint_{STEPS - PERIOD}", f"checkpoint_{STEPS}"]
  assert all(any(f.startswith("params/") for f in files) for files in r["manifests"].values())
  rows = [json.loads(l) for l in r["metrics"].splitlines()]
  assert [x["step"] for x in rows if "train/loss" in x] == list(range(5, STEPS + 1, 5))
  assert r["events"] == 2                         # the killed run's and the resumed one's
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  acc = EventAccumulator(str(tb))
  acc.Reload()
  assert STEPS in {ev.step for ev in acc.Tensors("train/loss")}

  # The resumed gs:// run ends where the uninterrupted local one does, bit for bit, and
  # encodes the same from the bucket.
  assert r["revisions"] == [f"checkpoint_{STEPS}"] * 2 and r["name"] == "contrastive"
  assert r["same_params"] and r["same_encodings"]

  # The evaluation harness wrote its results (JSON, summary, plot) to gs://.
  assert r["eval_saved"] == pytest.approx(r["eval_score"])
  assert r["summary"].startswith("# vmx evaluation")
  assert r["png"] == b"\x89PNG".hex()


LOCK = r"""
import sys
from etils import epath
from vmx.modeldir import run
d = sys.argv[1]
first = run.RunLock(d).acquire()
try:
  run.RunLock(d).acquire()
  print("SECOND TOOK IT")
except run.RunLockedError as e:
  print("REFUSED", e)
first.release()
print("LEFT", epath.Path(d, "vmx.lock").exists())
"""


def test_one_writer_on_gcs(gcs, tmp_path):
  """MODEL_DIR/vmx.lock on gs://: a second trainer is refused, the lock goes at release."""
  url, gcs_env = gcs
  script = tmp_path / "lock.py"
  script.write_text(LOCK)
  proc = subprocess.run([sys.executable, str(script), f"gs://{BUCKET}/locked_run"],
                        capture_output=True, text=True, cwd=REPO, timeout=300,
                        env={**os.environ, **gcs_env})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "REFUSED" in proc.stdout and "another trainer" in proc.stdout, proc.stdout
  assert "LEFT False" in proc.stdout
  assert not _object_exists(url, "locked_run/vmx.lock")
