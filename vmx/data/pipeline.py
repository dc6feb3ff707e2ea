"""Input pipeline: SeqIO task/mixture -> feature converter -> batches.

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
  position and resume this way, with a warning.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import numpy as np
import seqio
import tensorflow as tf

from vmx.data import packing, seqio_cache
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
  docstring). `array_cache_dir`: where the index reader's token cache lives (default
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
  """
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  batch_size: int
  split: str = "train"
  shuffle: bool = True
  seed: Optional[int] = None
  use_cached: bool = False
  reader: str = "index"
  array_cache_dir: Optional[str] = None
  slots: Optional[int] = None
  shuffle_window: int = 1024
  pack: bool = False

  def __post_init__(self):
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


def token_lengths(cfg, feature_converter_cls) -> list[int]:
  """The task lengths of the token features (int32 in the converters' TASK_FEATURES; not,
  say, a float vector such as distillation's `teacher`): what sentences are cut to."""
  out = []
  for key, c in task_configs(cfg).items():
    fc = (feature_converter_cls[key] if isinstance(feature_converter_cls, Mapping)
          else feature_converter_cls)
    specs = getattr(fc, "func", fc).TASK_FEATURES
    out += [n for f, n in c.task_feature_lengths.items()
            if f not in specs or specs[f].dtype == tf.int32]
  return out


def token_features(cfg, feature_converter_cls) -> list[str]:
  """The model's token features (int32 sequences, `key/feature` for several tasks): what
  packs, and what the step's `useful_token_fraction` counts."""
  out = []
  for key, c in task_configs(cfg).items():
    fc = (feature_converter_cls[key] if isinstance(feature_converter_cls, Mapping)
          else feature_converter_cls)
    specs = getattr(fc, "func", fc).MODEL_FEATURES
    out += [k if key is None else f"{key}/{k}" for k, spec in specs.items()
            if spec.dtype == tf.int32 and spec.rank == 1]
  return out


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


def model_feature_shapes(cfg, feature_converter_cls) -> dict:
  """Global batch shapes of the model features ([B] scalars, [B, length] sequences);
  `feature_converter_cls` is a model's FEATURE_CONVERTER_CLS (a dict for several tasks)."""
  multi = isinstance(feature_converter_cls, Mapping)
  if multi != isinstance(cfg, MultiTaskConfig):
    raise ConfigError(
        f"the model reads {'tasks ' + str(sorted(feature_converter_cls)) if multi else 'one task'}"
        f" each step but train_dataset_cfg is a {type(cfg).__name__}: "
        + ("use MultiTaskConfig(tasks={...})" if multi else "use one DatasetConfig"))
  if multi:
    missing = sorted(set(feature_converter_cls) - set(cfg.tasks))
    extra = sorted(set(cfg.tasks) - set(feature_converter_cls))
    if missing or extra:
      raise ConfigError(
          f"MultiTaskConfig.tasks has {sorted(cfg.tasks)} but the model reads "
          f"{sorted(feature_converter_cls)}" + (f"; missing: {missing}" if missing else "")
          + (f"; not read by the model: {extra}" if extra else ""))
  shapes = {}
  for key, c in task_configs(cfg).items():
    fc = (feature_converter_cls[key] if multi else feature_converter_cls)(pack=False)
    for k, n in fc.get_model_feature_lengths(c.task_feature_lengths).items():
      shapes[k if key is None else f"{key}/{k}"] = (
          (c.batch_size,) if fc.MODEL_FEATURES[k].rank == 0 else (c.batch_size, n))
  return shapes


def num_examples(cfg) -> dict:
  """{task key: training examples in its source(s), or None where a source does not say}
  (a mixture: the sum over its tasks)."""
  out = {}
  for key, c in task_configs(cfg).items():
    provider = seqio.get_mixture_or_task(c.mixture_or_task_name)
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    counts = [t.num_input_examples(c.split) for t in tasks]
    out[key] = None if any(n is None for n in counts) else int(sum(counts))
  return out


def uniform_config(feature_converter_cls, batch_size: int, length: int):
  """A placeholder dataset config (task names unset) giving every sequence feature of
  every task `length` and every task `batch_size`: shapes for benchmarks without data."""
  def one(fc_cls):
    features = getattr(fc_cls, "func", fc_cls).TASK_FEATURES   # a class or a partial
    lengths = {k: length for k, spec in features.items() if spec.rank > 0}
    return DatasetConfig("unset", lengths, batch_size)
  if isinstance(feature_converter_cls, Mapping):
    return MultiTaskConfig({k: one(c) for k, c in feature_converter_cls.items()})
  return one(feature_converter_cls)


def get_dataset(cfg: DatasetConfig, feature_converter: seqio.FeatureConverter,
                num_epochs: Optional[int] = None, seed: Optional[int] = None) -> tf.data.Dataset:
  """The GLOBAL batches: [batch_size, ...] numpy-able dicts (every process reads the
  whole stream; the trainer places each device's rows)."""
  provider = seqio.get_mixture_or_task(cfg.mixture_or_task_name)
  if cfg.use_cached:
    seqio_cache.check_cached(cfg.mixture_or_task_name, cfg.split)
  kwargs = dict(sequence_length=cfg.task_feature_lengths, split=cfg.split,
                use_cached=cfg.use_cached, shuffle=cfg.shuffle,
                seed=cfg.seed if cfg.seed is not None else seed,
                shard_info=seqio.ShardInfo(index=0, num_shards=1),
                num_epochs=num_epochs)
  if isinstance(provider, seqio.Mixture):
    # Mixtures keep only tokenized output features unless told: pass the converter's
    # other inputs (e.g. language ids) through.
    kwargs["passthrough_features"] = [k for k in feature_converter.TASK_FEATURES
                                      if k not in provider.output_features]
  ds = provider.get_dataset(**kwargs)
  ds = feature_converter(ds, cfg.task_feature_lengths)
  ds = ds.batch(cfg.batch_size, drop_remainder=True)
  options = tf.data.Options()
  options.deterministic = True
  return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


class DataIterator:
  """Numpy batches from a deterministic tf.data pipeline, with a checkpointable position
  (the `seqio` reader: GLOBAL batches, a resume replays `position` batches)."""

  reader = "seqio"
  rows = None   # every process reads the global batch

  def __init__(self, make_dataset: Callable[[], tf.data.Dataset], position: int = 0):
    self._make_dataset = make_dataset
    self.position = 0
    self._it = None
    self.restore({"position": position})

  def restore(self, state: Mapping[str, Any]):
    self.position = int(state["position"])
    self._it = iter(self._make_dataset().skip(self.position).as_numpy_iterator())

  def state_at(self, position: int) -> dict:
    return {"position": int(position)}

  def state(self) -> dict:
    return self.state_at(self.position)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    self.position += 1
    return batch


def _seqio_iterator(cfg, feature_converter_cls, seed: int) -> DataIterator:
  """The `seqio` reader's GLOBAL batches, the same on every process. A MultiTaskConfig
  zips its tasks' batches (task i shuffled with seed + i) into one dict with
  `key/feature` names; the position counts steps, as for one task."""
  if not isinstance(cfg, MultiTaskConfig):
    fc = feature_converter_cls(pack=False)
    return DataIterator(lambda: get_dataset(cfg, fc, num_epochs=None, seed=seed))

  def make_dataset():
    parts = {key: get_dataset(c, feature_converter_cls[key](pack=False), num_epochs=None,
                              seed=seed + i) for i, (key, c) in enumerate(cfg.tasks.items())}
    return tf.data.Dataset.zip(parts).map(
        lambda ex: {f"{key}/{k}": v for key, part in ex.items() for k, v in part.items()})
  return DataIterator(make_dataset)


def reader_of(cfg) -> str:
  readers = {c.reader for c in task_configs(cfg).values()}
  if len(readers) > 1:
    raise ConfigError(f"MultiTaskConfig: its tasks use different readers ({sorted(readers)}); "
                      f"set the same DatasetConfig.reader for all")
  return readers.pop()


def _check_nway(task, converter):
  """An N-way task's views and hard negatives are what the model reads."""
  n = getattr(task.source, "num_views", None)
  if n is None:
    return
  if getattr(converter, "num_views", n) != n:
    raise ConfigError(f"task {task.name} draws {n} views but the model reads "
                      f"{converter.num_views} (NUM_VIEWS)")
  hard = getattr(task.source, "hard_negatives", False)
  if getattr(converter, "hard_negatives", False) != hard:
    raise ConfigError(f"task {task.name} {'has' if hard else 'has no'} hard negatives but "
                      f"the model reads {'none' if hard else 'one per example'} "
                      f"(MPCLModel.hard_negatives)")


def _streams(cfg, feature_converter_cls, seed: int, progress: bool, orders: Mapping):
  """{task key: stream.Stream} of the configs (their token caches opened, built where
  missing and local); `orders`: {task key: stream.Order} instead of the config's (a
  state written before format 2)."""
  from vmx.data import stream  # grain: only for the index reader
  from vmx.data.token_cache import build
  multi = isinstance(feature_converter_cls, Mapping)
  described = described_config(cfg, seed)
  out = {}
  for key, c in task_configs(cfg).items():
    d = described[str(key)]
    converter = (feature_converter_cls[key] if multi else feature_converter_cls)(pack=False)
    tasks, rates, tables = build.open_tables(c, converter, progress)
    for t in tasks:
      _check_nway(t, converter)
    order = orders.get(key) or stream.Order.default(c.batch_size, c.slots, c.shuffle_window)
    out[key] = stream.Stream(
        [t.name for t in tasks], rates, tables, c.batch_size, d["seed"], c.shuffle, order,
        draw=[getattr(t.source, "draw_views", None) for t in tasks],
        about={k: d[k] for k in ("mixture_or_task_name", "split", "lengths")})
  return out


def described_config(cfg, seed: int) -> dict:
  """{task key: the stream description of the index reader} as far as the config says it
  without opening a token cache (no `tasks`): what a restart compares before it builds
  anything (vmx/training/trainer.py)."""
  from vmx.data import stream   # grain: only for the index reader
  out = {}
  for i, (key, c) in enumerate(task_configs(cfg).items()):
    out[str(key)] = {
        "mixture_or_task_name": c.mixture_or_task_name, "split": c.split,
        "lengths": {k: int(v) for k, v in sorted(c.task_feature_lengths.items())},
        "batch_size": c.batch_size, "shuffle": c.shuffle,
        "seed": c.seed if c.seed is not None else seed + i,
        "order": stream.Order.default(c.batch_size, c.slots, c.shuffle_window).describe()}
  return out


def train_iterator(cfg, feature_converter_cls, seed: int, rows: Optional[Mapping] = None,
                   progress: bool = True, orders: Optional[Mapping] = None):
  """The training batches of `cfg` from step 0. The index reader yields the rows `rows`
  ({task key: global row indices}, default all) of each step; the seqio reader yields
  global batches (`rows` ignored)."""
  if reader_of(cfg) == "seqio":
    return _seqio_iterator(cfg, feature_converter_cls, seed)
  from vmx.data import stream  # grain: only for the index reader
  return stream.IndexIterator(_streams(cfg, feature_converter_cls, seed, progress,
                                       orders or {}), rows)


def resume_iterator(cfg, feature_converter_cls, seed: int, state: Mapping,
                    rows: Optional[Mapping] = None, allow_change: bool = False):
  """The training batches of `cfg` from a checkpoint's data state. An index state
  restarts at its step; a replay position (the seqio reader, or a checkpoint written
  before the index reader) replays the seqio stream, with a warning when the config
  asks for the index reader."""
  if state.get("reader") == "index":
    if reader_of(cfg) != "index":
      raise ConfigError("the checkpoint's data state is the index reader's but "
                        "DatasetConfig.reader is 'seqio'; set it to 'index' to resume")
    from vmx.data import stream  # grain: only for the index reader
    # a state written before format 2 continues in the order it was written with
    described = state.get("stream", {})
    orders = {key: stream.Order.legacy_v1() for key in task_configs(cfg)
              if str(key) in described and "order" not in described[str(key)]}
    it = train_iterator(cfg, feature_converter_cls, seed, rows, orders=orders)
    it.restore(state, allow_change)
    return it
  if reader_of(cfg) == "index":
    print(f"[vmx] warning: the checkpoint's data position ({state.get('position')} batches) "
          f"was written by the replaying reader: this run goes on with that reader and "
          f"replays them (slow at large steps); a new run uses the index reader",
          flush=True)
  it = _seqio_iterator(cfg, feature_converter_cls, seed)
  it.restore(state)
  return it
