"""A full disk, for real: a tmpfs of 8 MB (mounted as root; skipped elsewhere), filled to
a few KB. Building the token cache, building a vocabulary and saving a checkpoint each
end with one clear error, leave no half-written file, and keep what was finished."""
import os
import subprocess

import pytest

from conftest import toy_train


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
