"""A full disk, for real: a tmpfs of 8 MB (mounted as root; skipped elsewhere), filled to
a few KB. Building the token cache (locally and on Beam), building a vocabulary and saving
a checkpoint each end with one clear error, leave no half-written file, and keep what was
finished."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, needs_data, toy_train


def _mount_tmpfs(mnt, options: str):
  """Mounts a tmpfs with `options` at the new directory `mnt` (skips without root)."""
  mnt.mkdir()
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  out = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                       capture_output=True, text=True)
  if out.returncode:
    pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
  """(mount point, fill(free_bytes)): an 8 MB tmpfs; fill() leaves that much room."""
  mnt = tmp_path / "disk"
  _mount_tmpfs(mnt, "size=8m")

  def fill(free: int):
    filler = mnt / "filler"
    if filler.exists():
      filler.unlink()
    room = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(filler, "wb") as f:
      os.posix_fallocate(f.fileno(), 0, max(room - free, 0))
  try:
    yield mnt, fill
  finally:
    subprocess.run(["umount", str(mnt)], capture_output=True)


def _leftovers(d):
  return [os.path.join(r, n) for r, _, names in os.walk(d) for n in names if ".tmp" in n]


def test_a_full_disk_during_the_cache_build(small_disk, toy_task):
  import seqio
  from vmx.data import feature_converters
  from vmx.data.token_cache import build
  from vmx.errors import DataError
  mnt, fill = small_disk
  fill(8 << 10)
  task = seqio.get_mixture_or_task(toy_task[0])
  lengths = {"inputs": 64, "targets": 64}
  with pytest.raises(DataError, match="no space left on the device.*finished shards are kept"):
    build.open_table(task, "train", lengths, feature_converters.PairFeatureConverter(),
                     str(mnt / "arrays"), progress=False)
  assert not _leftovers(mnt) and not list(mnt.rglob("manifest.json"))
  fill(4 << 20)                                   # room again: the rerun builds it
  t = build.open_table(task, "train", lengths, feature_converters.PairFeatureConverter(),
                       str(mnt / "arrays"), progress=False)
  assert len(t) > 250


@needs_data
@pytest.mark.slow
def test_a_full_disk_during_a_beam_build_is_one_line_and_the_rerun_collects_leftovers(
    tmp_path):
  """launch/cache_tasks.py on Beam (DirectRunner, 2 workers) into a disk that fills: exit 2
  and one `error:` line naming the full disk and the file that holds Beam's output (the
  workers' tracebacks), none of it on stderr.
  A killed worker's temporary file left in a task directory is removed by the rerun, which
  (with room again) finishes the cache."""
  pytest.importorskip("apache_beam", reason="apache-beam (the beam extra) is not installed")
  mnt = tmp_path / "disk"
  _mount_tmpfs(mnt, "size=32m")
  try:
    filler = mnt / "filler"
    with open(filler, "wb") as f:
      room = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
      os.posix_fallocate(f.fileno(), 0, room - (256 << 10))
    cmd = [sys.executable, "launch/cache_tasks.py", "--gin_file=contrastive_tiny.gin",
           "--gin.TRAIN_LANGUAGES=['deu', 'fra']", "--gin.LANGUAGES=['deu', 'fra', 'eng']",
           "--gin.VOCAB_SIZE=2000", "--beam_runner=DirectRunner", "--beam_workers=2",
           "--shard_rows=2048", f"--token_cache_dir={mnt / 'cache'}", "--no_progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines[-1].startswith("error: ") and "no space left on the device" in lines[-1], lines
    assert "Traceback" not in out.stderr and not any("apache_beam" in l for l in lines), lines
    log = lines[-1].rsplit("(Beam's output: ", 1)[1].rstrip(")")   # what the workers printed
    assert "Traceback" in open(log).read()
    os.remove(log)
    print(lines[-1])
    task_dir = next(d for d in sorted((mnt / "cache").rglob("*"))     # a task's directory
                    if d.is_dir() and not any(c.is_dir() for c in d.iterdir()))
    killed = task_dir / f"rows-00000-of-00009.bin.tmp-{socket.gethostname()}-4194303"
    killed.write_bytes(b"half a shard")
    filler.unlink()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "removed 1 unfinished file(s)" in out.stdout and not killed.exists()
    assert out.stdout.strip().splitlines()[-1].startswith("content digest: ")
    assert not _leftovers(mnt)
  finally:
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_during_the_vocabulary_build(small_disk, toy_task):
  from vmx.data import vocab
  from vmx.errors import DataError
  mnt, fill = small_disk
  _, _, src, tgt = toy_task
  fill(16 << 10)
  with pytest.raises(DataError, match="no space left on the device while building the "
                                      "vocabulary.*nothing was written"):
    vocab.train_sentencepiece([src, tgt], str(mnt / "v.model"), 60, ["xx", "en"])
  assert not (mnt / "v.model").exists() and not _leftovers(mnt)
  assert not [p for p in os.listdir(mnt) if p.startswith("v.model")]


def test_a_full_disk_during_a_checkpoint_save(small_disk, toy_task):
  """The second save does not fit: one CheckpointError, its partial files removed, the
  first checkpoint intact; with room again the run resumes from it."""
  from vmx.errors import CheckpointError
  from vmx.modeldir import checkpoints
  mnt, fill = small_disk
  name, vp, _, _ = toy_task
  d = mnt / "run"
  toy_train(d, name, vp, total_steps=2, period=2)
  used = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(d) for n in ns)
  fill(used // 4)
  with pytest.raises(CheckpointError, match=r"saving .*checkpoint_4 failed .*partial files were "
                                            r"removed.*latest: 2"):
    toy_train(d, name, vp, total_steps=4, period=2)
  assert checkpoints.verify(d / "checkpoint_2") is None
  assert not (d / "checkpoint_4").exists() and not _leftovers(d)
  fill(6 << 20)
  toy_train(d, name, vp, total_steps=4, period=2)
  assert checkpoints.verify(d / "checkpoint_4") is None


def test_a_read_only_cache_root_without_the_cache_is_one_error(tmp_path, toy_task):
  """A shared cache directory mounted read-only that lacks this run's cache: one
  DataError naming the root, the reason and both ways out (not a traceback)."""
  import seqio
  from vmx.data import feature_converters
  from vmx.data.token_cache import build
  from vmx.errors import DataError
  root = tmp_path / "ro"
  _mount_tmpfs(root, "ro,size=1m")
  try:
    task = seqio.get_mixture_or_task(toy_task[0])
    with pytest.raises(DataError, match=r"no tokenized cache for this run under .*/ro, and "
                                        r"it cannot be built there \(Read-only file system"
                                        r".*token_cache_dir to a writable directory"):
      build.open_table(task, "train", {"inputs": 8, "targets": 8},
                       feature_converters.PairFeatureConverter(), str(root),
                       progress=False)
  finally:
    subprocess.run(["umount", str(root)], capture_output=True)
