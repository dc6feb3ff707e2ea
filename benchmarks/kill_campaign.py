#!/usr/bin/env python
"""kill -9 campaign: SIGKILL a training run at random moments, restart it, and check that it
ends bit for bit where an uninterrupted run ends. `--signal=SIGTERM`: the preemption
campaign, the same with SIGTERM (what Cloud TPU preemption, SLURM and Kubernetes send).

  python benchmarks/kill_campaign.py [--kills=10] [--seed=0] [--steps=50] [--work_dir=DIR]
  python benchmarks/kill_campaign.py --signal=SIGTERM [--kills=10]

With SIGTERM, every signalled run must save a checkpoint at the next step boundary and
exit 75 (vmx/training/preemption.py) with a `preempted: ... checkpoint_<step>` line; the
record says which step it saved (`preempt_saved`) and the restart must resume from exactly
that step (nothing since the last periodic checkpoint is lost), then end bit for bit as
the reference does. Its random signals come within half a checkpoint period after a
random periodic checkpoint (not the final one) has appeared. Besides those, one signal
(of 4 or more) is aimed at the start-up, before step 1 (vocabulary, token cache, compile:
exit 75, `preempted: ... no training step had run, nothing needed saving`, and the restart
starts anew), and one at the final save (exit 75, `preempted: ... during the final save:
saved .../checkpoint_<steps>; the run is complete`, and the restart has nothing to do).
The start-up signal's moment is drawn from the reference's start-up; a run that begins its
first checkpoint write before that moment (it started faster than the reference did) is
SIGKILLed unsignalled and retried with a moment drawn from its own start-up.

What it does, all on the tiny synthetic task of benchmarks/common.py written into the work
dir (a checkpoint every 5 steps, 2 kept):

  1. runs `launch/train.py --gin_file=<work_dir>/experiment.gin --gin.MODEL_DIR=...` (the
     real CLI, subprocess, real 1-device CPU: XLA_FLAGS removed) once uninterrupted: the
     reference;
  2. for each of N kills, starts the same command on a fresh model dir and SIGKILLs its
     process group: about a third of the kills (at least one) land *during a checkpoint
     write* (the model dir is polled every 2 ms for orbax's temporary directory
     `checkpoint_<step>.orbax-checkpoint-tmp`, which lives ~200-300 ms; the kill comes at a
     random delay up to half its shortest lifetime after it appears, during the write of a
     randomly chosen checkpoint after step 1's: every 5th, the final one included), the
     others at a uniform random moment of the training part of the run: from the start of
     its first checkpoint write (after step 1) on, as long as the reference took from there
     to the end of its final checkpoint write (training steps, saves, deletion of old
     checkpoints); --random_window=process draws them between
     process start and the reference's wall time instead (most then hit the ~15 s of
     start-up, before any checkpoint exists). Whether the kill really fell inside a write
     is read from the model dir after the process died (a temporary dir left behind);
  3. re-runs the same command (no kill) until it exits 0, then compares the final
     checkpoint `checkpoint_<steps>` with the reference's: every leaf of the parameters
     and of the train state (step, optimizer state, RNG key, flax mutables) byte for byte,
     and the data position.

It prints one line per kill (kill time, during a checkpoint write or not, the checkpoints
that existed at the kill, the step the restart resumed from, equal or not) and a final
one-line JSON summary {"kills": N, "equal": k, "during_checkpoint_write": m, ...}. Exit
status 1 if any final state differs, a kill did not land or a restart failed.

Expected result: 10 of 10 equal (`"equal": 10`), 3 or more during a checkpoint write (5 of
10 when measured: random kills also land in writes, which take ~half of the training part);
7 minutes on 2 CPU cores shared with another test run (each run 15-25 s, mostly start-up).
tests/test_kill_campaign.py runs 2 kills and 4 SIGTERMs (30 steps) in CI, in one work dir:
a second campaign there reuses the first's reference run (`reference.json`) and
compilation cache.

By default the runs share a JAX persistent compilation cache in the work dir, filled first
by a 1-step warm-up run (so the reference's timing, the window of the random kills, is that
of the killed runs); it only saves compile time (~15-30 s a run), the executables are the
ones XLA compiled. --no_compile_cache turns it off (every run compiles).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)
from benchmarks.common import (RESUMED_RE, TMP_MARKER, Run, compare,  # noqa: E402
                               load_checkpoint, scan)
from vmx.errors import EXIT_PREEMPTED  # noqa: E402


# ----------------------------------------------------------------------------- campaign

def run_campaign(work_dir, kills: int = 10, seed: int = 0, steps: int = 50,
                 checkpoint_period: int = 5, keep: int = 2, write_fraction: float = 1 / 3,
                 random_window: str = "training", compile_cache: bool = True,
                 poll_interval: float = 0.002, max_restarts: int = 3,
                 run_timeout: float = 600.0, platforms: str = "cpu",
                 extra_flags: Sequence[str] = (), keep_dirs: bool = False,
                 sig: str = "SIGKILL", log: Callable[[str], None] = print) -> dict:
  """Runs the campaign in work_dir; returns the summary (see the module docstring) with
  one record per kill under "results".

  random_window: "training" (the random kills fall uniformly between the moment the run
  starts writing its first checkpoint, after step 1, and the moment its final checkpoint
  is written, as long as that took in the reference), or "process" (uniformly between process start and the reference's wall
  time: with ~15 s of start-up, most of those kills land before any training).
  """
  signum = signal.Signals[sig]
  if signum not in (signal.SIGKILL, signal.SIGTERM):
    raise ValueError(f"sig must be SIGKILL or SIGTERM, got {sig!r}")
  if random_window not in ("training", "process"):
    raise ValueError(f"random_window must be 'training' or 'process', got {random_window!r}")
  t_start = time.monotonic()
  work_dir = Path(work_dir).absolute()
  work_dir.mkdir(parents=True, exist_ok=True)
  rng = random.Random(seed)
  gin_file = common.write_task(work_dir, steps, checkpoint_period, keep)
  env = common.train_env(work_dir / "jax_cache" if compile_cache else None, platforms)
  logs = work_dir / "logs"
  logs.mkdir(exist_ok=True)

  def cmd(model_dir, *extra):
    return common.train_command(gin_file, model_dir, *extra_flags, *extra)

  def fresh(name):
    d = work_dir / name
    shutil.rmtree(d, ignore_errors=True)
    return d

  def finish(run, what, interval=poll_interval):
    rc = run.wait(run_timeout, interval)
    if rc != 0:
      raise RuntimeError(f"{what} exited {rc}:\n{run.log_tail()}")
    return run

  ref_dir = work_dir / "reference"
  ref_record = work_dir / "reference.json"
  key = {"experiment": gin_file.read_text(), "flags": list(extra_flags),
         "compile_cache": compile_cache, "platforms": platforms}
  kept = json.loads(ref_record.read_text()) if ref_record.exists() else None
  if kept and kept["key"] == key and common.checkpoint_dir(ref_dir, steps).is_dir():
    # A second campaign in the same work dir (the other signal): the reference run and
    # the warm compilation cache of the first are reused, with the reference's timings.
    ref_wall, tmp_seen = kept["wall_s"], {int(k): v for k, v in kept["tmp_seen"].items()}
    log(f"[kill_campaign] reusing the reference run of {ref_record}")
  else:
    if compile_cache:
      # Fills the cache first, so that the reference's timing (the window of the random
      # kills) is that of the killed runs, which all find a warm cache: compiled cold,
      # the reference's training part would also hold the compilations of its first steps.
      d = fresh("warmup")
      finish(Run(cmd(d, "--gin.train.stop_at_step=1"), env, d, logs / "warmup.log"),
             "warm-up", 0.05)
      shutil.rmtree(d, ignore_errors=True)
    ref_record.unlink(missing_ok=True)
    ref_dir = fresh("reference")
    ref = finish(Run(cmd(ref_dir), env, ref_dir, logs / "reference.log"), "reference run")
    ref_wall, tmp_seen = ref.elapsed(), ref.tmp_seen
    ref_record.write_text(json.dumps({"key": key, "wall_s": ref_wall, "tmp_seen": tmp_seen}))
  save_steps = sorted(s for s in tmp_seen if s >= 0)
  if not save_steps:  # every write finished between two polls: the planned save steps
    save_steps = sorted({1, *range(checkpoint_period, steps + 1, checkpoint_period), steps})
  # Training part of the reference: from the start of its first checkpoint write (after
  # step 1) to the end of its last (after that only shutdown: a kill there tests nothing).
  ref_train_start = min((a for a, _ in tmp_seen.values()), default=0.0)
  ref_train_end = max((b for _, b in tmp_seen.values()), default=ref_wall)
  lifetimes = [b - a for a, b in tmp_seen.values() if b > a]
  write_delay_max = 0.5 * min(lifetimes) if lifetimes else 0.0
  ref_state = load_checkpoint(ref_dir, steps)
  log(f"[kill_campaign] reference: {steps} steps in {ref_wall:.1f} s (checkpoint writes from "
      f"{ref_train_start:.1f} s to {ref_train_end:.1f} s); writes of checkpoints {save_steps}, the orbax temporary "
      f"dir seen for {min(lifetimes, default=0) * 1e3:.0f}-"
      f"{max(lifetimes, default=0) * 1e3:.0f} ms")

  n_write = min(kills, max(1, round(kills * write_fraction))) if kills else 0
  phases = (["start_up", "final_save"] if signum == signal.SIGTERM and kills >= 4 else [])
  kinds = phases + ["checkpoint_write"] * n_write + ["random"] * (kills - n_write - len(phases))
  rng.shuffle(kinds)
  results = []
  for i, kind in enumerate(kinds):
    name = f"kill_{i:02d}"
    rec = {"kill": i, "kind": kind}
    target, delay, offset = None, 0.0, 0.0
    if kind == "checkpoint_write":  # kill `delay` s after the temporary dir appears
      # (SIGTERM: not the final write, which has its own kind)
      target = rng.choice([s for s in save_steps if s > 1 and (
          signum == signal.SIGKILL or s < steps)] or save_steps)
      delay = rng.uniform(0.0, write_delay_max)
    elif kind == "final_save":      # when the final checkpoint's write has begun
      target, delay = steps, rng.uniform(0.0, write_delay_max)
    elif kind == "start_up":        # after process start, before step 1 is saved
      offset = rng.uniform(0.2, max(0.3, 0.9 * ref_train_start))
    elif random_window == "training" and signum == signal.SIGTERM:
      # A preemption while training runs: after a random periodic checkpoint (not the
      # final one) has appeared, within half a period of it. (A signal timed from the
      # start, like the SIGKILLs, often lands after the final checkpoint on a fast run,
      # where there is nothing to save.)
      target = rng.choice([s for s in save_steps if 1 < s < steps] or save_steps)
      period_s = (ref_train_end - ref_train_start) / max(len(save_steps) - 1, 1)
      offset = rng.uniform(0.0, 0.5 * period_s)
    elif random_window == "training":  # `offset` s after the first checkpoint write starts
      offset = rng.uniform(0.0, ref_train_end - ref_train_start)
    else:  # `offset` s after process start
      offset = rng.uniform(0.0, ref_wall)
    for attempt in range(1, 4):
      model_dir = fresh(name)
      run = Run(cmd(model_dir), env, model_dir, logs / f"{name}_killed.log")
      anchor = 0.0 if ((kind == "random" and random_window == "process")
                       or kind == "start_up") else None
      while run.proc.poll() is None:
        done, tmp = run.poll()
        t = run.elapsed()
        if anchor is None:
          if kind in ("checkpoint_write", "final_save") and any(s >= target for s in tmp):
            anchor = t
          elif kind == "random" and target is not None and target in done:
            anchor = t
          elif kind == "random" and target is None and (done or tmp):
            anchor = t
        if anchor is not None and t >= anchor + (delay if kind in ("checkpoint_write",
                                                                    "final_save") else offset):
          break
        if kind == "start_up" and (done or tmp):
          break  # this run got past step 1 sooner than the reference: again, sooner
        if t > run_timeout:
          break
        time.sleep(poll_interval)
      done_before, tmp_before = scan(model_dir)
      exited = run.proc.poll() is not None
      late = kind == "start_up" and bool(done_before or tmp_before)
      run.kill(signal.SIGKILL if late else signum)
      t_kill = run.elapsed()
      done_after, tmp_after = scan(model_dir)
      tmp_files = sum(len(files) for n in os.listdir(model_dir) if TMP_MARKER in n
                      for _, _, files in os.walk(model_dir / n))
      if not exited and not late:
        break
      # The run ended (or, for a start-up signal, began its first checkpoint write) before
      # the kill moment: the reference was slower than this run. Again, sooner.
      log(f"[kill_campaign] {name}: the run " + (
          f"began checkpoint writes {sorted(done_before + tmp_before)} before its start-up "
          f"signal (SIGKILLed at {t_kill:.1f} s)" if late else
          f"exited (rc {run.proc.returncode}) at {t_kill:.1f} s, before its kill")
          + f"; again (attempt {attempt + 1})")
      if late:
        first = min((a for a, _ in run.tmp_seen.values()), default=t_kill)
        offset = rng.uniform(0.2, max(0.3, 0.9 * first))
      elif kind == "random":
        offset = rng.uniform(0.0, 0.9 * max(0.0, t_kill - (anchor or 0.0)))
      else:
        delay = 0.0
    if signum == signal.SIGTERM and not exited and not late:
      line = common.last_line(run.text())
      m = re.search(r"saved \S*checkpoint_(\d+)", line)
      nothing = "no training step had run, nothing needed saving" in line
      saved = int(m.group(1)) if m else 0 if nothing else None
      rec.update(exit_code=run.proc.returncode, preempted_line=line[:300],
                 after_final_checkpoint=saved == steps, preempt_saved=saved,
                 preempt_ok=(run.proc.returncode == EXIT_PREEMPTED
                             and line.startswith("preempted: ") and saved is not None
                             and (saved == 0 or common.checkpoint_dir(model_dir,
                                                                      saved).is_dir())))
    rec.update(attempts=attempt, killed=not exited and not late, kill_time_s=round(t_kill, 3),
               target_save_step=target, write_delay_ms=round(delay * 1e3, 1),
               checkpoints_at_kill=done_before, tmp_dirs_at_kill=tmp_before,
               tmp_dirs_left=tmp_after, tmp_dir_files=tmp_files, checkpoint_existed=bool(done_before),
               during_checkpoint_write=bool(tmp_after))
    # Restart (the same command, no kill) until it exits 0.
    rcs, resumed, t_restart = [], None, 0.0
    for restart in range(1, max_restarts + 1):
      run = Run(cmd(model_dir), env, model_dir, logs / f"{name}_restart{restart}.log")
      rc = run.wait(run_timeout, 0.05)
      t_restart += run.elapsed()
      rcs.append(rc)
      m = RESUMED_RE.search(run.text())
      resumed = int(m.group(1)) if m else 0
      if rc == 0:
        break
      log(f"[kill_campaign] {name}: restart {restart} exited {rc}:\n{run.log_tail(1500)}")
    rec.update(restart_rcs=rcs, restart_ok=rcs[-1] == 0, resumed_from=resumed,
               restart_time_s=round(t_restart, 1))
    if "preempt_saved" in rec:   # the restart resumes where the signalled run saved
      rec["preempt_ok"] = rec["preempt_ok"] and resumed == rec["preempt_saved"]
    diffs = None
    if rec["restart_ok"]:
      try:
        diffs = compare(ref_state, load_checkpoint(model_dir, steps))
      except Exception as e:  # a missing/unreadable final checkpoint is a failure too
        diffs = [{"leaf": "*", "problem": f"{type(e).__name__}: {e}"}]
    rec["equal"] = diffs == []
    if diffs:
      rec["differences"] = diffs[:20]
      rec["unequal_leaves"] = len(diffs)
    results.append(rec)
    where = (f"during the write of checkpoint_{tmp_after[0]}, {tmp_files} files written"
             if tmp_after
             else "no checkpoint write under way")
    if "preempt_saved" in rec:
      where += (f"; exit {rec['exit_code']}, before step 1: nothing to save"
                if rec["preempt_ok"] and rec["preempt_saved"] == 0 else
                f"; exit {rec['exit_code']}, saved checkpoint_{rec['preempt_saved']}"
                if rec["preempt_ok"] else
                f"; exit {rec['exit_code']}, NO PREEMPTION LINE: {rec['preempted_line']}")
    log(f"[kill_campaign] kill {i + 1}/{kills} ({kind}): {sig} at {t_kill:.2f} s ({where}; "
        f"checkpoints then: {done_before or 'none'}), restart resumed from step {resumed} "
        f"in {t_restart:.1f} s (rc {rcs}): "
        + ("EQUAL" if rec["equal"] else f"NOT EQUAL {json.dumps(diffs[:5]) if diffs else ''}"))
    if not keep_dirs and rec["equal"]:
      shutil.rmtree(model_dir, ignore_errors=True)

  summary = {
      "kills": kills, "signal": sig,
      "equal": sum(r["equal"] for r in results),
      "during_checkpoint_write": sum(r["during_checkpoint_write"] for r in results),
      "checkpoint_existed_at_kill": sum(r["checkpoint_existed"] for r in results),
      "not_killed": sum(not r["killed"] for r in results),
      "restart_failures": sum(not r["restart_ok"] for r in results),
      "steps": steps, "seed": seed, "checkpoint_period": checkpoint_period,
      "random_window": random_window,
      "reference_wall_s": round(ref_wall, 1),
      "campaign_wall_s": round(time.monotonic() - t_start, 1),
      "compile_cache": compile_cache, "work_dir": str(work_dir),
  }
  if signum == signal.SIGTERM:
    summary["preempt_saved"] = sum(bool(r.get("preempt_ok")) for r in results)
  summary["ok"] = (summary["equal"] == kills and summary["not_killed"] == 0
                   and summary["restart_failures"] == 0
                   and summary.get("preempt_saved", kills) == kills)
  summary["results"] = results
  return summary


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--kills", type=int, default=10, help="number of kill/restart cycles")
  p.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
  p.add_argument("--steps", type=int, default=50, help="training steps of every run")
  p.add_argument("--checkpoint_period", type=int, default=5)
  p.add_argument("--keep", type=int, default=2, help="CHECKPOINTS_TO_KEEP")
  p.add_argument("--write_fraction", type=float, default=1 / 3,
                 help="share of kills aimed at a checkpoint write (at least one)")
  p.add_argument("--work_dir", default=None, help="default: a new temporary directory")
  p.add_argument("--random_window", choices=("training", "process"), default="training",
                 help="where the random kills fall: from the first checkpoint write to the "
                      "end (default), or from process start (mostly start-up)")
  p.add_argument("--no_compile_cache", action="store_true",
                 help="no shared JAX compilation cache (every run compiles)")
  p.add_argument("--keep_dirs", action="store_true", help="keep the model dirs of equal runs")
  p.add_argument("--poll_ms", type=float, default=2.0, help="model dir polling interval")
  p.add_argument("--signal", default="SIGKILL", choices=("SIGKILL", "SIGTERM"),
                 help="SIGKILL (kill -9) or SIGTERM (preemption: save, exit 75, resume)")
  args, extra = p.parse_known_args(argv)
  bad = [a for a in extra if not a.startswith("--gin.")]
  if bad:
    p.error(f"unrecognized arguments: {' '.join(bad)} (only --gin.KEY=VALUE is passed on)")
  work_dir = args.work_dir or tempfile.mkdtemp(prefix="vmx_kill_campaign_")
  summary = run_campaign(work_dir, kills=args.kills, seed=args.seed, steps=args.steps,
                         checkpoint_period=args.checkpoint_period, keep=args.keep,
                         write_fraction=args.write_fraction, random_window=args.random_window,
                         compile_cache=not args.no_compile_cache,
                         poll_interval=args.poll_ms / 1e3, extra_flags=extra,
                         keep_dirs=args.keep_dirs, sig=args.signal)
  results = summary.pop("results")
  (Path(work_dir) / "results.json").write_text(json.dumps(
      {**summary, "results": results}, indent=1))
  print(json.dumps(summary), flush=True)
  return 0 if summary["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
