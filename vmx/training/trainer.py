"""The training loop: `train(...)`, gin-configurable with t5x's keyword names.

  python launch/train.py --gin_file=contrastive_tiny.gin --gin.MODEL_DIR="'/tmp/run'"

`train()` checks the configuration (every binding's range, every phase's data and
shapes) before anything is built, opens the run directory (its lock, the restart
contract) and runs the loop (vmx/training/loop.py). What the loop loops over lives
beside it: the jitted step and its sharded `TrainState` (vmx/training/step.py), the phases
of a run (vmx/training/phases.py), periodic evaluation (an evaluator of
vmx/evaluation/periodic.py, handed an `Encoder` of the current parameters) and MODEL_DIR
(vmx/modeldir/: checkpoints, best/, vmx_model.json, config.gin). A
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

import dataclasses
import os
from typing import Callable, Optional, Sequence, Union

import gin
import jax
import optax

from vmx import cli, gin_utils
from vmx.data.vocab import load_tokenizer
from vmx.errors import ConfigError
from vmx.evaluation.periodic import PeriodicEvaluation, check_best_metric
from vmx.gin_utils import check_range, positive_int
from vmx.modeldir import checkpoints
from vmx.modeldir import run as run_lib
from vmx.models.base import BaseModel
from vmx.training import partitioning
from vmx.training.loop import LoopSettings, RunFiles, TrainingRun
from vmx.training.phases import Phase, check_same_state, phase_index, resolve_phases
from vmx.training.step import TrainState, TrainStep


def check_vocabulary_fits(model: BaseModel, vocabulary: str):
  """Token ids >= the embedding table's size would be clamped silently by the gather."""
  pieces = load_tokenizer(vocabulary).vocab_size
  if model.vocab_size is not None:
    check_range(model.vocab_size >= pieces, "TransformerEncoder", "vocab_size",
                model.vocab_size, f"at least the {pieces} pieces of the vocabulary {vocabulary}")


def check_train_args(total_steps, log_period, eval_period, stop_at_step):
  """Range checks naming the binding (and macro), before anything is built."""
  check_range(positive_int(total_steps), "train", "total_steps", total_steps,
              "a positive number of steps")
  check_range(positive_int(log_period), "train", "log_period", log_period,
              "a positive number of steps")
  check_range(isinstance(eval_period, int) and eval_period >= 0, "train", "eval_period",
              eval_period, "a number of steps >= 0 (0: no evaluation)")
  check_range(stop_at_step is None or positive_int(stop_at_step), "train", "stop_at_step",
              stop_at_step, "None or a positive step")


@gin.configurable
def train(*, model: BaseModel = gin.REQUIRED,
          train_dataset_cfg=None,
          optimizer: optax.GradientTransformation = gin.REQUIRED,
          model_dir: str = gin.REQUIRED, total_steps: int = gin.REQUIRED,
          vocabulary: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
          learning_rate: Optional[Callable] = None,
          partitioner: Optional[partitioning.Partitioner] = None,
          checkpoint_cfg: Optional[checkpoints.CheckpointConfig] = None,
          eval_cfg: Optional[PeriodicEvaluation] = None,
          eval_period: int = 1000,
          log_period: int = 50, random_seed: int = 0, progress: bool = True,
          stop_at_step: Optional[int] = None, initial_checkpoint_path: Optional[str] = None,
          initial_checkpoint_assignment: Optional[Sequence[tuple[str, str]]] = None,
          phases: Optional[Sequence[Phase]] = None,
          grad_cache_chunks: int = 1,
          best_metric: Union[None, str, Sequence[str]] = None,
          best_mode: str = "max", allow_config_change: bool = False,
          allow_data_change: bool = False, fresh: bool = False,
          prefetch_batches: int = 2) -> tuple[TrainState, dict]:
  """Trains `model` for `total_steps` steps (resuming from model_dir), returns (state, last metrics).

  `stop_at_step` ends this invocation early (as a preempted job would) without
  changing the schedule, which is defined by `total_steps`. A new run (no checkpoint
  in model_dir) with `initial_checkpoint_path` starts from that model directory's
  parameters, renamed by `initial_checkpoint_assignment` (default: the model's
  INITIAL_CHECKPOINT_ASSIGNMENT); see vmx/training/initial_checkpoint.py.
  `train_dataset_cfg`: the data of a run of one phase, a DatasetConfig or
  MultiTaskConfig (read by vmx/data/inputs.py `TokenCacheInput`) or any `Input`
  (vmx/training/inputs.py). `phases` (instead of `train_dataset_cfg`): a list of
  `Phase`s run one after the other, their steps adding up to `total_steps`; `model` is
  then the default objective and the model written for inference.
  `grad_cache_chunks` > 1: each step's gradients by GradCache in that many chunks
  (vmx/training/grad_cache.py: the same gradients, memory of one chunk's activations).
  `best_metric` (an evaluation metric, e.g. 'tatoeba/mean'): after every evaluation the
  parameters are kept in MODEL_DIR/best/ if the metric beats the best so far (`best_mode`
  'max' or 'min'); see checkpoints.BestCheckpointer. A list of metrics keeps the best step
  by each: the first in best/, the others in best-<metric>/ (e.g. MPCL §3.3's test sets
  as each other's dev sets, `launch/eval.py --step=per_task`).
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
  check_train_args(total_steps, log_period, eval_period, stop_at_step)
  check_range(isinstance(prefetch_batches, int) and not isinstance(prefetch_batches, bool)
              and prefetch_batches >= 0, "train", "prefetch_batches", prefetch_batches,
              "a number of batches >= 0 (0: no prefetch)")
  check_best_metric(best_metric, eval_cfg, eval_period)
  phases = resolve_phases(phases, model, train_dataset_cfg, optimizer, learning_rate,
                          total_steps)
  files = RunFiles(str(model_dir), vocabulary, languages,
                   checkpoint_cfg or checkpoints.CheckpointConfig(), initial_checkpoint_path,
                   initial_checkpoint_assignment, best_metric, best_mode, allow_config_change,
                   allow_data_change, fresh)
  settings = LoopSettings(total_steps, log_period, eval_period, random_seed, stop_at_step,
                          progress, prefetch_batches)
  return run_phases(model, phases, partitioner or partitioning.Partitioner(), files, settings,
                    eval_cfg, grad_cache_chunks)


def run_phases(model: BaseModel, phases: Sequence[Phase], partitioner: partitioning.Partitioner,
               files: RunFiles, settings: LoopSettings,
               evaluator: Optional[PeriodicEvaluation] = None,
               grad_cache_chunks: int = 1) -> tuple[TrainState, dict]:
  """Runs resolved `phases` (vmx/training/phases.py) into `files.model_dir`: every phase's
  input checked against its model and the devices and its step built (`TrainStep`) before
  anything is written, then the run directory opened (its lock, the restart contract) and
  the loop run. The one place a `TrainingRun` is built: `train()` and fine-tuning
  (vmx/finetune/run.py) differ only in the inputs, model and evaluator they hand in."""
  trainers = []
  for i, ph in enumerate(phases):
    where = f"Phase({ph.name!r}) " if len(phases) > 1 else ""
    try:
      ph.input.check(ph.model, partitioner.data_parallel_size)
      shapes = ph.input.batch_shapes(ph.model)
      trainers.append(TrainStep(
          ph.model, ph.optimizer, partitioner, shapes, ph.learning_rate, grad_cache_chunks,
          packed=ph.input.packed_features(ph.model, shapes),
          token_features=ph.input.token_features(ph.model)))
    except ConfigError as e:
      if not where:
        raise
      raise ConfigError(f"{where}{e}") from None
    if i:
      check_same_state(phases[0], trainers[0], ph, trainers[i])
  check_vocabulary_fits(model, files.vocabulary)
  primary = jax.process_index() == 0
  if primary:
    cli.warn_untested_versions()
  files = dataclasses.replace(
      files,
      # The longest input of any phase: what inference truncates to (vmx_model.json).
      max_length=max(n for ph in phases for n in ph.input.token_lengths(ph.model)),
      # config.gin: the experiment's files, bindings and header as comments, then gin's own
      operative_config=gin_utils.experiment_header() + gin.operative_config_str())
  lock = run_lib.open_run(
      files.model_dir, model, files.operative_config, files.allow_config_change, files.fresh,
      primary, lambda: data_changes(files.model_dir, phases, settings.random_seed),
      files.allow_data_change, files.vocabulary)
  try:
    return TrainingRun(model, phases, trainers, partitioner, files, settings, evaluator,
                       lock).run()
  finally:
    if lock is not None:
      lock.release()


def data_changes(model_dir, phases, random_seed: int) -> list[str]:
  """How the newest checkpoint's data stream differs from this config's, as far as the
  config says without building anything (the batch size, the mixture, the lengths...)."""
  latest = checkpoints.latest_data_state(model_dir)
  if latest is None:
    return []
  step, state = latest
  p = phase_index(phases, step)
  return phases[p].input.changes(state, random_seed + 1000 * p)
