"""The training loop: `train(...)`, gin-configurable with t5x's keyword names.

  python launch/train.py --gin_file=contrastive_tiny.gin --gin.MODEL_DIR="'/tmp/run'"

State: `TrainState(step, params, opt_state, flax_mutables, rng)`, sharded over a
('data', 'model') mesh by logical axis rules; one jitted step does forward,
backward, the optax update and the model's `after_update` hook (flax_mutables that
follow the new parameters: momentum encoders). The model's hooks also shard its
flax_mutables (`flax_mutables_axes`) and derive them from starting parameters
(`derive_mutables`); see vmx/models/base.py. A `MultiTaskConfig` feeds several tasks
into every step. The loss is computed on the global batch (the
sharding of every input and parameter is explicit, XLA inserts the collectives).
Checkpoints (orbax) hold params, optimizer state, step, RNG and the data
position; a run restarted with the same model_dir resumes from the newest intact
one (damaged ones are reported and set aside, see checkpoints.py).

Every process reads the same global batch stream and hands each of its devices
its rows, so a run's batches (and so its result) do not depend on the number of
processes. Non-finite values (any loss term, the gradients, the new parameters)
stop the run with a `NonFiniteError` naming the step and the terms, before anything
non-finite is logged or saved; the check reads the previous step's flags while the
current step runs, and the current step's before a log line or a checkpoint.
"""
from __future__ import annotations

import contextlib
import difflib
import os
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics

from vmx import storage
from vmx.data import devsets, pipeline
from vmx.data.vocab import copy_any_vocabulary, load_tokenizer
from vmx.errors import ConfigError, NonFiniteError
from vmx.gin_utils import check_range, positive_int
from vmx.inference import Encoder, write_model_info
from vmx.models.base import BaseModel, averaged
from vmx.training import checkpoints, grad_cache, initial_checkpoint, partitioning
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
    check_range(positive_int(batch_size), "TatoebaEvalConfig", "batch_size", batch_size,
                "a positive integer")
    self.languages, self.data_dir = list(languages), data_dir
    self.english, self.batch_size = english, batch_size


@gin.configurable
class HarnessEvalConfig:
  """Periodic evaluation during training with any tasks of the evaluation harness
  (`vmx.evaluation.harness`, e.g. ['dev'] for the dev sets carved from the training data,
  or ['dev', 'tatoeba', 'stsb']). Scalars written (and nameable by `train.best_metric`):
  `<task>/main_score` for each task, `<task>/<subset>` for each of its subsets (e.g.
  `dev/tico19/pt_BR`, `tatoeba/deu-eng`), and `dev/<set>` for each dev set. Tatoeba and
  dev default to the model's languages; the other fields are harness.EvalConfig's."""

  def __init__(self, tasks: Sequence[str] = ("dev",), data_dir: Optional[str] = None,
               tatoeba_languages: Optional[Sequence[str]] = None,
               dev_sets: Optional[Sequence[str]] = None, dev_max_sentences: Optional[int] = 1000,
               dev_languages: Optional[Sequence[str]] = None, batch_size: int = 256):
    from vmx.evaluation import harness
    check_range(positive_int(batch_size), "HarnessEvalConfig", "batch_size", batch_size,
                "a positive integer")
    try:
      self.tasks = harness.resolve_tasks(None, list(tasks))
    except ValueError as e:
      raise ConfigError(f"HarnessEvalConfig.tasks: {e}") from None
    extra = {} if dev_sets is None else {"dev_sets": devsets.check_names(
        dev_sets, "HarnessEvalConfig.dev_sets")}
    self.config = harness.EvalConfig(
        data_dir=data_dir, tatoeba_languages=tatoeba_languages,
        dev_max_sentences=dev_max_sentences, dev_languages=dev_languages, plots=False,
        progress=False, **extra)
    self.batch_size = batch_size

  def metric_names(self) -> list[str]:
    """The scalars known before the run (subsets depend on the data and the model)."""
    names = [f"{t}/main_score" for t in self.tasks]
    if "dev" in self.tasks:
      names += [f"dev/{s}" for s in self.config.dev_sets]
    return names

  def run(self, encoder) -> tuple[dict, str]:
    """(scalars, a one-line summary)."""
    import io
    from vmx.evaluation import harness
    # Quiet: the harness's per-task lines, and truncation at the run's MAX_LENGTH (the
    # same at every evaluation, so it does not bias the comparison between steps).
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=r".*longer than the model's max_length")
      results = harness.run(encoder, config=self.config, tasks=self.tasks)
    scalars, parts = {}, []
    for task, r in results.items():
      scalars[f"{task}/main_score"] = r["main_score"]
      for subs in r["scores"].values():
        for sub in subs:
          scalars[f"{task}/{sub['hf_subset']}"] = sub["main_score"]
      for name, v in r.get("sets", {}).items():
        scalars[f"dev/{name}"] = v
      parts.append(f"{task} {r['main_score']:.2f}" + (
          " (" + ", ".join(f"{k} {v:.2f}" for k, v in r["sets"].items()) + ")"
          if r.get("sets") else ""))
    return scalars, "; ".join(parts)


@gin.configurable
class Phase:
  """One phase of a run: `steps` optimizer steps on its own data, with its own model
  (objective; default: train's `model`) and optimizer (default: train's `optimizer`).

  A run is a list of phases (`train(phases=[...])`, EMMA-X's warm-up then EM). All phases
  share the parameters and flax_mutables (their models must build the same trees); the
  optimizer state carries over between phases with the same optimizer and starts anew for
  a phase with its own. The switch happens at a step boundary (logged, with a checkpoint);
  a checkpoint at step s belongs to the phase containing s (a phase's last step included),
  so a run killed inside any phase resumes in it, bit-exactly. Phase i reads its data
  with seed random_seed + 1000 i.
  """

  def __init__(self, name: str = gin.REQUIRED, steps: int = gin.REQUIRED,
               train_dataset_cfg=gin.REQUIRED, model: Optional[BaseModel] = None,
               optimizer: Optional[optax.GradientTransformation] = None,
               learning_rate: Optional[Callable] = None):
    check_range(isinstance(name, str) and bool(name), "Phase", "name", name, "a non-empty name")
    check_range(positive_int(steps), f"Phase({name!r})", "steps", steps,
                "a positive number of steps")
    check_range(isinstance(train_dataset_cfg, (pipeline.DatasetConfig, pipeline.MultiTaskConfig)),
                f"Phase({name!r})", "train_dataset_cfg", train_dataset_cfg,
                "a DatasetConfig or MultiTaskConfig (every phase needs data)")
    self.name, self.steps, self.train_dataset_cfg = name, steps, train_dataset_cfg
    self.model, self.optimizer, self.learning_rate = model, optimizer, learning_rate
    self.start = self.end = 0   # steps (start, end] of the run, set by `resolve_phases`


def resolve_phases(phases, model, train_dataset_cfg, optimizer, learning_rate,
                   total_steps) -> list:
  """The run's phases with defaults filled in and their step ranges; a run without
  `phases` is one phase 'train'. ConfigError for inconsistent settings."""
  if phases is None:
    if train_dataset_cfg is None:
      raise ConfigError("train: set train_dataset_cfg (or phases=[Phase(...), ...])")
    phases = [Phase("train", total_steps, train_dataset_cfg)]
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


def input_shapes(dataset_cfg, model: BaseModel) -> dict:
  """Global batch shapes of the model features: [B] for scalars, [B, length] otherwise
  (`task/feature` names for a MultiTaskConfig)."""
  return pipeline.model_feature_shapes(dataset_cfg, model.FEATURE_CONVERTER_CLS)


class Trainer:
  """Builds the sharded state and the jitted step for `model` on `partitioner`'s mesh."""

  def __init__(self, model: BaseModel, optimizer: optax.GradientTransformation,
               partitioner: partitioning.Partitioner, shapes: Mapping[str, tuple],
               learning_rate: Optional[Callable] = None, grad_cache_chunks: int = 1):
    self.model, self.tx, self.partitioner = model, optimizer, partitioner
    self.shapes = dict(shapes)
    self.learning_rate = learning_rate
    grad_cache.check(model, grad_cache_chunks, self.shapes, partitioner.data_parallel_size)
    self.grad_cache_chunks = grad_cache_chunks
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
    params_axes = partitioner.params_logical_axes(variables_shape["params_axes"])
    params_sh = partitioner.shardings_of(params_axes)
    repl = partitioner.replicated()

    opt_sh = opt_state_shardings(abstract.opt_state, abstract.params, params_sh, repl)
    # State not trained by gradients: sharded by the model's logical axes (a queue along
    # 'data', a momentum encoder like its parameters), else replicated.
    mutables_axes = model.flax_mutables_axes(params_axes, abstract.flax_mutables)
    mutables_sh = (jax.tree.map(lambda _: repl, abstract.flax_mutables)
                   if mutables_axes is None else partitioner.shardings_of(mutables_axes))
    self.state_shardings = TrainState(
        step=repl, params=params_sh, opt_state=opt_sh, flax_mutables=mutables_sh, rng=repl)
    self.abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract,
        self.state_shardings)
    self.init_state = jax.jit(init, out_shardings=self.state_shardings)
    self.train_step = jax.jit(self._train_step, in_shardings=(self.state_shardings,
                                                              self.batch_shardings),
                              out_shardings=(self.state_shardings, repl, repl),
                              donate_argnums=(0,))
    self.nonfinite_names: list[str] = []  # what each flag of `nonfinite` checks (set at trace)
    self.nonfinite = None                 # [n] bool flags of the last step (device array)

  def _loss_and_grads(self, state: TrainState, batch, dropout_rng):
    model = self.model
    if self.grad_cache_chunks > 1:
      loss, metrics, grads, mutables = grad_cache.loss_and_grads(
          model, state.params, batch, dropout_rng, self.grad_cache_chunks, state.flax_mutables)
      return loss, averaged(metrics), grads, mutables
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
    # The model's post-update hook sees the NEW parameters (e.g. a momentum encoder).
    mutables = self.model.after_update(params, mutables, state.step + 1)
    metrics = dict(metrics)
    metrics["grad_norm"] = clu_metrics.Average.from_model_output(optax.tree.norm(grads))
    if self.learning_rate is not None:
      metrics["learning_rate"] = clu_metrics.LastValue.from_model_output(
          jnp.asarray(self.learning_rate(state.step)))
    # One flag per loss term / metric, the gradients and the updated parameters.
    names = sorted(metrics)
    flags = [~jnp.all(jnp.isfinite(metrics[k].compute())) for k in names]
    flags.append(~jnp.all(jnp.stack([jnp.all(jnp.isfinite(p))
                                     for p in jax.tree.leaves(params)])))
    self.nonfinite_names = ["gradients" if k == "grad_norm" else k for k in names] + \
        ["parameters (after the update)"]
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         flax_mutables=mutables), metrics, jnp.stack(flags)

  def create_state(self, seed: int) -> TrainState:
    with self.partitioner.context():
      return self.init_state(jax.random.PRNGKey(seed))

  def replace_params(self, state: TrainState, params) -> TrainState:
    """`state` with new parameters, the optimizer state initialized for them and the
    model state derived from them (`derive_mutables`: a momentum encoder's copy)."""
    with self.partitioner.context():
      opt_state = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)(params)
      mutables = jax.jit(self.model.derive_mutables,
                         out_shardings=self.state_shardings.flax_mutables)(
                             params, state.flax_mutables)
    return state.replace(params=params, opt_state=opt_state, flax_mutables=mutables)

  def step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One update on the GLOBAL batch (numpy, identical on every process); the step's
    non-finite flags are left in `self.nonfinite` (see `check_finite`)."""
    batch = self.partitioner.global_batch({k: batch[k] for k in self.shapes},
                                          self.batch_shardings)
    with self.partitioner.context():
      state, metrics, self.nonfinite = self.train_step(state, batch)
    return state, metrics

  def nonfinite_terms(self, flags) -> list[str]:
    """Names of the non-finite terms in a step's flags ([] if all are finite)."""
    flags = np.asarray(local_value(flags))
    return [n for n, f in zip(self.nonfinite_names, flags) if f]


def opt_state_shardings(opt_state, params, params_sh, repl):
  """Each optimizer-state leaf sharded like the parameter it belongs to (same shape),
  else replicated: a leaf belongs to the parameter whose dict path ends its own path
  (optax states keep the parameter tree inside: `mu['encoder']['layers_0']...`), which
  also covers `multi_optimizer`'s per-subset states."""
  def keys(path):
    return tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)
  by_path = {keys(p): (x.shape, sh) for (p, x), sh in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(params_sh))}
  longest = max((len(k) for k in by_path), default=0)

  def leaf_sharding(path, leaf):
    path = keys(path)
    for n in range(min(longest, len(path)), 0, -1):
      hit = by_path.get(path[-n:])
      if hit is not None:
        return hit[1] if hit[0] == leaf.shape else repl
    return repl
  return jax.tree_util.tree_map_with_path(leaf_sharding, opt_state)


def local_value(x):
  """This process's copy of a replicated (possibly multi-process) array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)
  return x


def host_params(params):
  """Parameters usable by single-process code (evaluation): gathered across processes."""
  if jax.process_count() == 1:
    return params
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(params, tiled=True)


def merge_metrics(acc: Optional[dict], new: dict) -> dict:
  if acc is None:
    return new
  return {k: acc[k].merge(v) for k, v in new.items()}


def compute_metrics(acc: dict) -> dict:
  return {f"train/{k}": float(jax.device_get(v.compute())) for k, v in acc.items()}


def check_vocabulary_fits(model: BaseModel, vocabulary: str):
  """Token ids >= the embedding table's size would be clamped silently by the gather."""
  sizes = []

  def walk(cfg):
    if isinstance(cfg, dict):
      for k, v in cfg.items():
        if k == "vocab_size" and isinstance(v, int):
          sizes.append(v)
        walk(v)
    elif isinstance(cfg, list):
      for v in cfg:
        walk(v)
  walk(model.get_config())
  pieces = load_tokenizer(vocabulary).vocab_size
  if sizes:
    check_range(min(sizes) >= pieces, "TransformerEncoder", "vocab_size", min(sizes),
                f"at least the {pieces} pieces of the vocabulary {vocabulary}")


def check_train_args(total_steps, log_period, eval_period, stop_at_step, batch_size,
                     data_parallel_size):
  """Range checks naming the binding (and macro), before anything is built."""
  check_range(positive_int(total_steps), "train", "total_steps", total_steps,
              "a positive number of steps")
  check_range(positive_int(log_period), "train", "log_period", log_period,
              "a positive number of steps")
  check_range(isinstance(eval_period, int) and eval_period >= 0, "train", "eval_period",
              eval_period, "a number of steps >= 0 (0: no evaluation)")
  check_range(stop_at_step is None or positive_int(stop_at_step), "train", "stop_at_step",
              stop_at_step, "None or a positive step")
  sizes = dict(batch_size) if isinstance(batch_size, Mapping) else {None: batch_size}
  for key, size in sizes.items():
    check_range(size % data_parallel_size == 0, "DatasetConfig" if key is None else
                f"MultiTaskConfig.tasks[{key!r}] DatasetConfig", "batch_size", size,
                f"a multiple of the {data_parallel_size} data-parallel devices")


@gin.configurable
def train(*, model: BaseModel = gin.REQUIRED,
          train_dataset_cfg: pipeline.DatasetConfig | pipeline.MultiTaskConfig | None = None,
          optimizer: optax.GradientTransformation = gin.REQUIRED,
          model_dir: str = gin.REQUIRED, total_steps: int = gin.REQUIRED,
          vocabulary: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
          learning_rate: Optional[Callable] = None,
          partitioner: Optional[partitioning.Partitioner] = None,
          checkpoint_cfg: Optional[checkpoints.CheckpointConfig] = None,
          eval_cfg: Union[None, TatoebaEvalConfig, HarnessEvalConfig] = None,
          eval_period: int = 1000,
          log_period: int = 50, random_seed: int = 0, progress: bool = True,
          stop_at_step: Optional[int] = None, initial_checkpoint_path: Optional[str] = None,
          initial_checkpoint_assignment: Optional[Sequence[tuple[str, str]]] = None,
          phases: Optional[Sequence[Phase]] = None,
          grad_cache_chunks: int = 1, best_metric: Optional[str] = None,
          best_mode: str = "max") -> tuple[TrainState, dict]:
  """Trains `model` for `total_steps` steps (resuming from model_dir), returns (state, last metrics).

  `stop_at_step` ends this invocation early (as a preempted job would) without
  changing the schedule, which is defined by `total_steps`. A new run (no checkpoint
  in model_dir) with `initial_checkpoint_path` starts from that model directory's
  parameters, renamed by `initial_checkpoint_assignment` (default: the model's
  INITIAL_CHECKPOINT_ASSIGNMENT); see vmx/training/initial_checkpoint.py.
  `phases` (instead of `train_dataset_cfg`): a list of `Phase`s run one after the
  other, their steps adding up to `total_steps`; `model` is then the default objective
  and the model written for inference.
  `grad_cache_chunks` > 1: each step's gradients by GradCache in that many chunks
  (vmx/training/grad_cache.py: the same gradients, memory of one chunk's activations).
  `best_metric` (an evaluation metric, e.g. 'tatoeba/mean'): after every evaluation the
  parameters are kept in MODEL_DIR/best/ if the metric beats the best so far (`best_mode`
  'max' or 'min'); see checkpoints.BestCheckpointer.
  """
  if not isinstance(model_dir, (str, os.PathLike)) or not str(model_dir):
    check_range(False, "train", "model_dir", model_dir, "a path: set MODEL_DIR")
  model_dir = str(model_dir)
  partitioner = partitioner or partitioning.Partitioner()
  checkpoint_cfg = checkpoint_cfg or checkpoints.CheckpointConfig()
  check_train_args(total_steps, log_period, eval_period, stop_at_step, {}, 1)
  check_best_metric(best_metric, eval_cfg, eval_period)
  # Reads (and checks) a resumed run's best-checkpoint record; writes nothing yet.
  best = (checkpoints.BestCheckpointer(model_dir, best_metric, best_mode)
          if best_metric else None)
  phases = resolve_phases(phases, model, train_dataset_cfg, optimizer, learning_rate,
                          total_steps)
  trainers = []
  for i, ph in enumerate(phases):
    where = f"Phase({ph.name!r}) " if len(phases) > 1 else ""
    batch_sizes = {k: c.batch_size for k, c in pipeline.task_configs(ph.train_dataset_cfg).items()}
    try:
      check_train_args(total_steps, log_period, eval_period, stop_at_step, batch_sizes,
                       partitioner.data_parallel_size)
      examples = pipeline.num_examples(ph.train_dataset_cfg)
      empty = sorted(str(k) for k, n in examples.items() if n == 0)
      if empty:
        raise ConfigError(f"the data of task(s) {empty} have no examples")
      ph.model.validate_data(examples, batch_sizes)
      trainers.append(Trainer(ph.model, ph.optimizer, partitioner,
                              input_shapes(ph.train_dataset_cfg, ph.model), ph.learning_rate,
                              grad_cache_chunks))
    except ConfigError as e:
      if not where:
        raise
      raise ConfigError(f"{where}{e}") from None
    if i:
      check_same_state(phases[0], trainers[0], ph, trainers[i])
  trainer = trainers[0]

  check_vocabulary_fits(model, vocabulary)
  # Self-contained model_dir for inference: vocabulary + model config.
  max_length = max(n for ph in phases
                   for n in pipeline.token_lengths(ph.train_dataset_cfg,
                                                   ph.model.FEATURE_CONVERTER_CLS))
  storage.path(model_dir).mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    vocab_name = copy_any_vocabulary(vocabulary, model_dir)
    write_model_info(model_dir, model, languages, max_length, vocab_name)
    storage.write_atomic(storage.path(model_dir) / "config.gin", gin.operative_config_str())

  ckpt = checkpoints.Checkpointer(model_dir, checkpoint_cfg)

  def phase_data(i):
    ph = phases[i]
    return pipeline.train_iterator(ph.train_dataset_cfg, ph.model.FEATURE_CONVERTER_CLS,
                                   random_seed + 1000 * i)

  restored = (ckpt.restore_latest(lambda s: trainers[phase_index(phases, s)].abstract_state)
              if checkpoint_cfg.restore else None)
  if restored is not None:
    latest, state, data_state = restored
    p = phase_index(phases, latest)
    data = phase_data(p)
    data.restore(data_state)
    print(f"[vmx] resumed from {model_dir}/checkpoint_{latest} (data position "
          f"{data.position}" + (f", phase {phases[p].name!r}" if len(phases) > 1 else "") + ")",
          flush=True)
  else:
    p = 0
    data = phase_data(0)
    state = trainer.create_state(random_seed)
    if initial_checkpoint_path:
      rules = (model.INITIAL_CHECKPOINT_ASSIGNMENT if initial_checkpoint_assignment is None
               else initial_checkpoint_assignment)
      state = trainer.replace_params(state, initial_checkpoint.load(
          state.params, trainer.state_shardings.params, initial_checkpoint_path, rules))
  start = int(local_value(state.step))
  end = min(total_steps, stop_at_step or total_steps)

  # metrics.jsonl keeps one row per logged step: rows after the resumed step (written
  # by the stopped run after its last checkpoint) are dropped, as the run redoes them.
  writer = metrics_lib.create_writer(model_dir, resume_step=start)
  # One Encoder (one jitted encode function) for every evaluation of this run.
  encoder = (Encoder(model, None, load_tokenizer(vocabulary), languages, max_length,
                     eval_cfg.batch_size) if eval_cfg is not None else None)

  timer = {"eval_s": 0.0, "start": time.time()}

  def evaluate(step):
    if eval_cfg is None:
      return {}
    t0 = time.time()
    encoder.params = host_params(state.params)
    # Several processes: each evaluates the gathered parameters on its own first device.
    with (partitioner.context() if jax.process_count() == 1 else contextlib.nullcontext()):
      if isinstance(eval_cfg, HarnessEvalConfig):
        scalars, line = eval_cfg.run(encoder)
      else:
        from vmx.evaluation import tatoeba
        res = tatoeba.evaluate(lambda s, l: encoder.encode(s, lang=l), eval_cfg.languages,
                               eval_cfg.data_dir, eval_cfg.english)
        scalars = {f"tatoeba/{l}": r["mean"] for l, r in res["languages"].items()}
        scalars["tatoeba/mean"] = res["mean"]["mean"]
        per_lang = ", ".join(f"{l} {r['mean']:.1f}" for l, r in res["languages"].items())
        line = f"tatoeba mean {res['mean']['mean']:.2f} ({per_lang})"
    seconds = time.time() - t0
    timer["eval_s"] += seconds
    # Evaluation's share of this process's wall time so far (what EVAL_PERIOD trades).
    share = 100.0 * timer["eval_s"] / max(time.time() - timer["start"], 1e-9)
    scalars["eval/seconds"] = seconds
    writer.write_scalars(step, scalars)
    _print(f"[vmx] step {step}: {line} [{seconds:.1f} s; evaluation {share:.1f}% of the run's "
           f"time so far]")
    if best is not None:
      if best_metric not in scalars:   # a subset name, checked against the first results
        close = difflib.get_close_matches(str(best_metric), list(scalars), n=1)
        raise ConfigError(f"train.best_metric={best_metric!r} is not a metric of this run's "
                          f"evaluation" + (f"; did you mean {close[0]!r}?" if close else ""))
      before = best.record
      if best.update(step, scalars[best_metric], state.params):
        was = (f"; was {before['value']:.2f} at step {before['step']}" if before else "")
        _print(f"[vmx] step {step}: best {best_metric} {scalars[best_metric]:.2f}{was} "
               f"-> {checkpoints.BEST_DIR}/checkpoint_{step}")
    return scalars

  def eval_due(step):
    return eval_cfg is not None and eval_period and (step % eval_period == 0 or step == end)

  def check_finite(step, flags, tr):
    bad = tr.nonfinite_terms(flags)
    if bad:
      good = ckpt.latest_step()
      kept = f"last checkpoint: checkpoint_{good}" if good is not None else \
          "no checkpoint was written"
      raise NonFiniteError(
          f"non-finite values at step {step}: {', '.join(bad)}; stopped without logging or "
          f"saving them ({kept}, unchanged). Lower the learning rate or set CLIP_GRAD_NORM")

  def enter_phase(state, i):
    """Switch to phase i at its first step: new data, a new optimizer state if the
    phase brings its own optimizer."""
    ph, prev = phases[i], phases[i - 1]
    if ph.optimizer is not prev.optimizer:
      with partitioner.context():
        opt_state = jax.jit(ph.optimizer.init,
                            out_shardings=trainers[i].state_shardings.opt_state)(state.params)
      state = state.replace(opt_state=opt_state)
    _print(f"[vmx] step {ph.start}: phase {ph.name!r} ({ph.steps} steps, to step {ph.end})"
           + (", new optimizer state" if ph.optimizer is not prev.optimizer else ""))
    if not metrics_lib.has_row(model_dir, ph.start, "train/phase"):   # resumed at the switch
      writer.write_scalars(ph.start, {"train/phase": float(i)})
    return state, phase_data(i)

  bar = None
  if progress and jax.process_index() == 0:
    from tqdm.auto import tqdm
    bar = tqdm(total=end, initial=start, desc="train", unit="step", dynamic_ncols=True)
  _print = bar.write if bar is not None else (lambda s: print(s, flush=True))
  acc, last = None, {}
  t_log, steps_since = time.time(), 0
  try:
    # Step 0, or (one process) an evaluation that the stopped run did not get to: every
    # evaluation writes eval/seconds (runs before it wrote it: tatoeba/mean).
    if eval_due(start) and (start == 0 or (jax.process_count() == 1 and not metrics_lib.has_row(
        model_dir, start, "eval/seconds", "tatoeba/mean"))):
      last.update(evaluate(start))
    if len(phases) > 1 and start == 0:
      _print(f"[vmx] phase {phases[0].name!r} ({phases[0].steps} steps, to step "
             f"{phases[0].end})")
    pending = None  # (step, flags, trainer) of the previous step, checked while this one runs
    for step in range(start, end):
      if step == phases[p].end:
        if pending is not None:
          check_finite(*pending)
          pending = None
        p += 1
        state, data = enter_phase(state, p)
      tr = trainers[p]
      try:
        batch = next(data)
      except StopIteration:
        raise RuntimeError(f"training data ran out at step {step}") from None
      state, m = tr.step(state, batch)
      done = step + 1
      if pending is not None:
        check_finite(*pending)
      pending = (done, tr.nonfinite, tr)
      acc = merge_metrics(acc, jax.tree.map(local_value, m))
      steps_since += 1
      if bar is not None:
        bar.update(1)
      phase_end = done == phases[p].end
      log_due = done % log_period == 0 or done == end or phase_end
      save_due = ckpt.due(done, force=done == end or (phase_end and len(phases) > 1))
      if log_due or save_due or eval_due(done):
        check_finite(*pending)
        pending = None
      if log_due:
        scalars = compute_metrics(acc)
        dt = time.time() - t_log
        scalars["train/steps_per_sec"] = steps_since / dt
        scalars["train/examples_per_sec"] = (steps_since * phases[p].train_dataset_cfg.batch_size
                                             / dt)
        writer.write_scalars(done, scalars)
        writer.flush()
        last.update(scalars)
        if bar is not None:
          bar.set_postfix(loss=f"{scalars['train/loss']:.4f}")
        _print(f"[vmx] step {done}: " + ", ".join(
            f"{k.split('/')[-1]} {v:.4g}" for k, v in scalars.items()))
        acc, t_log, steps_since = None, time.time(), 0
      ckpt.save(done, state, data.state(),
                force=done == end or (phase_end and len(phases) > 1))
      if eval_due(done):
        last.update(evaluate(done))
  finally:
    if bar is not None:
      bar.close()
    ckpt.close()
    if best is not None:
      best.close()
    writer.close()
  return state, last


def eval_metric_names(eval_cfg) -> list[str]:
  """The scalars a periodic evaluation writes (what train.best_metric may name)."""
  if eval_cfg is None:
    return []
  if isinstance(eval_cfg, HarnessEvalConfig):
    return eval_cfg.metric_names()
  return ["tatoeba/mean"] + [f"tatoeba/{l}" for l in eval_cfg.languages]


def check_best_metric(best_metric, eval_cfg, eval_period):
  if best_metric is None:
    return
  names = eval_metric_names(eval_cfg)
  if not names or not eval_period:
    raise ConfigError(f"train.best_metric={best_metric!r} needs periodic evaluation: set "
                      "train.eval_cfg (TatoebaEvalConfig or HarnessEvalConfig) and "
                      "EVAL_PERIOD > 0")
  if best_metric not in names and not (
      isinstance(eval_cfg, HarnessEvalConfig)
      and any(str(best_metric).startswith(f"{t}/") for t in eval_cfg.tasks)):
    close = difflib.get_close_matches(str(best_metric), names, n=1)
    raise ConfigError(f"train.best_metric={best_metric!r} is not a metric of this run's "
                      f"evaluation ({', '.join(names[:8])}"
                      f"{', ...' if len(names) > 8 else ''})"
                      + (f"; did you mean {close[0]!r}?" if close else ""))


def check_same_state(first: Phase, first_trainer: Trainer, phase: Phase, trainer: Trainer):
  """Every phase trains the same parameters and flax_mutables (names and shapes)."""
  def shapes(tree):
    from flax import traverse_util
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
