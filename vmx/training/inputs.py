"""What a training run consumes: the `Input` seam, and the iterator it starts.

Training owns this protocol and the data layer implements it without importing it
(vmx/data/inputs.py `TokenCacheInput`: the token caches and the SeqIO tasks behind a
`DatasetConfig` / `MultiTaskConfig`; vmx/finetune/data.py `ArrayInput`: labelled pairs
tokenized into memory). A `Phase` holds one (vmx/training/phases.py) and the loop
(vmx/training/loop.py) calls only what is declared here, so a new kind of input plugs in
without a subclass of the loop or a configuration that pretends to be another.

How to use: build one, hand it to `Phase(name, steps, input)` (or `train(phases=[...])`);
gin's `train.train_dataset_cfg` / `Phase.train_dataset_cfg` are wrapped in a
`TokenCacheInput` for you.

The checkpoint stores `DataIterator.state_at(position)`; a resume hands it back to
`Input.start(..., state=...)`. Each input owns the format of its own state (the index
reader's `{"reader": "index", "step", "stream"}`, fine-tuning's `{"reader": "finetune",
"position", "data"}`), which must stay stable across releases: old checkpoints resume.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

from vmx.models.base import BaseModel


class DataIterator(Protocol):
  """Numpy batches, as `vmx.training.prefetch.Prefetcher` reads them."""
  position: int                                  # batches handed out so far
  rows: Optional[Mapping[Any, Sequence[int]]]    # {task key: global rows read}; None: all

  def __next__(self) -> dict: ...

  def state_at(self, position: int) -> dict:
    """What a checkpoint taken after `position` batches stores (JSON)."""


@runtime_checkable
class Input(Protocol):
  """A phase's training data (a phase checks `isinstance(x, Input)`: the members below).
  `model` is the phase's model: its feature layouts decide the batch's features and
  shapes."""
  name: str          # for messages and logs
  batch_size: int    # examples per step (all tasks), logged as examples/s

  def check(self, model: BaseModel, data_parallel_size: int) -> None:
    """ConfigError naming the binding if this input cannot feed `model` (sizes, empty
    data, the model's own `validate_data`). Called before anything is built."""

  def batch_shapes(self, model: BaseModel) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model features ([B] scalars, [B, length] sequences)."""

  def token_features(self, model: BaseModel) -> list[str]:
    """The token features (their non-pad share is logged, packed rows count them)."""

  def packed_features(self, model: BaseModel, shapes: Mapping[str, tuple]) -> dict:
    """{task key: [vmx.data.packing.Feature]} of the features packed into rows."""

  def token_lengths(self, model: BaseModel) -> list[int]:
    """The lengths sentences are cut to (the longest is what inference truncates to)."""

  def changes(self, state: Mapping, seed: int) -> list[str]:
    """How the stream of a checkpoint's data `state` differs from this input's, as far as
    the configuration tells without reading data (a restart names them); [] if unknown."""

  def start(self, model: BaseModel, seed: int, rows: Optional[Mapping],
            state: Optional[Mapping] = None, allow_change: bool = False,
            progress: bool = True) -> DataIterator:
    """The batches from the start (`state` None) or from a checkpoint's data `state`;
    `rows`: {task key: the global batch rows this process reads}. A state this input
    cannot continue is an error naming what differs, unless `allow_change`."""
