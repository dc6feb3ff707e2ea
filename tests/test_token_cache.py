"""The token cache (vmx/data/token_cache): built from the SeqIO task's own pipeline, in
shards whose layout changes no byte of the content; rebuilt or refused when what it was
built from changes; verified when read, so a damaged byte is a DataError naming the file
and block; an interrupted build finishes only what is missing and leaves nothing a run
uses; a remote cache is read by ranges; on Apache Beam, the same content as the local
build."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, needs_data, write_lines

LENGTHS = {"inputs": 8, "targets": 8}


def _fc():
  from vmx.data import feature_converters
  return feature_converters.PairFeatureConverter()


def _task(name):
  import seqio
  return seqio.get_mixture_or_task(name)


def _build(name, directory, shard_rows):
  from vmx.data.token_cache import build, fingerprint as fp
  task = _task(name)
  parts = fp.parts(task, "train", LENGTHS, _fc())
  return build.build_local(task, "train", LENGTHS, _fc(), directory, parts, progress=False,
                           shard_rows=shard_rows)


def test_the_cache_holds_what_the_task_yields_whatever_the_shard_layout(toy_task, tmp_path):
  """Shards of 256 rows and one shard: the same rows, digests and content digest, and
  the rows are what task.get_dataset and the converter yield, in file order."""
  from vmx.data.token_cache.table import Table
  name = toy_task[0]
  one = _build(name, tmp_path / "one", 1 << 20)
  two = _build(name, tmp_path / "two", 256)
  assert [len(one["shards"]), len(two["shards"])] == [1, 2]
  assert one["content_digest"] == two["content_digest"] and one["count"] == two["count"]
  a, b = Table(tmp_path / "one"), Table(tmp_path / "two")
  for k, v in a.take(np.arange(len(a))).items():
    np.testing.assert_array_equal(v, b.take(np.arange(len(b)))[k])
  ds = _fc()(_task(name).get_dataset(LENGTHS, "train", shuffle=False, num_epochs=1), LENGTHS)
  want = next(ds.batch(10_000).as_numpy_iterator())
  for k, v in want.items():
    np.testing.assert_array_equal(a.take(np.arange(len(a)))[k], v)


def test_the_cache_is_rebuilt_or_refused_when_its_inputs_change(toy_task, tmp_path):
  import tasks
  from vmx.data import vocab
  from vmx.data.token_cache import build
  from vmx.errors import ConfigError
  _, vp, src, tgt = toy_task
  s = write_lines(tmp_path / "c.xx", open(src).read().splitlines()[:50])
  t = write_lines(tmp_path / "c.en", open(tgt).read().splitlines()[:50])
  root = str(tmp_path / "arrays")
  name = tasks.moses_task("toy_changing", s, t, "xx", "en", vp, ["xx", "en"])

  def table(build_missing=None):
    return build.open_table(_task(name), "train", LENGTHS, _fc(), root, progress=False,
                            build_missing=build_missing)
  first = table()
  assert table(False).dir == first.dir                         # found, not rebuilt
  vp2 = vocab.train_sentencepiece([src, tgt], str(tmp_path / "v2.model"), 50, ["xx", "en"])
  tasks.moses_task("toy_changing", s, t, "xx", "en", vp2, ["xx", "en"])
  with pytest.raises(ConfigError, match="other vocabulary"):
    table(False)
  assert table().dir != first.dir                              # a new cache, by its name
  write_lines(t, [l + " X" for l in open(t).read().splitlines()])
  tasks.moses_task("toy_changing", s, t, "xx", "en", vp2, ["xx", "en"])
  with pytest.raises(ConfigError, match="other sources.*launch/cache_tasks.py"):
    table(False)


def test_a_damaged_byte_is_never_trained_on(toy_task, tmp_path):
  """One byte flipped in a shard, its size kept: the read of its block is a DataError
  naming the file, the block and what rebuilds it; a truncated shard, a digest list that
  is not the manifest's, a missing manifest: the same, at open."""
  from vmx.data.token_cache import build
  from vmx.data.token_cache.table import Table
  from vmx.errors import DataError
  t = build.open_table(_task(toy_task[0]), "train", LENGTHS, _fc(), str(tmp_path),
                       progress=False)
  shard = t.dir / "rows-00000-of-00001.bin"
  data = bytearray(shard.read_bytes())
  data[t.row_bytes * 3 + 1] ^= 0x40                          # row 3, block 0
  shard.write_bytes(bytes(data))
  damaged = Table(t.dir, "delete it")
  assert len(t) > 256
  damaged.take([len(t) - 1])                                 # block 1: intact, read
  with pytest.raises(DataError, match=rf"{shard}: block 0 \(rows 0-255\).*digest.*delete it"):
    damaged.take([3])
  sums = t.dir / "rows-00000-of-00001.sums"
  s = bytearray(sums.read_bytes())
  s[0] ^= 1
  sums.write_bytes(bytes(s))
  with pytest.raises(DataError, match=rf"{sums}: its digests do not match"):
    Table(t.dir).take([0])
  shard.write_bytes(bytes(data[:-5]))
  with pytest.raises(DataError, match=rf"{shard}: .* bytes, expected .*truncated"):
    Table(t.dir)
  (t.dir / "manifest.json").unlink()
  with pytest.raises(DataError, match="manifest.json: unreadable"):
    Table(t.dir)


def test_the_caches_records_are_a_contract(toy_task, tmp_path):
  """A manifest that claims fewer or more rows than its shards hold (a run trained on the
  smaller task, or crashed with an IndexError), or a shard record that disagrees with
  the manifest (its count, digests, input range, build): refused at open with one
  DataError naming the file and both values."""
  from vmx.data.token_cache.table import Table
  from vmx.errors import DataError
  built = _build(toy_task[0], tmp_path, 256)
  assert len(built["shards"]) >= 2
  manifest = tmp_path / "manifest.json"
  good = manifest.read_text()
  n = built["count"]
  for claim in (n - 100, n + 1000):
    manifest.write_text(json.dumps({**built, "count": claim}))
    with pytest.raises(DataError, match=rf"{manifest}: it claims {claim} rows, its 2 shards "
                       rf"{n}: the token cache's records disagree"):
      Table(tmp_path)
  manifest.write_text(good)
  record = tmp_path / "rows-00001-of-00002.json"
  rec = json.loads(record.read_text())
  for key, value in (("sums_sha256", "0" * 64), ("input", [0, rec["count"]]),
                     ("fingerprint", "another build"), ("count", rec["count"] - 1)):
    record.write_text(json.dumps({**rec, key: value}))
    with pytest.raises(DataError, match=rf"{record}: {key} .*, the manifest says"):
      Table(tmp_path)
  record.write_text(json.dumps(rec))
  assert len(Table(tmp_path)) == n


def test_a_damaged_block_is_found_in_a_large_table(toy_task, tmp_path):
  """Blocks are verified one by one: in a table of several blocks, reading rows of intact
  blocks works and the damaged block's rows fail, naming that block."""
  from vmx.data.token_cache.table import Table
  from vmx.errors import DataError
  m = _build(toy_task[0], tmp_path, 256)
  shard = tmp_path / "rows-00000-of-00002.bin"
  data = bytearray(shard.read_bytes())
  data[-1] ^= 1                                   # last row of shard 0: its block 0
  shard.write_bytes(bytes(data))
  t = Table(tmp_path)
  t.take(np.arange(256, m["count"]))              # shard 1: intact
  with pytest.raises(DataError, match="rows-00000-of-00002.bin: block 0 \\(rows 0-255\\)"):
    t.take([5])


def test_an_interrupted_build_finishes_only_the_missing_shards(toy_task, tmp_path, capsys):
  """A build killed after one shard leaves no manifest (nothing a run opens), and
  temporary files whose writer is gone; the next build removes them, writes the missing
  shard only, and ends with the same content. A shard of another fingerprint in the
  directory is refused."""
  import socket
  from vmx.data.token_cache import build
  from vmx.errors import DataError
  whole = _build(toy_task[0], tmp_path / "ref", 256)
  d = tmp_path / "run"
  _build(toy_task[0], d, 256)
  (d / "manifest.json").unlink()
  (d / "rows-00001-of-00002.json").unlink()
  (d / "rows-00001-of-00002.bin").unlink()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True).stdout.strip()
  host = socket.gethostname()
  (d / f"rows-00001-of-00002.bin.tmp-{host}-{dead}").write_bytes(b"partial")
  live = d / f"rows-00001-of-00002.sums.tmp-{host}-{os.getppid()}"   # alive
  live.write_bytes(b"being written")
  first = (d / "rows-00000-of-00002.bin").stat().st_mtime_ns
  again = _build(toy_task[0], d, 256)
  assert "removed 1 unfinished file(s)" in capsys.readouterr().out
  assert not (d / f"rows-00001-of-00002.bin.tmp-{host}-{dead}").exists() and live.exists()
  assert (d / "rows-00000-of-00002.bin").stat().st_mtime_ns == first     # not rewritten
  assert again["content_digest"] == whole["content_digest"]
  rec = json.loads((d / "rows-00001-of-00002.json").read_text())
  rec["fingerprint"] = "0" * 64
  (d / "rows-00001-of-00002.json").write_text(json.dumps(rec))
  with pytest.raises(DataError, match="two fingerprints"):
    build.missing_shards(d, whole["fingerprint"], build.shard_plan(_task(toy_task[0]),
                                                                   "train", shard_rows=256))


def test_a_build_never_adopts_a_shard_it_cannot_prove_it_wrote(toy_task, tmp_path):
  """A rerun finishes around the shards an earlier run left only once each is proven: the
  input range its record names is this build's plan, its .sums is the one its record
  hashes, its .bin has the record's rows, and every block of it its digest. Another
  build's bytes under this build's records are refused naming the file; no manifest."""
  import shutil
  from vmx.errors import DataError
  d = tmp_path / "run"
  whole = _build(toy_task[0], d, 256)
  keep = tmp_path / "keep"
  shutil.copytree(d, keep)

  def rerun_with(change):
    shutil.rmtree(d)
    shutil.copytree(keep, d)
    (d / "manifest.json").unlink()
    change()
    with pytest.raises(DataError) as e:
      _build(toy_task[0], d, 256)
    assert not (d / "manifest.json").exists()
    return str(e.value)

  def flip():                       # same size, another byte: only the blocks tell
    data = bytearray((d / "rows-00000-of-00002.bin").read_bytes())
    data[5] ^= 1
    (d / "rows-00000-of-00002.bin").write_bytes(bytes(data))
  assert "rows-00000-of-00002.bin: block 0 is not the block its .sums names" in rerun_with(flip)

  def swap():                       # shard 1's files under shard 0's record
    for ext in ("bin", "sums"):
      shutil.copy(d / f"rows-00001-of-00002.{ext}", d / f"rows-00000-of-00002.{ext}")
  assert "rows-00000-of-00002.sums: sha256" in rerun_with(swap)

  def elsewhere():                  # a record of another input range (another plan)
    rec = json.loads((d / "rows-00000-of-00002.json").read_text())
    rec["input"] = [0, 512]
    (d / "rows-00000-of-00002.json").write_text(json.dumps(rec))
  assert "a record of input rows [0, 512], this build planned [0, 256]" in rerun_with(elsewhere)

  shutil.rmtree(d)
  shutil.copytree(keep, d)
  (d / "manifest.json").unlink()
  assert _build(toy_task[0], d, 256)["content_digest"] == whole["content_digest"]


def test_a_full_disk_is_one_error_and_leaves_nothing(toy_task, tmp_path, monkeypatch):
  """ENOSPC while a shard is written (monkeypatched; the real small filesystem is in
  tests/test_modeldir.py): a DataError saying so, no temporary file, no manifest."""
  import errno
  from vmx.data.token_cache import disk_format
  from vmx.errors import DataError
  real = disk_format.to_records

  def full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(disk_format, "to_records", full)
  with pytest.raises(DataError, match="no space left on the device.*finished shards are kept"):
    _build(toy_task[0], tmp_path, 256)
  monkeypatch.setattr(disk_format, "to_records", real)
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
  assert not (tmp_path / "manifest.json").exists()


def test_a_remote_cache_is_read_by_ranges_and_verified(toy_task, tmp_path, gcs_emulator):
  """A cache in a bucket (the GCS emulator): a read fetches the blocks of its rows, one
  ranged request each, verified; a damaged object is a DataError naming the block; a
  store that stops answering is retried, then a DataError."""
  url, env = gcs_emulator
  script = f"""
import os, sys, json, numpy as np
sys.path.insert(0, {str(REPO)!r})
from vmx import storage
from vmx.data.token_cache.table import Table, Blocks
from vmx.errors import DataError
local = {str(tmp_path)!r}
for name in sorted(os.listdir(local)):
  storage.copy_file(os.path.join(local, name), "gs://vmx-test/cache/" + name)
blocks = Blocks(retry_s=1.0)
t = Table("gs://vmx-test/cache", "rebuild it", blocks)
ref = Table(local)
np.testing.assert_array_equal(t.take_records([3, 290, 7]), ref.take_records([3, 290, 7]))
first = blocks.requests
t.take_records([4, 5, 291])                    # cached blocks: no request
assert blocks.requests == first, (first, blocks.requests)
assert first == 4, first                       # 2 digest lists + 2 blocks
data = bytearray(open(os.path.join(local, "rows-00001-of-00002.bin"), "rb").read())
data[0] ^= 1
storage.write_atomic("gs://vmx-test/cache/rows-00001-of-00002.bin", bytes(data))
try:
  Table("gs://vmx-test/cache", "rebuild it", Blocks(retry_s=1.0)).take([256])
  raise SystemExit("no error")
except DataError as e:
  assert "rows-00001-of-00002.bin: block 0" in str(e) and "rebuild it" in str(e), e
print("ok")
"""
  _build(toy_task[0], tmp_path, 256)
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=300)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_a_store_that_stops_answering_is_retried_then_named(tmp_path, monkeypatch):
  from vmx import storage
  from vmx.data.token_cache.table import Blocks
  from vmx.errors import DataError
  calls = []

  def down(path, start, length):
    calls.append(start)
    raise ConnectionError("connection refused")
  monkeypatch.setattr(storage, "read_range", down)
  monkeypatch.setattr(storage, "remote_size", down)
  with pytest.raises(DataError, match="gs://b/x.bin: the store did not answer for 2 s"):
    Blocks(retry_s=2.0).read("gs://b/x.bin", 0, 10)
  assert len(calls) >= 3             # retried (a read, its size probe, a read again...)


@needs_data
@pytest.mark.slow
def test_cache_tasks_builds_an_experiments_cache_locally_and_on_beam(tmp_path):
  """launch/cache_tasks.py --gin_file writes every task of the run, and opening it without
  building finds them all; with --beam_runner=DirectRunner (2 worker processes) it writes
  the same content (the same `content digest` line)."""
  pytest.importorskip("apache_beam", reason="apache-beam (the beam extra) is not installed")
  from vmx import experiment
  from vmx.data.token_cache import build
  args = ["--gin_file=contrastive_tiny.gin", "--gin.TRAIN_LANGUAGES=['deu', 'fra']",
          "--gin.LANGUAGES=['deu', 'fra', 'eng']", "--gin.VOCAB_SIZE=2000"]
  digests = []
  for name, extra in (("local", []), ("beam", ["--beam_runner=DirectRunner",
                                               "--beam_workers=2", "--shard_rows=2048"])):
    root = str(tmp_path / name)
    out = subprocess.run([sys.executable, "launch/cache_tasks.py", *args, *extra,
                          f"--token_cache_dir={root}", "--no_progress"],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train: 2 task(s)" in out.stdout and root in out.stdout
    digests.append(out.stdout.strip().splitlines()[-1])
  assert digests[0].startswith("content digest: ") and digests[0] == digests[1], digests
  manifests = [json.loads(p.read_text()) for p in (tmp_path / "beam").rglob("manifest.json")]
  assert {m["builder"] for m in manifests} == {"beam:DirectRunner"}
  assert max(len(m["shards"]) for m in manifests) > 1
  _, model, cfg, _ = experiment.training_inputs(
      ["contrastive_tiny.gin"], [a[len("--gin."):] for a in args[1:]])[0]
  cfg.token_cache_dir = str(tmp_path / "beam")
  _, _, tables = build.open_tables(cfg, model.FEATURE_CONVERTER_CLS(), progress=False,
                                   build=False)
  assert len(tables) == 2 and all(len(t) > 1000 for t in tables)


@pytest.mark.parametrize("name,value", [("VMX_REMOTE_THREADS", "many"),
                                        ("VMX_REMOTE_THREADS", "0"),
                                        ("VMX_REMOTE_CACHE_MB", "-5"),
                                        ("VMX_REMOTE_RETRY_S", "nan")])
def test_a_malformed_remote_setting_is_one_line_naming_it(monkeypatch, name, value):
  """The remote reader's environment settings: a value that is not a number of the
  accepted range is a ConfigError naming the variable (it was a ValueError traceback)."""
  from vmx.data.token_cache.table import Blocks
  from vmx.errors import ConfigError
  monkeypatch.setenv(name, value)
  with pytest.raises(ConfigError, match=rf"^{name}='{value}': expected an? (integer|number) "
                     r">= \d+ \(unset: \d+\)$"):
    Blocks()


@pytest.mark.slow
def test_cache_tasks_sigterm_exits_75_and_the_rerun_builds_the_same_cache(tmp_path):
  """The signal contract (vmx/signals.py) in launch/cache_tasks.py: SIGTERM while a task's
  cache is built ends with exit 75 and a `preempted:` line naming the task; nothing
  half-written is left, and the same command builds the rest: the content digest of an
  uninterrupted build."""
  import signal
  args = ["--gin_file=contrastive_tiny.gin", "--gin.TRAIN_LANGUAGES=['deu', 'fra']",
          "--gin.LANGUAGES=['deu', 'fra', 'eng']", "--gin.VOCAB_SIZE=2000"]
  cmd = lambda root, *extra: [sys.executable, "launch/cache_tasks.py", *args,
                              f"--token_cache_dir={tmp_path / root}", *extra]
  ref = subprocess.run(cmd("ref", "--no_progress"), capture_output=True, text=True, cwd=REPO,
                       timeout=900)
  assert ref.returncode == 0, ref.stderr[-3000:]
  p = subprocess.Popen(cmd("cut"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       cwd=REPO)
  seen = b""
  while b"caching tatoeba_challenge.fra_eng" not in seen:   # the second task's build began
    chunk = p.stderr.read1(4096)
    assert chunk, seen[-2000:]
    seen += chunk
  p.send_signal(signal.SIGTERM)
  err = (seen + p.communicate(timeout=300)[1]).decode()
  assert p.returncode == 75, err[-2000:]
  assert "preempted: SIGTERM while building the token cache of tatoeba_challenge.fra_eng" in err
  assert not [q for q in (tmp_path / "cut").rglob("*") if ".tmp-" in q.name]
  again = subprocess.run(cmd("cut", "--no_progress"), capture_output=True, text=True,
                         cwd=REPO, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.strip().splitlines()[-1] == ref.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_signal_during_a_beam_build_ends_its_workers_and_the_rerun_finishes(tmp_path):
  """The signal contract on Beam (DirectRunner, 2 worker processes): SIGTERM as the
  workers start ends with exit 75 and a `preempted:` line naming the Beam run (the driver
  hung in the runner's shutdown, its workers running); no worker process outlives it, no temporary file is left, and the same command finishes
  the cache: the content digest of an uninterrupted local build."""
  pytest.importorskip("apache_beam", reason="apache-beam (the beam extra) is not installed")
  import signal
  import time
  from vmx import signals, storage
  args = ["--gin_file=contrastive_tiny.gin", "--gin.TRAIN_LANGUAGES=['deu', 'fra']",
          "--gin.LANGUAGES=['deu', 'fra', 'eng']", "--gin.VOCAB_SIZE=2000",
          "--shard_rows=2048", "--no_progress"]
  cmd = lambda root, *extra: [sys.executable, "launch/cache_tasks.py", *args,
                              f"--token_cache_dir={tmp_path / root}", *extra]
  beam = ("--beam_runner=DirectRunner", "--beam_workers=2")
  ref = subprocess.run(cmd("ref"), capture_output=True, text=True, cwd=REPO, timeout=900)
  assert ref.returncode == 0, ref.stderr[-3000:]
  p = subprocess.Popen(cmd("cut", *beam), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, cwd=REPO)
  deadline = time.monotonic() + 300
  workers = []
  while len(workers) < 4 and p.poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)   # two `sh -c python -m ...sdk_worker_main`, each with its python
    workers = [q for q in signals.child_processes(p.pid) if storage.pid_alive(q)]
  assert len(workers) >= 4, (workers, p.poll())
  # Half a second after the workers started: without their end the driver hung in the
  # runner's shutdown at 0, 0.5 and 1 s (and the workers ran on); at 2 s it did not.
  time.sleep(0.5)
  p.send_signal(signal.SIGTERM)
  err = p.communicate(timeout=120)[1]
  lines = [l for l in err.splitlines() if l.strip()]
  assert p.returncode == 75, err[-3000:]
  assert lines[-1].startswith("preempted: SIGTERM while writing ") and "on Beam" in lines[-1]
  assert "Traceback" not in err, err[-3000:]
  assert not [q for q in workers if storage.pid_alive(q)]
  assert not [q for q in (tmp_path / "cut").rglob("*") if ".tmp-" in q.name]
  again = subprocess.run(cmd("cut", *beam), capture_output=True, text=True, cwd=REPO,
                         timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.strip().splitlines()[-1] == ref.stdout.strip().splitlines()[-1]


def test_a_dead_store_ends_every_fetch_at_its_budget_and_does_not_hold_the_exit(tmp_path):
  """The retry budget runs from the store's first unanswered read whatever thread made it,
  the line says how long it was down, and a fetch stuck inside the store client's own
  retries neither delays the error nor keeps the process alive after it."""
  script = f"""
import sys, threading, time
sys.path.insert(0, {str(REPO)!r})
from vmx import storage
from vmx.data.token_cache.table import Blocks
from vmx.errors import DataError
def down(path, start, length):
  if start == 0:
    raise ConnectionError("connection refused")
  time.sleep(60)              # a request inside gcsfs's own retries
  raise ConnectionError("still down")
storage.read_range = down
storage.remote_size = down
blocks = Blocks(retry_s=2.0, threads=2)
blocks.prefetch({{("s", 1): lambda: blocks.read("gs://b/x.bin", 100, 10),
                  ("s", 2): lambda: blocks.read("gs://b/x.bin", 200, 10),
                  ("s", 3): lambda: blocks.read("gs://b/x.bin", 300, 10)}})
t0 = time.monotonic()
try:
  blocks.read("gs://b/x.bin", 0, 10)
  raise SystemExit("no error")
except DataError as e:
  print(f"{{time.monotonic() - t0:.1f}} {{e}}")
try:
  blocks.prefetch({{("s", 4): lambda: blocks.read("gs://b/x.bin", 0, 10)}})
  raise SystemExit("a dead store accepted more work")
except DataError as e:
  print("again:", e)
"""
  t0 = time.monotonic()
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
  took = time.monotonic() - t0
  assert out.returncode == 0, out.stderr[-3000:]
  first, again = out.stdout.strip().splitlines()
  seconds, message = first.split(" ", 1)
  assert float(seconds) < 10, first
  assert "gs://b/x.bin: the store did not answer for 2 s (VMX_REMOTE_RETRY_S=2; " \
         "ConnectionError: connection refused)" in message
  assert again == f"again: {message}"
  assert took < 30, f"the process lived {took:.0f} s after its error (a fetch held it)"
