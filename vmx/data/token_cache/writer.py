"""Writing one shard of a token cache: the examples [start, end) of a task's split, after
every preprocessor and the model's feature converter, as the SeqIO task yields them.

The same function writes every shard of a local build (vmx/data/token_cache/build.py) and
of a Beam build (vmx/data/token_cache/beam.py), so both give the same bytes. A shard
appears whole or not at all: locally its .bin is written under a temporary name
(`<name>.bin.tmp-<host>-<pid>`) and renamed; on an object store one upload is one object.
Its .json record is written last: a shard without it is not finished, and a later build
writes it again (and removes a temporary file whose writer is gone: `storage.remove_leftovers`).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from typing import Callable, Mapping, Optional

import seqio

from vmx import storage
from vmx.data.token_cache import disk_format
from vmx.data.token_cache.sources import NwayGroups
from vmx.errors import ConfigError, DataError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def examples(task: seqio.Task, split: str, lengths: Mapping[str, int], converter,
             start: int, end: int, use_cached: bool = False):
  """Numpy batches of the task's examples [start, end) (in file order), as
  `task.get_dataset(shuffle=False, num_epochs=1)` and the converter yield them."""
  source = task.source
  if isinstance(source, NwayGroups):   # N-way groups: views are drawn when read
    return source.stored_examples(task, split, lengths, start, end)
  if use_cached:
    # SeqIO's own offline cache (the replaying reader's world), through SeqIO's public
    # reader (shuffle=False: the cached files' order; not held in memory, which a range
    # never reuses). Its records are tokenized already; the post-cache preprocessors run
    # on the skipped records too (a teacher task's lookup each), the price of not using
    # SeqIO's private cached source.
    ds = task.get_dataset(dict(lengths), split=split, use_cached=True, shuffle=False,
                          seed=None, num_epochs=1, try_in_mem_cache=False)
    ds = ds.skip(start).take(end - start)
  else:
    # raw records are skipped before they are tokenized: what a later range costs
    ds = source.get_dataset(split=split, shuffle=False, seed=None).skip(start).take(end - start)
    ds = task.preprocess_precache(ds, seed=None)
    ds = task.preprocess_postcache(ds, sequence_length=dict(lengths), seed=None)
    check_output_features(task, ds)       # what seqio's get_dataset checks and trims
    ds = seqio.utils.trim_dataset(ds, dict(lengths), task.output_features)
  ds = converter(ds, dict(lengths))
  return ds.batch(4096).prefetch(2).as_numpy_iterator()


def check_output_features(task: seqio.Task, ds):
  """The preprocessed examples have the task's output features, of their dtype and rank
  (the check seqio's `get_dataset` makes; ConfigError naming the task and feature)."""
  specs = ds.element_spec
  for name, feature in task.output_features.items():
    if name not in specs:
      if feature.required:
        raise ConfigError(f"task {task.name}: no output feature {name!r} after its "
                          f"preprocessors")
      continue
    got = specs[name]
    if got.dtype != feature.dtype or got.shape.rank != feature.rank:
      raise ConfigError(f"task {task.name}: output feature {name!r} is {got.dtype.name} of "
                        f"rank {got.shape.rank} after its preprocessors; expected "
                        f"{feature.dtype.name} of rank {feature.rank}")


def full_disk_error(path, e: OSError) -> DataError:
  try:
    free = shutil.disk_usage(os.path.dirname(os.fspath(path)) or ".").free
    left = f" ({free} bytes free)"
  except OSError:
    left = ""
  return DataError(f"{path}: no space left on the device{left} ({e.strerror}); the "
                   f"unfinished file was removed and the finished shards are kept: free "
                   f"space and run again, it continues")


class _Blocks:
  """Block digests of a byte stream written in pieces."""

  def __init__(self, row_bytes: int):
    self.step = disk_format.BLOCK_ROWS * row_bytes
    self.buf = bytearray()
    self.sums = []

  def add(self, data: bytes):
    self.buf += data
    n = len(self.buf) // self.step * self.step
    if n:
      view = memoryview(self.buf)
      self.sums += [disk_format.block_digest(view[i:i + self.step]) for i in range(0, n, self.step)]
      view.release()
      del self.buf[:n]

  def close(self) -> bytes:
    if self.buf:
      self.sums.append(disk_format.block_digest(bytes(self.buf)))
      self.buf = bytearray()
    return b"".join(self.sums)


def shard_record(directory, name: str) -> Optional[dict]:
  """The .json record of a finished shard, or None."""
  f = storage.path(directory) / f"{name}.json"
  try:
    return json.loads(f.read_text())
  except (OSError, ValueError):
    return None


def write_shard(task: seqio.Task, split: str, lengths: Mapping[str, int], converter,
                directory, fingerprint: str, index: int, count: int, start: int, end: int,
                use_cached: bool = False, progress: Optional[Callable[[int], None]] = None
                ) -> dict:
  """Writes shard `index` of `count` (input examples [start, end)) into `directory`;
  returns its record (also written as `<name>.json`, last)."""
  d = storage.path(directory)
  remote = storage.is_remote(d)
  name = disk_format.shard_name(index, count)
  final = {s: d / f"{name}.{s}" for s in ("bin", "sums")}
  tmp = final if remote else {s: storage.path(storage.tmp_name(p)) for s, p in final.items()}
  d.mkdir(parents=True, exist_ok=True)
  f, blocks, dtype, features, rows = None, None, None, None, 0
  try:
    try:
      for batch in examples(task, split, lengths, converter, start, end, use_cached):
        if f is None:
          features = disk_format.feature_specs(batch)
          dtype = disk_format.record_dtype(features)
          blocks = _Blocks(dtype.itemsize)
          f = tmp["bin"].open("wb")
        data = disk_format.to_records(batch, dtype).tobytes()
        f.write(data)
        blocks.add(data)
        n = len(next(iter(batch.values())))
        rows += n
        if progress is not None:
          progress(n)
      if f is None:   # every input example filtered out: an empty shard
        f = tmp["bin"].open("wb")
      f.close()
      f = None
      sums = blocks.close() if blocks is not None else b""
      with tmp["sums"].open("wb") as g:
        g.write(sums)
      if not remote:
        for s in final:
          os.replace(tmp[s], final[s])
    except OSError as e:
      if e.errno in _FULL:
        raise full_disk_error(tmp["bin"], e) from None
      raise
  except BaseException:
    if f is not None:
      f.close()
    if not remote:
      for p in tmp.values():
        if os.path.exists(p):
          os.remove(p)
    raise
  record = {"name": name, "count": rows, "input": [start, end], "features": features,
            "row_bytes": dtype.itemsize if dtype is not None else None,
            "sums_sha256": disk_format.sums_sha256(sums), "fingerprint": fingerprint,
            "written_at": time.time()}
  try:
    storage.write_atomic(d / f"{name}.json", json.dumps(record))
  except OSError as e:
    if e.errno in _FULL:
      raise full_disk_error(d / f"{name}.json", e) from None
    raise
  return record
