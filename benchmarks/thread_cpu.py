#!/usr/bin/env python
r"""Where a training step's CPU goes, by thread: one JSON line.

  VMX_DATA_DIR=../shared/data python benchmarks/thread_cpu.py \
      --gin_file=contrastive_small_1h.gin [--from_step=200] [--to_step=600] [--gin.X=V ...]

Runs `launch/train.py` to `--to_step` + 100 and reads the CPU time of each of its threads
(`/proc/PID/task/*/stat`, Linux) when the log line of `--from_step` and of `--to_step`
appear in metrics.jsonl; prints steps/s between them and the CPU a step per thread name
(`tf_XLAEigen`: XLA's compute threads; `python`: the loop, the prefetch thread and the
stream). Run it for two revisions in turn on an otherwise idle machine
(docs/performance.md, "Where a step's CPU goes, by thread"). Steps are read once a second,
so choose `--from_step`/`--to_step` on the log period.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)


def thread_cpu(pid: int) -> dict:
  """{tid: (name, CPU seconds)} of a live process's threads."""
  tick, out = os.sysconf("SC_CLK_TCK"), {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:       # the thread ended meanwhile
      continue
    fields = stat[stat.rindex(")") + 2:].split()
    out[tid] = (stat[stat.index("(") + 1:stat.rindex(")")],
                (int(fields[11]) + int(fields[12])) / tick)     # utime + stime
  return out


def last_step(model_dir: Path) -> int:
  try:
    rows = common.metrics_rows(model_dir)
  except (FileNotFoundError, ValueError):    # not written yet, or a line half written
    return 0
  return max([int(r.get("step", 0)) for r in rows] or [0])


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--gin_file", required=True)
  p.add_argument("--from_step", type=int, default=200)
  p.add_argument("--to_step", type=int, default=600)
  p.add_argument("--model_dir", default="", help="default: a new temporary directory")
  args, extra = p.parse_known_args()
  if not 0 < args.from_step < args.to_step:
    raise SystemExit(f"error: --from_step={args.from_step} --to_step={args.to_step}: need "
                     f"0 < from_step < to_step")
  model_dir = Path(args.model_dir or tempfile.mkdtemp(prefix="thread_cpu_"))
  cmd = common.train_command(args.gin_file, model_dir, "--gin.train.progress=False",
                             f"--gin.train.stop_at_step={args.to_step + 100}", *extra)
  log = open(model_dir.parent / f"{model_dir.name}.log", "w")
  proc = subprocess.Popen(cmd, cwd=REPO, env=common.train_env(), stdout=log,
                          stderr=subprocess.STDOUT)
  marks = {}    # step -> (time, thread CPU)
  while proc.poll() is None and len(marks) < 2:
    time.sleep(1)
    step = last_step(model_dir)
    for mark in (args.from_step, args.to_step):
      if mark not in marks and step >= mark:
        marks[mark] = (time.time(), thread_cpu(proc.pid))
  proc.wait()
  if len(marks) < 2:
    raise SystemExit(f"error: the run stopped (exit {proc.returncode}) before step "
                     f"{args.to_step}; its log: {log.name}")
  (t0, cpu0), (t1, cpu1) = marks[args.from_step], marks[args.to_step]
  steps = args.to_step - args.from_step
  per_name = collections.defaultdict(float)
  for tid, (name, seconds) in cpu1.items():
    per_name[name] += seconds - cpu0.get(tid, (name, 0.0))[1]
  print(json.dumps({
      "gin_file": args.gin_file, "steps": steps, "steps_per_s": round(steps / (t1 - t0), 3),
      "cpu_ms_per_step": {name: round(1000 * s / steps, 2) for name, s in
                          sorted(per_name.items(), key=lambda kv: -kv[1]) if s > 0}}))


if __name__ == "__main__":
  main()
