"""Input pipeline: the dataset configs and the trainer's iterator over them.

Two readers (`DatasetConfig.reader`):
- `index` (default; vmx/data/stream.py over the token cache, vmx/data/token_cache): the
  example of row r at step s is a pure function of (seed, s, r) and the tasks' sizes, so
  a resume starts at its step at once, each process reads only its own rows (on any
  number of processes and devices), and the number of tasks or rows does not slow the
  stream. The checkpoint holds the step and a description of the stream; a resume with
  other data is refused (ALLOW_DATA_CHANGE).
- `seqio`: the tasks' tf.data pipelines (seqio.get_dataset, shuffle buffers) as t5x
  reads them. Every process builds the same GLOBAL batch stream and the trainer places
  each device's rows; a `DataIterator` counts the batches it produced (its `position`)
  and a resume rebuilds the seeded pipeline and skips that many, which takes as long as
  reading them did. Checkpoints written before the index reader existed hold such a
  position and resume this way, with a warning. It lives in vmx/data/seqio_reader.py.

A gin run's tasks are a `Deferred` call (vmx/data/deferred.py) until `DatasetConfig`
resolves them: from the record of its built token caches (vmx/data/token_cache/lookup.py:
no SeqIO, no TensorFlow), else by registering them with SeqIO. Shapes come from the
model's feature layouts (vmx/data/features.py), never from SeqIO.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

from vmx import _deprecated
from vmx.data import features, packing, stream, token_blocks, views
from vmx.data.deferred import Deferred
from vmx.data.token_cache import lookup
from vmx.data.token_cache.sources import CachedSource, view_draw
from vmx.errors import ConfigError
from vmx.gin_utils import check_range, positive_int


READERS = ("index", "seqio")


@dataclasses.dataclass
class DatasetConfig:
  """t5x-style dataset configuration (batch_size is GLOBAL, over all hosts).

  `split`: `train` or `validation` (vmx's tasks hold out 1% by content, see
  vmx/data/sources.py). `use_cached`: read seqio's offline cache of the tasks
  (vmx/data/seqio_cache.py; the cache dir given by launch/train.py's
  --seqio_additional_cache_dirs). `reader`: `index` or `seqio` (see the module
  docstring). `token_cache_dir`: where the index reader's token cache lives (default
  `vmx.data.token_cache.build.default_root()`, built there on first use; a gs:// dir must
  be written first by launch/cache_tasks.py --gin_file=...).
  The index reader's order (vmx/data/stream.py; part of the stream a resume keeps):
  `slots`, the groups of rows of a batch that each follow a stream of their own (None:
  gcd(batch_size, 64); a host reads the blocks of its slots' lanes), and
  `shuffle_window`, the rows mixed together per lane (a multiple of 256: blocks of 256
  rows in a random order per epoch, the rows of a window's blocks mixed).
  `pack`: lay several sentences into each row of the model's length (vmx/data/packing.py:
  the same examples, in the same order, the same loss; gin's PACKING); the model must
  read packed rows (`packed_features()`), else the run is refused.
  `block_length` (a monolingual task, the index reader): each example is a block of
  consecutive sentences of the cache, joined up to that many tokens (XLM-R's and InfoXLM's
  masked-LM text; vmx/data/token_blocks.py); the batch's tokens are [B, block_length].
  `mixture_or_task_name`: a registered name, or a `Deferred` task call (gin's
  `@tasks.parallel_mixture()`), resolved here to its name: from the record of its built
  token caches without SeqIO (`record`), else by registering it.
  """
  mixture_or_task_name: Any
  task_feature_lengths: Mapping[str, int]
  batch_size: int
  split: str = "train"
  shuffle: bool = True
  seed: Optional[int] = None
  use_cached: bool = False
  reader: str = "index"
  token_cache_dir: Optional[str] = None
  slots: Optional[int] = None
  shuffle_window: int = 1024
  pack: bool = False
  block_length: Optional[int] = None
  array_cache_dir: Optional[str] = None   # token_cache_dir's name in earlier releases
  # what the name was resolved from (not arguments: set by __post_init__)
  deferred: Optional[Deferred] = dataclasses.field(default=None, init=False, repr=False,
                                                   compare=False)
  record: Optional[lookup.Record] = dataclasses.field(default=None, init=False, repr=False,
                                                      compare=False)

  def __post_init__(self):
    if self.array_cache_dir is not None:    # the earlier name: one warning, same setting
      _deprecated.flag("DatasetConfig.array_cache_dir", "DatasetConfig.token_cache_dir")
      if self.token_cache_dir not in (None, self.array_cache_dir):
        raise ConfigError("DatasetConfig: token_cache_dir and array_cache_dir (its earlier "
                          "name) are both set, to different directories; set "
                          "token_cache_dir only")
      self.token_cache_dir, self.array_cache_dir = self.array_cache_dir, None
    check_range(positive_int(self.batch_size), "DatasetConfig", "batch_size", self.batch_size,
                "a positive integer (the global batch)")
    lengths = dict(self.task_feature_lengths) if isinstance(self.task_feature_lengths,
                                                            Mapping) else None
    check_range(lengths is not None and all(positive_int(v) for v in lengths.values()),
                "DatasetConfig", "task_feature_lengths", self.task_feature_lengths,
                "a dict of positive lengths, e.g. {'inputs': 32, 'targets': 32}")
    check_range(self.reader in READERS, "DatasetConfig", "reader", self.reader,
                f"one of {READERS}")
    check_range(self.slots is None or (positive_int(self.slots)
                                       and self.batch_size % self.slots == 0),
                "DatasetConfig", "slots", self.slots,
                f"None or a divisor of batch_size {self.batch_size}")
    check_range(positive_int(self.shuffle_window) and self.shuffle_window % 256 == 0,
                "DatasetConfig", "shuffle_window", self.shuffle_window,
                "a positive multiple of 256 rows")
    check_range(isinstance(self.pack, bool), "DatasetConfig", "pack", self.pack,
                "True or False (PACKING)")
    if self.block_length is not None:
      longest = max(lengths.values())
      check_range(positive_int(self.block_length) and self.block_length > longest,
                  "DatasetConfig", "block_length", self.block_length,
                  f"None, or a number of tokens > the sentences' length {longest} "
                  "(task_feature_lengths; a sentence and its </s> fill a block)")
      check_range(self.reader == "index" and not self.pack, "DatasetConfig", "block_length",
                  self.block_length, "None with reader='seqio' or pack=True (blocks are "
                  "the index reader's, and a block is already a full row)")
    if isinstance(self.mixture_or_task_name, Deferred):
      self.deferred = self.mixture_or_task_name
      self.record, why = lookup.find(self.deferred.key(), self.token_cache_dir)
      if self.record is not None:
        self.mixture_or_task_name = self.record.name
      else:
        if why != lookup.NOT_FOUND:
          print(f"[vmx] {self.deferred!r}: the record of its token caches does not match "
                f"({why}): registering its tasks with SeqIO", flush=True)
        self.mixture_or_task_name = self.deferred.name()
    check_range(isinstance(self.mixture_or_task_name, str), "DatasetConfig",
                "mixture_or_task_name", self.mixture_or_task_name,
                "a task or mixture name, or a tasks.* call such as @tasks.parallel_mixture()")

  def register(self) -> str:
    """Registers the tasks with SeqIO where they were found by their record (a deferred
    call, not called yet); returns the name. SeqIO's readers and builders call this."""
    if self.deferred is not None:
      name = self.deferred.name()
      if name != self.mixture_or_task_name:
        raise ConfigError(f"{self.deferred!r} registers {name!r}, but the record of its token "
                          f"caches ({self.record and self.record.path}) says "
                          f"{self.mixture_or_task_name!r}; delete that record")
    return self.mixture_or_task_name


@dataclasses.dataclass
class MultiTaskConfig:
  """Several tasks feeding every training step (InfoXLM: an MMLM, a TLM and an XLCO batch).

  `tasks` maps each task key of the model (the keys of its FEATURE_CONVERTER_CLS dict)
  to that task's DatasetConfig, whose `batch_size` is the task's number of examples per
  step: the proportions of the mix. Each task has its own feature converter and its
  own seeded stream; the step's batch features are named `key/feature`.
  """
  tasks: Mapping[str, DatasetConfig]

  def __post_init__(self):
    ok = isinstance(self.tasks, Mapping) and len(self.tasks) > 0 and all(
        isinstance(k, str) and "/" not in k and isinstance(v, DatasetConfig)
        for k, v in self.tasks.items())
    check_range(ok, "MultiTaskConfig", "tasks", self.tasks,
                "a non-empty dict {task key: DatasetConfig} (keys without '/')")
    self.tasks = dict(self.tasks)

  @property
  def batch_size(self) -> int:
    """Examples per step over all tasks."""
    return sum(c.batch_size for c in self.tasks.values())

  @property
  def task_feature_lengths(self) -> dict:
    return {f"{k}/{f}": n for k, c in self.tasks.items()
            for f, n in c.task_feature_lengths.items()}


def task_configs(cfg) -> dict:
  """{task key: DatasetConfig}; a single DatasetConfig has the key None."""
  return dict(cfg.tasks) if isinstance(cfg, MultiTaskConfig) else {None: cfg}


def _layouts(cfg, layouts) -> dict:
  """{task key: features.Layout} of a model's layouts (`feature_layout()`; SeqIO
  converter classes are accepted too: `FEATURE_CONVERTER_CLS`)."""
  out = features.layouts(layouts)
  return {key: (out[key] if isinstance(out, dict) else out) for key in task_configs(cfg)}


def token_lengths(cfg, layouts) -> list[int]:
  """The task lengths of the token features (int32 task features; not, say, a float
  vector such as distillation's `teacher`): what sentences are cut to."""
  out = []
  for key, c in task_configs(cfg).items():
    specs = _layouts(cfg, layouts)[key].TASK_FEATURES
    out += [n for f, n in c.task_feature_lengths.items()
            if f not in specs or specs[f].dtype == "int32"]
  return out


def token_features(cfg, layouts) -> list[str]:
  """The model's token features (int32 sequences, `key/feature` for several tasks): what
  packs, and what the step's `useful_token_fraction` counts."""
  return [k if key is None else f"{key}/{k}"
          for key, layout in _layouts(cfg, layouts).items() for k in layout.token_features()]


def packed_features(cfg, model, shapes: Mapping[str, tuple]) -> dict:
  """{task key: [packing.Feature]} of the tasks whose DatasetConfig packs (`shapes`: the
  model features' global example shapes). A model that cannot read packed rows is a
  ConfigError naming the binding."""
  spec = model.packed_features()
  out = {}
  for key, c in task_configs(cfg).items():
    if not c.pack:
      continue
    where = ("DatasetConfig.pack" if key is None
             else f"MultiTaskConfig.tasks[{key!r}] DatasetConfig.pack")
    if spec is None:
      raise ConfigError(f"{where}=True (PACKING = True): {type(model).__name__} reads one "
                        f"sentence a row and cannot pack (docs/performance.md, 'Packing'); "
                        f"set --gin.PACKING=False")
    out[key] = packing.features_of(model, shapes, key)
  return out


def model_feature_shapes(cfg, layouts) -> dict:
  """Global batch shapes of the model features ([B] scalars, [B, length] sequences);
  `layouts`: a model's `feature_layout()` (a dict for several tasks)."""
  multi = isinstance(layouts, Mapping)
  if multi != isinstance(cfg, MultiTaskConfig):
    raise ConfigError(
        f"the model reads {'tasks ' + str(sorted(layouts)) if multi else 'one task'}"
        f" each step but train_dataset_cfg is a {type(cfg).__name__}: "
        + ("use MultiTaskConfig(tasks={...})" if multi else "use one DatasetConfig"))
  if multi:
    missing = sorted(set(layouts) - set(cfg.tasks))
    extra = sorted(set(cfg.tasks) - set(layouts))
    if missing or extra:
      raise ConfigError(
          f"MultiTaskConfig.tasks has {sorted(cfg.tasks)} but the model reads "
          f"{sorted(layouts)}" + (f"; missing: {missing}" if missing else "")
          + (f"; not read by the model: {extra}" if extra else ""))
  shapes = {}
  for key, c in task_configs(cfg).items():
    layout = _layouts(cfg, layouts)[key]
    lengths = layout.model_lengths(c.task_feature_lengths)
    if c.block_length:
      lengths[_block_feature(layout, key)] = c.block_length
    for k, n in lengths.items():
      shapes[k if key is None else f"{key}/{k}"] = (
          (c.batch_size,) if layout.MODEL_FEATURES[k].rank == 0 else (c.batch_size, n))
  return shapes


def num_examples(cfg) -> dict:
  """{task key: training examples in its source(s), or None where a source does not say}
  (a mixture: the sum over its tasks); from the record of the token caches where the
  config was found by it, else from the registered tasks (SeqIO)."""
  out = {}
  for key, c in task_configs(cfg).items():
    n = c.record.num_examples(c.split) if c.record is not None else None
    if n is None:
      import seqio  # lazy: SeqIO only where no record counts the examples
      provider = seqio.get_mixture_or_task(c.register())
      tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
      counts = [t.num_input_examples(c.split) for t in tasks]
      n = None if any(m is None for m in counts) else int(sum(counts))
    out[key] = n
  return out


def uniform_config(layouts, batch_size: int, length: int):
  """A placeholder dataset config (task names unset) giving every sequence feature of
  every task `length` and every task `batch_size`: shapes for benchmarks without data."""
  def one(layout):
    lengths = {k: length for k, spec in layout.TASK_FEATURES.items() if spec.rank > 0}
    return DatasetConfig("unset", lengths, batch_size)
  out = features.layouts(layouts)
  if isinstance(out, Mapping):
    return MultiTaskConfig({k: one(v) for k, v in out.items()})
  return one(out)


def reader_of(cfg) -> str:
  readers = {c.reader for c in task_configs(cfg).values()}
  if len(readers) > 1:
    raise ConfigError(f"MultiTaskConfig: its tasks use different readers ({sorted(readers)}); "
                      f"set the same DatasetConfig.reader for all")
  return readers.pop()


def _check_views(task: str, draw: Optional[views.Draw], layout: features.Layout):
  """An N-way task's views and hard negatives are what the model reads."""
  if draw is None:
    return
  if layout.num_views is not None and layout.num_views != draw.num_views:
    raise ConfigError(f"task {task} draws {draw.num_views} views but the model reads "
                      f"{layout.num_views} (its feature converter {layout.NAME}'s num_views)")
  if layout.hard_negatives != draw.hard_negatives:
    hard = draw.hard_negatives
    raise ConfigError(f"task {task} {'has' if hard else 'has no'} hard negatives but "
                      f"the model reads {'none' if hard else 'one per example'} "
                      f"(its feature converter is {layout.NAME})")


def record_caches(cfg: DatasetConfig, layout: features.Layout, tasks, rates, tables,
                  root: Optional[str] = None):
  """Writes the record by which a later run finds these caches without SeqIO
  (vmx/data/token_cache/lookup.py) under `root` (default the config's), where the config
  is a deferred task call and every task's source names its files."""
  if cfg.deferred is None:
    return
  paths = [t.source.paths if isinstance(t.source, CachedSource) else None for t in tasks]
  if not all(paths):   # a source that cannot say which files it reads: never recorded
    return
  files = sorted({str(f) for p in paths for f in p} | set(_vocabulary_files(cfg.deferred)))
  counts = [t.num_input_examples(cfg.split) for t in tasks]
  lookup.write(
      cfg.deferred.key(), root or cfg.token_cache_dir, cfg.mixture_or_task_name,
      [{"name": t.name, "rate": float(r),
        "draw": None if view_draw(t.source) is None else view_draw(t.source).describe()}
       for t, r in zip(tasks, rates)],
      files, cfg.split, None if any(n is None for n in counts) else [int(n) for n in counts],
      cfg.task_feature_lengths, layout, [tab.dir for tab in tables],
      [tab.info["fingerprint"] for tab in tables])


def _vocabulary_files(call: Deferred) -> list[str]:
  """The files of the call's `vocabulary` (a SentencePiece model, or a tokenizer's
  directory): part of what the record stamps."""
  v = call.arguments.get("vocabulary")
  if not isinstance(v, str) or "://" in v or not os.path.exists(v):
    return []
  if os.path.isdir(v):
    return sorted(os.path.join(v, f) for f in os.listdir(v)
                  if os.path.isfile(os.path.join(v, f)))
  return [v]


def _streams(cfg, layouts, seed: int, progress: bool, orders: Mapping):
  """{task key: stream.Stream} of the configs: their token caches found by their record
  (no SeqIO), else opened through the registered tasks (built where missing and local)
  and recorded; `orders`: {task key: stream.Order} instead of the config's (a state
  written before format 2)."""
  described = described_config(cfg, seed)
  out = {}
  for key, c in task_configs(cfg).items():
    d = described[str(key)]
    layout = _layouts(cfg, layouts)[key]
    tables = c.record and c.record.tables(c.split, c.task_feature_lengths, layout,
                                          c.token_cache_dir)
    if tables:
      if progress:
        print(f"[vmx] {c.mixture_or_task_name}: {len(tables)} token cache(s) found by their "
              f"record {c.record.path} (SeqIO not imported)", flush=True)
      names = [t["name"] for t in c.record.tasks]
      rates = [t["rate"] for t in c.record.tasks]
      draws = [t["draw"] and views.Draw(**t["draw"]) for t in c.record.tasks]
    else:
      from vmx.data.token_cache import build  # SeqIO: caches not found by their record
      tasks, rates, tables = build.open_tables(c, layout.converter(), progress)
      record_caches(c, layout, tasks, rates, tables)
      names, draws = [t.name for t in tasks], [view_draw(t.source) for t in tasks]
    for name, draw in zip(names, draws):
      _check_views(name, draw, layout)
    if c.block_length:   # the call's vocabulary file, else the registered task's
      vocabulary = c.deferred.arguments.get("vocabulary") if c.deferred is not None else None
      if not isinstance(vocabulary, str):   # a registered task: its own vocabulary
        from vmx.data import seqio_vocab  # SeqIO: only a config without a vocabulary file
        from vmx.data.token_cache import build  # (the same)
        vocabulary = seqio_vocab.task_vocabulary(build.config_tasks(c)[0][0])
      tables = [token_blocks.TokenBlocks(t, _block_feature(layout, key), c.block_length,
                                         token_blocks.separator(vocabulary))
                for t in tables]
    order = orders.get(key) or stream.Order.default(c.batch_size, c.slots, c.shuffle_window)
    out[key] = stream.Stream(
        names, rates, tables, c.batch_size, d["seed"], c.shuffle, order, draw=draws,
        about={k: d[k] for k in ("mixture_or_task_name", "split", "lengths", "block_length")
               if k in d})
  return out


def described_config(cfg, seed: int) -> dict:
  """{task key: the stream description of the index reader} as far as the config says it
  without opening a token cache (no `tasks`): what a restart compares before it builds
  anything (vmx/training/trainer.py)."""
  out = {}
  for i, (key, c) in enumerate(task_configs(cfg).items()):
    out[str(key)] = {
        "mixture_or_task_name": c.mixture_or_task_name, "split": c.split,
        "lengths": {k: int(v) for k, v in sorted(c.task_feature_lengths.items())},
        "batch_size": c.batch_size, "shuffle": c.shuffle,
        "seed": c.seed if c.seed is not None else seed + i,
        "order": stream.Order.default(c.batch_size, c.slots, c.shuffle_window).describe()}
    if c.block_length:   # (only then: every other stream's description stays as it was)
      out[str(key)]["block_length"] = int(c.block_length)
  return out


def _block_feature(layout, key) -> str:
  """The one token feature a config with `block_length` reads in blocks (ConfigError
  naming the binding for a layout of several token features: pairs, views)."""
  tokens = layout.token_features()
  if (len(tokens) != 1 or len(layout.MODEL_FEATURES) != 1
      or any(s.rank != 1 for s in layout.TASK_FEATURES.values())):
    where = ("DatasetConfig" if key is None
             else f"MultiTaskConfig.tasks[{key!r}] DatasetConfig")
    raise ConfigError(f"{where}.block_length: blocks of text are for single sentences "
                      f"(a monolingual task), but this task's examples have "
                      f"{sorted(layout.MODEL_FEATURES)}")
  return tokens[0]


def _replaying(cfg, layouts, seed: int, state: Optional[Mapping] = None):
  """The replaying SeqIO reader, whole in vmx/data/seqio_reader.py: for `reader='seqio'`
  configs and replay positions (old checkpoints, SeqIO's own offline cache)."""
  from vmx.data import seqio_reader  # SeqIO and TensorFlow: the replaying reader only
  return seqio_reader.replaying_iterator(
      task_configs(cfg), {k: v.converter() for k, v in _layouts(cfg, layouts).items()}, seed,
      state, asked=reader_of(cfg))


def train_iterator(cfg, layouts, seed: int, rows: Optional[Mapping] = None,
                   progress: bool = True, orders: Optional[Mapping] = None):
  """The training batches of `cfg` from step 0. The index reader yields the rows `rows`
  ({task key: global row indices}, default all) of each step; the seqio reader yields
  global batches (`rows` ignored)."""
  if reader_of(cfg) == "seqio":
    return _replaying(cfg, layouts, seed)
  return stream.IndexIterator(_streams(cfg, layouts, seed, progress,
                                       orders or {}), rows)


def resume_iterator(cfg, layouts, seed: int, state: Mapping,
                    rows: Optional[Mapping] = None, allow_change: bool = False):
  """The training batches of `cfg` from a checkpoint's data state. An index state
  restarts at its step; a replay position (the seqio reader, or a checkpoint written
  before the index reader) replays the seqio stream, with a warning when the config
  asks for the index reader."""
  if state.get("reader") == "index":
    if reader_of(cfg) != "index":
      raise ConfigError("the checkpoint's data state is the index reader's but "
                        "DatasetConfig.reader is 'seqio'; set it to 'index' to resume")
    # a state written before format 2 continues in the order it was written with
    described = state.get("stream", {})
    orders = {key: stream.Order.legacy_v1() for key in task_configs(cfg)
              if str(key) in described and "order" not in described[str(key)]}
    it = train_iterator(cfg, layouts, seed, rows, orders=orders)
    it.restore(state, allow_change)
    return it
  blocks = [str(k) for k, c in task_configs(cfg).items() if c.block_length]
  if blocks:
    raise ConfigError(f"the checkpoint's data position was written by the replaying reader, "
                      f"which reads one sentence a row: set block_length None for task "
                      f"key(s) {blocks} (MMLM_BLOCK_LENGTH = None) to resume it")
  return _replaying(cfg, layouts, seed, state)
