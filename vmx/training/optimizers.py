"""Optimizers and learning-rate schedules (optax), gin-configurable."""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import gin
import jax.numpy as jnp
import optax

from vmx.errors import ConfigError

SCHEDULES = ("rsqrt", "linear", "cosine", "constant")
OPTIMIZERS = ("adafactor", "adam", "adamw", "amsgrad")


@gin.configurable
def learning_rate_schedule(name: str = "rsqrt", peak_value: float = 1e-3,
                           warmup_steps: int = 4000, total_steps: Optional[int] = None,
                           end_value: float = 0.0,
                           scale_at: Optional[Mapping[int, float]] = None) -> optax.Schedule:
  """Linear warmup from 0 to `peak_value`, then
    rsqrt:    peak * sqrt(warmup_steps / step)   (VMSST; t5x's rsqrt_decay)
    linear:   linear decay to `end_value` at `total_steps`
    cosine:   cosine decay to `end_value` at `total_steps`
    constant: stay at peak.
  `scale_at` {step: factor} multiplies the rate from that step on (factors compound), e.g.
  MPCL's {2000: 0.5}: 2e-5 for the single-positive warm-up, then 1e-5.
  """
  if name not in SCHEDULES:
    raise ConfigError(f"learning_rate_schedule.name={name!r}; expected one of {SCHEDULES}")
  warmup = optax.linear_schedule(0.0, peak_value, max(warmup_steps, 1))
  if name in ("linear", "cosine") and not total_steps:
    raise ConfigError(f"learning_rate_schedule.name={name!r} needs total_steps")
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
  schedule = optax.join_schedules([warmup, after], [max(warmup_steps, 1)])
  if scale_at:
    scale = optax.piecewise_constant_schedule(1.0, {int(k): float(v) for k, v in scale_at.items()})
    return lambda step: schedule(step) * scale(step)
  return schedule


@gin.configurable
def create_optimizer(name: str = "adafactor",
                     learning_rate: Callable | float = gin.REQUIRED,
                     weight_decay: float = 0.0, clip_grad_norm: Optional[float] = None,
                     b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                     adafactor_factored: bool = True) -> optax.GradientTransformation:
  """adafactor | adam | adamw | amsgrad, optionally after global-norm gradient clipping.

  Adafactor: optax defaults (decay 0.8, update clipping 1.0, parameter scaling);
  `adafactor_factored=False` keeps full second moments (a state that t5x's
  optimizer wrapper can partition).
  """
  if name not in OPTIMIZERS:
    raise ConfigError(f"create_optimizer.name={name!r}; expected one of {OPTIMIZERS}")
  if name == "adafactor":
    opt = optax.adafactor(learning_rate, factored=adafactor_factored,
                          weight_decay_rate=weight_decay or None)
  elif name == "adam":
    if weight_decay:
      raise ConfigError("create_optimizer: use name='adamw' for weight decay with Adam")
    opt = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  elif name == "adamw":
    opt = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  else:
    # PyTorch's Adam(amsgrad=True, weight_decay=wd) (EMS): L2 added to the gradient, the
    # max taken over RAW second moments and bias-corrected after it (optax.amsgrad takes
    # the max of corrected moments, which differs early in training).
    opt = optax.chain(
        optax.add_decayed_weights(weight_decay) if weight_decay else optax.identity(),
        optax.scale_by_amsgrad(b1=b1, b2=b2, eps=eps, bias_correction_nu=False),
        optax.scale_by_schedule(lambda count: jnp.sqrt(1.0 - b2 ** (count + 1))),
        optax.scale_by_learning_rate(learning_rate))
  if clip_grad_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_grad_norm), opt)
  return opt
