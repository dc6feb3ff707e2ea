"""Reading a built token cache: `Table(dir)` gives `len(table)` rows and `take(indices)`.

Local caches are memory-mapped: a read is an offset into the shard's file, the page cache
holds the data and the process's own memory does not grow with the corpus. Remote caches
(gs://, any fsspec URL) are read by units of FETCH_ROWS rows (four digest blocks; the
stream's default window): one ranged request each, fetched in parallel by a pool of threads into a bounded LRU cache shared by every
table of the process (`Blocks`), so a host fetches the blocks of the rows it reads and
nothing else; `prefetch(indices)` starts the fetches of rows needed soon. A store that
stops answering is retried with exponential backoff for VMX_REMOTE_RETRY_S seconds
(default 600) counted from its first unanswered read, whichever thread made it, then a
DataError names it, and every other fetch (queued, or retrying) stops with the same one.

Every block is verified against its digest before any of its rows is used (local: once
per block per process, a bit per block; remote: on every fetch), and each shard's digest
list against the manifest's sha256 first. A mismatch, a missing or short shard, a
manifest of another format: a DataError naming the file (and the block), and what
rebuilds it (`rebuild`, the opener's words).
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import random
import sys
import threading
import time
from typing import Optional

import numpy as np

from vmx import storage
from vmx.data.token_cache import disk_format
from vmx.data.token_cache.daemon_pool import DaemonPool, DeadlinePassed, call_by
from vmx.errors import ConfigError, DataError

RETRY_ENV = "VMX_REMOTE_RETRY_S"
CACHE_ENV = "VMX_REMOTE_CACHE_MB"
DEFAULT_CACHE_MB = 1024
THREADS_ENV = "VMX_REMOTE_THREADS"


def env_number(name: str, default: float, kind=float, minimum: float = 0.0):
  """Environment variable `name` as a `kind` >= `minimum` (unset: `default`); anything
  else is a ConfigError naming the variable and what it accepts."""
  raw = os.environ.get(name)
  if raw is None or raw.strip() == "":
    return kind(default)
  try:
    value = kind(raw)
  except ValueError:
    value = None
  if value is None or value < minimum or value != value:
    what = "an integer" if kind is int else "a number"
    raise ConfigError(f"{name}={raw!r}: expected {what} >= {minimum:g} (unset: {default:g})")
  return value


FETCH_THREADS = 16                        # VMX_REMOTE_THREADS
FETCH_BLOCKS = 4                          # digest blocks per ranged read of a remote shard
FETCH_ROWS = FETCH_BLOCKS * disk_format.BLOCK_ROWS   # (the stream's default window: one read)


def read_manifest(directory, rebuild: str) -> dict:
  path = storage.path(directory) / disk_format.MANIFEST
  try:
    info = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: unreadable ({type(e).__name__}: {e}); {rebuild}") from None
  if info.get("format") != disk_format.FORMAT:
    raise DataError(f"{path}: token cache format {info.get('format')!r}, this vmx reads "
                    f"format {disk_format.FORMAT}; {rebuild}")
  wrong = disk_format.records_disagree(info)
  if wrong:
    raise DataError(f"{path}: {wrong}: the token cache's records disagree; {rebuild}")
  return info


class Blocks:
  """Blocks of remote shards by ranged reads: a bounded LRU of verified bytes, a thread
  pool for parallel and ahead-of-time fetches, retries with backoff. Counts its requests
  and bytes (`requests`, `bytes`)."""

  def __init__(self, capacity_bytes: Optional[int] = None, threads: Optional[int] = None,
               retry_s: Optional[float] = None):
    threads = threads or env_number(THREADS_ENV, FETCH_THREADS, int, 1)
    self.capacity = int(capacity_bytes if capacity_bytes is not None else
                        env_number(CACHE_ENV, DEFAULT_CACHE_MB) * (1 << 20))
    self.retry_s = float(retry_s if retry_s is not None else env_number(RETRY_ENV, 600))
    self._pool = DaemonPool(threads)   # (not joined at exit: daemon_pool.py says why)
    self._lock = threading.Lock()
    self._lru: collections.OrderedDict = collections.OrderedDict()   # key -> bytes
    self._size = 0
    self._pending: dict = {}                                          # key -> Future
    self.requests = 0
    self.bytes = 0
    self.closed = False
    # One outage clock for every read of the process: since when the store has not
    # answered (None: it answers), and the error that ended the wait.
    self._down_since: Optional[float] = None
    self._why = ""                          # the last failed read's error, for the line
    self.dead: Optional[str] = None
    atexit.register(self.close)

  def close(self):
    """Stops fetching: pending fetches are cancelled, retries end."""
    self.closed = True
    self._pool.shutdown()

  def _give_up(self, message: str) -> DataError:
    """The store is declared dead: every read from now on fails at once with `message`,
    queued fetches are cancelled (a prefetch must not keep retrying after the error)."""
    with self._lock:
      self.dead = self.dead or message
    self.close()
    return DataError(self.dead)

  def _down(self, path, since: float, why: str) -> DataError:
    """The store is declared dead (`_give_up`), the line saying for how long it did not
    answer: from the start of its first unanswered read to now."""
    return self._give_up(f"{path}: the store did not answer for "
                         f"{time.monotonic() - since:.0f} s ({RETRY_ENV}={self.retry_s:g}; "
                         f"{why})")

  def read(self, path, start: int, length: int, hint: str = "") -> bytes:
    """One ranged read, retried with backoff while the store does not answer. The budget
    (retry_s) runs from the start of the store's first unanswered read, whichever thread
    made it, and includes the store client's own retries inside an attempt (gcsfs tries a
    request six times over about 35 s): an attempt is waited for only while the budget
    lasts (`daemon_pool.call_by`)."""
    wait, said = 0.5, False
    while True:
      if self.dead:
        raise DataError(self.dead)
      began = time.monotonic()
      with self._lock:
        since = self._down_since if self._down_since is not None else began
      try:
        data = call_by(since + self.retry_s, storage.read_range, path, start, length)
        with self._lock:
          self.requests += 1
          self.bytes += len(data)
          self._down_since = None
        return data
      except DataError:
        raise
      except DeadlinePassed:
        raise self._down(path, since, self._why or "a read was still waiting") from None
      except FileNotFoundError:
        raise DataError(f"{path}: missing: the token cache is incomplete; {hint}") from None
      except Exception as e:  # noqa: BLE001  (fsspec/gcsfs/aiohttp raise many kinds)
        if self.dead:
          raise DataError(self.dead) from None
        if self.closed:
          raise DataError(f"{path}: not read, the reader was closed") from None
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        try:
          short = call_by(since + self.retry_s, _short, path, start + length)
        except DeadlinePassed:
          raise self._down(path, since, why) from None
        if short is not None:
          raise DataError(f"{path}: {short} bytes, expected at least {start + length}: the "
                          f"token cache is truncated; {hint}") from None
        now = time.monotonic()
        with self._lock:   # down since this attempt began: its time inside the client counts
          self._why = why
          self._down_since = began if self._down_since is None else min(began,
                                                                        self._down_since)
          down = now - self._down_since
        if down >= self.retry_s:
          raise self._down(path, self._down_since, why) from None
        if not said:
          print(f"[vmx] {path}: read failed ({type(e).__name__}); retrying for up to "
                f"{self.retry_s - down:.0f} s more", file=sys.stderr, flush=True)
          said = True
        # never past the budget's end: the last try is made there
        time.sleep(min(wait * (0.5 + random.random()), self.retry_s - down))
        wait = min(wait * 2, 30.0)

  def put(self, key, data: bytes):
    with self._lock:
      if key in self._lru:
        return
      self._lru[key] = data
      self._size += len(data)
      while self._size > self.capacity and len(self._lru) > 1:
        _, old = self._lru.popitem(last=False)
        self._size -= len(old)

  def cached(self, key):
    with self._lock:
      data = self._lru.get(key)
      if data is not None:
        self._lru.move_to_end(key)
      return data

  def _submit(self, key, fetch):
    """The future of `key` (fetch() -> verified bytes), started unless cached/pending."""
    with self._lock:
      if self.dead:
        raise DataError(self.dead)
      fut = self._pending.get(key)
      if fut is not None:
        return fut
      fut = self._pool.submit(self._run, key, fetch)
      self._pending[key] = fut
      return fut

  def _run(self, key, fetch):
    try:
      data = fetch()
      self.put(key, data)
      return data
    finally:
      with self._lock:
        self._pending.pop(key, None)

  def get_many(self, requests: dict) -> dict:
    """{key: bytes} of {key: fetch}, fetched in parallel where not cached."""
    out, futures = {}, {}
    for key, fetch in requests.items():
      data = self.cached(key)
      if data is not None:
        out[key] = data
      else:
        futures[key] = self._submit(key, fetch)
    for key, fut in futures.items():
      out[key] = fut.result()
    return out

  def prefetch(self, requests: dict):
    """Starts the fetches of {key: fetch} not cached or pending; returns at once."""
    for key, fetch in requests.items():
      if self.cached(key) is None:
        self._submit(key, fetch)


def _short(path, need: int) -> Optional[int]:
  """The object's size when it is shorter than `need` (None: long enough, or unknown)."""
  try:
    size = storage.remote_size(path) if storage.is_remote(path) else os.path.getsize(path)
  except Exception:  # noqa: BLE001  (the store may be down: keep retrying)
    return None
  return size if size < need else None


_BLOCKS: Optional[Blocks] = None


def shared_blocks() -> Blocks:
  """The process's one remote block cache (its capacity: VMX_REMOTE_CACHE_MB); a new one
  for tables opened after the store was given up on (a notebook retrying later)."""
  global _BLOCKS
  if _BLOCKS is None or _BLOCKS.closed:
    _BLOCKS = Blocks()
  return _BLOCKS


class Table:
  """The rows of one built token cache (see vmx/data/token_cache/disk_format.py)."""

  def __init__(self, directory, rebuild: str = "build it again",
               blocks: Optional[Blocks] = None):
    self.dir = storage.path(directory)
    self.rebuild = rebuild
    self.info = read_manifest(self.dir, rebuild)
    self.count = int(self.info["count"])
    self.features = self.info["features"]
    self.dtype = disk_format.record_dtype(self.features)
    self.row_bytes = self.dtype.itemsize
    shards = self.info["shards"]
    self.starts = np.cumsum([0] + [int(s["count"]) for s in shards])
    self.remote = storage.is_remote(self.dir)
    self.blocks = (blocks or shared_blocks()) if self.remote else None
    self._bins = [self.dir / f"{s['name']}.bin" for s in shards]
    self._bin_names = [str(p) for p in self._bins]   # (keys of the block cache)
    self._sums_files = [self.dir / f"{s['name']}.sums" for s in shards]
    self._shards = shards
    self._maps, self._sums = {}, {}
    blocks = [self._num_blocks(i) for i in range(len(shards))]
    self._block0 = np.cumsum([0] + blocks)          # each shard's first block, table-wide
    self._verified = np.zeros(self._block0[-1], bool)   # local reads: a flag per block
    self._lock = threading.Lock()
    if not self.remote:   # sizes now (cheap); a remote short object fails at its read
      for i, s in enumerate(shards):
        self._check_record(i, s)
        self._check_size(self._bins[i], int(s["count"]) * self.row_bytes)
        self._check_size(self._sums_files[i], self._num_blocks(i) * disk_format.DIGEST_BYTES)

  def _check_record(self, i: int, entry: dict):
    """Shard i's own .json record (written with its .bin, before the manifest) against the
    manifest: its count and digest list's sha256, its input range where the shards
    before it end, its fingerprint the cache's. A DataError naming the record and both
    values where they disagree (local caches: one small read a shard)."""
    f = self.dir / f"{entry['name']}.json"
    if not os.path.exists(f):
      return
    try:
      rec = json.loads(f.read_text())
    except (OSError, ValueError) as e:
      raise DataError(f"{f}: unreadable ({type(e).__name__}); {self.rebuild}") from None
    want = {"count": entry.get("count"), "sums_sha256": entry.get("sums_sha256"),
            "input": [int(self.starts[i]), int(self.starts[i + 1])],
            "fingerprint": self.info.get("fingerprint")}
    for key, value in want.items():
      if key in rec and rec[key] != value:
        raise DataError(f"{f}: {key} {rec[key]!r}, the manifest says {value!r}: the token "
                        f"cache's records disagree; {self.rebuild}")

  def __len__(self) -> int:
    return self.count

  def _num_blocks(self, shard: int) -> int:
    return -(-int(self._shards[shard]["count"]) // disk_format.BLOCK_ROWS)

  def _check_size(self, path, want: int):
    have = os.path.getsize(path) if os.path.exists(path) else -1
    if have != want:
      raise DataError(f"{path}: {'missing' if have < 0 else f'{have} bytes'}, expected {want}"
                      f": the token cache is truncated or damaged; {self.rebuild}")

  def _damaged(self, shard: int, block: int) -> DataError:
    r0 = int(self.starts[shard]) + block * disk_format.BLOCK_ROWS
    r1 = min(r0 + disk_format.BLOCK_ROWS, int(self.starts[shard + 1])) - 1
    return DataError(f"{self._bins[shard]}: block {block} (rows {r0}-{r1}) does not match "
                     f"its digest in {self._sums_files[shard].name}: the token cache is "
                     f"damaged; {self.rebuild}")

  # -- digests ----------------------------------------------------------------------------
  def _shard_sums(self, shard: int):
    """The shard's block digests [blocks, 16] uint8, checked against the manifest once."""
    sums = self._sums.get(shard) if not self.remote else None
    if sums is not None:
      return sums
    f = self._sums_files[shard]
    want = self._shards[shard]["sums_sha256"]
    if self.remote:
      key = (str(f), "sums")
      data = self.blocks.cached(key)
      if data is None:
        with self._lock:   # (in the fetching thread: never waits on the pool)
          data = self.blocks.cached(key)
          if data is None:
            data = self._fetch_sums(shard)
            self.blocks.put(key, data)
      return np.frombuffer(data, np.uint8).reshape(-1, disk_format.DIGEST_BYTES)
    sums = np.memmap(f, np.uint8, mode="r").reshape(-1, disk_format.DIGEST_BYTES)
    if disk_format.sums_sha256(sums.tobytes()) != want:
      raise DataError(f"{f}: its digests do not match the manifest's sha256: the token "
                      f"cache is damaged; {self.rebuild}")
    self._sums[shard] = sums
    return sums

  def _fetch_sums(self, shard: int) -> bytes:
    f = self._sums_files[shard]
    n = self._num_blocks(shard) * disk_format.DIGEST_BYTES
    data = self.blocks.read(f, 0, n, self.rebuild)
    if len(data) != n:
      raise DataError(f"{f}: {len(data)} bytes, expected {n}: the token cache is truncated; "
                      f"{self.rebuild}")
    if disk_format.sums_sha256(data) != self._shards[shard]["sums_sha256"]:
      raise DataError(f"{f}: its digests do not match the manifest's sha256: the token "
                      f"cache is damaged; {self.rebuild}")
    return data

  # -- local ------------------------------------------------------------------------------
  def _map(self, shard: int) -> np.ndarray:
    m = self._maps.get(shard)
    if m is None:
      n = int(self._shards[shard]["count"])
      if n:
        # (the default advice: the page cache holds each block once verified, and a fault
        # maps its neighbours too; numpy's memmap subclass costs per index: a plain view)
        m = np.memmap(self._bins[shard], self.dtype, mode="r", shape=(n,)).view(np.ndarray)
      else:
        m = np.zeros(0, self.dtype)
      self._maps[shard] = m
    return m

  def _verify_local(self, blocks: np.ndarray):
    """Verifies the table-wide blocks `blocks` not yet verified, each read once with
    pread (a page fault per page of a mapping costs far more, sparse or cold files most)
    into the page cache, where the mapping then finds it."""
    todo = blocks[~self._verified[blocks]]
    if not len(todo):
      return
    step = disk_format.BLOCK_ROWS * self.row_bytes
    shards = np.searchsorted(self._block0, todo, side="right") - 1
    for shard in np.unique(shards).tolist():
      sums = self._shard_sums(shard)
      fd = os.open(self._bins[shard], os.O_RDONLY)
      try:
        for g in todo[shards == shard].tolist():
          b = g - int(self._block0[shard])
          if disk_format.block_digest(os.pread(fd, step, b * step)) != sums[b].tobytes():
            raise self._damaged(shard, b)
          self._verified[g] = True
      finally:
        os.close(fd)

  # -- remote -----------------------------------------------------------------------------
  def _unit_fetch(self, shard: int, unit: int):
    """fetch() -> the verified bytes of fetch unit `unit` of a shard: FETCH_BLOCKS digest
    blocks in one ranged read."""
    def fetch():
      sums = self._shard_sums(shard)
      n = int(self._shards[shard]["count"])
      first = unit * FETCH_BLOCKS * disk_format.BLOCK_ROWS
      rows = min(FETCH_BLOCKS * disk_format.BLOCK_ROWS, n - first)
      start = first * self.row_bytes
      data = self.blocks.read(self._bins[shard], start, rows * self.row_bytes, self.rebuild)
      if len(data) != rows * self.row_bytes:
        raise DataError(f"{self._bins[shard]}: {len(data)} bytes at offset {start}, expected "
                        f"{rows * self.row_bytes}: the token cache is truncated; "
                        f"{self.rebuild}")
      step = disk_format.BLOCK_ROWS * self.row_bytes
      view = memoryview(data)
      for i in range(0, len(data), step):
        b = unit * FETCH_BLOCKS + i // step
        if disk_format.block_digest(view[i:i + step]) != sums[b].tobytes():
          raise self._damaged(shard, b)
      return data
    return fetch

  def _requests(self, keys: np.ndarray) -> dict:
    """{cache key: fetch} of fetch units `keys` (shard << 32 | unit)."""
    return {(self._bin_names[k >> 32], k & 0xFFFFFFFF): self._unit_fetch(k >> 32, k & 0xFFFFFFFF)
            for k in keys.tolist()}

  # -- reads ------------------------------------------------------------------------------
  def locate(self, indices):
    """(shard [R], row within its shard [R]) of table rows `indices`."""
    idx = np.asarray(indices, np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= self.count):
      raise IndexError(f"{self.dir}: rows {idx.min()}..{idx.max()} of {self.count}")
    shard = np.searchsorted(self.starts, idx, side="right") - 1
    return shard, idx - self.starts[shard]

  def prefetch(self, indices):
    """Starts fetching the blocks of `indices` (remote; local: nothing to do)."""
    if self.remote and len(indices):
      shard, local = self.locate(indices)
      keys = np.unique(shard.astype(np.int64) << 32 | local // FETCH_ROWS)
      self.blocks.prefetch(self._requests(keys))

  def take_records(self, indices) -> np.ndarray:
    """[R] records of rows `indices` (verified)."""
    shard_R, local_R = self.locate(indices)
    block_R = local_R // disk_format.BLOCK_ROWS
    out = np.empty(len(shard_R), self.dtype)
    if not self.remote:
      blocks = np.unique(self._block0[shard_R] + block_R)
      if not self._verified[blocks].all():
        with self._lock:
          self._verify_local(blocks)
      order = np.argsort(shard_R, kind="stable")
      for sel in np.split(order, np.flatnonzero(np.diff(shard_R[order])) + 1):
        if len(sel):
          out[sel] = self._map(int(shard_R[sel[0]]))[local_R[sel]]
      return out
    keys = shard_R.astype(np.int64) << 32 | local_R // FETCH_ROWS
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    got = self.blocks.get_many(self._requests(keys[order[np.r_[0, bounds]]]))
    for sel in np.split(order, bounds):
      k = int(keys[sel[0]])
      rec = np.frombuffer(got[(self._bin_names[k >> 32], k & 0xFFFFFFFF)], self.dtype)
      out[sel] = rec[local_R[sel] - (k & 0xFFFFFFFF) * FETCH_ROWS]
    return out

  def take(self, indices) -> dict:
    """{feature: [R, ...]} of rows `indices` (verified)."""
    return disk_format.from_records(self.take_records(indices))

  def all_records(self) -> np.ndarray:
    """Every row, verified (small tables held in memory)."""
    return self.take_records(np.arange(self.count))
