"""Orbax checkpoints in t5x's layout: MODEL_DIR/checkpoint_<step>/{params,train_state,data}.

`params` alone is what inference restores; `train_state` holds step, optimizer
state, flax_mutables and the RNG key; `data` is the input position (JSON).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import gin
import orbax.checkpoint as ocp

from vmx.inference import CHECKPOINT_PREFIX

ITEMS = ("params", "train_state", "data")


@gin.configurable
@dataclasses.dataclass
class CheckpointConfig:
  period: int = 1000           # save every `period` steps (and at the end)
  keep: Optional[int] = 3      # newest checkpoints kept (None: all)
  restore: bool = True         # resume from the latest checkpoint in model_dir


class Checkpointer:

  def __init__(self, model_dir, cfg: CheckpointConfig):
    self.cfg = cfg
    self.manager = ocp.CheckpointManager(
        Path(model_dir).absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                             save_interval_steps=cfg.period,
                                             step_prefix=CHECKPOINT_PREFIX, create=True),
        item_names=ITEMS)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
    """Saves if `step` is due (or `force`). `step` is a Python int, so that asking
    costs no device->host sync in the training loop."""
    if not (force or self.manager.should_save(step)):
      return False
    rest = {"step": state.step, "opt_state": state.opt_state,
            "flax_mutables": state.flax_mutables, "rng": state.rng}
    return self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params), train_state=ocp.args.StandardSave(rest),
        data=ocp.args.JsonSave(data_state)), force=force)

  def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
    """abstract_state: TrainState of jax.ShapeDtypeStruct with shardings."""
    rest = {"step": abstract_state.step, "opt_state": abstract_state.opt_state,
            "flax_mutables": abstract_state.flax_mutables, "rng": abstract_state.rng}
    r = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        train_state=ocp.args.StandardRestore(rest), data=ocp.args.JsonRestore()))
    t = r["train_state"]
    state = abstract_state.replace(step=t["step"], params=r["params"], opt_state=t["opt_state"],
                                   flax_mutables=t["flax_mutables"], rng=t["rng"])
    return state, r["data"]

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()
