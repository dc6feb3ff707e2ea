"""Launching on clusters: cluster detection and the per-process layout, the SLURM batch
script run end to end with a local stand-in for srun (two processes that find each other
through SLURM's variables and all-reduce), the TPU pod script against a stand-in for
gcloud, and lint of the shell scripts and the Dockerfile."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port

CLUSTER_VARS = re.compile(r"^(SLURM_|OMPI_|PMI_|TPU_|MEGASCALE_|JAX_COORDINATOR|"
                          r"JOB_COMPLETION_INDEX)")


def _clean_env(**extra):
  """The test's environment without any cluster's variables, plus `extra`."""
  env = {k: v for k, v in os.environ.items() if not CLUSTER_VARS.match(k)}
  env.update(VMX_HOST_MALLOC="off", **extra)
  return env


def _stub(directory: Path, name: str, body: str) -> None:
  p = directory / name
  p.write_text("#!/usr/bin/env bash\n" + body)
  p.chmod(0o755)


def test_detect_cluster_reads_slurm_variables(monkeypatch):
  from vmx.training import distributed
  for k in list(os.environ):
    if CLUSTER_VARS.match(k):
      monkeypatch.delenv(k)
  assert distributed.detect_cluster() in (None, "gce_tpu", "gke_tpu")  # None off Cloud
  for k, v in dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="node[001-004]", SLURM_NTASKS="4",
                   SLURM_PROCID="2", SLURM_LOCALID="0").items():
    monkeypatch.setenv(k, v)
  assert distributed.detect_cluster() == "slurm"


@pytest.mark.parametrize("flags,message", [
    (["--multihost"], "no cluster detected"),
    (["--coordinator_address=127.0.0.1:1234"], "go together"),
    (["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=2"],
     r"--process_id=2 is not in \[0, --num_processes=2\)"),
])
def test_multihost_start_up_errors(flags, message):
  """Bad multi-process flags are one `error:` line before anything waits on a peer."""
  proc = subprocess.run([sys.executable, "launch/train.py", "--check_cluster", *flags],
                        capture_output=True, text=True, cwd=REPO, env=_clean_env(),
                        timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert re.search(message, proc.stderr.splitlines()[-1]), proc.stderr[-2000:]


def test_check_cluster_single_process():
  proc = subprocess.run([sys.executable, "launch/train.py", "--check_cluster"],
                        capture_output=True, text=True, cwd=REPO, timeout=120,
                        env=_clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "process 0 of 1" in proc.stdout and "(single process): 4 local / 4 devices" in proc.stdout
  assert "all-reduce over 4 devices: 4 (ok)" in proc.stdout


def test_slurm_batch_script_runs_two_processes(tmp_path):
  """launch/slurm_gpu.sbatch, with srun replaced by a stand-in that starts SLURM_NTASKS
  local tasks with SLURM's per-task variables: JAX detects SLURM, the two processes
  connect (coordinator: the first node of the step's node list) and all-reduce."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _stub(bin_dir, "srun", """
while [[ "${1:-}" == --* ]]; do shift; done   # srun's own options
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" > "$TASK_LOGS/task$i.out" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
""")
  env = _clean_env(
      PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
      VMX_VENV=str(tmp_path / "no_venv"), TASK_LOGS=str(tmp_path),
      GIN_FILE="contrastive_tiny.gin", MODEL_DIR=str(tmp_path / "run"),
      SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2",
      SLURM_SUBMIT_DIR=str(REPO), JAX_COORDINATOR_PORT=str(free_port()),
      XLA_FLAGS="--xla_force_host_platform_device_count=2")
  proc = subprocess.run(["bash", "launch/slurm_gpu.sbatch", "--check_cluster"],
                        capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
  logs = [(tmp_path / f"task{i}.out").read_text() for i in range(2)]
  assert proc.returncode == 0, proc.stderr[-2000:] + "\n".join(l[-2000:] for l in logs)
  for i, log in enumerate(logs):
    assert f"process {i} of 2" in log and "(slurm): 2 local / 4 devices" in log, log
    assert "all-reduce over 4 devices: 4 (ok)" in log, log
  assert not (tmp_path / "run").exists()     # a check writes nothing


def test_slurm_batch_script_needs_its_settings(tmp_path):
  proc = subprocess.run(["bash", "launch/slurm_gpu.sbatch"], capture_output=True, text=True,
                        cwd=REPO, env=_clean_env(), timeout=60)
  assert proc.returncode != 0 and "set GIN_FILE" in proc.stderr


def _pod(tmp_path, *args, state="READY", **settings):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  log = tmp_path / "gcloud.log"
  _stub(bin_dir, "gcloud", f"""
printf '%s\\n' "$*" >> {log}
if [[ "$*" == *" describe "* ]]; then echo {state}; fi
""")
  env = _clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", TPU_NAME="pod1", ZONE="zone-a",
                   **settings)
  proc = subprocess.run(["bash", "launch/tpu_pod.sh", *args], capture_output=True, text=True,
                        cwd=REPO, env=env, timeout=120)
  return proc, (log.read_text().splitlines() if log.exists() else [])


def test_tpu_pod_resume_recreates_a_preempted_pod_and_trains(tmp_path):
  """`resume` on a preempted spot pod: delete, create, copy, install, then train on all
  workers with --multihost into the same MODEL_DIR (which resumes from its checkpoint)."""
  proc, calls = _pod(tmp_path, "resume", "--gin.BATCH_SIZE=4096", state="PREEMPTED",
                     SPOT="1", MODEL_DIR="/mnt/shared/run 1", GIN_FILE="contrastive_24l.gin")
  assert proc.returncode == 0, proc.stderr
  verbs = [c.split()[3] for c in calls]
  assert verbs == ["describe", "delete", "create", "scp", "ssh", "ssh", "ssh"], calls
  create = calls[2]
  assert "--accelerator-type=v4-32" in create and "--spot" in create and "--zone=zone-a" in create
  assert all("--worker=all" in c for c in calls[3:])
  train = calls[-1]
  assert "--multihost" in train and "--gin.BATCH_SIZE=4096" in train
  assert r"--gin.MODEL_DIR=/mnt/shared/run\ 1" in train and "--gin_file=contrastive_24l.gin" in train
  assert "launch/train.py" in train and "nohup" in train


def test_tpu_pod_copy_sends_the_tracked_files(tmp_path):
  proc, calls = _pod(tmp_path, "copy")
  assert proc.returncode == 0, proc.stderr
  assert calls[0].split()[3] == "scp" and "pod1:vmx.tar.gz" in calls[0]
  archive = calls[0].split()[4]
  names = subprocess.run(["tar", "-tzf", archive], capture_output=True, text=True).stdout.split()
  tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                           cwd=REPO).stdout.split()
  assert sorted(names) == sorted(tracked) and "launch/train.py" in names


def test_tpu_pod_script_errors(tmp_path):
  proc, calls = _pod(tmp_path, "train")
  assert proc.returncode != 0 and "set MODEL_DIR" in proc.stderr and not calls
  proc, _ = _pod(tmp_path, "frobnicate")
  assert proc.returncode == 2 and "launch/tpu_pod.sh create" in proc.stdout


@pytest.mark.parametrize("tool,files", [
    ("shellcheck", ["launch/tpu_pod.sh", "launch/slurm_gpu.sbatch", ".ci/run"]),
    ("hadolint", ["Dockerfile"]),
])
def test_scripts_and_dockerfile_lint_clean(tool, files):
  exe = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
  if exe is None:
    pytest.skip(f"{tool} not installed (the test extra brings it)")
  proc = subprocess.run([exe, *files], capture_output=True, text=True, cwd=REPO)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_copies_what_the_package_needs():
  """No docker engine here: check that the image gets every package setup.py installs and
  what its entry point runs."""
  text = (REPO / "Dockerfile").read_text()
  copied = {m.group(1) for m in re.finditer(r"^COPY (\S+) ", text, re.M)}
  copied |= {w for m in re.finditer(r"^COPY (.+) \./$", text, re.M) for w in m.group(1).split()}
  for path in copied:
    assert (REPO / path).exists(), path
  assert {"setup.py", "README.md", "vmx", "tasks", "gin_configs", "launch"} <= copied
  assert '"launch/train.py"' in text
