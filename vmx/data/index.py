"""Index-based training input: the stream's position is a step number, not a history.

The example in row r of step s of a task key (one DatasetConfig) is a pure function of
(seed, s, r) and the sizes and rates of its tasks:

  g = s * batch_size + r                  its position in the endless stream
  (t, k) = mix(proportions)[g]            which task fills it, and that task's k-th draw:
                                          grain's `MapDataset.mix` interleave (exact
                                          proportions by integer arithmetic, `mix_select`)
  i = order(seed_t, k // n_t)[k mod n_t]  epoch k // n_t of task t, reshuffled each epoch
  example = task t's cached example i     (vmx/data/arrays.py)

N-way tasks then draw the example's views from a generator seeded by (seed, g). So:

- a resume at step s starts there at once (`IndexIterator.restore`: the state is the step
  and a description of the stream, a few hundred bytes per task in the checkpoint);
- each process reads only the rows its devices hold (`rows`), and the global batch is the
  same whatever the number of processes;
- a batch costs about the same whatever the number of tasks: the interleave repeats with
  period sum(proportions), so one tabulated period maps any position; each row is one
  index into its task's epoch order; one gather per feature reads the rows (from one
  in-memory array for small corpora, else per task from the memory-mapped columns).
  Figures: docs/performance.md, "The input path".

MultiTaskConfig (InfoXLM: MMLM, TLM and XLCO each step): one stream per task key, task
key i seeded with seed + i, its features named `key/feature`.
"""
from __future__ import annotations

import hashlib
import json
from typing import Mapping, Optional

import grain
import numpy as np
# grain's rates -> integer weights of MapDataset.mix (tests/test_index_input.py pins the
# interleave to grain's own pipeline, so a change in grain shows there)
from grain._src.python.dataset.transformations.mix import _float_to_int_proportions
import seqio
from tqdm.auto import tqdm

from vmx.data import arrays, cache as seqio_cache
from vmx.errors import ConfigError


# Tasks up to this size shuffle each epoch with numpy (a permutation seeded by (task seed,
# epoch), computed when the epoch is first read, ~10 ns per example; grain's index
# shuffle costs 2-170 µs a call, the most on small ranges); larger ones use grain's index
# shuffle per example, which needs no O(n) memory.
EPOCH_TABLE_MAX = 1 << 17
# Mixtures whose interleave period (the sum of grain's integer weights) is up to this
# many positions tabulate one period (two int64 arrays).
PERIOD_TABLE_MAX = 1 << 22
# Streams whose tasks' columns total up to this many bytes hold them in one array per
# feature (a copy in memory, one gather a batch); larger ones gather per task from the
# memory-mapped columns.
MERGE_MAX_BYTES = 1 << 30


def _task_seed(seed: int, name: str) -> int:
  return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


def open_tables(cfg, converter, progress: bool = True, build: Optional[bool] = None):
  """(tasks, rates, tables) of a DatasetConfig: its tasks with a positive rate, and
  their cached examples (vmx/data/arrays.py; `build`: see `arrays.open_table`)."""
  provider = seqio.get_mixture_or_task(cfg.mixture_or_task_name)
  if cfg.use_cached:   # built from seqio's offline cache: checked as the seqio reader does
    seqio_cache.check_cached(cfg.mixture_or_task_name, cfg.split)
  if isinstance(provider, seqio.Mixture):
    tasks = [(t, float(provider.get_rate(t))) for t in provider.tasks]
    tasks = [(t, r) for t, r in tasks if r > 0]
  else:
    tasks = [(provider, 1.0)]
  tables = [arrays.open_table(t, cfg.split, cfg.task_feature_lengths, converter,
                              cfg.array_cache_dir, cfg.use_cached, progress, build)
            for t, _ in tqdm(tasks, desc="[vmx] opening the tokenized cache", unit=" task",
                             disable=not progress or len(tasks) < 10, leave=False)]
  return [t for t, _ in tasks], [r for _, r in tasks], tables


def mix_select(g_R: np.ndarray, proportions) -> tuple[np.ndarray, np.ndarray]:
  """(task [R], draw of that task [R]) of stream positions `g_R`: grain's
  `MapDataset.mix` interleave (its `_dataset_and_key_of_next_element`), vectorized over
  positions. `proportions`: the integer weights grain derives from the rates.
  `tests/test_index_input.py` pins it to grain's own `MapDataset.mix`."""
  total = int(sum(proportions))
  big = int(np.max(g_R, initial=0)) + 1 > (2**62) // max(total, 1)
  k = np.asarray(g_R, object if big else np.int64)   # Python ints where int64 would overflow
  k1 = k + 1
  task = np.full(len(k), -1, np.int64)
  draw = np.zeros(len(k), np.int64)
  remaining = total
  for i, p in enumerate(proportions):
    next_k, next_k1 = (k * (remaining - p)) // remaining, (k1 * (remaining - p)) // remaining
    count = k1 - next_k1
    hit = (task < 0) & ((k - next_k) != count)
    task[hit], draw[hit] = i, (count[hit] - 1)
    remaining -= p
    k, k1 = next_k, next_k1
    if not (task < 0).any():
      break
  return task, draw


class TaskStream:
  """The endless example stream of one DatasetConfig, addressable by position.

  Task t's draw k is example `shuffle(seed_t, k // n_t)(k mod n_t)` of its cache: epoch
  k // n_t of the task, reshuffled each epoch (numpy's permutation up to EPOCH_TABLE_MAX
  examples, else grain's `MapDataset.range(n_t).shuffle(seed_t).repeat()` order, i.e.
  `grain.experimental.index_shuffle` with seed seed_t + epoch, 4 rounds)."""

  def __init__(self, cfg, converter, seed: int, progress: bool = True):
    self.cfg, self.seed = cfg, int(cfg.seed if cfg.seed is not None else seed)
    self.tasks, self.rates, self.tables = open_tables(cfg, converter, progress)
    self.draw = [getattr(t.source, "draw_views", None) for t in self.tasks]
    for t in self.tasks:
      n = getattr(t.source, "num_views", None)
      if n is not None and getattr(converter, "num_views", n) != n:
        raise ConfigError(f"task {t.name} draws {n} views but the model reads "
                          f"{converter.num_views} (NUM_VIEWS)")
      hard = getattr(t.source, "hard_negatives", False)
      if n is not None and getattr(converter, "hard_negatives", False) != hard:
        raise ConfigError(f"task {t.name} {'has' if hard else 'has no'} hard negatives but "
                          f"the model reads {'none' if hard else 'one per example'} "
                          f"(MPCLModel.hard_negatives)")
    self.task_seeds = [_task_seed(self.seed, t.name) for t in self.tasks]
    # grain's integer weights (the smallest rate scaled to 100), as MapDataset.mix uses
    self.proportions = tuple(_float_to_int_proportions(self.rates)) if len(self.tasks) > 1 \
        else (1,)
    self._orders = {}   # (task, epoch) -> that epoch's order, for tasks up to EPOCH_TABLE_MAX
    self.sizes = np.array([len(t) for t in self.tables], np.int64)
    # grain's interleave repeats with period sum(proportions), each task's draws growing
    # by its proportion per period: one period, tabulated, maps any position in O(1).
    period = int(sum(self.proportions))
    self._period = None
    if len(self.tasks) > 1 and period <= PERIOD_TABLE_MAX:
      self._period = (period, *mix_select(np.arange(period), self.proportions),
                      np.array(self.proportions, np.int64))
    # Small corpora: every task's columns in one array per feature (one gather a batch).
    self.merged, self.offsets = None, np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
    specs = {json.dumps(t.info["features"], sort_keys=True) for t in self.tables}
    nbytes = sum(sum(c.nbytes for c in t.columns.values()) for t in self.tables)
    if len(specs) == 1 and all(d is None for d in self.draw) and nbytes <= MERGE_MAX_BYTES:
      self.merged = {k: np.concatenate([t.columns[k] for t in self.tables])
                     for k in self.tables[0].columns}

  def mix(self, g_R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(task [R], draw of that task [R]) of stream positions `g_R` (see mix_select)."""
    if len(self.tasks) == 1:
      return np.zeros(len(g_R), np.int64), np.asarray(g_R, np.int64)
    if self._period is None:
      return mix_select(g_R, self.proportions)
    period, task_P, draw_P, props = self._period
    cycle, r = np.divmod(np.asarray(g_R, np.int64), period)
    task = task_P[r]
    return task, cycle * props[task] + draw_P[r]

  def example_indices(self, task_R: np.ndarray, draw_R: np.ndarray) -> np.ndarray:
    """The cached example (index in its task's table) of each (task, draw)."""
    epoch_R, within_R = np.divmod(draw_R, self.sizes[task_R])
    if not self.cfg.shuffle:
      return within_R
    out = np.empty(len(draw_R), np.int64)
    for j, (t, e, i) in enumerate(zip(task_R.tolist(), epoch_R.tolist(), within_R.tolist())):
      # small tasks: the epoch's order as an array, kept while it is read
      out[j] = (self._epoch_order(t, e)[i] if self.sizes[t] <= EPOCH_TABLE_MAX
                else self._shuffled(t, e, i))
    return out

  def _shuffled(self, t: int, epoch: int, i: int) -> int:
    return int(grain.experimental.index_shuffle(
        i, max_index=len(self.tables[t]) - 1, seed=(self.task_seeds[t] + epoch) % 2**32,
        rounds=4))

  def _epoch_order(self, t: int, epoch: int) -> np.ndarray:
    key = (t, epoch)
    if key not in self._orders:
      if len(self._orders) >= 2 * len(self.tables):   # about two epochs per task
        self._orders.pop(next(iter(self._orders)))
      self._orders[key] = np.random.default_rng(
          [self.task_seeds[t], epoch]).permutation(len(self.tables[t])).astype(np.int32)
    return self._orders[key]

  def description(self) -> dict:
    """What the stream is made of (stored with the checkpoint; a resume compares it)."""
    c = self.cfg
    return {"mixture_or_task_name": c.mixture_or_task_name, "split": c.split,
            "batch_size": c.batch_size, "shuffle": c.shuffle, "seed": self.seed,
            "lengths": {k: int(v) for k, v in sorted(c.task_feature_lengths.items())},
            "tasks": [[t.name, len(tab), round(r / sum(self.rates), 9)]
                      for t, tab, r in zip(self.tasks, self.tables, self.rates)]}

  def rows(self, step: int, rows_R) -> dict:
    """The examples of rows `rows_R` of step `step`: {feature: [R, ...]}."""
    g_R = step * self.cfg.batch_size + np.asarray(rows_R, np.int64)
    task_R, draw_R = self.mix(g_R)
    index_R = self.example_indices(task_R, draw_R)
    if self.merged is not None:
      flat = self.offsets[task_R] + index_R
      return {k: v[flat] for k, v in self.merged.items()}
    out = None
    for t in np.unique(task_R).tolist():
      sel = np.flatnonzero(task_R == t)
      part = self.tables[t].take(index_R[sel])
      if self.draw[t] is not None:
        part = self.draw[t](part, [(self.seed, int(g_R[j])) for j in sel])
      if out is None:
        out = {k: np.empty((len(g_R), *v.shape[1:]), v.dtype) for k, v in part.items()}
      for k, v in part.items():
        out[k][sel] = v
    return out


def stream_difference(old: Mapping, new: Mapping) -> list[str]:
  """What changed between two stream descriptions, in words."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    where = f"task key {key!r}: " if key != "None" else ""
    if a is None or b is None:
      out.append(f"{where}{'added' if a is None else 'removed'}")
      continue
    for field in ("mixture_or_task_name", "split", "batch_size", "shuffle", "seed", "lengths"):
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
  """Numpy batches (this process's rows) of a DatasetConfig or MultiTaskConfig; its
  `position` is the number of steps read, its state `{"reader": "index", "step": ...,
  "stream": ...}`."""

  reader = "index"

  def __init__(self, configs: Mapping, converters: Mapping, seed: int,
               rows: Optional[Mapping] = None, progress: bool = True):
    self.streams = {key: TaskStream(c, converters[key], seed + i, progress)
                    for i, (key, c) in enumerate(configs.items())}
    self.rows = {key: np.asarray(rows[key] if rows is not None else
                                 np.arange(s.cfg.batch_size), np.int64)
                 for key, s in self.streams.items()}
    self.position = 0
    self.examples_read = 0

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

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    batch = {}
    for key, s in self.streams.items():
      part = s.rows(self.position, self.rows[key])
      self.examples_read += len(self.rows[key])
      batch.update(part if key is None else {f"{key}/{k}": v for k, v in part.items()})
    self.position += 1
    return batch
