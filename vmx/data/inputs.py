"""`TokenCacheInput`: a `DatasetConfig` / `MultiTaskConfig` as a training run's input.

It implements the training loop's `Input` protocol (vmx/training/inputs.py, not imported:
the data layer depends on nothing above it) over the pipeline (vmx/data/pipeline.py):
the index reader over the token caches (vmx/data/stream.py), or the replaying SeqIO
reader a `DatasetConfig(reader='seqio')` or an old checkpoint asks for. The config is
normalised once here, single or several tasks alike, and the checks a run makes before
it builds anything (batch sizes against the devices, empty tasks, the model's own
`validate_data`) name the gin binding.

How to use:
  Phase("warmup", 600, TokenCacheInput(DatasetConfig(...)))
or, in gin, `train.train_dataset_cfg = @train/DatasetConfig()` (wrapped by `train()`).
"""
from __future__ import annotations

from typing import Mapping, Optional

from vmx.data import pipeline, stream
from vmx.errors import ConfigError
from vmx.gin_utils import check_range


class TokenCacheInput:
  """The training batches of a dataset config (see the module docstring)."""

  def __init__(self, cfg):
    check_range(isinstance(cfg, (pipeline.DatasetConfig, pipeline.MultiTaskConfig)),
                "train", "train_dataset_cfg", cfg, "a DatasetConfig or MultiTaskConfig")
    self.cfg = cfg
    self.configs = pipeline.task_configs(cfg)      # {task key (None: one task): config}
    self.name = " + ".join(str(c.mixture_or_task_name) for c in self.configs.values())
    self.batch_size = cfg.batch_size

  def __repr__(self):
    return f"TokenCacheInput({self.cfg!r})"

  # -- before anything is built -----------------------------------------------------------
  def batch_sizes(self) -> dict:
    return {k: c.batch_size for k, c in self.configs.items()}

  def check(self, model, data_parallel_size: int) -> None:
    for key, size in self.batch_sizes().items():
      check_range(size % data_parallel_size == 0, "DatasetConfig" if key is None else
                  f"MultiTaskConfig.tasks[{key!r}] DatasetConfig", "batch_size", size,
                  f"a multiple of the {data_parallel_size} data-parallel devices")
    examples = pipeline.num_examples(self.cfg)
    empty = sorted(str(k) for k, n in examples.items() if n == 0)
    if empty:
      raise ConfigError(f"the data of task(s) {empty} have no examples")
    model.validate_data(examples, self.batch_sizes())

  def batch_shapes(self, model) -> dict:
    return pipeline.model_feature_shapes(self.cfg, model.feature_layout())

  def token_features(self, model) -> list[str]:
    return pipeline.token_features(self.cfg, model.feature_layout())

  def packed_features(self, model, shapes: Mapping[str, tuple]) -> dict:
    return pipeline.packed_features(self.cfg, model, shapes)

  def token_lengths(self, model) -> list[int]:
    return pipeline.token_lengths(self.cfg, model.feature_layout())

  def changes(self, state: Mapping, seed: int) -> list[str]:
    """How an index-reader state's stream differs from this config's (the batch size,
    the mixture, the lengths...); nothing for a replay position."""
    if state.get("reader") != "index":
      return []
    old = {k: {f: v for f, v in d.items() if f != "tasks"}
           for k, d in state.get("stream", {}).items()}
    new = pipeline.described_config(self.cfg, seed)
    for k, d in new.items():   # a state written before format 2 keeps its own order
      if "order" not in old.get(k, {}):
        d.pop("order", None)
    return stream.stream_difference(old, new)

  # -- the batches ------------------------------------------------------------------------
  def start(self, model, seed: int, rows: Optional[Mapping], state: Optional[Mapping] = None,
            allow_change: bool = False, progress: bool = True):
    layouts = model.feature_layout()
    if state is None:
      return pipeline.train_iterator(self.cfg, layouts, seed, rows, progress=progress)
    return pipeline.resume_iterator(self.cfg, layouts, seed, state, rows, allow_change)
