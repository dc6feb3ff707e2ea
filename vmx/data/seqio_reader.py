"""The `seqio` reader: the tasks' tf.data pipelines (seqio.get_dataset, shuffle buffers) as
t5x reads them, kept for what it alone reads: checkpoints written before the index reader
(their data state is a replay position) and SeqIO's own offline cache
(`DatasetConfig.use_cached`, vmx/data/seqio_cache.py). Every process builds the same
GLOBAL batch stream and the trainer places each device's rows; a `DataIterator` counts
the batches it produced (its `position`) and a resume rebuilds the seeded pipeline and
skips that many, which takes as long as reading them did. vmx/data/pipeline.py hands it
`reader='seqio'` configs and replay positions (`replaying_iterator`); everything of this
reader is here, and it is the only module of the training path that needs TensorFlow.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np
import seqio
import tensorflow as tf

from vmx.data import seqio_cache


def get_dataset(cfg, feature_converter: seqio.FeatureConverter,
                num_epochs: Optional[int] = None, seed: Optional[int] = None) -> tf.data.Dataset:
  """The GLOBAL batches: [batch_size, ...] numpy-able dicts (every process reads the
  whole stream; the trainer places each device's rows)."""
  provider = seqio.get_mixture_or_task(cfg.register())
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


def replaying_iterator(configs: Mapping, converters: Mapping, seed: int,
                       state: Optional[Mapping] = None, asked: str = "seqio") -> DataIterator:
  """`seqio_iterator`, at the replay position `state` (None: step 0). `asked`: the reader
  the config names; a replay position resumed by a config asking for the index reader
  goes on replaying, with a warning (the checkpoint's stream is this reader's)."""
  if state is not None and asked == "index":
    print(f"[vmx] warning: the checkpoint's data position ({state.get('position')} batches) "
          f"was written by the replaying reader: this run goes on with that reader and "
          f"replays them (slow at large steps); a new run uses the index reader",
          flush=True)
  it = seqio_iterator(configs, converters, seed)
  if state is not None:
    it.restore(state)
  return it


def seqio_iterator(configs: Mapping, converters: Mapping, seed: int) -> DataIterator:
  """The `seqio` reader's GLOBAL batches of {task key: DatasetConfig} (one config: the key
  None), each read through its converter, the same on every process. Several task keys
  (a MultiTaskConfig) zip their batches (task i shuffled with seed + i) into one dict
  with `key/feature` names; the position counts steps, as for one task."""
  if list(configs) == [None]:
    return DataIterator(lambda: get_dataset(configs[None], converters[None], num_epochs=None,
                                            seed=seed))

  def make_dataset():
    parts = {key: get_dataset(c, converters[key], num_epochs=None, seed=seed + i)
             for i, (key, c) in enumerate(configs.items())}
    return tf.data.Dataset.zip(parts).map(
        lambda ex: {f"{key}/{k}": v for key, part in ex.items() for k, v in part.items()})
  return DataIterator(make_dataset)
