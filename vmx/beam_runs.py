"""Shard jobs on Apache Beam, for every vmx pipeline that has them: the token cache's
shards (vmx/data/token_cache/beam.py) and a mining job's embedding and search shards
(vmx/bitext_beam.py).

`run(jobs, fn, ...)` is one ParDo of `fn` (a beam.DoFn) over the jobs, spread over the
workers. Each job writes its results to storage itself, with a record written last, so
the driver plans only the jobs without one and a rerun after an interruption does the
rest. A worker's error reaches the user as vmx's one line (`worker_error`: its own
message, a full disk's naming the file). What Beam and its worker processes print
meanwhile goes to a log file that line names (`_WorkerOutput`; Beam's loggers are quiet:
vmx/quiet.py); `VMX_VERBOSE=1` (`--verbose`) shows it all. apache-beam is the `beam`
extra.
"""
from __future__ import annotations

import re
import shlex
from typing import Callable, Sequence

from vmx import errors, signals, storage
from vmx.errors import ConfigError, DataError


def require_beam():
  try:
    import apache_beam  # noqa: F401  (lazy: the beam extra)
  except ImportError:
    raise ConfigError("--beam_runner needs Apache Beam, which the train extra leaves out: "
                      "pip install 'vmx[train,beam]' (in a checkout: pip install -e "
                      "'.[train,beam]')") from None


def pipeline_options(runner: str, workers: int, extra: str):
  from apache_beam.options.pipeline_options import PipelineOptions  # lazy: beam extra
  args = [f"--runner={runner}", *shlex.split(extra or "")]
  if runner == "DirectRunner":
    args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
  return PipelineOptions(args)


def check_shared_storage(runner: str, paths: Sequence[str], what: str):
  """A runner other than the DirectRunner has workers on other machines: what they read
  and write (`what`, in words) must be on shared storage."""
  if runner == "DirectRunner":
    return
  local = [p for p in paths if p and not storage.is_remote(p)]
  if local:
    raise ConfigError(f"--beam_runner={runner}: its workers run on other machines, so "
                      f"{what} must be on storage they all read (gs://...); local: "
                      f"{local[0]}")


class _Progress:
  """A progress bar of the jobs done, counted by `count()` (finished records on storage)
  every few seconds while the pipeline runs (Beam's own logs say little)."""

  def __init__(self, total: int, count: Callable[[], int], desc: str, enabled: bool,
               file=None):
    import threading
    from tqdm.auto import tqdm
    self.count = count
    self.before = count()
    self.bar = tqdm(total=total, desc=desc, unit=" shard", disable=not enabled, leave=False,
                    file=file)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    if enabled:
      self._thread.start()

  def _run(self):
    while not self._stop.wait(3.0):
      try:
        self.bar.n = min(self.bar.total, self.count() - self.before)
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


def run(jobs: Sequence, fn, runner: str, workers: int, extra_options: str,
        count: Callable[[], int], desc: str, progress: bool = True) -> int:
  """Runs the beam.DoFn `fn` on every job on Beam (the DirectRunner with `workers`
  processes, or `runner` with `extra_options`); returns the number of jobs. `count()`:
  the jobs finished so far, for the progress bar."""
  require_beam()
  import os
  import apache_beam as beam  # lazy: the beam extra
  if not jobs:
    return 0
  options = pipeline_options(runner, workers, extra_options)
  output = _WorkerOutput(verbose=os.environ.get("VMX_VERBOSE") == "1")
  bar = _Progress(len(jobs), count, desc, progress, output.terminal)
  failed = False
  try:
    # A signal mid-run: the DirectRunner's worker processes are killed first (its shutdown
    # waits for them, and they did not end: the driver hung, or died leaving them running),
    # then `Interrupted` ends the run. A remote runner's job is not cancelled: its jobs
    # write whole results or none, so a rerun beside it is safe (the concurrency rule).
    with signals.stopping(signals.end_child_processes):
      with beam.Pipeline(options=options) as p:
        _ = (p | "Jobs" >> beam.Create(list(jobs)) | "Spread" >> beam.Reshuffle()
             | "Run" >> beam.ParDo(fn))
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
