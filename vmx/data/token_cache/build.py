"""Finding a task's token cache, building it where it is missing, refusing where it differs.

`open_table` looks for the cache of (task, split, lengths, converter) under a root
(default `lookup.default_root()`, beside the vocabularies): the directory named by its
fingerprint (vmx/data/token_cache/fingerprint.py). Missing, it is built in this process
(`build_local`, a local root) or refused with what differs from the caches that are there
and the command that writes it (a remote root: `launch/cache_tasks.py`, on Beam past one
machine, vmx/data/token_cache/beam.py). Both builders write shards with
`writer.write_shard` and end with `assemble`, which checks every shard's record and writes
the manifest last.
"""
from __future__ import annotations

import errno
import json
import os
import time
from typing import Optional

import seqio
from tqdm.auto import tqdm

from vmx import signals, storage
from vmx.data import seqio_cache
from vmx.data.token_cache import fingerprint as fp
from vmx.data.token_cache import disk_format
from vmx.data.token_cache import writer
from vmx.data.token_cache.lookup import default_root
from vmx.data.token_cache.table import Table
from vmx.errors import ConfigError, DataError


def directory_of(root, task: seqio.Task, split: str, digest: str):
  return storage.path(root) / seqio.utils.get_task_dir_from_name(task.name) / \
      f"{split}.{digest[:16]}"


def rebuild_hint(root, directory) -> str:
  if storage.is_remote(root):
    return (f"write it again with `python launch/cache_tasks.py --gin_file=<the run's gin "
            f"files> --token_cache_dir={root}`")
  return f"delete {directory} and run again (a local cache is rebuilt)"


def input_count(task: seqio.Task, split: str, use_cached: bool = False) -> int:
  """The examples the source yields for `split` (what the shards split into ranges)."""
  if use_cached:
    return int(task.get_cached_stats(split)["examples"])
  n = task.num_input_examples(split)
  if n is None:
    raise ConfigError(f"task {task.name}: its source does not say how many examples split "
                      f"{split!r} has, so its cache cannot be written in shards")
  return int(n)


def shard_plan(task: seqio.Task, split: str, use_cached: bool = False,
               shard_rows: int = disk_format.SHARD_ROWS) -> list[tuple[int, int, int, int]]:
  """[(index, count, start, end)] of the shards of a task's split."""
  ranges = disk_format.plan(input_count(task, split, use_cached), shard_rows)
  return [(i, len(ranges), a, b) for i, (a, b) in enumerate(ranges)]


def missing_shards(directory, digest: str, plan) -> list:
  """The planned shards without a finished record; a record of another fingerprint in
  the directory is refused."""
  out = []
  for job in plan:
    rec = writer.shard_record(directory, disk_format.shard_name(job[0], job[1]))
    if rec is not None and rec.get("fingerprint") != digest:
      raise DataError(f"{storage.path(directory) / disk_format.shard_name(job[0], job[1])}.json: a "
                      f"shard built from other inputs (fingerprint "
                      f"{str(rec.get('fingerprint'))[:16]}…) in the directory of "
                      f"{digest[:16]}…: shards of two fingerprints are never mixed; delete "
                      f"{directory} and build it again")
    if rec is None:
      out.append(job)
  return out


def assemble(directory, digest: str, parts: dict, plan, builder: str,
             written=()) -> dict:
  """Checks every shard against its record and the plan (`prove_shard`) and writes
  manifest.json (last); returns it. `plan`: the shard jobs (index, count, start, end);
  `written`: the shard indices this build wrote itself (the others, adopted from an
  earlier run into this directory, are verified block by block)."""
  d = storage.path(directory)
  records = []
  for index, count, start, end in plan:
    name = disk_format.shard_name(index, count)
    rec = writer.shard_record(d, name)
    if rec is None:
      raise DataError(f"{d / name}.json: missing: shard {index} of {count} is not written")
    if rec.get("fingerprint") != digest:
      raise DataError(f"{d / name}.json: built from other inputs than {d.name}: shards of "
                      f"two fingerprints are never mixed; delete {d} and build it again")
    prove_shard(d, name, rec, (start, end), full=index not in set(written))
    records.append(rec)
  specs = {json.dumps(r["features"], sort_keys=True) for r in records if r["count"]}
  if not specs:
    raise ConfigError(f"task {parts['task']}: split {parts['split']!r} has no examples to "
                      f"train on")
  if len(specs) > 1:
    raise DataError(f"{d}: its shards hold different features ({sorted(specs)[:2]}); delete "
                    f"it and build it again")
  features = json.loads(specs.pop())
  shards = [{"name": r["name"], "count": r["count"], "sums_sha256": r["sums_sha256"]}
            for r in records]
  m = disk_format.manifest(digest, parts, features, shards, "", builder, time.time())
  m["content_digest"] = _content_digest(d, m)
  storage.write_atomic(d / disk_format.MANIFEST, disk_format.dumps(m))
  return m


PROOF_BLOCKS = 256   # digest blocks read at once when an adopted shard is proven


def prove_shard(d, name: str, rec: dict, planned: tuple, full: bool):
  """The shard's files are the ones its record describes, for the input range this build
  planned: its `.sums` has the record's sha256 and one digest per block of its rows, its
  `.bin` the record's rows, and (`full`: a shard this build did not write in this run)
  every block of the `.bin` its digest. A DataError names the file, what its record
  claims and what is there: a build never adopts bytes it cannot prove it wrote."""
  redo = f"delete {d / name}.* and run the build again (it rewrites that shard)"
  if list(rec.get("input") or []) != list(planned):
    raise DataError(f"{d / name}.json: a record of input rows {rec.get('input')}, this "
                    f"build planned {list(planned)} for {name}: another build's shard; {redo}")
  count, row_bytes = int(rec.get("count", -1)), rec.get("row_bytes")
  sums = (d / f"{name}.sums").read_bytes() if (d / f"{name}.sums").exists() else None
  if sums is None or disk_format.sums_sha256(sums) != rec.get("sums_sha256"):
    raise DataError(f"{d / name}.sums: " + ("missing" if sums is None else
                    f"sha256 {disk_format.sums_sha256(sums)[:16]}…, its record claims "
                    f"{str(rec.get('sums_sha256'))[:16]}…") + f": not the digests this "
                    f"build wrote; {redo}")
  blocks = -(-count // disk_format.BLOCK_ROWS)
  if len(sums) != blocks * disk_format.DIGEST_BYTES:
    raise DataError(f"{d / name}.sums: {len(sums) // disk_format.DIGEST_BYTES} digests, its "
                    f"record's {count} rows have {blocks} blocks; {redo}")
  if not count:
    return
  bin_path = d / f"{name}.bin"
  size = (storage.remote_size(bin_path) if storage.is_remote(bin_path) else
          (os.path.getsize(os.fspath(bin_path)) if bin_path.exists() else None))
  if size != count * int(row_bytes or 0):
    raise DataError(f"{bin_path}: " + ("missing" if size is None else f"{size} bytes") +
                    f", its record claims {count} rows of {row_bytes} bytes; {redo}")
  if full:   # one read per PROOF_BLOCKS blocks (a remote store: few, large requests)
    step, n = disk_format.BLOCK_ROWS * int(row_bytes), disk_format.DIGEST_BYTES
    for first in range(0, blocks, PROOF_BLOCKS):
      data = memoryview(storage.read_range(bin_path, first * step, PROOF_BLOCKS * step))
      for b in range(first, min(first + PROOF_BLOCKS, blocks)):
        block = data[(b - first) * step:(b - first + 1) * step]
        if disk_format.block_digest(block) != sums[b * n:(b + 1) * n]:
          raise DataError(f"{bin_path}: block {b} is not the block its .sums names: bytes "
                          f"this build did not write; {redo}")


def _content_digest(d, m: dict) -> str:
  """sha256 over the digests of blocks counted from row 0: the shards' own digests when
  every shard but the last holds whole blocks (as planned), else recomputed from the rows."""
  counts = [s["count"] for s in m["shards"]]
  if all(c % disk_format.BLOCK_ROWS == 0 for c in counts[:-1]):
    return disk_format.content_digest((d / f"{s['name']}.sums").read_bytes()
                                      for s in m["shards"] if s["count"])
  # (readable by Table meanwhile)
  storage.write_atomic(d / disk_format.MANIFEST, disk_format.dumps(m))
  table = Table(d)
  step = disk_format.BLOCK_ROWS
  return disk_format.content_digest(
      disk_format.block_digest(table.take_records(range(i, min(i + step, len(table)))).tobytes())
      for i in range(0, len(table), step))


def collect_leftovers(directory):
  """Removes the temporary files of writers that are gone (a killed build's, local or
  a Beam worker's on this host: `storage.remove_leftovers`), saying how many."""
  gone = storage.remove_leftovers(directory)
  if gone:
    print(f"[vmx] {directory}: removed {len(gone)} unfinished file(s) of a build that "
          f"stopped", flush=True)


def build_local(task: seqio.Task, split: str, lengths, converter, directory, parts: dict,
                use_cached: bool = False, progress: bool = True,
                shard_rows: int = disk_format.SHARD_ROWS) -> dict:
  """Builds the cache of `task` in this process, the missing shards only."""
  digest = fp.digest(parts)
  collect_leftovers(directory)
  plan = shard_plan(task, split, use_cached, shard_rows)
  todo = missing_shards(directory, digest, plan)
  bar = tqdm(total=sum(b - a for _, _, a, b in todo), desc=f"[vmx] caching {task.name}:{split}",
             unit=" ex", disable=not progress, leave=False)
  try:
    with signals.activity(f"building the token cache of {task.name}:{split}"):
      for index, count, start, end in todo:
        writer.write_shard(task, split, lengths, converter, directory, digest, index, count,
                           start, end, use_cached, bar.update)
  finally:
    bar.close()
  return assemble(directory, digest, parts, plan, "local", [job[0] for job in todo])


def _others(task_dir, split: str) -> list:
  """(built_at, built_from) of the other caches of this task's split (format 1 included)."""
  out = []
  if not task_dir.exists():
    return out
  for p in task_dir.glob(f"{split}.*"):
    for name in (disk_format.MANIFEST, "arrays.json"):
      try:
        info = json.loads((p / name).read_text())
      except (OSError, ValueError):
        continue
      out.append((p, info.get("built_at", 0), info.get("built_from", {})))
      break
  return out


def locate(task: seqio.Task, split: str, lengths, converter, root: str):
  """(fingerprint parts, digest, directory) of the cache of `task` under `root`: where
  `open_table` reads it and launch/cache_tasks.py writes it."""
  parts = fp.parts(task, split, lengths, converter)
  digest = fp.digest(parts)
  return parts, digest, directory_of(root, task, split, digest)


def built(directory) -> bool:
  """Whether the cache in `directory` is complete (its manifest is written last)."""
  return (directory / disk_format.MANIFEST).exists()


def open_table(task: seqio.Task, split: str, lengths, converter, root: Optional[str] = None,
               use_cached: bool = False, progress: bool = True,
               build_missing: Optional[bool] = None) -> Table:
  """The cache of `task` under `root`, built first where it is missing and
  `build_missing` (default: where the root is local; a remote root must hold it already,
  written by launch/cache_tasks.py)."""
  root = root or default_root()
  parts, digest, directory = locate(task, split, lengths, converter, root)
  hint = rebuild_hint(root, directory)
  if built(directory):
    table = Table(directory, hint)
    if table.info.get("fingerprint") != digest:
      raise DataError(f"{directory / disk_format.MANIFEST}: built from other inputs than its name "
                      f"says; {hint}")
    return table
  differs = ""
  others = _others(directory.parent, split)
  if others:   # the newest one: what the previous run of this task read
    last, _, old = max(others, key=lambda o: o[1])
    differs = (f"; the cache at {last} was built with other "
               f"{', '.join(fp.differences(old, parts)) or 'inputs'}")
  if build_missing is None:
    build_missing = not storage.is_remote(root)
  if not build_missing:
    raise ConfigError(
        f"task {task.name}: no tokenized cache for this run under {root}{differs}; write it "
        f"with `python launch/cache_tasks.py --gin_file=<the run's gin files> "
        f"--token_cache_dir={root}`")
  if differs:
    print(f"[vmx] task {task.name}: building a new tokenized cache{differs}", flush=True)
  try:
    build_local(task, split, lengths, converter, directory, parts, use_cached, progress)
  except OSError as e:   # a read-only root (a shared, prebuilt cache directory)
    if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
      raise
    raise DataError(f"task {task.name}: no tokenized cache for this run under {root}, "
                    f"and it cannot be built there ({e.strerror}: {e.filename}){differs}; "
                    f"set DatasetConfig.token_cache_dir to a writable directory, or write "
                    f"the cache where it should be with `python launch/cache_tasks.py "
                    f"--gin_file=<the run's gin files> --token_cache_dir={root}`") from None
  return Table(directory, hint)


def config_tasks(cfg) -> tuple[list, list]:
  """(tasks, rates) of a DatasetConfig: its task, or its mixture's tasks with a positive
  rate."""
  provider = seqio.get_mixture_or_task(cfg.register())
  if isinstance(provider, seqio.Mixture):
    pairs = [(t, float(provider.get_rate(t))) for t in provider.tasks]
    pairs = [(t, r) for t, r in pairs if r > 0]
  else:
    pairs = [(provider, 1.0)]
  return [t for t, _ in pairs], [r for _, r in pairs]


def open_tables(cfg, converter, progress: bool = True, build: Optional[bool] = None):
  """(tasks, rates, tables) of a DatasetConfig (see `open_table` for `build`)."""
  if cfg.use_cached:   # built from seqio's offline cache: checked as the seqio reader does
    seqio_cache.check_cached(cfg.mixture_or_task_name, cfg.split)
  tasks, rates = config_tasks(cfg)
  tables = [open_table(t, cfg.split, cfg.task_feature_lengths, converter,
                       cfg.token_cache_dir, cfg.use_cached, progress, build)
            for t in tqdm(tasks, desc="[vmx] opening the tokenized cache", unit=" task",
                          disable=not progress or len(tasks) < 10, leave=False)]
  return tasks, rates, tables
