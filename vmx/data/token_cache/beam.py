"""Building token caches on Apache Beam: the shards of every task are written by workers.

  python launch/cache_tasks.py --gin_file=contrastive_small_1h.gin \
      --beam_runner=DirectRunner --beam_workers=2            # this machine, 2 processes
  python launch/cache_tasks.py --gin_file=ems.gin --gin.DATA_DIR="'gs://bucket/data'" \
      --token_cache_dir=gs://bucket/vmx_arrays --beam_runner=DataflowRunner \
      --beam_options="--project=P --region=us-central1 --temp_location=gs://bucket/tmp"

The pipeline is one ParDo over shard jobs (task, split, shard, input range): each worker
parses the experiment's gin files, which registers the same SeqIO tasks (its setup), and
writes its shards with `writer.write_shard`, the function of the local build, so the
bytes are the same. The driver plans the jobs (only shards without a finished record: a
rerun after an interruption finishes the rest), runs the pipeline, then checks every
shard and writes each manifest (`build.assemble`). A worker that sees other inputs than
the driver (another vocabulary, other files) refuses to write.

A worker's error reaches the user as vmx's one line (`worker_error`: its own message, a full
disk's naming the file). What Beam and its worker processes print meanwhile goes to a log
file that line names (`_WorkerOutput`; Beam's loggers are quiet: vmx/quiet.py); `--verbose`
shows it all. A rerun first removes the temporary files of workers that were killed
(`build.collect_leftovers`), as the local build does.

Every runner reads the same files: with a runner other than the DirectRunner, the data,
the vocabulary and the cache root must be on storage every worker reads (gs://), which
the driver checks before it submits anything. apache-beam is the `beam` extra.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Sequence

from vmx import errors, signals, storage
from vmx.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class ShardJob:
  """One shard to write: phase i's task key `key`, task `task`, split, and the shard."""
  phase: int
  key: str | None
  task: str
  split: str
  directory: str
  fingerprint: str
  index: int
  count: int
  start: int
  end: int
  use_cached: bool


def require_beam():
  try:
    import apache_beam  # noqa: F401  (lazy: the beam extra)
  except ImportError:
    raise ConfigError("--beam_runner needs Apache Beam, which the train extra leaves out: "
                      "pip install 'vmx[train,beam]' (in a checkout: pip install -e "
                      "'.[train,beam]')") from None


def _write_fn_class():
  import apache_beam as beam  # lazy: the beam extra

  class WriteShard(beam.DoFn):
    """Writes shard jobs; its setup registers the experiment's tasks from gin."""

    def __init__(self, gin_files, bindings, search_paths, inputs_fn):
      super().__init__()
      self.gin_files, self.bindings, self.search_paths = (list(gin_files), list(bindings),
                                                          search_paths)
      self.inputs_fn = inputs_fn   # vmx.experiment.training_inputs (pickled by reference)

    def setup(self):
      import importlib.util  # noqa: F401  (gin-config 0.5: before gin parses)
      self.inputs = self.inputs_fn(self.gin_files, self.bindings, self.search_paths)

    def process(self, job: ShardJob):
      from collections.abc import Mapping
      import seqio  # lazy: in the worker
      from vmx.data.token_cache import fingerprint as fp, writer   # SeqIO: in the worker
      _, model, cfg, _ = self.inputs[job.phase]
      c = cfg if job.key is None else cfg.tasks[job.key]
      fcs = model.FEATURE_CONVERTER_CLS
      converter = (fcs[job.key] if isinstance(fcs, Mapping) else fcs)(pack=False)
      task = seqio.get_mixture_or_task(job.task)
      mine = fp.digest(fp.parts(task, job.split, c.task_feature_lengths, converter))
      if mine != job.fingerprint:
        raise ConfigError(f"task {job.task}: this worker sees other inputs than the driver "
                          f"(fingerprint {mine[:16]}… against {job.fingerprint[:16]}…): every "
                          f"worker must read the same data and vocabulary")
      rec = writer.write_shard(task, job.split, c.task_feature_lengths, converter,
                               job.directory, job.fingerprint, job.index, job.count,
                               job.start, job.end, job.use_cached)
      yield (job.task, job.index, rec["count"])

  return WriteShard


def pipeline_options(runner: str, workers: int, extra: str):
  from apache_beam.options.pipeline_options import PipelineOptions  # lazy: beam extra
  args = [f"--runner={runner}", *shlex.split(extra or "")]
  if runner == "DirectRunner":
    args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
  return PipelineOptions(args)


def check_shared_storage(runner: str, paths: Sequence[str]):
  """A runner other than the DirectRunner has workers on other machines: what they read
  and write must be on shared storage."""
  if runner == "DirectRunner":
    return
  local = [p for p in paths if p and not storage.is_remote(p)]
  if local:
    raise ConfigError(f"--beam_runner={runner}: its workers run on other machines, so the "
                      f"data, the vocabulary and --token_cache_dir must be on storage they "
                      f"all read (gs://...); local: {local[0]}")


class _Progress:
  """A progress bar of the shards written, counted from the directories' shard records
  while the pipeline runs (every few seconds; Beam's own logs say little)."""

  def __init__(self, jobs: Sequence[ShardJob], enabled: bool, file=None):
    import threading
    from tqdm.auto import tqdm
    self.dirs = sorted({j.directory for j in jobs})
    self.before = self._count()
    self.bar = tqdm(total=len(jobs), desc="[vmx] shards written on Beam", unit=" shard",
                    disable=not enabled, leave=False, file=file)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    if enabled:
      self._thread.start()

  def _count(self) -> int:
    n = 0
    for d in self.dirs:
      p = storage.path(d)
      if p.exists():
        n += sum(1 for _ in p.glob("rows-*.json"))
    return n

  def _run(self):
    while not self._stop.wait(3.0):
      try:
        self.bar.n = min(self.bar.total, self._count() - self.before)
        self.bar.refresh()
      except OSError:
        pass

  def close(self):
    self._stop.set()
    self.bar.close()


# The last "module.Class: message" line of a traceback Beam relays from a worker
_RAISED = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Interrupt))): (.+)$", re.M)


def worker_error(e: BaseException, runner: str) -> errors.VmxError:
  """The one line of a failed pipeline: the worker's own error (Beam relays its traceback
  as text inside a RuntimeError), as the vmx error it was (a DataError naming the file
  and what is kept), or a DataError quoting any other; `--verbose` shows Beam's logs."""
  found = _RAISED.findall(str(e))
  if not found:
    text = str(e).strip().splitlines()
    return DataError(f"the Beam pipeline ({runner}) failed: {type(e).__name__}: "
                     f"{text[0] if text else ''} (--verbose shows Beam's logs)")
  qualified, name, message = found[-1]
  message = re.sub(r" \[while running '[^']*'\]$", "", message.strip())
  cls = getattr(errors, name, None) if qualified.startswith("vmx.errors.") else None
  if isinstance(cls, type) and issubclass(cls, errors.VmxError):
    return cls(message)
  return DataError(f"a Beam worker ({runner}) failed: {name}: {message} (--verbose shows "
                   f"Beam's logs; finished shards are kept, a rerun writes the rest)")


class _WorkerOutput:
  """While the pipeline runs, this process's stderr (file descriptor 2, which the
  DirectRunner's worker processes inherit and print their tracebacks to, whatever the log
  level) goes to a log file; `terminal` is the real stderr, for the progress bar. The file
  is removed after a success and named in a failure's line. With --verbose nothing is
  redirected."""

  def __init__(self, verbose: bool):
    import os
    import sys
    import tempfile
    self.path, self._saved, self.terminal = None, None, None
    if verbose:
      return
    fd, self.path = tempfile.mkstemp(prefix="vmx-beam-", suffix=".log")
    sys.stderr.flush()
    self._saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    self.terminal = os.fdopen(os.dup(self._saved), "w")

  def restore(self, keep: bool):
    import os
    import sys
    if self._saved is None:
      return
    sys.stderr.flush()
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._saved = None
    self.terminal.close()
    if not keep:
      os.remove(self.path)


def run(jobs: Sequence[ShardJob], gin_files, bindings, search_paths, runner: str,
        workers: int, extra_options: str, inputs_fn, progress: bool = True) -> int:
  """Writes the shards of `jobs` on Beam; returns the number written. `inputs_fn(gin
  files, bindings, search paths)`: the experiment's [(phase, model, config, seed)], which
  each worker calls once (it registers the tasks): vmx.experiment.training_inputs."""
  require_beam()
  import os
  import apache_beam as beam  # lazy: the beam extra
  if not jobs:
    return 0
  options = pipeline_options(runner, workers, extra_options)
  output = _WorkerOutput(verbose=os.environ.get("VMX_VERBOSE") == "1")
  bar = _Progress(jobs, progress, output.terminal)
  failed = False
  try:
    # A signal mid-run: the DirectRunner's worker processes are killed first (its shutdown
    # waits for them, and they did not end: the driver hung, or died leaving them running),
    # then `Interrupted` ends the run. A remote runner's job is not cancelled: its shards
    # are written whole or not at all, so a rerun beside it is safe (the concurrency rule).
    with signals.stopping(signals.end_child_processes):
      with beam.Pipeline(options=options) as p:
        _ = (p | "Jobs" >> beam.Create(list(jobs)) | "Spread" >> beam.Reshuffle()
             | "WriteShards" >> beam.ParDo(_write_fn_class()(gin_files, bindings,
                                                            search_paths, inputs_fn)))
  except errors.VmxError:
    failed = True
    raise
  except Exception as e:   # noqa: BLE001  (whatever the runner raises: one line)
    failed = True
    error = worker_error(e, runner)
    if output.path:
      error.args = (f"{error.args[0]} (Beam's output: {output.path})",)
    raise error from e   # (the launcher shows the chain with --verbose)
  finally:
    bar.close()
    output.restore(keep=failed)
  return len(jobs)
