"""The phases of a run: `train(phases=[Phase(...), ...])` (EMMA-X's warm-up then EM).

A run without `phases` is one phase 'train' (its input: train's `train_dataset_cfg`).
`resolve_phases` fills in the defaults and each phase's step range (start, end];
`phase_index` maps a step to its phase; `check_same_state` refuses phases whose models
build different train states.
"""
from __future__ import annotations

from typing import Callable, Optional

import flax
import gin
import optax
from flax import traverse_util

from vmx.data import pipeline
from vmx.data.inputs import TokenCacheInput
from vmx.errors import ConfigError
from vmx.gin_utils import check_range, positive_int
from vmx.models.base import BaseModel
from vmx.training.inputs import Input
from vmx.training.step import TrainStep


def as_input(data, where: str):
  """`data` as an `Input`: a DatasetConfig / MultiTaskConfig (gin's train_dataset_cfg) is
  wrapped in a `TokenCacheInput`; anything else must be an Input already."""
  if isinstance(data, (pipeline.DatasetConfig, pipeline.MultiTaskConfig)):
    return TokenCacheInput(data)
  check_range(isinstance(data, Input), where, "input", data, "a DatasetConfig, "
              "MultiTaskConfig or an Input (vmx/training/inputs.py): every phase needs data")
  return data


# Registered under the trainer's module, the name gin files know it by
# (`vmx.training.trainer.Phase`, as well as `Phase`).
@gin.configurable(module="vmx.training.trainer")
class Phase:
  """One phase of a run: `steps` optimizer steps on its own `input` (an `Input`,
  vmx/training/inputs.py; gin's `train_dataset_cfg`, a DatasetConfig / MultiTaskConfig, is
  wrapped as one), with its own model (objective; default: train's `model`) and optimizer
  (default: train's `optimizer`).

  A run is a list of phases (`train(phases=[...])`, EMMA-X's warm-up then EM). All phases
  share the parameters and flax_mutables (their models must build the same trees); the
  optimizer state carries over between phases with the same optimizer and starts anew for
  a phase with its own. The switch happens at a step boundary (logged, with a checkpoint);
  a checkpoint at step s belongs to the phase containing s (a phase's last step included),
  so a run killed inside any phase resumes in it, bit-exactly. Phase i reads its data
  with seed random_seed + 1000 i.
  """

  def __init__(self, name: str = gin.REQUIRED, steps: int = gin.REQUIRED, input=None,
               model: Optional[BaseModel] = None,
               optimizer: Optional[optax.GradientTransformation] = None,
               learning_rate: Optional[Callable] = None, *, train_dataset_cfg=None):
    check_range(isinstance(name, str) and bool(name), "Phase", "name", name, "a non-empty name")
    check_range(positive_int(steps), f"Phase({name!r})", "steps", steps,
                "a positive number of steps")
    if input is not None and train_dataset_cfg is not None:
      raise ConfigError(f"Phase({name!r}): both input and train_dataset_cfg are set; set one")
    self.name, self.steps = name, steps
    self.input = as_input(input if input is not None else train_dataset_cfg,
                          f"Phase({name!r})")
    self.model, self.optimizer, self.learning_rate = model, optimizer, learning_rate
    self.start = self.end = 0   # steps (start, end] of the run, set by `resolve_phases`


def resolve_phases(phases, model, train_dataset_cfg, optimizer, learning_rate,
                   total_steps) -> list:
  # `train_dataset_cfg`: train's (a dataset config or an Input) for a run of one phase
  """The run's phases with defaults filled in and their step ranges; a run without
  `phases` is one phase 'train'. ConfigError for inconsistent settings."""
  if phases is None:
    if train_dataset_cfg is None:
      raise ConfigError("train: set train_dataset_cfg (or phases=[Phase(...), ...])")
    phases = [Phase("train", total_steps, as_input(train_dataset_cfg, "train"))]
  else:
    phases = list(phases)
    if train_dataset_cfg is not None:
      raise ConfigError("train: both train_dataset_cfg and phases are set; a phased run "
                        "reads each phase's own Phase.train_dataset_cfg (set "
                        "train.train_dataset_cfg = None)")
    if not phases or not all(isinstance(p, Phase) for p in phases):
      raise ConfigError(f"train.phases={phases!r}: expected a non-empty list of Phase(...)")
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
      raise ConfigError(f"train.phases: phase names {names} repeat")
    if sum(p.steps for p in phases) != total_steps:
      raise ConfigError(f"train.total_steps={total_steps} but the phases' steps add up to "
                        f"{sum(p.steps for p in phases)} ("
                        + ", ".join(f"{p.name} {p.steps}" for p in phases) + ")")
  end = 0
  for p in phases:
    p.model = p.model or model
    p.optimizer = p.optimizer or optimizer
    p.learning_rate = p.learning_rate or learning_rate
    p.start, end = end, end + p.steps
    p.end = end
  return phases


def phase_index(phases, step: int) -> int:
  """The phase a state at `step` belongs to: the first whose range (start, end] holds
  it (step 0: the first)."""
  return next((i for i, p in enumerate(phases) if step <= p.end), len(phases) - 1)


def check_same_state(first: Phase, first_trainer: TrainStep, phase: Phase, trainer: TrainStep):
  """Every phase trains the same parameters and flax_mutables (names and shapes)."""
  def shapes(tree):
    return {"/".join(map(str, k)): tuple(v.shape)
            for k, v in traverse_util.flatten_dict(flax.core.unfreeze(tree)).items()}
  for what in ("params", "flax_mutables"):
    a = shapes(getattr(first_trainer.abstract_state, what))
    b = shapes(getattr(trainer.abstract_state, what))
    if a != b:
      diff = sorted(set(a.items()) ^ set(b.items()))[:4]
      raise ConfigError(f"Phase({phase.name!r}) builds other {what} than Phase({first.name!r}) "
                        f"(e.g. {diff}); the phases of a run share one train state: give "
                        "them models of the same architecture")
