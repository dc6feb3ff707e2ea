"""Packing: several sentences share a row of the model's length (host side, numpy).

A step trains on the examples the stream gives it, in their order; packing changes only
how their sentences are laid out in rows (SeqIO's convention, `seqio.utils.trim_and_pack`):

  <name>              [rows, L]  the sentences' tokens, one after the other (0: a free slot)
  <name>_segment_ids  [rows, L]  1, 2, ... for the sentences of a row, 0 for free slots
  <name>_positions    [rows, L]  0, 1, ... restarting in each sentence
  <name>_starts       [B] or [B, k]  where each example's sentence starts: row * L + column
  <name>_key          [B] or [B, k]  `losses.token_row_key` of each sentence (what duplicate
                                     masking compares), computed here from the unpacked row

Attention then sees only a token's own segment, pooling is per segment, and the model
gathers each example's vector back into the order the loss expects (vmx/packing.py).

The unit of packing is one data-parallel shard of the global batch (the examples one
device holds, `B / P`) and, with GradCache, one chunk of it (examples i with i mod n = c,
vmx/training/grad_cache.py): the rows of unit (shard p, chunk c) are global rows
(p·R + r)·n + c, so the batch's row sharding puts a shard's rows on its device and
GradCache's chunking (rows c, c + n, ...) gives each chunk its own rows; `starts` count rows
within the chunk. Every unit of a step has the same number of rows R (the largest any unit
needs, rounded up to a multiple of `granule` so that few shapes are compiled); several
processes agree on it through jax's coordination service before placing the batch.

The layout is a pure function of the step's examples, the number of shards and chunks
(best-fit decreasing: sentences by length, longest first, each into the fullest row it
fits in; ties by position), so a resume at any step, and an elastic restart on the same
number of shards, packs its batches exactly as the uninterrupted run did.

`reserve` slots follow each sentence that is shorter than a row (a decoder's EOS target:
VMSST); they carry the sentence's segment id and the next position but no token.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from vmx.errors import ConfigError

SUFFIXES = ("_segment_ids", "_positions", "_starts", "_key")
ROW_SUFFIXES = ("", "_segment_ids", "_positions")   # [rows, L]; the others are per example
KEY_MULT = 0x9E3779B1      # losses.token_row_key's multiplier (pinned by tests/test_packing.py)


def packed_names(name: str) -> tuple[str, ...]:
  """The batch features one packed feature becomes (tokens first)."""
  return (name,) + tuple(name + s for s in SUFFIXES)


def features_of(model, shapes: Mapping[str, tuple], key: Optional[str] = None) -> list:
  """[Feature] of the token features `model.packed_features()` names for task key `key`
  (None: a single task), from the batch's example shapes ({feature: [B, width]})."""
  prefix = "" if key is None else f"{key}/"
  out = []
  for name, reserve in (model.packed_features() or {}).items():
    if ("/" in name) != (key is not None) or not name.startswith(prefix):
      continue
    k = model.sentences_per_example(name)
    out.append(Feature(name, shapes[name][1] // k, k, int(reserve)))
  return out


def row_features(name: str) -> tuple[str, ...]:
  """The features of packed feature `name` laid out by rows ([rows, L])."""
  return tuple(name + s for s in ROW_SUFFIXES)


def step_shapes(shapes: Mapping[str, tuple], packed: Mapping) -> dict:
  """The step's batch shapes: `shapes` (the examples') with each packed feature of `packed`
  ({task key: [Feature]}) replaced by its rows (their number varies by step: the unpacked
  row count stands for it here) and its per-example starts and keys."""
  out = dict(shapes)
  for features in packed.values():
    for f in features:
      b, width = shapes[f.name]
      rows = (b * f.sentences, f.length)
      per_example = (b,) if f.sentences == 1 else (b, f.sentences)
      del out[f.name]
      out.update({f.name: rows, f.name + "_segment_ids": rows, f.name + "_positions": rows,
                  f.name + "_starts": per_example, f.name + "_key": per_example})
  return out


@dataclasses.dataclass(frozen=True)
class Feature:
  """One packed token feature: `name` in the batch ('left_tokens', 'views', 'tlm/tokens'),
  `length` its sentences' (and the rows') length L, `sentences` per example (an N-way
  example's V views: a [B, V * L] feature), `reserve` slots kept after each sentence."""
  name: str
  length: int
  sentences: int = 1
  reserve: int = 0


def row_keys(tokens_NxL: np.ndarray) -> np.ndarray:
  """[N] uint32 `losses.token_row_key` of unpacked rows (same hash, numpy)."""
  length = tokens_NxL.shape[-1]
  mult = ((np.arange(1, length + 1, dtype=np.uint64) * KEY_MULT) & 0xFFFFFFFF).astype(
      np.uint32) | np.uint32(1)
  with np.errstate(over="ignore"):
    return np.sum(tokens_NxL.astype(np.uint32) * mult, axis=-1, dtype=np.uint32)


def best_fit_decreasing(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(row [N], offset [N], rows): each item, longest first (ties: the earlier item), in the
  row with the least room that fits it, else a new row. Sizes are 1 .. capacity."""
  n = len(sizes)
  row, offset = np.empty(n, np.int64), np.empty(n, np.int64)
  open_rows = [[] for _ in range(capacity + 1)]   # rows by their free slots
  count = np.zeros(capacity + 1, np.int64)
  rows = 0
  for i in np.argsort(-sizes, kind="stable").tolist():
    s = int(sizes[i])
    fits = np.flatnonzero(count[s:])
    if len(fits):
      free = s + int(fits[0])
      r = open_rows[free].pop()
      count[free] -= 1
    else:
      free, r = capacity, rows
      rows += 1
    row[i], offset[i] = r, capacity - free
    open_rows[free - s].append(r)
    count[free - s] += 1
  return row, offset, rows


@dataclasses.dataclass
class _Plan:
  """Where each sentence of one feature of one unit goes."""
  row: np.ndarray      # [N] row within the unit
  offset: np.ndarray   # [N] column of the first slot
  length: np.ndarray   # [N] tokens
  slots: np.ndarray    # [N] slots (tokens + reserve, at most L, at least 1)
  rows: int


class Packer:
  """Packs one task key's batches: this process's example rows (its shards, in order) ->
  its packed rows. `agree(rows)`: the rows every process needs (their maximum); None on
  one process."""

  def __init__(self, features: Sequence[Feature], batch_size: int, shards: int, chunks: int,
               local_shards: Sequence[int], granule: Optional[int] = None,
               agree: Optional[Callable[[int], int]] = None):
    self.features = tuple(features)
    self.batch_size, self.shards, self.chunks = int(batch_size), int(shards), int(chunks)
    if self.batch_size % (self.shards * self.chunks):
      raise ConfigError(f"packing: batch size {batch_size} is not a multiple of the "
                        f"{shards} data-parallel shards x {chunks} GradCache chunks")
    self.per_shard = self.batch_size // self.shards
    self.per_unit = self.per_shard // self.chunks
    self.local_shards = [int(p) for p in local_shards]
    most = max(f.sentences for f in self.features)
    self.granule = int(granule or max(1, -(-self.per_unit * most // 32)))
    self.agree = agree
    self.shapes_seen: dict[int, int] = {}   # rows per unit -> steps packed with it

  def row_lookup(self, local_rows: int) -> np.ndarray:
    """[global rows] this process's row of each global packed row (-1: another process's),
    for a step packed into `local_rows` rows here."""
    block = local_rows // max(len(self.local_shards), 1)      # one shard's rows (n·R)
    out = np.full(self.shards * block, -1, np.int64)
    for j, p in enumerate(self.local_shards):
      out[p * block:(p + 1) * block] = np.arange(j * block, (j + 1) * block)
    return out

  def rows_for(self, needed: int) -> int:
    """The row count of a step whose largest unit needs `needed` rows."""
    return -(-max(needed, 1) // self.granule) * self.granule

  # -- one step -----------------------------------------------------------------------------
  def _sentences(self, feature: Feature, tokens: np.ndarray) -> np.ndarray:
    """[local examples, k, L] sentences of a [local examples, k * L] feature."""
    b = tokens.shape[0]
    if tokens.shape[1] != feature.sentences * feature.length:
      raise ConfigError(f"packing: feature {feature.name!r} is {tokens.shape[1]} wide, not "
                        f"{feature.sentences} x {feature.length}")
    return tokens.reshape(b, feature.sentences, feature.length)

  def plan(self, batch: Mapping[str, np.ndarray]) -> dict:
    """{(feature, local shard j, chunk c): _Plan} of this process's examples."""
    plans = {}
    for f in self.features:
      sent = self._sentences(f, np.asarray(batch[f.name]))
      lengths = (sent > 0).sum(-1)                                   # [b, k]
      slots = np.clip(np.minimum(lengths + f.reserve, f.length), 1, None)
      for j in range(len(self.local_shards)):
        for c in range(self.chunks):
          ex = j * self.per_shard + np.arange(c, self.per_shard, self.chunks)
          s = slots[ex].reshape(-1)
          row, offset, rows = best_fit_decreasing(s, f.length)
          plans[f.name, j, c] = _Plan(row, offset, lengths[ex].reshape(-1), s, rows)
    return plans

  def __call__(self, batch: Mapping[str, np.ndarray]) -> dict:
    """This process's packed batch: the packed features (rows of its shards, see the module
    docstring) and every other feature as it was."""
    plans = self.plan(batch)
    needed = max((p.rows for p in plans.values()), default=1)
    if self.agree is not None:
      needed = self.agree(needed)
    rows = self.rows_for(needed)
    self.shapes_seen[rows] = self.shapes_seen.get(rows, 0) + 1
    out = {k: v for k, v in batch.items() if k not in {f.name for f in self.features}}
    for f in self.features:
      out.update(self._materialize(f, np.asarray(batch[f.name]), plans, rows))
    return out

  def _materialize(self, f: Feature, tokens: np.ndarray, plans: dict, rows: int) -> dict:
    sent = self._sentences(f, tokens)
    b, k, length = sent.shape
    n, local = self.chunks, len(self.local_shards)
    block = rows * n                                # rows of one shard
    tok = np.zeros((local * block, length), tokens.dtype)
    seg = np.zeros((local * block, length), np.int32)
    pos = np.zeros((local * block, length), np.int32)
    starts = np.empty((b, k), np.int32)
    for j, p in enumerate(self.local_shards):
      for c in range(n):
        plan = plans[f.name, j, c]
        ex = j * self.per_shard + np.arange(c, self.per_shard, n)
        local_row = j * block + plan.row * n + c      # this process's row of each sentence
        # sentence ids within their row: 1, 2, ... in the order of their offsets
        order = np.lexsort((plan.offset, plan.row))
        seg_id = np.empty(len(order), np.int32)
        first = np.r_[True, plan.row[order][1:] != plan.row[order][:-1]]
        idx = np.arange(len(order))
        seg_id[order] = idx - np.maximum.accumulate(np.where(first, idx, 0)) + 1
        # every slot of every sentence: (row, column, position in the sentence)
        reps = plan.slots
        which = np.repeat(np.arange(len(reps)), reps)
        within = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        r_s, col = local_row[which], plan.offset[which] + within
        tok[r_s, col] = sent[ex].reshape(-1, length)[which, within]   # 0 past its tokens
        seg[r_s, col] = seg_id[which]
        pos[r_s, col] = within
        chunk_row = p * rows + plan.row               # its row among the chunk's: p·R + r
        starts[ex] = (chunk_row * length + plan.offset).reshape(len(ex), k)
    keys = row_keys(sent.reshape(b * k, length)).reshape(b, k)
    if k == 1:
      starts, keys = starts[:, 0], keys[:, 0]
    name = f.name
    return {name: tok, name + "_segment_ids": seg, name + "_positions": pos,
            name + "_starts": starts, name + "_key": keys}


def useful_fraction(batch: Mapping[str, np.ndarray], names: Sequence[str]) -> float:
  """Non-pad token positions over all token positions of the token features `names`."""
  used = sum(int((np.asarray(batch[n]) > 0).sum()) for n in names)
  total = sum(int(np.asarray(batch[n]).size) for n in names)
  return used / max(total, 1)


def shard_of_rows(rows: np.ndarray, batch_size: int, shards: int) -> list[int]:
  """The data-parallel shards whose examples `rows` (sorted global example rows) hold;
  ConfigError unless they are whole shards."""
  per = batch_size // shards
  held = sorted({int(r) // per for r in np.asarray(rows).tolist()})
  want = np.concatenate([np.arange(p * per, (p + 1) * per) for p in held]) if held else []
  if not np.array_equal(np.asarray(rows), want):
    raise ConfigError("packing: this process's rows are not whole data-parallel shards")
  return held


class CoordinationAgreement:
  """The largest of the processes' row counts for each packed step, through jax's
  coordination service (a key-value store every process of `jax.distributed` reaches;
  host-only, so it is safe in the prefetch thread, unlike a device collective). Each call
  is one step: every process calls in the same order."""

  def __init__(self, tag: str, timeout_s: int = 600):
    # jax has no public name for the coordination client; orbax reaches it the same way.
    from jax._src import distributed  # the coordination client (see above)
    import jax
    self.client = distributed.global_state.client
    self.process, self.count = jax.process_index(), jax.process_count()
    self.tag, self.timeout_ms, self.calls = tag, timeout_s * 1000, 0

  def __call__(self, needed: int) -> int:
    step = self.calls
    self.calls += 1
    key = f"vmx/pack/{self.tag}/{step}/"
    self.client.key_value_set(key + str(self.process), str(int(needed)))
    most = int(needed)
    for q in range(self.count):
      if q != self.process:
        most = max(most, int(self.client.blocking_key_value_get(key + str(q), self.timeout_ms)))
    if step >= 2:   # every process has read step - 2's values (it set step - 1 after)
      try:
        self.client.key_value_delete(f"vmx/pack/{self.tag}/{step - 2}/{self.process}")
      except Exception:  # noqa: BLE001  (an old key left behind costs a few bytes)
        pass
    return most
