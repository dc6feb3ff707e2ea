#!/usr/bin/env python
"""Nothing lost (issue 35): each failure a user meets, tried through the real launchers on a
tiny synthetic task (benchmarks/kill_campaign.py's), with what it printed and whether every
byte written before it is still there.

  python benchmarks/failure_probe.py [--work_dir=DIR] [--only=case,case]

Cases:
  shape_change      restart a run with --gin.EMB_DIM=64 (it was 32): exit 2, one line naming
                    EMB_DIM, the run directory byte-identical; the original command then
                    resumes
  two_trainers      a second trainer on a directory a running one writes: exit 2 within
                    seconds naming the holder; the first ends with every metrics row
  sigterm           SIGTERM during training: a checkpoint at the next step, exit 75, one
                    `preempted:` line; the rerun resumes from that step
  sigint_twice      two SIGINTs: the second stops at once (no save)
  missing_step      launch/eval.py --step=999999: exit 2, `no checkpoint_999999 (existing ...)`
  fresh_elsewhere   a fresh run in a directory with another run's rows, under another config:
                    refused (exit 2) unless --fresh, which moves the old run aside
  read_only         a read-only MODEL_DIR: one error line (skipped as root: root writes anyway)
  bad_hf_config     launch/import_checkpoint.py on a config.json that is a list: one error line
  no_config_sizes   ... on a config.json that lacks the sizes: one error line

Prints one line per case (`ok` / `FAIL`, exit status, the last stderr line, bytes kept) and a
final JSON summary; exit status 1 if a case failed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kill_campaign  # noqa: E402  (its synthetic task and environment)

REPO = Path(__file__).resolve().parents[1]


def snapshot(d: Path) -> dict:
  return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(d.rglob("*")) if p.is_file()}


def kept(before: dict, d: Path) -> bool:
  """Every file of `before` is still there with the same bytes."""
  now = snapshot(d)
  return all(now.get(k) == v for k, v in before.items())


def last_line(text: str) -> str:
  lines = [l for l in text.splitlines() if l.strip() and not l.startswith(("I0000", "W0000",
                                                                          "E0000", "WARNING"))]
  return lines[-1] if lines else ""


class Probe:
  def __init__(self, work_dir: Path):
    self.work = work_dir
    self.gin = kill_campaign.write_task(work_dir, steps=60, checkpoint_period=10, keep=3)
    self.env = kill_campaign.train_env(work_dir / "jax_cache")

  def train_cmd(self, model_dir, *extra):
    return [sys.executable, str(REPO / "launch/train.py"), f"--gin_file={self.gin}",
            f"--gin.MODEL_DIR={model_dir}", "--gin.LOG_PERIOD=2", *extra]

  def run(self, cmd, timeout=600):
    return subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=REPO,
                          timeout=timeout)

  def start(self, cmd, log):
    f = open(log, "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=self.env,
                            cwd=REPO), f

  def trained(self, name, *extra) -> Path:
    d = self.work / name
    p = self.run(self.train_cmd(d, "--gin.train.stop_at_step=20", *extra))
    assert p.returncode == 0, p.stderr[-2000:]
    return d

  @staticmethod
  def wait_for(path: Path, text: str, timeout=300):
    t0 = time.time()
    while text not in path.read_text(errors="replace"):
      if time.time() - t0 > timeout:
        raise TimeoutError(f"{path}: no {text!r} after {timeout} s")
      time.sleep(0.05)

  # ------------------------------------------------------------------ cases

  def shape_change(self):
    d = self.trained("shape")
    before = snapshot(d)
    p = self.run(self.train_cmd(d, "--gin.EMB_DIM=64"))
    line = last_line(p.stderr)
    identical = snapshot(d) == before
    ok = p.returncode == 2 and "EMB_DIM 32 -> 64" in line and identical
    again = self.run(self.train_cmd(d))
    ok = ok and again.returncode == 0 and "resumed from" in again.stdout
    return ok, p.returncode, line, identical

  def two_trainers(self):
    d = self.work / "two"
    long = ("--gin.TRAIN_STEPS=100000",)
    first, f = self.start(self.train_cmd(d, *long), self.work / "two_first.log")
    self.wait_for(self.work / "two_first.log", "step 2:")
    t0 = time.time()
    p = self.run(self.train_cmd(d, *long))
    seconds = time.time() - t0
    line = last_line(p.stderr)
    running = first.poll() is None
    first.send_signal(signal.SIGTERM)            # the first saves and stops
    rc_first = first.wait(timeout=600)
    f.close()
    rows = [json.loads(l)["step"] for l in (d / "metrics.jsonl").read_text().splitlines()]
    logged = [int(l.split()[2].rstrip(":")) for l in (self.work / "two_first.log").read_text(
        ).splitlines() if l.startswith("[vmx] step ") and ": " in l and "loss" in l]
    ok = (p.returncode == 2 and "another trainer" in line and seconds < 60 and running
          and rc_first == 75 and rows == logged)
    return ok, p.returncode, f"{line} [{seconds:.0f} s]", rows == logged

  def sigterm(self):
    d = self.work / "term"
    log = self.work / "term.log"
    proc, f = self.start(self.train_cmd(d), log)
    self.wait_for(log, "step 4:")
    before = snapshot(d)
    metrics_before = (d / "metrics.jsonl").read_text()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    f.close()
    line = last_line(log.read_text())
    saved = line.split("saved ")[-1].split(";")[0] if "saved " in line else ""
    # The checkpoints and the metrics rows written before the signal are still there.
    bytes_kept = kept({k: v for k, v in before.items()
                       if k.startswith("checkpoint_") and "orbax" not in k}, d) and (
        d / "metrics.jsonl").read_text().startswith(metrics_before)
    there = bool(saved) and Path(saved).is_dir()
    again = self.run(self.train_cmd(d))
    ok = (rc == 75 and line.startswith("preempted: SIGTERM") and there
          and f"resumed from {saved}" in again.stdout and again.returncode == 0)
    return ok, rc, line, bytes_kept

  def sigint_twice(self):
    d = self.work / "int"
    log = self.work / "int.log"
    proc, f = self.start(self.train_cmd(d), log)
    self.wait_for(log, "step 4:")
    proc.send_signal(signal.SIGINT)
    self.wait_for(log, "SIGINT: saving")       # the first is taken; the second stops at once
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=120)
    f.close()
    line = last_line(log.read_text())
    return rc != 0 and rc != 75, rc, line, True

  def missing_step(self):
    d = self.trained("eval")
    before = snapshot(d)
    p = self.run([sys.executable, str(REPO / "launch/eval.py"), f"--checkpoint_dir={d}",
                  "--step=999999", "--tasks=tatoeba", "--no_progress"])
    line = last_line(p.stderr)
    return (p.returncode == 2 and "no checkpoint_999999 (existing steps:" in line,
            p.returncode, line, snapshot(d) == before)

  def fresh_elsewhere(self):
    d = self.trained("fresh")
    before = snapshot(d)
    p = self.run(self.train_cmd(d, "--gin.LEARNING_RATE=0.01"))
    refused = p.returncode == 2 and "LEARNING_RATE" in last_line(p.stderr)
    unchanged = snapshot(d) == before
    q = self.run(self.train_cmd(d, "--gin.LEARNING_RATE=0.01", "--fresh"))
    moved = [x for x in self.work.iterdir() if x.name.startswith("fresh.previous-")]
    ok = refused and unchanged and q.returncode == 0 and len(moved) == 1 and kept(
        before, moved[0])
    return ok, p.returncode, last_line(p.stderr), unchanged and bool(moved) and kept(before,
                                                                                   moved[0])

  def read_only(self):
    if os.geteuid() == 0:
      return None, None, "skipped: root ignores permissions", True
    d = self.trained("ro")
    before = snapshot(d)
    for p in [d, *d.rglob("*")]:
      p.chmod(p.stat().st_mode & ~0o222)
    try:
      p = self.run(self.train_cmd(d))
    finally:
      for x in [d, *d.rglob("*")]:
        x.chmod(x.stat().st_mode | 0o200)
    line = last_line(p.stderr)
    return (p.returncode == 2 and line.startswith("error:") and "Traceback" not in p.stderr,
            p.returncode, line, snapshot(d) == before)

  def _import(self, config) -> tuple:
    hf = self.work / f"hf_{len(list(self.work.glob('hf_*')))}"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config))
    out = self.work / f"{hf.name}_out"
    p = self.run([sys.executable, str(REPO / "launch/import_checkpoint.py"), f"--hf_dir={hf}",
                  f"--output_dir={out}"])
    line = last_line(p.stderr)
    return (p.returncode == 2 and line.startswith("error:") and "Traceback" not in p.stderr
            and not out.exists(), p.returncode, line, not out.exists())

  def bad_hf_config(self):
    return self._import([1, 2, 3])

  def no_config_sizes(self):
    return self._import({"model_type": "bert"})


CASES = ("shape_change", "two_trainers", "sigterm", "sigint_twice", "missing_step",
         "fresh_elsewhere", "read_only", "bad_hf_config", "no_config_sizes")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--work_dir", default=None)
  ap.add_argument("--only", default="", help=f"comma-separated of {', '.join(CASES)}")
  args = ap.parse_args(argv)
  work = Path(args.work_dir or tempfile.mkdtemp(prefix="vmx_failure_probe_")).absolute()
  work.mkdir(parents=True, exist_ok=True)
  probe = Probe(work)
  results = {}
  for name in [c for c in (args.only.split(",") if args.only else CASES) if c]:
    t0 = time.time()
    try:
      ok, rc, line, bytes_kept = getattr(probe, name)()
    except Exception as e:  # noqa: BLE001  (a probe that breaks is a failed case)
      ok, rc, line, bytes_kept = False, None, f"{type(e).__name__}: {e}", None
    results[name] = {"ok": ok, "exit": rc, "line": line, "bytes_kept": bytes_kept,
                     "seconds": round(time.time() - t0, 1)}
    tag = "ok  " if ok else ("skip" if ok is None else "FAIL")
    print(f"[failure_probe] {tag} {name:<16} exit {rc}  kept {bytes_kept}  {line[:160]}",
          flush=True)
  failed = [k for k, r in results.items() if r["ok"] is False]
  print(json.dumps({"cases": len(results), "failed": failed, "work_dir": str(work)}))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
