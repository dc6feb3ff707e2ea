"""The training loop: `train(...)`, gin-configurable with t5x's keyword names.

  python launch/train.py --gin_file=contrastive_tiny.gin --gin.MODEL_DIR="'/tmp/run'"

`train()` is the loop; what it loops over lives beside it: the jitted step and its
sharded `TrainState` (vmx/training/step.py), the phases of a run
(vmx/training/phases.py), periodic evaluation (an evaluator of
vmx/evaluation/periodic.py, handed an `Encoder` of the current parameters) and
MODEL_DIR (vmx/modeldir/: checkpoints, best/, vmx_model.json, config.gin). A
`MultiTaskConfig` feeds several tasks into every step. Checkpoints (orbax) hold params,
optimizer state, step, RNG and the data position; a run restarted with the same
model_dir resumes from the newest intact one (damaged ones are reported and set aside,
see vmx/modeldir/checkpoints.py).

Each process reads the rows of the global batch its devices hold (the index reader,
vmx/data/stream.py; the seqio reader reads the whole global batch on every process), so a
run's batches (and so its result) do not depend on the number of processes. Non-finite
values (any loss term, the gradients, the new parameters) stop the run with a
`NonFiniteError` naming the step and the terms, before anything non-finite is logged or
saved; the check reads the previous step's flags while the current step runs, and the
current step's before a log line or a checkpoint.
"""
from __future__ import annotations

import contextlib
import difflib
import os
import time
from typing import Callable, Mapping, Optional, Sequence

import gin
import jax
import optax
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from vmx.data import pipeline
from vmx.data.vocab import load_tokenizer
from vmx.errors import ConfigError, NonFiniteError
from vmx.evaluation.periodic import (Evaluator, HarnessEvalConfig,  # noqa: F401 (old path)
                                     TatoebaEvalConfig, check_best_metric)
from vmx.gin_utils import check_range, positive_int
from vmx.inference import Encoder
from vmx.modeldir import checkpoints, layout
from vmx.modeldir import run as run_lib
from vmx.models.base import BaseModel
from vmx.training import initial_checkpoint, partitioning
from vmx.training import metrics as metrics_lib
from vmx.training.phases import (Phase, check_same_state, phase_index,  # noqa: F401
                                 resolve_phases)
from vmx.training.prefetch import Prefetcher
from vmx.training.preemption import Preempted, PreemptionWatch
from vmx.training.step import (TrainState, Trainer, compute_metrics,  # noqa: F401 (old path)
                               host_params, input_shapes, local_value, merge_metrics,
                               opt_state_shardings)


def check_vocabulary_fits(model: BaseModel, vocabulary: str):
  """Token ids >= the embedding table's size would be clamped silently by the gather."""
  pieces = load_tokenizer(vocabulary).vocab_size
  if model.vocab_size is not None:
    check_range(model.vocab_size >= pieces, "TransformerEncoder", "vocab_size",
                model.vocab_size, f"at least the {pieces} pieces of the vocabulary {vocabulary}")


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
          eval_cfg: Optional[Evaluator] = None,
          eval_period: int = 1000,
          log_period: int = 50, random_seed: int = 0, progress: bool = True,
          stop_at_step: Optional[int] = None, initial_checkpoint_path: Optional[str] = None,
          initial_checkpoint_assignment: Optional[Sequence[tuple[str, str]]] = None,
          phases: Optional[Sequence[Phase]] = None,
          grad_cache_chunks: int = 1, best_metric: Optional[str] = None,
          best_mode: str = "max", allow_config_change: bool = False,
          allow_data_change: bool = False, fresh: bool = False,
          prefetch_batches: int = 2) -> tuple[TrainState, dict]:
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
  The run directory has one writer (MODEL_DIR/vmx.lock) and its stored config is the
  contract of a restart: a run that would continue with another model, data or
  optimization is refused before anything is written (`allow_config_change`: accept the
  changes; `fresh`: move the earlier run aside and start anew); vmx/modeldir/run.py.
  The checkpoint's data state describes the stream (vmx/data/stream.py): a resume whose
  data (mixture, tasks, batch size, lengths, seed) differ is refused, saying what changed,
  unless `allow_data_change` (the new stream from the checkpoint's step).
  SIGTERM / SIGINT save a checkpoint at the next step boundary and raise `Preempted`
  (vmx/training/preemption.py).
  `prefetch_batches`: batches read and placed on the devices ahead of the step by a
  background thread (vmx/training/prefetch.py; 0: in the loop); the seconds each log
  period waited for input are logged as `train/input_wait_fraction`.
  """
  if not isinstance(model_dir, (str, os.PathLike)) or not str(model_dir):
    check_range(False, "train", "model_dir", model_dir, "a path: set MODEL_DIR")
  model_dir = str(model_dir)
  partitioner = partitioner or partitioning.Partitioner()
  checkpoint_cfg = checkpoint_cfg or checkpoints.CheckpointConfig()
  check_train_args(total_steps, log_period, eval_period, stop_at_step, {}, 1)
  check_range(isinstance(prefetch_batches, int) and not isinstance(prefetch_batches, bool)
              and prefetch_batches >= 0, "train", "prefetch_batches", prefetch_batches,
              "a number of batches >= 0 (0: no prefetch)")
  check_best_metric(best_metric, eval_cfg, eval_period)
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
  check_vocabulary_fits(model, vocabulary)
  # The longest input of any phase: what inference truncates to (vmx_model.json).
  max_length = max(n for ph in phases
                   for n in pipeline.token_lengths(ph.train_dataset_cfg,
                                                   ph.model.FEATURE_CONVERTER_CLS))
  primary = jax.process_index() == 0
  operative_config = gin.operative_config_str()
  lock = run_lib.open_run(model_dir, model, operative_config, allow_config_change, fresh,
                          primary)
  try:
    return _run(
        model=model, phases=phases, trainers=trainers, model_dir=model_dir,
        total_steps=total_steps, vocabulary=vocabulary, languages=languages,
        partitioner=partitioner, checkpoint_cfg=checkpoint_cfg, eval_cfg=eval_cfg,
        eval_period=eval_period, log_period=log_period, random_seed=random_seed,
        progress=progress, stop_at_step=stop_at_step,
        initial_checkpoint_path=initial_checkpoint_path,
        initial_checkpoint_assignment=initial_checkpoint_assignment, best_metric=best_metric,
        best_mode=best_mode, max_length=max_length, operative_config=operative_config,
        lock=lock, prefetch_batches=prefetch_batches, allow_data_change=allow_data_change)
  finally:
    if lock is not None:
      lock.release()


def _report_input(it):
  """Several processes: how much of each batch this one read (the index reader: its rows)."""
  rows = getattr(it, "rows", None)
  share = ("the whole global batch (the seqio reader)" if rows is None else
           ", ".join(f"{len(r)} rows{'' if k is None else ' of ' + k}" for k, r in rows.items()))
  print(f"[vmx] process {jax.process_index()} of {jax.process_count()} read {share} per step"
        + (f"; {it.examples_read} examples in all (read ahead included)"
           if hasattr(it, "examples_read") else ""), flush=True)


def _run(*, model, phases, trainers, model_dir, total_steps, vocabulary, languages, partitioner,
         checkpoint_cfg, eval_cfg, eval_period, log_period, random_seed, progress,
         stop_at_step, initial_checkpoint_path, initial_checkpoint_assignment, best_metric,
         best_mode, max_length, operative_config, lock, prefetch_batches, allow_data_change):
  """The body of `train` once the run directory is open (its lock held by process 0)."""
  trainer, primary = trainers[0], jax.process_index() == 0
  if jax.process_count() > 1:   # the other processes wait for open_run (--fresh moves files)
    multihost_utils.sync_global_devices("vmx.open_run")
  # Reads (and checks) a resumed run's best-checkpoint record; writes nothing yet.
  best = (checkpoints.BestCheckpointer(model_dir, best_metric, best_mode)
          if best_metric else None)
  ckpt = checkpoints.Checkpointer(model_dir, checkpoint_cfg)

  def phase_data(i, data_state=None):
    ph, tr = phases[i], trainers[i]
    args = (ph.train_dataset_cfg, ph.model.FEATURE_CONVERTER_CLS, random_seed + 1000 * i)
    it = (pipeline.train_iterator(*args, tr.local_rows(), progress=primary)
          if data_state is None else
          pipeline.resume_iterator(*args, data_state, tr.local_rows(), allow_data_change))
    return Prefetcher(it, tr.placer(it.rows), prefetch_batches)

  restored = (ckpt.restore_latest(lambda s: trainers[phase_index(phases, s)].abstract_state)
              if checkpoint_cfg.restore else None)
  if restored is not None:
    latest, state, data_state = restored
    p = phase_index(phases, latest)
    data = phase_data(p, data_state)
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
    n = phases[0].model.prefill_batches(state.flax_mutables)
    if n:   # e.g. InfoXLM's queue of negatives, filled before step 1 (§4.1)
      print(f"[vmx] filling the model state before step 1: {n} batches, forward only",
            flush=True)
      state = trainer.prefill(state, data)
  start = int(local_value(state.step))
  end = min(total_steps, stop_at_step or total_steps)
  # Self-contained model_dir for inference (vocabulary, model config) and the run's config:
  # written once the restore succeeded, so a refused restart changes nothing.
  if primary:
    layout.write_inference_files(model_dir, model, languages, max_length, vocabulary)
    layout.write_config(model_dir, operative_config)

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
      scalars, line = eval_cfg.run(encoder)
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
               f"-> {layout.BEST_DIR}/{layout.CHECKPOINT_PREFIX}_{step}")
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
    bar = tqdm(total=end, initial=start, desc="train", unit="step", dynamic_ncols=True)
  _print = bar.write if bar is not None else (lambda s: print(s, flush=True))
  acc, last = None, {}
  t_log, steps_since, waited = time.time(), 0, 0.0
  watch = PreemptionWatch()
  watch.install()
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
        data.close()
        state, data = enter_phase(state, p)
      tr = trainers[p]
      t_wait = time.perf_counter()
      try:
        batch = next(data)
      except StopIteration:
        raise RuntimeError(f"training data ran out at step {step}") from None
      waited += time.perf_counter() - t_wait
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
      # every process, every step (one answer for all); at the end there is nothing to stop
      preempted = watch.requested(done) and done < end
      log_due = done % log_period == 0 or done == end or phase_end
      force = done == end or (phase_end and len(phases) > 1) or preempted
      save_due = ckpt.due(done, force=force)
      if log_due or save_due or eval_due(done):
        check_finite(*pending)
        pending = None
      if log_due:
        scalars = compute_metrics(acc)
        dt = time.time() - t_log
        scalars["train/steps_per_sec"] = steps_since / dt
        scalars["train/examples_per_sec"] = (steps_since * phases[p].train_dataset_cfg.batch_size
                                             / dt)
        scalars["train/input_wait_fraction"] = min(1.0, waited / dt)
        writer.write_scalars(done, scalars)
        writer.flush()
        last.update(scalars)
        if bar is not None:
          bar.set_postfix(loss=f"{scalars['train/loss']:.4f}")
        _print(f"[vmx] step {done}: " + ", ".join(
            f"{k.split('/')[-1]} {v:.4g}" for k, v in scalars.items()))
        acc, t_log, steps_since, waited = None, time.time(), 0, 0.0
      if ckpt.save(done, state, data.state(), force=force) and lock is not None:
        lock.refresh()
      if preempted:
        raise Preempted(f"{watch.signal} at step {done}: saved "
                        f"{layout.step_dir(model_dir, done)}; rerun the same command to "
                        f"resume from it")
      if eval_due(done):
        last.update(evaluate(done))
    if jax.process_count() > 1:
      _report_input(data.data)
  finally:
    watch.uninstall()
    data.close()
    if bar is not None:
      bar.close()
    ckpt.close()
    if best is not None:
      best.close()
    writer.close()
  return state, last


