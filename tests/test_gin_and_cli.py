"""Every gin experiment file parses; bad command lines give one clear error line."""
import ast
import os
import subprocess
import sys

import gin
import pytest

from conftest import REPO
from vmx import experiment, gin_utils

EXPERIMENTS = sorted(str(p.relative_to(REPO / "gin_configs"))
                     for pat in ("*.gin", "ablations/*.gin") for p in (REPO / "gin_configs").glob(pat))
REQUIRED_MACROS = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "NUM_LAYERS", "EMB_DIM",
                   "NUM_HEADS", "MLP_DIM", "VOCAB_SIZE", "MAX_LENGTH")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_parses_and_exposes_macros(name):
  gin.clear_config()
  try:
    experiment.parse_gin([name], ["MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 7",
                                 "INITIAL_CHECKPOINT_PATH = '/tmp/imported'"])
    static = name.startswith("static_")   # a StaticEncoder has no layers, heads or MLP
    for m in REQUIRED_MACROS:
      if not (static and m in ("NUM_LAYERS", "NUM_HEADS", "MLP_DIM")):
        gin.query_parameter(f"%{m}")
    assert gin.query_parameter("%TRAIN_STEPS") == 7
    lines = (REPO / "gin_configs" / name).read_text().splitlines()
    header = lines[:next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))]
    text = "\n".join(header)   # the leading comment block
    for word in ("Command:", "Hardware:", "Time:", "Result:"):
      assert word in text, f"{name}: header lacks {word!r}"
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name,bindings,want", [
    ("contrastive_minilm_all_pairs.gin", [], "/tmp/vmx/all-minilm-l6-v2"),   # the file's path
    ("contrastive_24l_mt5.gin", [], None),                       # required: None for tools
    ("contrastive_24l_mt5.gin", ["INITIAL_CHECKPOINT_PATH = '/x'"], "/x"),
    ("contrastive_small_1h.gin", [], None)])
def test_tools_keep_an_experiments_initial_checkpoint(name, bindings, want):
  """parse_experiment (benchmarks, training_inputs) sets INITIAL_CHECKPOINT_PATH only where
  the files leave it required: an imported tokenizer named through it stays the
  vocabulary (benchmarks/input_pipeline.py once timed a SentencePiece vocabulary built in
  its place)."""
  gin.clear_config()
  try:
    experiment.parse_experiment([name], bindings)
    assert gin.query_parameter("%INITIAL_CHECKPOINT_PATH") == want
  finally:
    gin.clear_config()


def _run(*args, env=None):
  e = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), *args],
                        capture_output=True, text=True, env=e, cwd=REPO, timeout=300)


def _error_line(proc):
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  return errors[0]


def test_unknown_binding_names_the_binding():
  line = _error_line(_run("--gin_file=contrastive_tiny.gin", "--gin.MODEL_DIR=/tmp/x",
                          "--gin.TransformerEncoder.num_layerz=3"))
  assert "num_layerz" in line


def test_unknown_configurable_names_it():
  line = _error_line(_run("--gin_file=contrastive_tiny.gin", "--gin.MODEL_DIR=/tmp/x",
                          "--gin.NoSuchThing.x=3"))
  assert "NoSuchThing" in line


def test_missing_gin_file():
  line = _error_line(_run("--gin_file=no_such_experiment.gin"))
  assert "no_such_experiment.gin" in line and "not found" in line


def test_required_model_dir_left_unset():
  line = _error_line(_run("--gin_file=contrastive_tiny.gin"))
  assert "MODEL_DIR" in line


def test_missing_data_dir(tmp_path):
  line = _error_line(_run("--gin_file=contrastive_tiny.gin", f"--gin.MODEL_DIR={tmp_path}",
                          env={"VMX_DATA_DIR": str(tmp_path / "absent")}))
  assert "absent" in line and "not a directory" in line


def test_plain_string_values_need_no_quotes():
  bindings, rest = gin_utils.split_gin_bindings(["--gin.MODEL_DIR=/tmp/a b", "--x",
                                                 "--gin.N=3", "--gin.S='q'"])
  assert bindings == ["MODEL_DIR = '/tmp/a b'", "N = 3", "S = 'q'"] and rest == ["--x"]


def test_scripts_help_keeps_the_commands_line_breaks():
  """`--help` prints each script's module docstring (and `help()` a module's): a `\\` ending
  a command's line there must be kept (a raw docstring, or `\\\\`), or the command is printed
  joined and without it."""
  joined = []
  for script in sorted(p for d in ("launch", "benchmarks", "vmx", "tasks")
                       for p in REPO.glob(f"{d}/**/*.py")):
    src = script.read_text()
    tree = ast.parse(src)
    doc = ast.get_docstring(tree, clean=False)
    if doc is not None and doc.count("\n") != ast.get_source_segment(src, tree.body[0].value).count("\n"):
      joined.append(script.relative_to(REPO).as_posix())
  assert not joined, f"docstrings that lose a line break: {joined}"


def test_build_vocab_sigterm_exits_75_and_writes_nothing(tmp_path):
  """The signal contract (vmx/signals.py) in launch/build_vocab.py: SIGTERM while
  SentencePiece trains ends with exit 75 and one `preempted:` line once the C call
  returns, and no vocabulary file appears (a rerun builds it whole)."""
  import random
  import signal
  import time
  rng = random.Random(0)
  words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
           for _ in range(30000)]
  text = tmp_path / "text.txt"
  text.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + "\n"
                          for _ in range(80000)))
  out = tmp_path / "vocab" / "v.model"
  p = subprocess.Popen([sys.executable, "launch/build_vocab.py", f"--output={out}",
                        "--vocab_size=4000", f"--input={text}"], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert "[vmx] building a 4000-piece vocabulary" in p.stdout.readline()
  time.sleep(2.0)                       # reading and sampling done: SentencePiece trains
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 75, err[-2000:]
  assert "preempted: SIGTERM while building the vocabulary" in err, err[-2000:]
  assert "Traceback" not in err and not out.exists()
  assert not out.parent.exists() or not [q for q in out.parent.iterdir() if ".tmp" in q.name]


def test_import_checkpoint_sigterm_exits_75_and_writes_nothing(tmp_path):
  """The signal contract in launch/import_checkpoint.py: SIGTERM during the import ends
  with exit 75 and one `preempted:` line, and the output directory does not appear."""
  import signal
  out = tmp_path / "imported"
  p = subprocess.Popen([sys.executable, "launch/import_checkpoint.py", f"--hf_dir={tmp_path}",
                        f"--output_dir={out}"], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  assert "[vmx] importing" in p.stdout.readline()
  p.send_signal(signal.SIGTERM)         # while jax and the importer load
  _, err = p.communicate(timeout=300)
  assert p.returncode == 75, err[-2000:]
  assert f"preempted: SIGTERM while importing {tmp_path}: nothing was written to {out}" in err
  assert "Traceback" not in err and not out.exists()
  assert not [q for q in tmp_path.iterdir() if q.name.startswith("imported")]


def test_a_signal_ends_registered_child_processes_before_its_line(tmp_path):
  """`signals.stopping(signals.end_child_processes)` (what a Beam run registers): the first
  SIGTERM kills every descendant (a `sh -c` and the program it runs, as Beam starts its
  workers) before `Interrupted` is raised, and waits until they are gone; a zombie (a child
  ended, not yet reaped) counts as gone for `storage.pid_alive`, the rule by which a killed
  writer's temporary files are collected."""
  script = f"""
import os, signal, subprocess, sys, time
sys.path.insert(0, {str(REPO)!r})
from vmx import signals, storage
from vmx.errors import Interrupted
zombie = subprocess.Popen(["true"])
time.sleep(0.5)                                  # ended, not reaped: a zombie
assert not storage.pid_alive(zombie.pid) and storage.pid_alive(os.getpid())
worker = subprocess.Popen("sleep 300; true", shell=True)
deadline = time.monotonic() + 10
while len(signals.child_processes()) < 2 and time.monotonic() < deadline:
  time.sleep(0.05)
kids = [q for q in signals.child_processes() if q != zombie.pid]
signals.install()
try:
  with signals.activity("waiting on workers"), signals.stopping(signals.end_child_processes):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
except Interrupted as e:
  print(len(kids), [q for q in kids if storage.pid_alive(q)], e)
"""
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith("2 [] SIGTERM while waiting on workers:"), out.stdout
