"""The training stream: which cached example fills row r of step s, as a pure function.

The index reader's position is a step number, not a history. For one DatasetConfig
(a task or a mixture of T tasks with n_t rows each and integer proportions p_t, grain's
`MapDataset.mix` weights, period P = Σ p_t), batch B, `slots` S (S divides B) and seed:

  u = r // (B/S), k = s·(B/S) + r mod (B/S)    row r is position k of slot u's stream
  (t, D) = mix(k + φ_u)                        grain's interleave, each slot started at its
                                               own phase φ_u = u·P // S of the period
  k_t = (D − D_t(φ_u))·S + u                   the slot's own draw of task t, interleaved
                                               with the other slots' into one index
  e, j = divmod(k_t, n_t)                      epoch e of task t, position j in it
  x = offset(j mod S) + j // S                 lane j mod S reads a contiguous range of...
  row = order_t,e(x)                           ...the epoch's order of task t's rows

and the example is row `row` of task t's token cache (vmx/data/token_cache). The epoch's
order is a random order of the task's windows of `window_rows` consecutive rows (1,024 by
default: four digest blocks of the cache, one ranged read of a remote one), the rows of
each window permuted (a task that fits in one window is one uniform permutation, numpy's,
as before format 2); both are keyed bijections (`permute`, a Feistel network), so no
table grows with the rows and a batch's rows are computed in a few numpy calls.

What this gives:
- resume at any step at once (the data state is the step and a description of the
  stream, a few hundred bytes per task), and the same global batch whatever the number of
  processes or devices: a process computes only its rows;
- every row of a task once per epoch (k_t over an epoch is a bijection onto its rows);
- locality: the rows of a process (contiguous slots) come from its own lanes, so from its
  own blocks: a host reading a remote cache fetches the blocks it uses, each about once;
- every batch draws from many blocks (the S lanes' windows of every task in it).

The order of states written before format 2 (no `order` in their description) is
`Order.legacy()`: one slot, uniform permutations up to 2^17 rows, grain's index shuffle per
row beyond; such a run resumes in its own stream. N-way tasks (MPCL) draw their views when
read, from a generator seeded by (seed, s·B + r). MultiTaskConfig (InfoXLM: MMLM, TLM and
XLCO each step): one stream per task key, key i seeded with seed + i, features named
`key/feature`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from vmx.errors import ConfigError

# Mixtures whose interleave period (the sum of grain's integer weights) is up to this
# many positions tabulate one period (two int64 arrays).
PERIOD_TABLE_MAX = 1 << 22
# Streams whose tables total up to this many bytes, all local, hold them in one array
# (one gather a batch, e.g. the 149 small tasks of the one-hour recipes); larger ones
# gather per task from the memory-mapped shards.
MERGE_MAX_BYTES = 1 << 28
LEGACY_WINDOW = 1 << 17     # before format 2: tasks up to this size permuted whole
MAX_SLOTS = 64
LOOKAHEAD = 4               # steps whose remote blocks are fetched ahead


@dataclasses.dataclass(frozen=True)
class Order:
  """How a stream's positions become rows: `slots` S (the rows of a batch in S groups, each
  a stream of its own) and `window_rows` (a task's rows in windows of that many
  consecutive rows, in a random order each epoch, the rows of a window permuted)."""
  slots: int = 1
  window_rows: int = 1024
  legacy: bool = False

  @classmethod
  def legacy_v1(cls) -> "Order":
    return cls(1, LEGACY_WINDOW, True)

  @classmethod
  def default(cls, batch_size: int, slots: Optional[int], window: int) -> "Order":
    s = math.gcd(int(batch_size), MAX_SLOTS) if slots is None else int(slots)
    if s <= 0 or batch_size % s:
      raise ConfigError(f"DatasetConfig.slots={slots!r}: a divisor of the batch size "
                        f"{batch_size} (None: gcd(batch size, {MAX_SLOTS}))")
    if window <= 0 or window % 256:
      raise ConfigError(f"DatasetConfig.shuffle_window={window!r}: a positive multiple of "
                        f"256 rows")
    return cls(s, int(window))

  def describe(self) -> Optional[dict]:
    return None if self.legacy else {"slots": self.slots, "window_rows": self.window_rows}


# -- keyed bijections (vectorized) -------------------------------------------------------

_U = np.uint64
_M1, _M2, _GOLD = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB), _U(0x9E3779B97F4A7C15)
_ROUNDS = [_U((0x9E3779B97F4A7C15 * (r + 1)) % 2**64) for r in range(4)]


def _mix64(z: np.ndarray) -> np.ndarray:
  """splitmix64's finalizer on uint64 arrays (wrapping arithmetic)."""
  z = (z ^ (z >> _U(30))) * _M1
  z = (z ^ (z >> _U(27))) * _M2
  return z ^ (z >> _U(31))


def key_of(*parts) -> np.ndarray:
  """A uint64 key per element from integer parts (scalars or arrays, broadcast)."""
  h = np.zeros(np.broadcast(*parts).shape, np.uint64)
  with np.errstate(over="ignore"):   # wrapping arithmetic is the point
    for p in parts:
      h = _mix64(h ^ (np.asarray(p).astype(np.uint64) + _GOLD))
  return h


def permute(x: np.ndarray, m, key: np.ndarray) -> np.ndarray:
  """π_key,m(x) for x in [0, m): a bijection of [0, m) for each (key, m), vectorized over
  elements (each with its own key and m, or one for all). A 4-round Feistel network on
  the smallest even number of bits that covers m, cycle-walked back into [0, m) (the
  construction of grain's index_shuffle, in numpy)."""
  x = np.asarray(x, np.int64)
  key = np.broadcast_to(np.asarray(key, np.uint64), x.shape)
  m = np.broadcast_to(np.asarray(m, np.int64), x.shape)
  bits = np.frexp(np.maximum(m - 1, 1).astype(np.float64))[1].astype(np.int64)  # bit length
  bits = np.maximum(bits, 2)
  bits += bits & 1
  half = (bits // 2).astype(np.uint64)
  mask = (np.uint64(1) << half) - np.uint64(1)
  out = x.astype(np.uint64)
  mu = m.astype(np.uint64)
  todo = np.arange(len(out))
  while len(todo):
    y, k, h, msk = out[todo], key[todo], half[todo], mask[todo]
    left, right = y >> h, y & msk
    for c in _ROUNDS:
      left, right = right, left ^ (_mix64(right ^ k ^ c) & msk)
    out[todo] = (left << h) | right
    todo = todo[out[todo] >= mu[todo]]
  return out.astype(np.int64)


# -- the mixture ---------------------------------------------------------------------------

def proportions(rates: Sequence[float]) -> tuple:
  """grain's integer weights of MapDataset.mix: every rate scaled so that the smallest is
  100, truncated (grain's rule, written here rather than imported from grain's private
  module; tests/test_stream.py pins the interleave to grain's own pipeline, so a change in
  grain's rule shows there)."""
  if len(rates) == 1:
    return (1,)
  scale = 100 / min(rates)
  return tuple(int(r * scale) for r in rates)


def mix_select(g_R: np.ndarray, props) -> tuple[np.ndarray, np.ndarray]:
  """(task [R], draw of that task [R]) of stream positions `g_R`: grain's
  `MapDataset.mix` interleave (its `_dataset_and_key_of_next_element`), vectorized over
  positions. `tests/test_stream.py` pins it to grain's own `MapDataset.mix`."""
  total = int(sum(props))
  big = int(np.max(g_R, initial=0)) + 1 > (2**62) // max(total, 1)
  k = np.asarray(g_R, object if big else np.int64)   # Python ints where int64 would overflow
  k1 = k + 1
  task = np.full(len(k), -1, np.int64)
  draw = np.zeros(len(k), np.int64)
  remaining = total
  for i, p in enumerate(props):
    next_k, next_k1 = (k * (remaining - p)) // remaining, (k1 * (remaining - p)) // remaining
    count = k1 - next_k1
    hit = (task < 0) & ((k - next_k) != count)
    task[hit], draw[hit] = i, (count[hit] - 1)
    remaining -= p
    k, k1 = next_k, next_k1
    if not (task < 0).any():
      break
  return task, draw


def counts_before(x: int, props) -> np.ndarray:
  """[T] the positions of each task among positions [0, x) of grain's interleave."""
  out = np.zeros(len(props), np.int64)
  m, remaining = int(x), int(sum(props))
  for i, p in enumerate(props):
    rest = m * (remaining - p) // remaining
    out[i] = m - rest
    m, remaining = rest, remaining - p
  return out


def task_seed(seed: int, name: str) -> int:
  return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


class Stream:
  """The endless example stream of one DatasetConfig, addressable by (step, row).

  `tables`: each task's rows (`len`, `take(indices)`, `take_records`, `prefetch`; see
  vmx/data/token_cache/table.py); `draw`: per task None, or a function drawing an
  example's views from its stored rows and seeds (N-way tasks); `about`: what the
  description records besides the tasks (mixture name, split, lengths)."""

  def __init__(self, names: Sequence[str], rates: Sequence[float], tables, batch_size: int,
               seed: int, shuffle: bool = True, order: Order = Order(), draw=None,
               about: Optional[Mapping] = None):
    self.names, self.rates, self.tables = list(names), list(rates), list(tables)
    self.batch_size, self.seed, self.shuffle, self.order = int(batch_size), int(seed), \
        bool(shuffle), order
    self.about = dict(about or {})
    self.draw = list(draw) if draw is not None else [None] * len(self.tables)
    if self.batch_size % order.slots:
      raise ConfigError(f"the stream's {order.slots} slots do not divide the batch size "
                        f"{self.batch_size}")
    self.task_seeds = [task_seed(self.seed, n) for n in self.names]
    self._seeds = np.array(self.task_seeds, np.int64)
    self.proportions = proportions(self.rates)
    self.sizes = np.array([len(t) for t in self.tables], np.int64)
    period = int(sum(self.proportions))
    self._period = None
    if len(self.tables) > 1 and period <= PERIOD_TABLE_MAX:
      # grain's interleave repeats with period P, each task's draws growing by its
      # proportion per period: one period, tabulated, maps any position in O(1).
      self._period = (period, *mix_select(np.arange(period), self.proportions),
                      np.array(self.proportions, np.int64))
    s = order.slots
    self.per_slot = self.batch_size // s
    self.phases = np.array([(u * period) // s for u in range(s)], np.int64)
    # [S, T] draws of each task before each slot's phase (subtracted: slot-own counts)
    self._before = np.stack([counts_before(int(p), self.proportions) for p in self.phases])
    self._orders = {}   # (task, epoch) -> a whole-task permutation (tasks of one window)
    self.merged = None
    self.remote = any(getattr(t, "remote", False) for t in self.tables)
    local = not self.remote
    dtypes = {getattr(t, "dtype", None) for t in self.tables}
    nbytes = sum(len(t) * getattr(t, "row_bytes", 0) for t in self.tables)
    if (local and len(dtypes) == 1 and None not in dtypes and all(d is None for d in self.draw)
        and nbytes <= MERGE_MAX_BYTES):
      self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
      self.merged = np.empty(int(self.sizes.sum()), dtypes.pop())
      for t, o, n in zip(self.tables, self.offsets.tolist(), self.sizes.tolist()):
        self.merged[o:o + n] = t.all_records()

  # -- positions -> (task, global draw index) --------------------------------------------
  def mix(self, m_R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(task [R], its draw index [R]) of interleave positions `m_R` (see mix_select)."""
    if len(self.tables) == 1:
      return np.zeros(len(m_R), np.int64), np.asarray(m_R, np.int64)
    if self._period is None:
      return mix_select(m_R, self.proportions)
    period, task_P, draw_P, props = self._period
    cycle, r = np.divmod(np.asarray(m_R, np.int64), period)
    task = task_P[r]
    return task, cycle * props[task] + draw_P[r]

  def draws(self, step: int, rows_R) -> tuple[np.ndarray, np.ndarray]:
    """(task [R], task draw index k_t [R]) of rows `rows_R` of step `step`."""
    rows_R = np.asarray(rows_R, np.int64)
    u_R, i_R = np.divmod(rows_R, self.per_slot)
    task_R, d_R = self.mix(step * self.per_slot + i_R + self.phases[u_R])
    return task_R, (d_R - self._before[u_R, task_R]) * self.order.slots + u_R

  # -- draw index -> row -------------------------------------------------------------------
  def example_indices(self, task_R: np.ndarray, k_R: np.ndarray) -> np.ndarray:
    """The row (of its task's table) of each task draw index, for all tasks at once."""
    o = self.order
    n_R = self.sizes[task_R]
    epoch, j = np.divmod(k_R, n_R)
    if not self.shuffle:
      return j
    s = o.slots
    lane, q = np.mod(j, s), j // s
    x = lane * (n_R // s) + np.minimum(lane, n_R % s) + q    # lane's contiguous range
    out = np.empty(len(k_R), np.int64)
    legacy = (n_R > LEGACY_WINDOW) if o.legacy else np.zeros(len(k_R), bool)
    whole = (n_R <= o.window_rows) & ~legacy                  # one window: the whole task
    big = ~whole & ~legacy
    if whole.any():
      for t, e in set(zip(task_R[whole].tolist(), epoch[whole].tolist())):
        sel = whole & (task_R == t) & (epoch == e)
        out[sel] = self._epoch_order(t, e)[x[sel]]
    if big.any():
      out[big] = self._windowed(task_R[big], n_R[big], epoch[big], x[big])
    if legacy.any():    # before format 2, tasks over 2^17 rows: grain's index shuffle per row
      import grain  # lazy: only old data states of such tasks
      out[legacy] = [grain.experimental.index_shuffle(
          i, max_index=int(n) - 1, seed=(self.task_seeds[t] + e) % 2**32, rounds=4)
          for i, n, t, e in zip(j[legacy].tolist(), n_R[legacy].tolist(),
                                task_R[legacy].tolist(), epoch[legacy].tolist())]
    return out

  def _windowed(self, task, n, epoch, x) -> np.ndarray:
    """Rows of positions x of the epochs' orders of tasks larger than a window (arrays
    of one element per row): the task's whole windows of consecutive rows in a keyed
    order, the short last one last, the rows of each permuted."""
    wr = self.order.window_rows
    seed = self._seeds[task]
    whole = n // wr
    w, r = np.divmod(x, wr)
    tail = w >= whole
    y = permute(r, np.where(tail, n - whole * wr, wr), key_of(seed, epoch, w, 1))
    out = whole * wr + y                      # the short last window, if any
    body = ~tail
    out[body] = permute(w[body], whole[body], key_of(seed[body], epoch[body], -1, 2)) * wr \
        + y[body]
    return out

  def _epoch_order(self, t: int, epoch: int) -> np.ndarray:
    key = (t, epoch)
    if key not in self._orders:
      if len(self._orders) >= 2 * len(self.tables):   # about two epochs per task
        self._orders.pop(next(iter(self._orders)))
      self._orders[key] = np.random.default_rng(
          [self.task_seeds[t], epoch]).permutation(int(self.sizes[t])).astype(np.int32)
    return self._orders[key]

  # -- reading ------------------------------------------------------------------------------
  def indices(self, step: int, rows_R) -> tuple[np.ndarray, np.ndarray]:
    """(task [R], row of its table [R]) of rows `rows_R` of step `step`."""
    task_R, k_R = self.draws(step, rows_R)
    return task_R, self.example_indices(task_R, k_R)

  def prefetch(self, step: int, rows_R):
    """Starts the remote reads of step `step`'s rows (nothing for local tables)."""
    if not self.remote:
      return
    task_R, index_R = self.indices(step, rows_R)
    for t in np.unique(task_R).tolist():
      prefetch = getattr(self.tables[t], "prefetch", None)
      if prefetch is not None:
        prefetch(index_R[task_R == t])

  def rows(self, step: int, rows_R) -> dict:
    """The examples of rows `rows_R` of step `step`: {feature: [R, ...]}."""
    rows_R = np.asarray(rows_R, np.int64)
    task_R, index_R = self.indices(step, rows_R)
    if self.merged is not None:
      rec = self.merged[self.offsets[task_R] + index_R]
      return {name: np.ascontiguousarray(rec[name]) for name in rec.dtype.names}
    g_R = step * self.batch_size + rows_R
    out = None
    for t in np.unique(task_R).tolist():
      sel = np.flatnonzero(task_R == t)
      part = self.tables[t].take(index_R[sel])
      if self.draw[t] is not None:
        part = self.draw[t](part, [(self.seed, int(g_R[j])) for j in sel])
      if out is None:
        out = {k: np.empty((len(rows_R), *v.shape[1:]), v.dtype) for k, v in part.items()}
      for k, v in part.items():
        out[k][sel] = v
    return out

  def description(self) -> dict:
    """What the stream is made of (stored with the checkpoint; a resume compares it)."""
    out = {**self.about, "batch_size": self.batch_size, "shuffle": self.shuffle,
           "seed": self.seed,
           "tasks": [[n, len(tab), round(r / sum(self.rates), 9)]
                     for n, tab, r in zip(self.names, self.tables, self.rates)]}
    order = self.order.describe()
    if order is not None:
      out["order"] = order
    return out


def stream_difference(old: Mapping, new: Mapping) -> list[str]:
  """What changed between two stream descriptions ({task key: description}), in words."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    where = f"task key {key!r}: " if key != "None" else ""
    if a is None or b is None:
      out.append(f"{where}{'added' if a is None else 'removed'}")
      continue
    for field in ("mixture_or_task_name", "split", "batch_size", "shuffle", "seed", "lengths",
                  "order", "block_length"):
      if a.get(field) != b.get(field):
        out.append(f"{where}{field} {a.get(field)!r} -> {b.get(field)!r}")
    ta, tb = {t[0]: t[1:] for t in a.get("tasks", [])}, {t[0]: t[1:] for t in b.get("tasks", [])}
    if set(ta) != set(tb):
      gone, new_ = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
      out.append(f"{where}tasks" + (f" removed {gone[:3]}{'…' if len(gone) > 3 else ''}"
                                    if gone else "")
                 + (f" added {new_[:3]}{'…' if len(new_) > 3 else ''}" if new_ else ""))
    else:
      sized = [n for n in ta if ta[n][0] != tb[n][0]]
      rated = [n for n in ta if ta[n][1] != tb[n][1]]
      if sized:
        out.append(f"{where}examples of {sized[0]} {ta[sized[0]][0]} -> {tb[sized[0]][0]}"
                   + (f" (and {len(sized) - 1} more tasks)" if len(sized) > 1 else ""))
      elif rated:
        out.append(f"{where}mixing rates of {len(rated)} task(s)")
  return out


class IndexIterator:
  """Numpy batches (this process's rows) of several streams ({task key: Stream}); its
  `position` is the number of steps read, its state `{"reader": "index", "step": ...,
  "stream": ...}`."""

  reader = "index"

  def __init__(self, streams: Mapping, rows: Optional[Mapping] = None):
    self.streams = dict(streams)
    self.rows = {key: np.asarray(rows[key] if rows is not None else
                                 np.arange(s.batch_size), np.int64)
                 for key, s in self.streams.items()}
    self.position = 0
    self.examples_read = 0
    self._prefetched = 0

  def description(self) -> dict:
    return {str(key): s.description() for key, s in self.streams.items()}

  def state_at(self, position: int) -> dict:
    return {"reader": self.reader, "step": int(position), "stream": self.description()}

  def state(self) -> dict:
    return self.state_at(self.position)

  def restore(self, state: Mapping, allow_change: bool = False):
    """Continue at the state's step. A stream that differs from the checkpoint's is a
    ConfigError saying what changed (`allow_change`: the new stream, from that step)."""
    if state.get("reader") != self.reader:
      raise ConfigError(f"a data state of reader {state.get('reader')!r} cannot restore "
                        f"the index-based input")
    changed = stream_difference(state.get("stream", {}), self.description())
    if changed and not allow_change:
      raise ConfigError(
          f"the training data changed since the checkpoint: {'; '.join(changed)}. Resume "
          f"with the data it was written with, or pass --gin.ALLOW_DATA_CHANGE=True to "
          f"continue with the new data from step {state['step']} of this phase")
    self.position = int(state["step"])
    self._prefetched = self.position

  def __iter__(self):
    return self

  def _prefetch_ahead(self):
    while self._prefetched < self.position + LOOKAHEAD:
      for key, s in self.streams.items():
        s.prefetch(self._prefetched, self.rows[key])
      self._prefetched += 1

  def __next__(self) -> dict:
    self._prefetch_ahead()
    batch = {}
    for key, s in self.streams.items():
      part = s.rows(self.position, self.rows[key])
      self.examples_read += len(self.rows[key])
      batch.update(part if key is None else {f"{key}/{k}": v for k, v in part.items()})
    self.position += 1
    return batch
