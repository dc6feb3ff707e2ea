"""vmx's own error types: what a user did wrong, said in one line.

Every launcher enters through `cli.run_main`, which prints a `VmxError` as
`error: <message>` on stderr (no traceback unless `--verbose`) and exits with the
error's `exit_code`. Anything else escaping a launcher is a bug in vmx and keeps its
traceback. Messages name the file (and line), the gin binding, the checkpoint or the
input index that is at fault.
"""
from __future__ import annotations


class VmxError(Exception):
  """Base of vmx's user-facing errors."""
  exit_code = 2


class ConfigError(VmxError, ValueError):
  """A gin file, binding or argument that names nothing, has the wrong type or range."""


class DataError(VmxError, ValueError):
  """Bad or missing input data; the message names the file (and line)."""


class CheckpointError(VmxError):
  """A missing or damaged checkpoint (no intact one to fall back to)."""


class InputError(VmxError, ValueError):
  """A bad argument to a vmx API call (e.g. `Encoder.encode`), naming the index."""


class NonFiniteError(VmxError):
  """Training or inference produced NaN/Inf; nothing non-finite was saved."""
  exit_code = 3


EXIT_PREEMPTED = 75   # EX_TEMPFAIL: rerun the same command to continue


class Preempted(VmxError):
  """SIGTERM or SIGINT stopped the process; what was saved is in the message (vmx/signals.py,
  vmx/training/preemption.py). Not an error: `preempted: ...`, exit 75."""
  exit_code = EXIT_PREEMPTED
  prefix = "preempted"


class Interrupted(BaseException):
  """What the process-wide signal handler (vmx/signals.py) raises in the main thread,
  wherever that thread is: a BaseException, as KeyboardInterrupt is, so that no `except
  Exception` on the way (a retry loop, a fallback, a library's own) takes the signal for a
  failure and carries on. `cli.run_main` ends with it as with `Preempted`: one
  `preempted:` line, exit 75."""
  exit_code = EXIT_PREEMPTED
  prefix = "preempted"
