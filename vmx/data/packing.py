"""Packing: several sentences share a row of the model's length (host side, numpy).

A step trains on the examples the stream gives it, in their order; packing changes only
how their sentences are laid out in rows (SeqIO's convention, `seqio.utils.trim_and_pack`):

  <group>              [rows, L]  the sentences' tokens, one after the other (0: a free slot)
  <group>_segment_ids  [rows, L]  1, 2, ... for the sentences of a row, 0 for free slots
  <group>_positions    [rows, L]  0, 1, ... restarting in each sentence
  <name>_starts        [B] or [B, k]  where each example's sentence starts: row * L + column
  <name>_key           [B] or [B, k]  `losses.token_row_key` of each sentence (what duplicate
                                      masking compares), computed here from the unpacked row

A group is one feature (`<group>` = `<name>`) or several that share rows: a pair's two
sides, which one encoder reads (the model's `packed_groups()`), so that one row count fits
both and every row fills up.

Attention then sees only a token's own segment, pooling is per segment, and the model
gathers each example's vector back into the order the loss expects (vmx/packing.py).

The unit of packing is one data-parallel shard of the global batch (the examples one
device holds, `B / P`) and, with GradCache, one chunk of it (examples i with i mod n = c,
vmx/training/grad_cache.py): the rows of unit (shard p, chunk c) are global rows
(p·R + r)·n + c, so the batch's row sharding puts a shard's rows on its device and
GradCache's chunking (rows c, c + n, ...) gives each chunk its own rows; `starts` count rows
within the chunk. Every unit of a step has the same number of rows R of a group (the
largest any unit needs, rounded up to a multiple of `granule` so that few shapes are
compiled; each group its own); several processes agree on them through jax's coordination
service before placing the batch.

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

ROW_SUFFIXES = ("", "_segment_ids", "_positions")   # [rows, L]; the others are per example
# A step's rows are rounded up to a multiple of 1/32 of a shard's sentences, and of at least
# MIN_GRANULE rows: a few compiled shapes per run (each row count compiles the step once).
MIN_GRANULE = 4
KEY_MULT = 0x9E3779B1      # losses.token_row_key's multiplier (pinned by tests/test_packing.py)


def features_of(model, shapes: Mapping[str, tuple], key: Optional[str] = None) -> list:
  """[Feature] of the token features `model.packed_features()` names for task key `key`
  (None: a single task), from the batch's example shapes ({feature: [B, width]})."""
  prefix = "" if key is None else f"{key}/"
  group = {m: g for g, members in model.packed_groups().items() for m in members}
  out = []
  for name, reserve in (model.packed_features() or {}).items():
    if ("/" in name) != (key is not None) or not name.startswith(prefix):
      continue
    k = model.sentences_per_example(name)
    out.append(Feature(name, shapes[name][1] // k, k, int(reserve), group.get(name)))
  return out


def row_features(name: str) -> tuple[str, ...]:
  """The features of packed group `name` laid out by rows ([rows, L])."""
  return tuple(name + s for s in ROW_SUFFIXES)


def step_shapes(shapes: Mapping[str, tuple], packed: Mapping) -> dict:
  """The step's batch shapes: `shapes` (the examples') with each packed feature of `packed`
  ({task key: [Feature]}) replaced by its rows (their number varies by step: the unpacked
  row count stands for it here) and its per-example starts and keys."""
  out = dict(shapes)
  for features in packed.values():
    for g, members in groups_of(features).items():
      b = shapes[members[0].name][0]
      rows = (b * sum(f.sentences for f in members), members[0].length)
      for f in members:
        per_example = (b,) if f.sentences == 1 else (b, f.sentences)
        del out[f.name]
        out.update({f.name + "_starts": per_example, f.name + "_key": per_example})
      out.update({name: rows for name in row_features(g)})
  return out


@dataclasses.dataclass(frozen=True)
class Feature:
  """One packed token feature: `name` in the batch ('left_tokens', 'views', 'tlm/tokens'),
  `length` its sentences' (and the rows') length L, `sentences` per example (an N-way
  example's V views: a [B, V * L] feature), `reserve` slots kept after each sentence,
  `group`: the rows it shares with the other features of its group (a pair's two sides,
  read by one encoder: one row count, full rows); None: rows of its own."""
  name: str
  length: int
  sentences: int = 1
  reserve: int = 0
  group: Optional[str] = None


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
  """Where each sentence of one group of one unit goes (its members' sentences in order)."""
  row: np.ndarray      # [N] row within the unit
  offset: np.ndarray   # [N] column of the first slot
  length: np.ndarray   # [N] tokens
  slots: np.ndarray    # [N] slots (tokens + reserve, at most L, at least 1)
  rows: int


def groups_of(features: Sequence[Feature]) -> dict:
  """{group: [its features]}, in the features' order."""
  out: dict = {}
  for f in features:
    out.setdefault(f.group or f.name, []).append(f)
  for g, members in out.items():
    if len({(f.length, f.reserve) for f in members}) > 1:
      raise ConfigError(f"packing: the features of group {g!r} differ in length or reserve: "
                        f"{[(f.name, f.length, f.reserve) for f in members]}")
  return out


class Packer:
  """Packs one task key's batches: this process's example rows (its shards, in order) ->
  its packed rows. `agree([rows per group])`: the rows every process needs (their
  maximum, per group); None on one process."""

  def __init__(self, features: Sequence[Feature], batch_size: int, shards: int, chunks: int,
               local_shards: Sequence[int], granule: Optional[int] = None,
               agree: Optional[Callable[[list], list]] = None):
    self.features = tuple(features)
    self.groups = groups_of(self.features)
    self.batch_size, self.shards, self.chunks = int(batch_size), int(shards), int(chunks)
    if self.batch_size % (self.shards * self.chunks):
      raise ConfigError(f"packing: batch size {batch_size} is not a multiple of the "
                        f"{shards} data-parallel shards x {chunks} GradCache chunks")
    self.per_shard = self.batch_size // self.shards
    self.per_unit = self.per_shard // self.chunks
    self.local_shards = [int(p) for p in local_shards]
    most = max(sum(f.sentences for f in fs) for fs in self.groups.values())
    self.granule = int(granule or max(MIN_GRANULE, -(-self.per_unit * most // 32)))
    self.agree = agree

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

  def _units(self):
    """(local shard j, chunk c, its local examples) of every unit of this process."""
    for j in range(len(self.local_shards)):
      for c in range(self.chunks):
        yield j, c, j * self.per_shard + np.arange(c, self.per_shard, self.chunks)

  def plan(self, batch: Mapping[str, np.ndarray]) -> dict:
    """{(group, local shard j, chunk c): _Plan} of this process's examples."""
    plans = {}
    for g, members in self.groups.items():
      length, reserve = members[0].length, members[0].reserve
      lengths = [(self._sentences(f, np.asarray(batch[f.name])) > 0).sum(-1) for f in members]
      for j, c, ex in self._units():
        n = np.concatenate([x[ex].reshape(-1) for x in lengths])     # members in order
        slots = np.clip(np.minimum(n + reserve, length), 1, None)
        row, offset, rows = best_fit_decreasing(slots, length)
        plans[g, j, c] = _Plan(row, offset, n, slots, rows)
    return plans

  def __call__(self, batch: Mapping[str, np.ndarray]) -> dict:
    """This process's packed batch: the packed groups (rows of its shards, see the module
    docstring) and every other feature as it was."""
    plans = self.plan(batch)
    needed = [max(p.rows for (g2, _, _), p in plans.items() if g2 == g) for g in self.groups]
    if self.agree is not None:
      needed = self.agree(needed)
    out = {k: v for k, v in batch.items() if k not in {f.name for f in self.features}}
    for (g, members), n in zip(self.groups.items(), needed):
      out.update(self._materialize(g, members, batch, plans, self.rows_for(n)))
    return out

  def _materialize(self, group: str, members, batch, plans: dict, rows: int) -> dict:
    sents = [self._sentences(f, np.asarray(batch[f.name])) for f in members]
    length = members[0].length
    n, local = self.chunks, len(self.local_shards)
    block = rows * n                                # rows of one shard
    tok = np.zeros((local * block, length), sents[0].dtype)
    seg = np.zeros((local * block, length), np.int32)
    pos = np.zeros((local * block, length), np.int32)
    starts = [np.empty(x.shape[:2], np.int32) for x in sents]
    for j, c, ex in self._units():
      p = self.local_shards[j]
      plan = plans[group, j, c]
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
      flat = np.concatenate([x[ex].reshape(-1, length) for x in sents])
      tok[r_s, col] = flat[which, within]            # 0 past a sentence's tokens
      seg[r_s, col] = seg_id[which]
      pos[r_s, col] = within
      flat_start = (p * rows + plan.row) * length + plan.offset   # within the chunk's rows
      at = 0
      for x, st in zip(sents, starts):
        k = x.shape[1]
        st[ex] = flat_start[at:at + len(ex) * k].reshape(len(ex), k)
        at += len(ex) * k
    out = {group: tok, group + "_segment_ids": seg, group + "_positions": pos}
    for f, x, st in zip(members, sents, starts):
      b, k, _ = x.shape
      keys = row_keys(x.reshape(b * k, length)).reshape(b, k)
      out[f.name + "_starts"] = st[:, 0] if k == 1 else st
      out[f.name + "_key"] = keys[:, 0] if k == 1 else keys
    return out


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
  """The largest of the processes' row counts (per packed feature) for each step, through jax's
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

  def __call__(self, needed: Sequence[int]) -> list[int]:
    step = self.calls
    self.calls += 1
    key = f"vmx/pack/{self.tag}/{step}/"
    self.client.key_value_set(key + str(self.process), ",".join(str(int(n)) for n in needed))
    most = [int(n) for n in needed]
    for q in range(self.count):
      if q != self.process:
        theirs = self.client.blocking_key_value_get(key + str(q), self.timeout_ms)
        most = [max(a, int(b)) for a, b in zip(most, theirs.split(","))]
    if step >= 2:   # every process has read step - 2's values (it set step - 1 after)
      try:
        self.client.key_value_delete(f"vmx/pack/{self.tag}/{step - 2}/{self.process}")
      except Exception:  # noqa: BLE001  (an old key left behind costs a few bytes)
        pass
    return most
