"""How every launcher runs: `run_main(main)` turns vmx's errors into one `error:` line.

  if __name__ == "__main__":
    cli.run_main(main)

A `VmxError` (vmx/errors.py) and gin's own configuration errors print `error: <message>`
on stderr, with the closest valid name where there is one, and exit with the error's
`exit_code`; `--verbose` (anywhere in argv, or VMX_VERBOSE=1) adds the traceback.
Errors that are not vmx's own are bugs and keep their traceback.

`run_main` is where the host allocator is set up (vmx/host_memory.py), which must
precede the runtime's threads (the mining launchers keep glibc's default: the tuned
allocator keeps a process's peak, and their bar is memory), and the quiet start
(vmx/quiet.py: each Python warning kind printed once; not with --verbose): this module
imports neither jax nor TensorFlow, and a launcher imports what needs them
(vmx.experiment, the trainer) inside `main`.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from vmx import host_memory, quiet
from vmx.errors import ConfigError, Interrupted, VmxError
from vmx.gin_utils import GIN_ERRORS, one_line, with_suggestion


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser, its errors one line: argparse prints the whole usage (26 lines for
  launch/eval.py) before the message. `<prog>: error: <message> (--help lists the flags)`
  on stderr, exit 2, as argparse."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def run_main(main, argv=None, host_malloc: str | None = None):
  """Runs main(argv); a vmx error is one `error:` line on stderr and its exit code.
  `host_malloc` is the launcher's allocator policy where VMX_HOST_MALLOC is unset (None:
  "auto"), set as VMX_HOST_MALLOC for what the process starts: a job whose bar is
  memory, not step speed, passes "off"."""
  argv = list(sys.argv[1:] if argv is None else argv)
  verbose = "--verbose" in argv or os.environ.get("VMX_VERBOSE") == "1"
  if verbose:   # for what reads it later, worker processes included (Beam's output)
    os.environ["VMX_VERBOSE"] = "1"
  argv = [a for a in argv if a != "--verbose"]
  quiet.install(verbose)   # each Python warning kind once (TensorFlow's lines: import vmx)
  try:
    try:
      if host_malloc and not os.environ.get("VMX_HOST_MALLOC"):
        os.environ["VMX_HOST_MALLOC"] = host_malloc
      host_memory.configure()
    except ValueError as e:  # a bad VMX_HOST_MALLOC
      raise ConfigError(str(e)) from None
    return main(argv)
  except (VmxError, FileNotFoundError, ValueError, TypeError) as e:
    msg = one_line(e)
    if not isinstance(e, (VmxError, FileNotFoundError)) and not any(p in msg for p in
                                                                   GIN_ERRORS):
      raise
    if verbose:
      traceback.print_exc()
    # (a preemption that saved is not an error: `preempted: ...`, vmx/training/preemption.py)
    quiet.warnings_summary()   # before the line: it stays the last one
    print(f"{getattr(e, 'prefix', 'error')}: {with_suggestion(msg)}", file=sys.stderr)
    sys.exit(getattr(e, "exit_code", 2))
  except Interrupted as e:   # a signal outside the training loop (vmx/signals.py)
    if verbose:
      traceback.print_exc()
    quiet.warnings_summary()
    print(f"{e.prefix}: {one_line(e)}", file=sys.stderr)
    sys.exit(e.exit_code)


def step_flag(s: str):
  """argparse type of --step: a checkpoint step number, 'best' (MODEL_DIR/best/) or
  'best:<metric>' (the best step by that metric of train.best_metric)."""
  from vmx.modeldir.layout import BEST_BY, BEST_STEP  # lazy: parsing runs after run_main
  if s == BEST_STEP or (s.startswith(BEST_STEP + BEST_BY) and len(s) > len(BEST_STEP) + 1):
    return s
  try:
    return int(s)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"{s!r}: a step number, {BEST_STEP!r} or '{BEST_STEP}{BEST_BY}<metric>'") from None


def add_vector_flags(p: argparse.ArgumentParser, verb: str):
  """--embedding_dim and --precision: which vectors a command scores or searches
  (`vector_options` turns them into Encoder.from_checkpoint's keywords)."""
  p.add_argument("--embedding_dim", type=int, default=None,
                 help=f"{verb} each vector's first N values, renormalized (models trained "
                      "with MATRYOSHKA_DIMS only)")
  p.add_argument("--precision", default="float32", choices=("float32", "int8", "binary"),
                 help=f"{verb} the vectors as an int8 (calibrated: launch/calibrate.py) or "
                      "binary index holds them (vmx/quantize.py; launch/eval.py: "
                      "--tatoeba.rescore=M rescores M x k candidates with the float vectors)")


def vector_options(args) -> dict:
  """Encoder.from_checkpoint's `dim` and `quantized` from `add_vector_flags`' flags."""
  return {"dim": args.embedding_dim,
          "quantized": None if args.precision == "float32" else args.precision}


def add_process_flags(p: argparse.ArgumentParser, what: str):
  """--multihost and the explicit multi-process flags (vmx/training/distributed.py)."""
  p.add_argument("--multihost", action="store_true",
                 help=f"call jax.distributed.initialize(): {what} (cluster auto-detected: "
                      "Cloud TPU, SLURM, Open MPI, Kubernetes, unless the three flags below "
                      "are given)")
  p.add_argument("--coordinator_address", default=None,
                 help="host:port of process 0 (explicit multi-process set-up)")
  p.add_argument("--num_processes", type=int, default=None)
  p.add_argument("--process_id", type=int, default=None)


def add_beam_flags(p: argparse.ArgumentParser, what: str):
  """--beam_runner, --beam_workers, --beam_options (vmx/beam_runs.py): `what` runs on Beam."""
  p.add_argument("--beam_runner", default=None,
                 help=f"{what} on Apache Beam with this runner (DirectRunner, DataflowRunner, "
                      "FlinkRunner, SparkRunner, ...); default: in this process")
  p.add_argument("--beam_workers", type=int, default=2,
                 help="DirectRunner: worker processes (default 2)")
  p.add_argument("--beam_options", default="",
                 help="more Beam pipeline options, one string (e.g. \"--project=P "
                      "--region=R --temp_location=gs://b/tmp\")")


# jax versions the suite or the accelerator benchmark ran on (README, "Tested versions").
TESTED_JAX = ("0.10.2", "0.11.2")


def warn_untested_versions():
  """One warning line when jax (and the accelerator's runtime) is not a tested version."""
  import jax  # (the caller has started jax)
  if jax.__version__ in TESTED_JAX:
    return
  runtime = getattr(jax.devices()[0].client, "platform_version", "") or jax.default_backend()
  print(f"[vmx] warning: jax {jax.__version__} with {runtime.strip()} is not a tested version "
        f"(tested: jax {', '.join(TESTED_JAX)}; README, 'Tested versions')", flush=True)
