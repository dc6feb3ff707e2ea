"""What the benchmarks share: the `launch/train.py` command and its environment, running
and watching it, what a run leaves in MODEL_DIR (by vmx.modeldir.layout's names), comparing
two runs' checkpoints bit for bit, and the tiny synthetic task of the campaigns and probes.

Imported normally (`from benchmarks import common`): the scripts put the repository root
first on sys.path, the tests have it there already.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

from vmx.modeldir import layout  # noqa: E402  (after the path set-up above)

# orbax 0.12 writes <model_dir>/checkpoint_<step>.orbax-checkpoint-tmp... then renames it
TMP_MARKER = ".orbax-checkpoint-tmp"
CKPT_RE = re.compile(rf"^{layout.CHECKPOINT_PREFIX}_(\d+)$")
TMP_RE = re.compile(rf"^{layout.CHECKPOINT_PREFIX}_(\d+)\.orbax-checkpoint-tmp")
RESUMED_RE = re.compile(r"\[vmx\] resumed from .*checkpoint_(\d+)")
PREEMPTED_RE = re.compile(r"preempted: SIG\w+ at step (\d+): saved .*checkpoint_(\d+)")
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau").split()


# ----------------------------------------------------------------------------- commands

def train_command(gin_files, model_dir, *extra: str) -> list[str]:
  """`python launch/train.py --gin_file=... --gin.MODEL_DIR=... <extra>`."""
  files = [gin_files] if isinstance(gin_files, (str, os.PathLike)) else list(gin_files)
  return [sys.executable, str(REPO / "launch" / "train.py"),
          *[f"--gin_file={f}" for f in files], f"--gin.MODEL_DIR={model_dir}", *extra]


def launcher_command(name: str, *args: str) -> list[str]:
  """`python launch/<name>.py <args>` (eval, cache_tasks, import_checkpoint, ...)."""
  return [sys.executable, str(REPO / "launch" / f"{name}.py"), *args]


def train_env(compile_cache: Optional[Path] = None, platforms: str = "cpu") -> dict:
  """The environment of a benchmark's launcher: the real 1-device CPU (XLA_FLAGS dropped),
  unbuffered output, optionally a shared JAX compilation cache."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["PYTHONUNBUFFERED"] = "1"
  if platforms:
    env["JAX_PLATFORMS"] = platforms
  if compile_cache is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = str(compile_cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  return env


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now (emulators, JAX coordinators)."""
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_gcs_emulator(bucket: str, port: Optional[int] = None, log=None):
  """tests/gcs_emulator.py (in memory, one bucket) on 127.0.0.1, once it takes connections:
  (its process, its URL, the variables that point clients at it). `log`: where its output
  goes (default nowhere). RuntimeError if it does not start in 30 s."""
  import socket
  port = port or free_port()
  proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcs_emulator.py"), str(port),
                           bucket], stdout=log or subprocess.DEVNULL,
                          stderr=subprocess.STDOUT if log else subprocess.DEVNULL)
  url = f"http://127.0.0.1:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "EPATH_USE_TF": "false",
         # gcsfs's probe for zonal buckets needs real credentials: off (no warning a call)
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  deadline = time.time() + 30
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return proc, url, env
    except OSError:
      if time.time() > deadline or proc.poll() is not None:
        proc.kill()
        raise RuntimeError(f"the GCS emulator did not start on port {port}") from None
      time.sleep(0.2)


def run(cmd: Sequence[str], env: Optional[dict] = None, timeout: float = 3600,
        check: bool = False, echo: bool = False) -> subprocess.CompletedProcess:
  """Runs a command in the repository root and captures its output; `check`: a non-zero
  exit raises with the end of its stderr."""
  if echo:
    print("[bench] " + " ".join(str(c) for c in cmd[1:]), flush=True)
  out = subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=timeout)
  if check and out.returncode != 0:
    raise RuntimeError(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n"
                       f"{out.stderr[-3000:]}")
  return out


def last_line(text: str) -> str:
  """The last line a launcher printed, without TensorFlow's and XLA's start-up lines."""
  lines = [l for l in text.splitlines() if l.strip() and not l.startswith(
      ("I0000", "W0000", "E0000", "WARNING"))]
  return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- MODEL_DIR

def metrics_rows(model_dir) -> list[dict]:
  """The rows of a run's metrics file, one per logged step."""
  path = Path(model_dir) / layout.METRICS_FILE
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def checkpoint_dir(model_dir, step: int) -> Path:
  return Path(layout.step_dir(model_dir, step))


def scan(model_dir) -> tuple[list[int], list[int]]:
  """(finished checkpoint steps, steps of orbax's temporary checkpoint dirs)."""
  done, tmp = [], []
  try:
    names = os.listdir(model_dir)
  except FileNotFoundError:
    return done, tmp
  for n in names:
    m = CKPT_RE.match(n)
    if m:
      done.append(int(m.group(1)))
    elif TMP_MARKER in n:
      m = TMP_RE.match(n)
      tmp.append(int(m.group(1)) if m else -1)
  return sorted(done), sorted(tmp)


def load_checkpoint(model_dir, step: int) -> dict:
  """{'params<path>': ndarray, 'train_state<path>': ndarray, 'data': dict} of a checkpoint,
  as saved (no model needed)."""
  import warnings

  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  ckpt = checkpoint_dir(Path(model_dir).absolute(), step)
  out = {}
  with ocp.PyTreeCheckpointer() as c, warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Sharding info not provided")
    for item in ("params", "train_state"):
      tree = c.restore(ckpt / item)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        out[f"{item}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
  out["data"] = json.loads((ckpt / "data" / "metadata").read_text())
  return out


def compare(ref: dict, got: dict) -> list[dict]:
  """Differences between two load_checkpoint() results ([] = bitwise equal)."""
  import numpy as np
  diffs = []
  for k in sorted(set(ref) | set(got)):
    if k not in ref or k not in got:
      diffs.append({"leaf": k, "problem": "missing in " + ("run" if k in ref else "reference")})
      continue
    a, b = ref[k], got[k]
    if k == "data":
      if a != b:
        diffs.append({"leaf": k, "reference": a, "run": b})
      continue
    if a.dtype != b.dtype or a.shape != b.shape:
      diffs.append({"leaf": k, "problem": f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"})
    elif a.tobytes() != b.tobytes():  # bitwise, NaNs and signed zeros included
      d = {"leaf": k, "unequal_elements": int(np.sum(a != b))}
      if np.issubdtype(a.dtype, np.number):
        d["max_abs_diff"] = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
      diffs.append(d)
  return diffs


def same_final_state(model_dir_a, model_dir_b, step: int) -> list[dict]:
  """compare() of two runs' checkpoints at `step`."""
  return compare(load_checkpoint(model_dir_a, step), load_checkpoint(model_dir_b, step))


# ----------------------------------------------------------------------------- a watched run

class Run:
  """One launcher process in its own session (a signal goes to its whole group), its
  output in `log_path`, its MODEL_DIR polled for checkpoint writes."""

  def __init__(self, cmd: Sequence[str], env: dict, model_dir: Path, log_path: Path):
    self.model_dir = Path(model_dir)
    self.model_dir.mkdir(parents=True, exist_ok=True)
    self.log_path = log_path
    self._log = open(log_path, "w")
    self.t0 = time.monotonic()
    self.proc = subprocess.Popen(list(cmd), env=env, cwd=REPO, stdout=self._log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    self.tmp_seen: dict[int, list[float]] = {}   # step -> [first seen, last seen] (s)

  def elapsed(self) -> float:
    return time.monotonic() - self.t0

  def poll(self) -> tuple[list[int], list[int]]:
    done, tmp = scan(self.model_dir)
    t = self.elapsed()
    for s in tmp:
      self.tmp_seen.setdefault(s, [t, t])[1] = t
    return done, tmp

  def kill(self, sig: int = signal.SIGKILL, timeout: float = 300.0):
    """Sends `sig` to the process group and waits for the exit (SIGKILL after `timeout`)."""
    try:
      os.killpg(self.proc.pid, sig)
    except ProcessLookupError:
      pass
    try:
      self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait()
    self._log.close()

  def wait(self, timeout: float, poll_interval: float = 0.05) -> int:
    deadline = time.monotonic() + timeout
    while self.proc.poll() is None:
      if time.monotonic() > deadline:
        self.kill()
        raise TimeoutError(f"{self.log_path}: no exit after {timeout:.0f} s")
      self.poll()
      time.sleep(poll_interval)
    self._log.close()
    return self.proc.returncode

  def text(self) -> str:
    return self.log_path.read_text(errors="replace")

  def wait_for(self, text: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while text not in self.text():
      if time.monotonic() > deadline or self.proc.poll() is not None:
        raise TimeoutError(f"{self.log_path}: no {text!r}")
      time.sleep(0.05)

  def log_tail(self, n: int = 2000) -> str:
    return self.text()[-n:]


# ----------------------------------------------------------------------------- the tiny task

def write_task(work_dir: Path, steps: int, checkpoint_period: int = 5, keep: int = 2,
               pairs: int = 600, vocab_size: int = 100, seed: int = 0) -> Path:
  """A ~600-pair synthetic Moses corpus from a 19-word list, its ~100-piece vocabulary and
  an experiment file (a 1-layer, 32-wide CONTRASTIVE encoder with dropout 0.1, adam with
  linear warm-up/decay, batch 16, length 16, no evaluation) in work_dir; returns the gin
  file's path."""
  import numpy as np
  data = work_dir / "data"
  data.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for _ in range(pairs):
    ws = list(rng.choice(WORDS, size=rng.integers(2, 9)))
    src.append(" ".join(ws))
    tgt.append(" ".join(w.upper() for w in ws))
  src_path, tgt_path = data / "toy.xx", data / "toy.en"
  src_path.write_text("".join(l + "\n" for l in src), encoding="utf-8")
  tgt_path.write_text("".join(l + "\n" for l in tgt), encoding="utf-8")
  vocab_path = data / "toy.model"
  if not vocab_path.exists():
    from vmx.data.vocab import train_sentencepiece
    train_sentencepiece([str(src_path), str(tgt_path)], str(vocab_path), vocab_size,
                        ["xx", "en"])
  import sentencepiece as spm
  pieces = spm.SentencePieceProcessor(model_file=str(vocab_path)).get_piece_size()
  gin_file = work_dir / "experiment.gin"
  gin_file.write_text(f"""\
# Written by benchmarks/common.py: a tiny CONTRASTIVE run on a synthetic corpus.
include 'architectures/transformer.gin'
include 'models/contrastive.gin'
include 'runs/train.gin'

MIXTURE_OR_TASK_NAME = @tasks.moses_task()
tasks.moses_task.name = 'kill_campaign_toy'
tasks.moses_task.source_file = {str(src_path)!r}
tasks.moses_task.target_file = {str(tgt_path)!r}
tasks.moses_task.source_language = 'xx'
tasks.moses_task.target_language = 'en'
tasks.moses_task.vocabulary = %VOCABULARY
tasks.moses_task.model_languages = %LANGUAGES
VOCABULARY = {str(vocab_path)!r}
LANGUAGES = ['xx', 'en']
train.eval_cfg = None

NUM_LAYERS = 1
EMB_DIM = 32
NUM_HEADS = 2
MLP_DIM = 64
VOCAB_SIZE = {pieces}
MAX_LENGTH = 16
BATCH_SIZE = 16
DROPOUT_RATE = 0.1
TRAIN_STEPS = {steps}
OPTIMIZER = 'adam'
LR_SCHEDULE = 'linear'
LEARNING_RATE = 2e-3
WARMUP_STEPS = 5
CHECKPOINT_PERIOD = {checkpoint_period}
CHECKPOINTS_TO_KEEP = {keep}
LOG_PERIOD = 10
""", encoding="utf-8")
  return gin_file
