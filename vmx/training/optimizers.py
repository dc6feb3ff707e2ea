"""Optimizers and learning-rate schedules (optax), gin-configurable."""
from __future__ import annotations

import re
from typing import Callable, Mapping, Optional, Sequence

import gin
import jax.numpy as jnp
import optax
from flax import traverse_util

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

  `weight_decay`: decoupled for adamw (and Adafactor's decay rate); an L2 term added to
  the gradient for adam and amsgrad (PyTorch's `weight_decay` of Adam / AMSGrad).

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
    # Weight decay with Adam is PyTorch's Adam(weight_decay=wd), EMS §4.3's "Adam ...
    # weight decay": L2 added to the gradient before the moments (adamw decouples it).
    opt = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    if weight_decay:
      opt = optax.chain(optax.add_decayed_weights(weight_decay), opt)
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


@gin.configurable
def multi_optimizer(optimizers: Mapping[str, optax.GradientTransformation] = gin.REQUIRED,
                    labels: Sequence[tuple[str, str]] = gin.REQUIRED
                    ) -> optax.GradientTransformation:
  """One optimizer per parameter subset (`optax.multi_transform`), e.g. a classifier and
  an encoder with their own learning rates and schedules:

    train.optimizer = @multi_optimizer()
    multi_optimizer.optimizers = {'classifier': @classifier/create_optimizer(),
                                  'encoder': @create_optimizer()}
    multi_optimizer.labels = [('^classifier/', 'classifier'), ('.*', 'encoder')]

  `labels`: (regex, subset) rules over parameter paths ('encoder/layers_0/mlp/wi/kernel'),
  the first `re.search` match wins. A subset named 'frozen' that `optimizers` does not
  define gets `optax.set_to_zero()` (its parameters never change). Every parameter must
  match a rule: the unmatched ones are a ConfigError naming them, at start-up.
  """
  optimizers = dict(optimizers)
  rules = [(re.compile(pattern), name) for pattern, name in labels]
  unknown = sorted({name for _, name in rules} - set(optimizers) - {"frozen"})
  if unknown:
    raise ConfigError(f"multi_optimizer.labels name subsets {unknown} that "
                      f"multi_optimizer.optimizers does not define ({sorted(optimizers)})")
  if any(name == "frozen" for _, name in rules) and "frozen" not in optimizers:
    optimizers["frozen"] = optax.set_to_zero()

  def label_tree(params):
    flat = traverse_util.flatten_dict(params, sep="/")
    out, unmatched = {}, []
    for path in flat:
      name = next((n for r, n in rules if r.search(path)), None)
      if name is None:
        unmatched.append(path)
      out[path] = name
    if unmatched:
      raise ConfigError(f"multi_optimizer.labels: {len(unmatched)} parameters match no rule "
                        f"(e.g. {', '.join(unmatched[:4])}); add a rule such as ('.*', NAME)")
    return traverse_util.unflatten_dict(out, sep="/")

  return optax.multi_transform(optimizers, label_tree)
