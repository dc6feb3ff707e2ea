"""Optimizers and learning-rate schedules (optax), gin-configurable."""
from __future__ import annotations

from typing import Callable, Optional

import gin
import jax.numpy as jnp
import optax

SCHEDULES = ("rsqrt", "linear", "cosine", "constant")
OPTIMIZERS = ("adafactor", "adam", "adamw")


@gin.configurable
def learning_rate_schedule(name: str = "rsqrt", peak_value: float = 1e-3,
                           warmup_steps: int = 4000, total_steps: Optional[int] = None,
                           end_value: float = 0.0) -> optax.Schedule:
  """Linear warmup from 0 to `peak_value`, then
    rsqrt:    peak * sqrt(warmup_steps / step)   (VMSST; t5x's rsqrt_decay)
    linear:   linear decay to `end_value` at `total_steps`
    cosine:   cosine decay to `end_value` at `total_steps`
    constant: stay at peak.
  """
  if name not in SCHEDULES:
    raise ValueError(f"learning_rate_schedule.name={name!r}; expected one of {SCHEDULES}")
  warmup = optax.linear_schedule(0.0, peak_value, max(warmup_steps, 1))
  if name in ("linear", "cosine") and not total_steps:
    raise ValueError(f"learning_rate_schedule.name={name!r} needs total_steps")
  if name == "rsqrt":
    w = float(max(warmup_steps, 1))
    after = lambda step: peak_value * jnp.sqrt(w / jnp.maximum(step + w, w))
  elif name == "linear":
    after = optax.linear_schedule(peak_value, end_value, max(total_steps - warmup_steps, 1))
  elif name == "cosine":
    after = optax.cosine_decay_schedule(peak_value, max(total_steps - warmup_steps, 1),
                                        alpha=end_value / peak_value if peak_value else 0.0)
  else:
    after = optax.constant_schedule(peak_value)
  return optax.join_schedules([warmup, after], [max(warmup_steps, 1)])


@gin.configurable
def create_optimizer(name: str = "adafactor",
                     learning_rate: Callable | float = gin.REQUIRED,
                     weight_decay: float = 0.0, clip_grad_norm: Optional[float] = None,
                     b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                     adafactor_factored: bool = True) -> optax.GradientTransformation:
  """adafactor | adam | adamw, optionally after global-norm gradient clipping.

  Adafactor: optax defaults (decay 0.8, update clipping 1.0, parameter scaling);
  `adafactor_factored=False` keeps full second moments (a state that t5x's
  optimizer wrapper can partition).
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"create_optimizer.name={name!r}; expected one of {OPTIMIZERS}")
  if name == "adafactor":
    opt = optax.adafactor(learning_rate, factored=adafactor_factored,
                          weight_decay_rate=weight_decay or None)
  elif name == "adam":
    if weight_decay:
      raise ValueError("create_optimizer: use name='adamw' for weight decay with Adam")
    opt = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  else:
    opt = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  if clip_grad_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_grad_norm), opt)
  return opt
