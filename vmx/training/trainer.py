"""The training loop: `train(...)`, gin-configurable with t5x's keyword names.

  python launch/train.py --gin_file=contrastive_tiny.gin --gin.MODEL_DIR="'/tmp/run'"

State: `TrainState(step, params, opt_state, flax_mutables, rng)`, sharded over a
('data', 'model') mesh by logical axis rules; one jitted step does forward,
backward and the optax update. The loss is computed on the global batch (the
sharding of every input and parameter is explicit, XLA inserts the collectives).
Checkpoints (orbax) hold params, optimizer state, step, RNG and the data
position; a run restarted with the same model_dir resumes from the latest one.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import flax
import gin
import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics

from vmx.data import pipeline
from vmx.data.vocab import Tokenizer, copy_vocabulary
from vmx.inference import Encoder, write_model_info
from vmx.models.base import BaseModel
from vmx.training import checkpoints, partitioning
from vmx.training import metrics as metrics_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  flax_mutables: Any
  rng: jax.Array  # raw uint32 key data; dropout rng of step s = fold_in(rng, s)


@gin.configurable
class TatoebaEvalConfig:
  """Periodic Tatoeba evaluation during training."""

  def __init__(self, languages: Sequence[str] = gin.REQUIRED, data_dir: Optional[str] = None,
               english: str = "eng", batch_size: int = 256):
    self.languages, self.data_dir = list(languages), data_dir
    self.english, self.batch_size = english, batch_size


def input_shapes(dataset_cfg: pipeline.DatasetConfig, model: BaseModel,
                 batch_size: Optional[int] = None) -> dict:
  """Global batch shapes of the model features: [B] for scalars, [B, length] otherwise."""
  fc = model.FEATURE_CONVERTER_CLS(pack=False)
  lengths = fc.get_model_feature_lengths(dataset_cfg.task_feature_lengths)
  b = batch_size or dataset_cfg.batch_size
  return {k: (b,) if fc.MODEL_FEATURES[k].rank == 0 else (b, n) for k, n in lengths.items()}


class Trainer:
  """Builds the sharded state and the jitted step for `model` on `partitioner`'s mesh."""

  def __init__(self, model: BaseModel, optimizer: optax.GradientTransformation,
               partitioner: partitioning.Partitioner, shapes: Mapping[str, tuple],
               learning_rate: Optional[Callable] = None):
    self.model, self.tx, self.partitioner = model, optimizer, partitioner
    self.shapes = dict(shapes)
    self.learning_rate = learning_rate
    batch_abstract = {k: jax.ShapeDtypeStruct(s, jnp.int32) for k, s in self.shapes.items()}
    self.batch_shardings = partitioner.batch_sharding(batch_abstract)

    def init(rng):
      init_rng, dropout_rng = jax.random.split(rng)
      variables = dict(model.get_initial_variables(init_rng, self.shapes))
      params = variables.pop("params")
      variables.pop("params_axes", None)
      mutables = {k: v for k, v in variables.items() if not k.endswith("_axes")}
      return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                        opt_state=self.tx.init(params), flax_mutables=mutables,
                        rng=jax.random.key_data(dropout_rng))

    self._init = init
    with partitioner.context():
      variables_shape = jax.eval_shape(
          lambda: model.get_initial_variables(jax.random.PRNGKey(0), self.shapes))
      abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
    params_sh = partitioner.params_shardings(variables_shape["params_axes"])
    repl = partitioner.replicated()

    def opt_leaf_sharding(leaf, param_sh, param):
      return param_sh if leaf.shape == param.shape else repl

    opt_sh = optax.tree_map_params(self.tx, opt_leaf_sharding, abstract.opt_state, params_sh,
                                   abstract.params, transform_non_params=lambda _: repl,
                                   is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    self.state_shardings = TrainState(
        step=repl, params=params_sh, opt_state=opt_sh,
        flax_mutables=jax.tree.map(lambda _: repl, abstract.flax_mutables), rng=repl)
    self.abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract,
        self.state_shardings)
    self.init_state = jax.jit(init, out_shardings=self.state_shardings)
    self.train_step = jax.jit(self._train_step, in_shardings=(self.state_shardings,
                                                              self.batch_shardings),
                              out_shardings=(self.state_shardings, repl), donate_argnums=(0,))

  def _loss_and_grads(self, state: TrainState, batch, dropout_rng):
    model = self.model
    if model.HAS_MUTABLES:
      fn = lambda p: model.loss_fn(p, batch, dropout_rng, state.flax_mutables)
      (loss, (metrics, mutables)), grads = jax.value_and_grad(fn, has_aux=True)(state.params)
    else:
      fn = lambda p: model.loss_fn(p, batch, dropout_rng)
      (loss, metrics), grads = jax.value_and_grad(fn, has_aux=True)(state.params)
      mutables = state.flax_mutables
    return loss, metrics, grads, mutables

  def _train_step(self, state: TrainState, batch):
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, metrics, grads, mutables = self._loss_and_grads(state, batch, dropout_rng)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics)
    metrics["grad_norm"] = clu_metrics.Average.from_model_output(optax.tree.norm(grads))
    if self.learning_rate is not None:
      metrics["learning_rate"] = clu_metrics.LastValue.from_model_output(
          jnp.asarray(self.learning_rate(state.step)))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         flax_mutables=mutables), metrics

  def create_state(self, seed: int) -> TrainState:
    with self.partitioner.context():
      return self.init_state(jax.random.PRNGKey(seed))

  def step(self, state: TrainState, local_batch) -> tuple[TrainState, dict]:
    batch = self.partitioner.host_local_to_global(
        {k: local_batch[k] for k in self.shapes}, self.batch_shardings)
    with self.partitioner.context():
      return self.train_step(state, batch)


def merge_metrics(acc: Optional[dict], new: dict) -> dict:
  if acc is None:
    return new
  return {k: acc[k].merge(v) for k, v in new.items()}


def compute_metrics(acc: dict) -> dict:
  return {f"train/{k}": float(jax.device_get(v.compute())) for k, v in acc.items()}


@gin.configurable
def train(*, model: BaseModel = gin.REQUIRED,
          train_dataset_cfg: pipeline.DatasetConfig = gin.REQUIRED,
          optimizer: optax.GradientTransformation = gin.REQUIRED,
          model_dir: str = gin.REQUIRED, total_steps: int = gin.REQUIRED,
          vocabulary: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
          learning_rate: Optional[Callable] = None,
          partitioner: Optional[partitioning.Partitioner] = None,
          checkpoint_cfg: Optional[checkpoints.CheckpointConfig] = None,
          eval_cfg: Optional[TatoebaEvalConfig] = None, eval_period: int = 1000,
          log_period: int = 50, random_seed: int = 0, progress: bool = True,
          stop_at_step: Optional[int] = None) -> tuple[TrainState, dict]:
  """Trains `model` for `total_steps` steps (resuming from model_dir), returns (state, last metrics).

  `stop_at_step` ends this invocation early (as a preempted job would) without
  changing the schedule, which is defined by `total_steps`.
  """
  if not isinstance(model_dir, (str, os.PathLike)) or not str(model_dir):
    raise ValueError(f"train.model_dir must be a path, got {model_dir!r}: set MODEL_DIR")
  model_dir = str(model_dir)
  Path(model_dir).mkdir(parents=True, exist_ok=True)
  partitioner = partitioner or partitioning.Partitioner()
  checkpoint_cfg = checkpoint_cfg or checkpoints.CheckpointConfig()
  shapes = input_shapes(train_dataset_cfg, model)
  if train_dataset_cfg.batch_size % partitioner.data_parallel_size:
    raise ValueError(f"batch size {train_dataset_cfg.batch_size} is not divisible by the "
                     f"{partitioner.data_parallel_size} data-parallel devices")
  trainer = Trainer(model, optimizer, partitioner, shapes, learning_rate)

  # Self-contained model_dir for inference: vocabulary + model config.
  max_length = max(train_dataset_cfg.task_feature_lengths.values())
  if jax.process_index() == 0:
    copy_vocabulary(vocabulary, model_dir)
    write_model_info(model_dir, model, languages, max_length)
    (Path(model_dir) / "config.gin").write_text(gin.operative_config_str())

  ckpt = checkpoints.Checkpointer(model_dir, checkpoint_cfg)
  data = pipeline.train_iterator(train_dataset_cfg, model.FEATURE_CONVERTER_CLS, random_seed)
  latest = ckpt.latest_step() if checkpoint_cfg.restore else None
  if latest is not None:
    state, data_state = ckpt.restore(latest, trainer.abstract_state)
    data.restore(data_state)
    print(f"[vmx] resumed from {model_dir}/checkpoint_{latest} (data position "
          f"{data.position})", flush=True)
  else:
    state = trainer.create_state(random_seed)
  start = int(jax.device_get(state.step))
  end = min(total_steps, stop_at_step or total_steps)

  writer = metrics_lib.create_writer(model_dir)
  # One Encoder (one jitted encode function) for every evaluation of this run.
  encoder = (Encoder(model, None, Tokenizer(vocabulary), languages, max_length,
                     eval_cfg.batch_size) if eval_cfg is not None else None)

  def evaluate(step):
    if eval_cfg is None:
      return {}
    from vmx.evaluation import tatoeba
    encoder.params = state.params
    with partitioner.context():
      res = tatoeba.evaluate(lambda s, l: encoder.encode(s, lang=l), eval_cfg.languages,
                             eval_cfg.data_dir, eval_cfg.english)
    scalars = {f"tatoeba/{l}": r["mean"] for l, r in res["languages"].items()}
    scalars["tatoeba/mean"] = res["mean"]["mean"]
    writer.write_scalars(step, scalars)
    per_lang = ", ".join(f"{l} {r['mean']:.1f}" for l, r in res["languages"].items())
    _print(f"[vmx] step {step}: tatoeba mean {res['mean']['mean']:.2f} ({per_lang})")
    return scalars

  bar = None
  if progress and jax.process_index() == 0:
    from tqdm.auto import tqdm
    bar = tqdm(total=end, initial=start, desc="train", unit="step", dynamic_ncols=True)
  _print = bar.write if bar is not None else (lambda s: print(s, flush=True))
  acc, last = None, {}
  t_log, steps_since = time.time(), 0
  try:
    if start == 0 and eval_cfg is not None and eval_period:
      last.update(evaluate(0))
    for step in range(start, end):
      try:
        batch = next(data)
      except StopIteration:
        raise RuntimeError(f"training data ran out at step {step}") from None
      state, m = trainer.step(state, batch)
      acc = merge_metrics(acc, m)
      steps_since += 1
      done = step + 1
      if bar is not None:
        bar.update(1)
      if done % log_period == 0 or done == end:
        scalars = compute_metrics(acc)
        dt = time.time() - t_log
        scalars["train/steps_per_sec"] = steps_since / dt
        scalars["train/pairs_per_sec"] = steps_since * train_dataset_cfg.batch_size / dt
        writer.write_scalars(done, scalars)
        last.update(scalars)
        if bar is not None:
          bar.set_postfix(loss=f"{scalars['train/loss']:.4f}")
        _print(f"[vmx] step {done}: " + ", ".join(
            f"{k.split('/')[-1]} {v:.4g}" for k, v in scalars.items()))
        acc, t_log, steps_since = None, time.time(), 0
      ckpt.save(done, state, data.state(), force=done == end)
      if eval_cfg is not None and eval_period and (done % eval_period == 0 or done == end):
        last.update(evaluate(done))
  finally:
    if bar is not None:
      bar.close()
    ckpt.wait()
    ckpt.close()
    writer.flush()
  return state, last
