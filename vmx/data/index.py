"""Index-based training input: the stream's position is a step number, not a history.

The example in row r of step s of a task key (one DatasetConfig) is a pure function of
(seed, s, r) and the sizes and rates of its tasks:

  g = s * batch_size + r                        its position in the endless stream
  (task t, k) = grain's mix(rates)[g]           which task fills it, and that task's k-th draw
  i = shuffle(seed_t + k // n_t)(k mod n_t)     epoch k // n_t of task t, shuffled anew per epoch
  example = the task's cached example i         (vmx/data/arrays.py)

(`grain.MapDataset`: `range(n_t).shuffle(seed_t).repeat()` per task, reshuffled each
epoch; `MapDataset.mix` interleaves the tasks in exact proportion to their rates, each
index in O(number of tasks) arithmetic.) N-way tasks then draw the example's views from
a generator seeded by (seed, g). So:

- a resume at step s starts there at once (`IndexIterator.restore`: the state is the step
  and a description of the stream, a few hundred bytes in the checkpoint);
- each process reads only the rows its devices hold (`rows`), and the global batch is the
  same whatever the number of processes;
- the cost of an example does not depend on the number of tasks (one gather per task
  present in the batch, from memory-mapped columns).

MultiTaskConfig (InfoXLM: MMLM, TLM and XLCO each step): one stream per task key, task
key i seeded with seed + i, its features named `key/feature`.
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Optional

import grain
import numpy as np
import seqio
from tqdm.auto import tqdm

from vmx.data import arrays, cache as seqio_cache
from vmx.errors import ConfigError


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


class TaskStream:
  """The endless example stream of one DatasetConfig, addressable by position."""

  def __init__(self, cfg, converter, seed: int, progress: bool = True):
    self.cfg, self.seed = cfg, int(cfg.seed if cfg.seed is not None else seed)
    self.tasks, self.rates, self.tables = open_tables(cfg, converter, progress)
    self.draw = [getattr(t.source, "draw_views", None) for t in self.tasks]
    for t in self.tasks:
      n = getattr(t.source, "num_views", None)
      if n is not None and getattr(converter, "num_views", n) != n:
        raise ConfigError(f"task {t.name} draws {n} views but the model reads "
                          f"{converter.num_views} (NUM_VIEWS)")
    parts = []
    for i, (t, table) in enumerate(zip(self.tasks, self.tables)):
      part = grain.MapDataset.range(len(table))
      if cfg.shuffle:
        part = part.shuffle(seed=_task_seed(self.seed, t.name))
      parts.append(part.repeat().map(lambda k, i=i: (i, k)))
    self.index = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, self.rates)

  def description(self) -> dict:
    """What the stream is made of (stored with the checkpoint; a resume compares it)."""
    c = self.cfg
    return {"mixture_or_task_name": c.mixture_or_task_name, "split": c.split,
            "batch_size": c.batch_size, "shuffle": c.shuffle, "seed": self.seed,
            "lengths": {k: int(v) for k, v in sorted(c.task_feature_lengths.items())},
            "tasks": [[t.name, len(tab), round(r / sum(self.rates), 9)]
                      for t, tab, r in zip(self.tasks, self.tables, self.rates)]}

  def rows(self, step: int, rows_R: np.ndarray) -> dict:
    """The examples of rows `rows_R` of step `step`: {feature: [R, ...]}."""
    g_R = step * self.cfg.batch_size + np.asarray(rows_R, np.int64)
    picks = [self.index[int(g)] for g in g_R]
    which = np.array([t for t, _ in picks], np.int64)
    within = np.array([k for _, k in picks], np.int64)
    out = None
    for t in np.unique(which):
      sel = np.flatnonzero(which == t)
      part = self.tables[t].take(within[sel])
      if self.draw[t] is not None:
        part = self.draw[t](part, [(self.seed, int(g)) for g in g_R[sel]])
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
