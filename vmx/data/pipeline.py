"""Input pipeline: SeqIO task/mixture -> feature converter -> per-host batches.

Iteration is seeded and deterministic; a `DataIterator` counts the batches it
has produced (its `position`), which the checkpoint stores; on restore the same
seeded pipeline is rebuilt and advanced by `position` batches, so a resumed run
sees exactly the batches an uninterrupted run would have seen. Every process
builds the same GLOBAL batch stream (the trainer places each device's rows), so
the batches do not depend on the number of processes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import numpy as np
import seqio
import tensorflow as tf


@dataclasses.dataclass
class DatasetConfig:
  """t5x-style dataset configuration (batch_size is GLOBAL, over all hosts)."""
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  batch_size: int
  split: str = "train"
  shuffle: bool = True
  seed: Optional[int] = None
  use_cached: bool = False
  pack: bool = False

  def __post_init__(self):
    from vmx.gin_utils import check_range, positive_int
    check_range(positive_int(self.batch_size), "DatasetConfig", "batch_size", self.batch_size,
                "a positive integer (the global batch)")
    lengths = dict(self.task_feature_lengths) if isinstance(self.task_feature_lengths,
                                                            Mapping) else None
    check_range(lengths is not None and all(positive_int(v) for v in lengths.values()),
                "DatasetConfig", "task_feature_lengths", self.task_feature_lengths,
                "a dict of positive lengths, e.g. {'inputs': 32, 'targets': 32}")


def get_dataset(cfg: DatasetConfig, feature_converter: seqio.FeatureConverter,
                num_epochs: Optional[int] = None, seed: Optional[int] = None) -> tf.data.Dataset:
  """The GLOBAL batches: [batch_size, ...] numpy-able dicts (every process reads the
  whole stream; the trainer places each device's rows)."""
  provider = seqio.get_mixture_or_task(cfg.mixture_or_task_name)
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
  """Numpy batches from a deterministic tf.data pipeline, with a checkpointable position."""

  def __init__(self, make_dataset: Callable[[], tf.data.Dataset], position: int = 0):
    self._make_dataset = make_dataset
    self.position = 0
    self._it = None
    self.restore({"position": position})

  def restore(self, state: Mapping[str, Any]):
    self.position = int(state["position"])
    self._it = iter(self._make_dataset().skip(self.position).as_numpy_iterator())

  def state(self) -> dict:
    return {"position": self.position}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    self.position += 1
    return batch


def train_iterator(cfg: DatasetConfig, feature_converter_cls, seed: int) -> DataIterator:
  """Iterator over the GLOBAL training batches, the same on every process."""
  fc = feature_converter_cls(pack=cfg.pack)
  return DataIterator(lambda: get_dataset(cfg, fc, num_epochs=None, seed=seed))
