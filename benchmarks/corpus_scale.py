#!/usr/bin/env python
"""The index reader at corpus scale: a synthetic token cache of N rows in the real format
(vmx/data/token_cache/disk_format.py: sparse shard files made with truncate, real digests, a
real manifest; 8 tasks of N/8 rows, pairs of two 32-token sides), read by the real
stream (vmx/data/stream.py) in batches of 2,048.

  python benchmarks/corpus_scale.py --rows=1000000000
  python benchmarks/corpus_scale.py --rows=10000000 --remote --latency_ms=20

`--remote`: the cache is uploaded to a GCS emulator on 127.0.0.1 (tests/gcs_emulator.py,
in memory) and read through gcsfs, every request delayed by --latency_ms (in the
requesting thread, as a network round trip would). Prints one JSON line: rows,
row_bytes, first_batch_s (opening the tables and the first batch), examples_per_s (the
next --batches batches), resume_s (a new stream, restored at step 10^6, to its first
batch), peak_rss_gib (the process's anonymous memory, sampled; not the page cache of the
mapped shards), and with --remote bytes_fetched_per_example and requests_per_batch.
`--merge_max_bytes=0` keeps a small cache on the mapped shards instead of one array in
memory (the default below 1 GiB).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)

TASKS, BATCH, LENGTH = 8, 2048, 32


def anon_rss_gib() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("RssAnon:"):
        return int(line.split()[1]) / (1 << 20)
  return 0.0


class PeakRss:
  """The largest anonymous RSS seen, sampled every 20 ms in a thread."""

  def __init__(self):
    self.peak, self._stop = anon_rss_gib(), threading.Event()
    self._t = threading.Thread(target=self._run, daemon=True)
    self._t.start()

  def _run(self):
    while not self._stop.wait(0.02):
      self.peak = max(self.peak, anon_rss_gib())

  def stop(self) -> float:
    self._stop.set()
    self._t.join()
    return max(self.peak, anon_rss_gib())


def write_synthetic(directory: str, rows: int, shard_rows: int):
  """A token cache of `rows` zero rows: sparse shards, their real block digests."""
  import numpy as np
  from vmx.data.token_cache import disk_format
  features = {"left_lang": {"dtype": "int32", "shape": []},
              "left_tokens": {"dtype": "int32", "shape": [LENGTH]},
              "right_lang": {"dtype": "int32", "shape": []},
              "right_tokens": {"dtype": "int32", "shape": [LENGTH]}}
  row_bytes = disk_format.record_dtype(features).itemsize
  zero_block = disk_format.block_digest(bytes(disk_format.BLOCK_ROWS * row_bytes))
  os.makedirs(directory, exist_ok=True)
  ranges = disk_format.plan(rows, shard_rows)
  shards, all_sums = [], []
  for i, (a, b) in enumerate(ranges):
    name = disk_format.shard_name(i, len(ranges))
    n = b - a
    with open(os.path.join(directory, f"{name}.bin"), "wb") as f:
      f.truncate(n * row_bytes)
    full, tail = divmod(n, disk_format.BLOCK_ROWS)
    sums = zero_block * full + (disk_format.block_digest(bytes(tail * row_bytes)) if tail else b"")
    with open(os.path.join(directory, f"{name}.sums"), "wb") as f:
      f.write(sums)
    shards.append({"name": name, "count": n, "sums_sha256": disk_format.sums_sha256(sums)})
    all_sums.append(sums)
  m = disk_format.manifest("synthetic", {"task": os.path.basename(directory)}, features, shards,
                   disk_format.content_digest(all_sums), "benchmarks/corpus_scale.py", time.time())
  with open(os.path.join(directory, disk_format.MANIFEST), "w") as f:
    f.write(disk_format.dumps(m))
  del np
  return row_bytes


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, required=True)
  p.add_argument("--batches", type=int, default=200)
  p.add_argument("--remote", action="store_true")
  p.add_argument("--latency_ms", type=float, default=0.0)
  p.add_argument("--merge_max_bytes", type=int, default=None)
  p.add_argument("--shard_rows", type=int, default=1 << 20)
  p.add_argument("--dir", default=None, help="where to write the synthetic cache")
  args = p.parse_args()
  work = args.dir or tempfile.mkdtemp(prefix="vmx_corpus_scale_")
  emulator = None
  if args.remote:   # before gcsfs is imported: it reads the endpoint once
    emulator, _, env = common.start_gcs_emulator("bench")
    os.environ.update(env)
  from vmx import storage
  from vmx.data import stream as stream_lib
  from vmx.data.token_cache import table as table_lib
  if args.merge_max_bytes is not None:
    stream_lib.MERGE_MAX_BYTES = args.merge_max_bytes
  try:
    per_task = args.rows // TASKS
    dirs = []
    for t in range(TASKS):
      d = os.path.join(work, f"task{t}")
      row_bytes = write_synthetic(d, per_task, args.shard_rows)
      dirs.append(d)
    if args.remote:
      import fsspec
      fs = fsspec.filesystem("gs")
      t0 = time.time()
      for t, d in enumerate(dirs):
        for name in sorted(os.listdir(d)):
          fs.put_file(os.path.join(d, name), f"gs://bench/task{t}/{name}")
      dirs = [f"gs://bench/task{t}" for t in range(TASKS)]
      print(f"[bench] uploaded in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
      real = storage.read_range

      def delayed(path, start, length):
        time.sleep(args.latency_ms / 1000)
        return real(path, start, length)
      storage.read_range = delayed
    rss = PeakRss()
    blocks = table_lib.Blocks() if args.remote else None

    def make(position=0, fresh=None):
      tables = [table_lib.Table(d, "benchmark", fresh or blocks) for d in dirs]
      s = stream_lib.Stream([f"task{t}" for t in range(TASKS)], [1.0] * TASKS, tables, BATCH,
                            seed=0, order=stream_lib.Order.default(BATCH, None, 1024))
      it = stream_lib.IndexIterator({None: s})
      if position:
        it.restore(it.state_at(position))
      return it

    t0 = time.perf_counter()
    it = make()
    next(it)
    first = time.perf_counter() - t0
    r0, b0 = (blocks.requests, blocks.bytes) if blocks else (0, 0)
    t0 = time.perf_counter()
    for _ in range(args.batches):
      next(it)
    dt = time.perf_counter() - t0
    out = {"rows": TASKS * per_task, "row_bytes": row_bytes, "remote": args.remote,
           "latency_ms": args.latency_ms, "first_batch_s": round(first, 3),
           "examples_per_s": round(args.batches * BATCH / dt)}
    if blocks:
      out["bytes_fetched_per_example"] = round((blocks.bytes - b0) / (args.batches * BATCH), 1)
      out["requests_per_batch"] = round((blocks.requests - r0) / args.batches, 1)
      out["bytes_fetched_over_row_bytes"] = round(out["bytes_fetched_per_example"] / row_bytes, 2)
    t0 = time.perf_counter()   # a new process's resume: nothing cached
    resumed = table_lib.Blocks() if args.remote else None
    it = make(10**6, resumed)
    next(it)
    out["resume_s"] = round(time.perf_counter() - t0, 3)
    if resumed:
      resumed.close()
    out["peak_rss_gib"] = round(rss.stop(), 3)
    if blocks:
      blocks.close()
    print(json.dumps(out), flush=True)
  finally:
    if emulator is not None:
      emulator.kill()
    if args.dir is None:
      import shutil
      shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
