"""The training loop, once the run directory is open: `TrainingRun(...).run()`.

Each step of the loop is a named method: `start` (resume from the newest intact
checkpoint, or a new state, its initial checkpoint and prefill), `read_batch`, the jitted
step, `check_finite` (the previous step's flags, read while this one runs), `log`,
`save`, `stop_if_preempted`, `evaluate` (and the best checkpoint), `enter_phase`, and
`finish` (the final save, waited for, and a signal that came meanwhile). What the loop
loops over lives beside it: the step and its state (step.py), phases (phases.py),
preemption (preemption.py), MODEL_DIR (vmx/modeldir/).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Optional, Sequence, Union

import jax
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from vmx import signals
from vmx.data.vocab import load_tokenizer
from vmx.errors import DataError, NonFiniteError, Preempted
from vmx.evaluation.periodic import PeriodicEvaluation, best_metrics, metric_value
from vmx.inference import Encoder
from vmx.modeldir import checkpoints, layout
from vmx.training import initial_checkpoint
from vmx.training import metrics as metrics_lib
from vmx.training.phases import phase_index
from vmx.training.prefetch import Prefetcher
from vmx.training.preemption import PreemptionWatch
from vmx.training.step import compute_metrics, host_params, local_value, merge_metrics


@dataclasses.dataclass(frozen=True)
class RunFiles:
  """MODEL_DIR and its restart contract: what the run reads and writes there.

  `languages`, `vocabulary`, `max_length`: the inference files (vmx_model.json);
  `operative_config`: config.gin (filled by `run_phases`, as is `max_length`, the
  longest input of any phase); `allow_config_change`, `allow_data_change`, `fresh`: what
  a restart with other settings may do (vmx/modeldir/run.py); `best_metric` (a metric or
  a list) / `best_mode`: MODEL_DIR/best/, and best-<metric>/ for each further metric
  (checkpoints.BestCheckpointer)."""
  model_dir: str
  vocabulary: str
  languages: Sequence[str]
  checkpoint_cfg: checkpoints.CheckpointConfig
  initial_checkpoint_path: Optional[str] = None
  initial_checkpoint_assignment: Optional[Sequence[tuple[str, str]]] = None
  best_metric: Union[None, str, Sequence[str]] = None
  best_mode: str = "max"
  allow_config_change: bool = False
  allow_data_change: bool = False
  fresh: bool = False
  max_length: int = 0
  operative_config: str = ""


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """How the loop runs: `total_steps` (the schedule), `stop_at_step` (this invocation
  ends early, as a preempted job would), the log and evaluation periods (0: no
  evaluation), the data seed (phase i reads with random_seed + 1000 i), the progress bar
  and the batches prefetched (vmx/training/prefetch.py)."""
  total_steps: int
  log_period: int = 50
  eval_period: int = 1000
  random_seed: int = 0
  stop_at_step: Optional[int] = None
  progress: bool = True
  prefetch_batches: int = 2


class TrainingRun:
  """One invocation of a run on an open run directory (see the module docstring); built
  by vmx/training/trainer.py `run_phases` alone."""

  def __init__(self, model, phases, trainers, partitioner, files: RunFiles,
               settings: LoopSettings, evaluator: Optional[PeriodicEvaluation], lock):
    self.model, self.phases, self.trainers = model, phases, trainers
    self.partitioner, self.files, self.eval_cfg, self.lock = partitioner, files, evaluator, lock
    self.model_dir, self.total_steps = files.model_dir, settings.total_steps
    self.eval_period, self.log_period = settings.eval_period, settings.log_period
    self.random_seed, self.progress = settings.random_seed, settings.progress
    self.stop_at_step, self.prefetch_batches = settings.stop_at_step, settings.prefetch_batches
    self.primary = jax.process_index() == 0
    if jax.process_count() > 1:   # the other processes wait for open_run (--fresh moves files)
      multihost_utils.sync_global_devices("vmx.open_run")
    # Reads (and checks) a resumed run's best-checkpoint record; writes nothing yet.
    self.best = [checkpoints.BestCheckpointer(self.model_dir, metric, files.best_mode,
                                              first=i == 0)
                 for i, metric in enumerate(best_metrics(files.best_metric))]
    self.ckpt = checkpoints.Checkpointer(self.model_dir, files.checkpoint_cfg)
    self.restore = files.checkpoint_cfg.restore
    self.eval_s, self.t0 = 0.0, time.time()
    self.bar, self.writer, self.encoder, self.data = None, None, None, None

  # -- start ------------------------------------------------------------------------------
  def phase_data(self, i: int, data_state=None) -> Prefetcher:
    """Phase i's batches (this process's rows), from its start or a checkpoint's state."""
    ph, tr = self.phases[i], self.trainers[i]
    rows = tr.local_rows()
    it = ph.input.start(ph.model, self.random_seed + 1000 * i, rows, data_state,
                        self.files.allow_data_change, progress=self.primary)
    return Prefetcher(it, tr.placer(it.rows), self.prefetch_batches)

  def start(self):
    """(state, phase index): the newest intact checkpoint's, or a new state (with its
    initial checkpoint and prefill); the data of that phase in `self.data`."""
    restored = (self.ckpt.restore_latest(
        lambda s: self.trainers[phase_index(self.phases, s)].abstract_state)
        if self.restore else None)
    if restored is not None:
      latest, state, data_state = restored
      p = phase_index(self.phases, latest)
      self.data = self.phase_data(p, data_state)
      print(f"[vmx] resumed from {self.model_dir}/checkpoint_{latest} (data position "
            f"{self.data.position}" + (f", phase {self.phases[p].name!r}"
                                       if len(self.phases) > 1 else "") + ")", flush=True)
      return state, p
    trainer = self.trainers[0]
    self.data = self.phase_data(0)
    state = trainer.create_state(self.random_seed)
    files = self.files
    if files.initial_checkpoint_path:
      rules = (self.model.INITIAL_CHECKPOINT_ASSIGNMENT
               if files.initial_checkpoint_assignment is None
               else files.initial_checkpoint_assignment)
      state = trainer.replace_params(state, initial_checkpoint.load(
          state.params, trainer.state_shardings.params, files.initial_checkpoint_path, rules))
    n = self.phases[0].model.prefill_batches(state.flax_mutables)
    if n:   # e.g. InfoXLM's queue of negatives, filled before step 1 (§4.1)
      print(f"[vmx] filling the model state before step 1: {n} batches, forward only",
            flush=True)
      state = trainer.prefill(state, self.data)
    return state, 0

  def write_run_files(self, start: int):
    """Inference files, config.gin, the metrics writer and the evaluation's Encoder:
    written once the restore succeeded, so a refused restart changes nothing."""
    if self.primary:
      layout.write_inference_files(self.model_dir, self.model, self.files.languages,
                                   self.files.max_length, self.files.vocabulary)
      layout.write_config(self.model_dir, self.files.operative_config)
    # metrics.jsonl keeps one row per logged step: rows after the resumed step (written
    # by the stopped run after its last checkpoint) are dropped, as the run redoes them.
    self.writer = metrics_lib.create_writer(self.model_dir, resume_step=start)
    if self.eval_cfg is not None:   # one jitted encode function for every evaluation
      self.encoder = Encoder(self.model, None, load_tokenizer(self.files.vocabulary),
                             self.files.languages, self.files.max_length,
                             self.eval_cfg.batch_size)

  # -- the steps of the loop -------------------------------------------------------------
  def say(self, line: str):
    (self.bar.write if self.bar is not None else lambda s: print(s, flush=True))(line)

  def eval_due(self, step: int, end: int) -> bool:
    return (self.eval_cfg is not None and bool(self.eval_period)
            and (step % self.eval_period == 0 or step == end))

  def evaluate(self, step: int, state) -> dict:
    """The periodic evaluation of `state` at `step`, logged, and the best checkpoint."""
    t0 = time.time()
    self.encoder.params = host_params(state.params)
    # Several processes: each evaluates the gathered parameters on its own first device.
    with (self.partitioner.context() if jax.process_count() == 1
          else contextlib.nullcontext()):
      scalars, line = self.eval_cfg.run(self.encoder)
    seconds = time.time() - t0
    self.eval_s += seconds
    # Evaluation's share of this process's wall time so far (what EVAL_PERIOD trades).
    share = 100.0 * self.eval_s / max(time.time() - self.t0, 1e-9)
    scalars["eval/seconds"] = seconds
    self.writer.write_scalars(step, scalars)
    self.say(f"[vmx] step {step}: {line} [{seconds:.1f} s; evaluation {share:.1f}% of the "
             f"run's time so far]")
    for best in self.best:
      value = metric_value(best.metric, scalars)
      before = best.record
      if best.update(step, value, state.params):
        was = f"; was {before['value']:.2f} at step {before['step']}" if before else ""
        self.say(f"[vmx] step {step}: best {best.metric} {value:.2f}{was} -> "
                 f"{best.dir.name}/{layout.CHECKPOINT_PREFIX}_{step}")
    return scalars

  def check_finite(self, step: int, flags, trainer):
    bad = trainer.nonfinite_terms(flags)
    if bad:
      good = self.ckpt.latest_step()
      kept = (f"last checkpoint: checkpoint_{good}" if good is not None else
              "no checkpoint was written")
      raise NonFiniteError(
          f"non-finite values at step {step}: {', '.join(bad)}; stopped without logging or "
          f"saving them ({kept}, unchanged). Lower the learning rate or set CLIP_GRAD_NORM")

  def read_batch(self, step: int, state, pending):
    """The next batch. One that cannot be read (a remote token cache that stopped
    answering) saves the state it has (once the previous step's flags say it is finite)
    and stops with the reason."""
    try:
      return next(self.data)
    except StopIteration:
      raise RuntimeError(f"training data ran out at step {step}") from None
    except DataError as e:
      if pending is not None:
        self.check_finite(*pending)
      raise DataError(f"{e}; {self.save_before_stopping(step, state)}") from None

  def save_before_stopping(self, step: int, state) -> str:
    """What a run that cannot go on keeps: the state of `step` saved (one process;
    several cannot agree on a save without the others' next collective)."""
    if jax.process_count() > 1:
      good = self.ckpt.latest_step()
      return (f"stopped at step {step}; the last checkpoint is checkpoint_{good}"
              if good is not None else f"stopped at step {step} before any checkpoint")
    if self.ckpt.latest_step() != step:
      self.ckpt.save(step, state, self.data.state(), force=True)
    return (f"saved {layout.step_dir(self.model_dir, step)}; rerun the same command to "
            f"resume from it")

  def log(self, done: int, acc, steps: int, seconds: float, waited: float, batch_size: int):
    scalars = compute_metrics(acc)
    scalars["train/steps_per_sec"] = steps / seconds
    scalars["train/examples_per_sec"] = steps * batch_size / seconds
    scalars["train/input_wait_fraction"] = min(1.0, waited / seconds)
    self.writer.write_scalars(done, scalars)
    self.writer.flush()
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{scalars['train/loss']:.4f}")
    self.say(f"[vmx] step {done}: " + ", ".join(
        f"{k.split('/')[-1]} {v:.4g}" for k, v in scalars.items()))
    return scalars

  def save(self, done: int, state, force: bool):
    if self.ckpt.save(done, state, self.data.state(), force=force) and self.lock is not None:
      self.lock.refresh()

  def enter_phase(self, state, i: int):
    """Switch to phase i at its first step: new data, a new optimizer state if the
    phase brings its own optimizer."""
    ph, prev = self.phases[i], self.phases[i - 1]
    if ph.optimizer is not prev.optimizer:
      with self.partitioner.context():
        opt_state = jax.jit(ph.optimizer.init,
                            out_shardings=self.trainers[i].state_shardings.opt_state)(
                                state.params)
      state = state.replace(opt_state=opt_state)
    self.say(f"[vmx] step {ph.start}: phase {ph.name!r} ({ph.steps} steps, to step {ph.end})"
             + (", new optimizer state" if ph.optimizer is not prev.optimizer else ""))
    if not metrics_lib.has_row(self.model_dir, ph.start, "train/phase"):  # resumed at the switch
      self.writer.write_scalars(ph.start, {"train/phase": float(i)})
    self.data.close()
    self.data = self.phase_data(i)
    return state

  def report_input(self):
    """Several processes: how much of each batch this one read (the index reader: its
    rows)."""
    it = self.data.data
    rows = getattr(it, "rows", None)
    share = ("the whole global batch (the seqio reader)" if rows is None else
             ", ".join(f"{len(r)} rows{'' if k is None else ' of ' + k}"
                       for k, r in rows.items()))
    print(f"[vmx] process {jax.process_index()} of {jax.process_count()} read {share} per "
          f"step" + (f"; {it.examples_read} examples in all (read ahead included)"
                     if hasattr(it, "examples_read") else ""), flush=True)

  # -- the loop ---------------------------------------------------------------------------
  def run(self):
    """Trains from the newest checkpoint to `total_steps` (or `stop_at_step`); returns
    (state, last metrics)."""
    state, p = self.start()
    start = int(local_value(state.step))
    end = min(self.total_steps, self.stop_at_step or self.total_steps)
    self.write_run_files(start)
    if self.progress and self.primary:
      self.bar = tqdm(total=end, initial=start, desc="train", unit="step", dynamic_ncols=True)
    last, watch = {}, PreemptionWatch()
    watch.install()
    try:
      try:
        state, last = self._steps(state, p, start, end, watch, last)
      finally:
        self._close()
    finally:
      watch.uninstall()
    kept = (f"saved {layout.step_dir(self.model_dir, end)}"
            + ("; the run is complete" if end == self.total_steps else
               "; rerun the same command to continue"))
    signals.saved(kept)   # what a signal during the launcher's exit would leave
    if watch.signal is not None:   # during the last step's evaluation or the final save
      raise Preempted(f"{watch.signal} during the final save: {kept}")
    return state, last

  def _steps(self, state, p, start, end, watch, last):
    phases = self.phases
    # Step 0, or (one process) an evaluation that the stopped run did not get to: every
    # evaluation writes eval/seconds (runs before it wrote it: tatoeba/mean).
    if self.eval_due(start, end) and (start == 0 or (
        jax.process_count() == 1 and not metrics_lib.has_row(
            self.model_dir, start, "eval/seconds", "tatoeba/mean"))):
      last.update(self.evaluate(start, state))
    if len(phases) > 1 and start == 0:
      self.say(f"[vmx] phase {phases[0].name!r} ({phases[0].steps} steps, to step "
               f"{phases[0].end})")
    acc, t_log, steps_since, waited = None, time.time(), 0, 0.0
    pending = None  # (step, flags, trainer) of the previous step, checked while this one runs
    for step in range(start, end):
      if step == phases[p].end:
        if pending is not None:
          self.check_finite(*pending)
          pending = None
        p += 1
        state = self.enter_phase(state, p)
      tr = self.trainers[p]
      t_wait = time.perf_counter()
      batch = self.read_batch(step, state, pending)
      waited += time.perf_counter() - t_wait
      state, m = tr.step(state, batch)
      done = step + 1
      if pending is not None:
        self.check_finite(*pending)
      pending = (done, tr.nonfinite, tr)
      acc = merge_metrics(acc, jax.tree.map(local_value, m))
      steps_since += 1
      if self.bar is not None:
        self.bar.update(1)
      phase_end = done == phases[p].end
      # every process, every step (one answer for all); at the end there is nothing to stop
      preempted = watch.requested(done) and done < end
      log_due = done % self.log_period == 0 or done == end or phase_end
      force = done == end or (phase_end and len(phases) > 1) or preempted
      if log_due or self.ckpt.due(done, force=force) or self.eval_due(done, end):
        self.check_finite(*pending)
        pending = None
      if log_due:
        dt = time.time() - t_log
        last.update(self.log(done, acc, steps_since, dt, waited,
                             phases[p].input.batch_size))
        acc, t_log, steps_since, waited = None, time.time(), 0, 0.0
      self.save(done, state, force)
      if preempted:
        raise Preempted(f"{watch.signal} at step {done}: saved "
                        f"{layout.step_dir(self.model_dir, done)}; rerun the same command "
                        f"to resume from it")
      if self.eval_due(done, end):
        last.update(self.evaluate(done, state))
    if jax.process_count() > 1:
      self.report_input()
    for tr in self.trainers:
      report = tr.packing_report()
      if report and self.primary:
        self.say(f"[vmx] packed batches: {report}")
    return state, last

  def _close(self):
    if self.data is not None:
      self.data.close()
    if self.bar is not None:
      self.bar.close()
    self.ckpt.close()            # waits for the last save
    for best in self.best:
      best.close()
    if self.writer is not None:
      self.writer.close()
