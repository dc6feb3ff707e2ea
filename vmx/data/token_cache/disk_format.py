"""The token cache's layout on disk or in a bucket (format 2), and its digests.

One directory per (task, split, fingerprint), `<root>/<task dir>/<split>.<fingerprint 16>/`:

  manifest.json                written last: its presence means the cache is complete
  rows-00000-of-00004.bin      rows [start, start + count) of shard 0: fixed-size records,
                               every feature of one example after the other (`features`,
                               little-endian), BLOCK_ROWS records a block
  rows-00000-of-00004.sums     a 16-byte BLAKE2b digest of each block of the .bin
  rows-00000-of-00004.json     the shard's record (count, sizes, the sha256 of its .sums,
                               the fingerprint), written after its .bin and .sums

A row is one record, so a block of rows is one contiguous byte range: one ranged read of
a remote store (vmx/data/token_cache/table.py) or one run of pages of a local file. A
block is verified against its digest before any of its rows is used; a shard's .sums is
checked against the manifest's sha256 before any of its digests is believed. So a damaged
byte is a DataError naming the file and block, and a start never re-hashes the data.

The manifest's `content_digest` is the sha256 of every block digest in row order over
blocks of BLOCK_ROWS rows counted from the first row of the task: the same whatever the
shard layout (local build, Beam, another number of shards). This module knows the format
only: no seqio, no TensorFlow.
"""
from __future__ import annotations

import hashlib
import json
from typing import Iterable, Mapping, Sequence

import numpy as np

FORMAT = 2
MANIFEST = "manifest.json"
BLOCK_ROWS = 256            # rows per digest (and per remote read)
SHARD_ROWS = 1 << 20        # input examples per shard (a multiple of BLOCK_ROWS)
DIGEST_BYTES = 16


def shard_name(index: int, count: int) -> str:
  return f"rows-{index:05d}-of-{count:05d}"


def record_dtype(features: Mapping[str, Mapping]) -> np.dtype:
  """The packed record of one example: {name: {"dtype", "shape"}} in the given order."""
  return np.dtype([(name, np.dtype(spec["dtype"]).newbyteorder("<"), tuple(spec["shape"]))
                   for name, spec in features.items()])


def feature_specs(batch: Mapping[str, np.ndarray]) -> dict:
  """{name: {"dtype", "shape"}} of a batch of examples, by feature name."""
  return {k: {"dtype": np.asarray(v).dtype.name, "shape": list(np.shape(v)[1:])}
          for k, v in sorted(batch.items())}


def to_records(batch: Mapping[str, np.ndarray], dtype: np.dtype) -> np.ndarray:
  """[n] records of a batch {feature: [n, ...]}."""
  n = len(next(iter(batch.values())))
  out = np.empty(n, dtype)
  for name in dtype.names:
    out[name] = batch[name]
  return out


def from_records(rec: np.ndarray) -> dict:
  """{feature: contiguous [n, ...] array} of [n] records."""
  return {name: np.ascontiguousarray(rec[name]) for name in rec.dtype.names}


def block_digest(data) -> bytes:
  return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def sums_sha256(sums: bytes) -> str:
  return hashlib.sha256(sums).hexdigest()


def content_digest(block_sums: Iterable[bytes]) -> str:
  """sha256 over the block digests, in row order (blocks counted from row 0)."""
  h = hashlib.sha256()
  for s in block_sums:
    h.update(s)
  return h.hexdigest()


def plan(count: int, shard_rows: int = SHARD_ROWS) -> list[tuple[int, int]]:
  """[(start, end)] input ranges of the shards of `count` examples."""
  if shard_rows <= 0 or shard_rows % BLOCK_ROWS:
    raise ValueError(f"shard_rows={shard_rows}: a positive multiple of {BLOCK_ROWS}")
  return [(s, min(s + shard_rows, count)) for s in range(0, max(count, 1), shard_rows)]


def manifest(fingerprint: str, built_from: dict, features: dict, shards: Sequence[dict],
             digest: str, builder: str, built_at: float) -> dict:
  dtype = record_dtype(features)
  return {"format": FORMAT, "fingerprint": fingerprint, "count": sum(s["count"] for s in shards),
          "features": features, "row_bytes": dtype.itemsize, "block_rows": BLOCK_ROWS,
          "shards": list(shards), "content_digest": digest, "builder": builder,
          "built_at": built_at, "built_from": built_from}


def records_disagree(info: Mapping) -> str:
  """'' when a manifest's row count is its shards' sum, else what disagrees, in words. A
  manifest has no digest of its own: this, the shards' sizes and digests and their own
  records (table.Table) are what bind its numbers to the bytes."""
  counts = [int(s.get("count", -1)) for s in info.get("shards") or []]
  if int(info.get("count", -1)) != sum(counts):
    return f"it claims {info.get('count')} rows, its {len(counts)} shards {sum(counts)}"
  return ""


def dumps(obj) -> str:
  return json.dumps(obj, indent=1, sort_keys=False)
