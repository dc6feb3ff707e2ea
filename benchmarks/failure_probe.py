#!/usr/bin/env python
"""Nothing lost (issue 35): each failure a user meets, tried through the real launchers on a
tiny synthetic task (benchmarks/common.py's), with what it printed and whether every
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
  damaged_cache     one byte flipped in a token cache shard: one line naming it and its block
  cache_build_sigterm  SIGTERM while the token cache is built: exit 75, `preempted: ...`,
                    nothing unfinished left; the rerun builds it
  cache_build_kill  kill -9 while it is built: the next build removes the leftover file
  full_disk         the cache's disk fills up (an 8 MB tmpfs; root): one `error:` line
  config_and_data_change  --gin.BATCH_SIZE changed on restart: one refusal, both flags
  vocabulary_edited the vocabulary's corpus edited in place: a new vocabulary, the run refuses
  eval_bad_path     launch/eval.py --sts17.dir=/nonexistent: one line within seconds
  dead_store        the remote token cache's store (the GCS emulator) killed mid-run: one
                    `error:` line and a saved checkpoint within VMX_REMOTE_RETRY_S (15) + 30 s,
                    and the rerun resumes (needs the test extra's gcsfs and emulator)

Prints one line per case (`ok` / `FAIL`, exit status, the last stderr line, bytes kept) and a
final JSON summary; exit status 1 if a case failed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)
from benchmarks.common import last_line, metrics_rows  # noqa: E402


def snapshot(d: Path) -> dict:
  return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(d.rglob("*")) if p.is_file()}


def kept(before: dict, d: Path) -> bool:
  """Every file of `before` is still there with the same bytes."""
  now = snapshot(d)
  return all(now.get(k) == v for k, v in before.items())


class Probe:
  def __init__(self, work_dir: Path):
    self.work = work_dir
    self.gin = common.write_task(work_dir, steps=60, checkpoint_period=10, keep=3)
    self.env = common.train_env(work_dir / "jax_cache")
    self.env["VMX_CACHE_DIR"] = str(work_dir / "cache" / "data")   # its own caches only

  def train_cmd(self, model_dir, *extra):
    return common.train_command(self.gin, model_dir, "--gin.LOG_PERIOD=2", *extra)

  def run(self, cmd, timeout=600):
    return common.run(cmd, self.env, timeout)

  def start(self, cmd, log):
    f = open(log, "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=self.env,
                            cwd=common.REPO), f

  def trained(self, name, *extra) -> Path:
    """A run directory of 20 trained steps: one run of the probe's task, copied for each
    case (a case may change its copy)."""
    base = self.work / "_trained"
    if not (base / "checkpoint_20").is_dir():
      p = self.run(self.train_cmd(base, "--gin.train.stop_at_step=20", *extra))
      assert p.returncode == 0, p.stderr[-2000:]
    d = self.work / name
    shutil.copytree(base, d, ignore=shutil.ignore_patterns("vmx.lock"))
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
    rows = [r["step"] for r in metrics_rows(d)]
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
    metrics_before = [r for r in metrics_rows(d)]
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    f.close()
    line = last_line(log.read_text())
    saved = line.split("saved ")[-1].split(";")[0] if "saved " in line else ""
    # The checkpoints and the metrics rows written before the signal are still there.
    bytes_kept = kept({k: v for k, v in before.items()
                       if k.startswith("checkpoint_") and "orbax" not in k}, d) and (
        metrics_rows(d)[:len(metrics_before)] == metrics_before)
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
    p = self.run(common.launcher_command("eval", f"--checkpoint_dir={d}", "--step=999999",
                                         "--tasks=tatoeba", "--no_progress"))
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

  # -- the token cache, the vocabulary, refusals, early checks (issue 43) ----------------

  def _cache_root(self) -> Path:
    return Path(self.env["VMX_CACHE_DIR"]).parent / "arrays"

  def damaged_cache(self):
    """One byte flipped in a token cache shard (its size kept): the next run stops with one
    line naming the shard and its block, and trains on nothing."""
    self.trained("cache_ok")
    shards = sorted(self._cache_root().rglob("rows-*.bin"))
    victim = shards[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    d = self.work / "cache_damaged"
    p = self.run(self.train_cmd(d, "--gin.train.stop_at_step=20"))
    line = last_line(p.stderr)
    data[len(data) // 2] ^= 0x10                 # mended for the other cases
    victim.write_bytes(bytes(data))
    ok = (p.returncode == 2 and line.startswith("error: ") and victim.name in line
          and "block" in line and not (d / "checkpoint_1").exists())
    return ok, p.returncode, line, True

  def _big_task(self, name: str, pairs: int = 150_000):
    work = self.work / name
    return common.write_task(work, steps=20, checkpoint_period=10, pairs=pairs), work

  def cache_build_sigterm(self):
    """SIGTERM while the token cache is built: exit 75, one `preempted:` line saying so,
    no unfinished file left, no manifest; the rerun builds it and trains."""
    gin, work = self._big_task("big_term")
    d = work / "run"
    log = work / "run.log"
    proc, f = self.start(common.train_command(gin, d, "--gin.LOG_PERIOD=2"), log)
    self.wait_for(log, "caching")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    f.close()
    line = last_line(log.read_text())
    root = self._cache_root()
    left = [p for p in root.rglob("*") if ".tmp-" in p.name]
    again = self.run(common.train_command(gin, d, "--gin.LOG_PERIOD=2"))
    ok = (rc == 75 and line.startswith("preempted: SIGTERM while building the token cache")
          and not left and again.returncode == 0)
    return ok, rc, line, not left

  def cache_build_kill(self):
    """kill -9 while the token cache is built leaves an unfinished shard file; the next
    build removes it (its writer is gone) and finishes."""
    gin, work = self._big_task("big_kill", pairs=150_001)
    d = work / "run"
    log = work / "run.log"
    proc, f = self.start(common.train_command(gin, d), log)
    self.wait_for(log, "caching")
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    f.close()
    left = [p for p in self._cache_root().rglob("*") if ".tmp-" in p.name]
    again = self.run(common.train_command(gin, d))
    gone = not [p for p in self._cache_root().rglob("*") if ".tmp-" in p.name]
    ok = bool(left) and gone and again.returncode == 0 and "unfinished file" in again.stdout
    line = f"{len(left)} unfinished file(s) after the kill; removed: {gone}"
    return ok, again.returncode, line, gone

  def full_disk(self):
    """The token cache's disk fills up while it is built (a tmpfs of 8 MB, as root):
    one `error:` line, nothing unfinished left."""
    if os.geteuid() != 0:
      return None, None, "skipped: mounting a tmpfs needs root", True
    mnt = self.work / "small_disk"
    mnt.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]).returncode:
      return None, None, "skipped: cannot mount a tmpfs here", True
    try:
      gin, work = self._big_task("big_full", pairs=150_002)
      env = dict(self.env, VMX_CACHE_DIR=str(mnt / "data"))
      p = common.run(common.train_command(gin, work / "run"), env, 600)
      line = last_line(p.stderr)
      left = [x for x in mnt.rglob("*") if ".tmp-" in x.name]
      ok = (p.returncode == 2 and line.startswith("error: ") and "no space left" in line
            and "Traceback" not in p.stderr and not left)
      return ok, p.returncode, line, not left
    finally:
      subprocess.run(["umount", str(mnt)])

  def dead_store(self, retry_s: float = 15.0):
    """The remote token cache's store dies mid-run (the GCS emulator, tests/gcs_emulator.py,
    killed with SIGKILL while the run reads its cache from it block by block): the run
    saves and ends with one `error:` line within VMX_REMOTE_RETRY_S + 30 s of the outage
    (issue 57's bar), no traceback, and the rerun resumes from the saved step once the
    store answers again. The seconds from the kill to the exit are the case's line."""
    try:
      import gcp_storage_emulator  # noqa: F401
      import gcsfs  # noqa: F401
    except ImportError:
      return None, None, "skipped: gcsfs and gcp-storage-emulator (the test extra)", True
    gin, work = self._big_task("dead_store", pairs=150_003)   # many blocks, read all along
    d = work / "run"
    log = work / "run.log"
    root = "gs://vmx-probe/arrays"
    cmd = common.train_command(gin, d, "--gin.LOG_PERIOD=2", "--gin.TRAIN_STEPS=100000",
                               f"--gin.DatasetConfig.token_cache_dir='{root}'")
    cache = common.launcher_command("cache_tasks", f"--gin_file={gin}",
                                    f"--token_cache_dir={root}", "--no_progress")

    def write_cache():     # a run reads a remote cache, cache_tasks.py writes it
      p = common.run(cache, env, 600)
      assert p.returncode == 0, p.stderr[-2000:]

    port = common.free_port()        # the same port again when the store comes back
    store, _, store_env = common.start_gcs_emulator("vmx-probe", port)
    stores = [store]
    env = dict(self.env, **store_env, VMX_REMOTE_RETRY_S=f"{retry_s:g}",
               VMX_REMOTE_CACHE_MB="0")
    f = open(log, "w")
    proc = None
    try:
      write_cache()
      proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd=common.REPO)
      while "step 30:" not in log.read_text(errors="replace"):
        assert proc.poll() is None, last_line(log.read_text(errors="replace"))
        time.sleep(0.1)
      stores[0].kill()
      stores[0].wait()
      t0 = time.time()
      rc = proc.wait(timeout=retry_s + 600)
      took = time.time() - t0
      f.close()
      text = log.read_text(errors="replace")
      line = last_line(text)
      saved = line.split("saved ")[-1].split(";")[0] if "saved " in line else ""
      stores.append(common.start_gcs_emulator("vmx-probe", port)[0])   # back, empty: so
      write_cache()                 # the cache is written again; the rerun resumes the save
      step = int(saved.rsplit("_", 1)[1]) if saved[-1:].isdigit() else 0
      again = common.run(cmd + [f"--gin.train.stop_at_step={step + 4}"], env, 900)
    finally:
      if proc is not None and proc.poll() is None:
        proc.kill()
      f.close()
      for store in stores:
        store.kill()
    ok = (rc == 2 and line.startswith("error: ") and "did not answer" in line
          and "Traceback" not in text and bool(saved) and Path(saved).is_dir()
          and took <= retry_s + 30 and again.returncode == 0
          and f"resumed from {saved}" in again.stdout)
    return ok, rc, f"{took:.1f} s from the outage to the exit; {line}", bool(saved)

  def config_and_data_change(self):
    """A batch-size change is a setting and a data change: one refusal names both and
    both flags; nothing is written."""
    d = self.trained("batch")
    before = snapshot(d)
    p = self.run(self.train_cmd(d, "--gin.BATCH_SIZE=32"))
    line = last_line(p.stderr)
    ok = (p.returncode == 2 and "BATCH_SIZE 16 -> 32" in line and "batch_size 16 -> 32" in line
          and "--gin.ALLOW_CONFIG_CHANGE=True --gin.ALLOW_DATA_CHANGE=True" in line)
    again = self.run(self.train_cmd(d, "--gin.BATCH_SIZE=32", "--gin.ALLOW_CONFIG_CHANGE=True",
                                    "--gin.ALLOW_DATA_CHANGE=True"))
    ok = ok and again.returncode == 0 and "resumed from" in again.stdout
    return ok, p.returncode, line, kept(before, d)

  def vocabulary_edited(self):
    """The corpus a run's vocabulary is built from is edited in place: the next start
    builds a new vocabulary (keyed by content) and refuses to continue the run with it."""
    work = self.work / "vocab_run"
    gin = common.write_task(work, steps=60, checkpoint_period=10)
    built = work / "built_vocab.gin"
    built.write_text(f"include {str(gin)!r}\n"
                     "VOCABULARY = @vocabulary_path()\n"
                     f"vocabulary_path.train_files = [{str(work / 'data/toy.xx')!r}, "
                     f"{str(work / 'data/toy.en')!r}]\n"
                     "vocabulary_path.vocab_size = 100\n"
                     "vocabulary_path.languages = ['xx', 'en']\n")
    d = work / "run"
    first = self.run(common.train_command(built, d, "--gin.train.stop_at_step=10"))
    src = work / "data/toy.xx"
    src.write_text(src.read_text().replace("alpha", "omega"))
    p = self.run(common.train_command(built, d))
    line = last_line(p.stderr)
    ok = (first.returncode == 0 and p.returncode == 2
          and "is not the one MODEL_DIR" in line and "--fresh" in line)
    return ok, p.returncode, line, True

  def eval_bad_path(self):
    """launch/eval.py with a path flag that names nothing: one line within seconds, before
    any evaluation."""
    d = self.trained("eval_paths")
    t0 = time.time()
    p = self.run(common.launcher_command("eval", f"--checkpoint_dir={d}", "--protocol=mpcl",
                                         "--sts17.dir=/nonexistent", "--no_progress"))
    seconds = time.time() - t0
    line = last_line(p.stderr)
    ok = p.returncode == 2 and "--sts17.dir=/nonexistent" in line and seconds < 60
    return ok, p.returncode, f"{line} [{seconds:.0f} s]", True

  def _import(self, config) -> tuple:
    hf = self.work / f"hf_{len(list(self.work.glob('hf_*')))}"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config))
    out = self.work / f"{hf.name}_out"
    p = self.run(common.launcher_command("import_checkpoint", f"--hf_dir={hf}",
                                         f"--output_dir={out}"))
    line = last_line(p.stderr)
    return (p.returncode == 2 and line.startswith("error:") and "Traceback" not in p.stderr
            and not out.exists(), p.returncode, line, not out.exists())

  def bad_hf_config(self):
    return self._import([1, 2, 3])

  def no_config_sizes(self):
    return self._import({"model_type": "bert"})


CASES = ("shape_change", "two_trainers", "sigterm", "sigint_twice", "missing_step",
         "fresh_elsewhere", "read_only", "bad_hf_config", "no_config_sizes", "damaged_cache",
         "cache_build_sigterm", "cache_build_kill", "full_disk", "config_and_data_change",
         "vocabulary_edited", "eval_bad_path", "dead_store")


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
