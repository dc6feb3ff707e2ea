#!/usr/bin/env python
r"""Train a vmx model from gin files (t5x's shape).

  python launch/train.py --gin_file=contrastive_tiny.gin --gin.MODEL_DIR=/tmp/vmx_tiny
  python launch/train.py --gin_file=contrastive_24l.gin --gin.MODEL_DIR=gs://... \
      --gin.BATCH_SIZE=2048 --multihost

Gin files are looked up in gin_configs/ (and --gin_search_paths).
"""
import importlib.util  # noqa: F401  (gin-config 0.5 gotcha: import before gin parses)
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

from vmx import cli, gin_utils, signals  # noqa: E402
from vmx.errors import ConfigError  # noqa: E402


def require_training_extra():
  """`pip install vmx` is inference only; say how to get the training pipeline. (SeqIO and
  TensorFlow are checked where a task must be registered: a run whose token cache is
  built and recorded needs neither, vmx/data/deferred.py.)"""
  missing = [m for m in ("grain",) if importlib.util.find_spec(m) is None]
  if missing:
    raise ConfigError(
        f"training needs {' and '.join(missing)}, which the base install leaves out "
        "(it is inference and evaluation only): pip install 'vmx[train]' "
        "(in a checkout: pip install -e '.[train]')")


def main(argv):
  multihost = any(a.split("=")[0] in ("--multihost", "--coordinator_address") for a in argv)
  if not multihost:   # (several processes: JAX's preemption service owns SIGTERM)
    signals.install()   # SIGTERM / SIGINT from here on: exit 75, one `preempted:` line
  bindings, rest = gin_utils.split_gin_bindings(argv)
  parser = cli.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(parser)
  cli.add_process_flags(parser, "TPU pods, multi-node GPU")
  parser.add_argument("--check_cluster", action="store_true",
                      help="start the processes, print each one's devices, run one "
                           "all-reduce across all of them and exit (nothing is trained or "
                           "written): the check to run on every worker before a long job")
  parser.add_argument("--fresh", action="store_true",
                      help="start anew in a MODEL_DIR that holds an earlier run: its files "
                           "are moved to MODEL_DIR.previous-<time>/ (never deleted)")
  parser.add_argument("--seqio_additional_cache_dirs", default="",
                      help="comma-separated dirs where seqio looks for cached tasks "
                           "(launch/cache_tasks.py), read with "
                           "--gin.DatasetConfig.use_cached=True")
  args = parser.parse_args(rest)
  if args.fresh:
    bindings.append("train.fresh = True")
  require_training_extra()
  if args.seqio_additional_cache_dirs:
    import seqio  # lazy: seqio/TensorFlow (the train extra, checked first)
    seqio.add_global_cache_dirs([d for d in args.seqio_additional_cache_dirs.split(",") if d])
  # Config errors first: nothing is initialized, built or written for a bad config
  # (--check_cluster checks the config too when it is given one).
  if args.gin_file or bindings or not args.check_cluster:
    from vmx import experiment  # lazy: jax/TF only after cli.run_main's host set-up
    experiment.parse_gin(args.gin_file, bindings, args.gin_search_paths)
    experiment.check_paths()   # every input path the config names, before any long work
  if args.multihost or args.coordinator_address or args.check_cluster:
    from vmx.training import distributed  # lazy: jax, after cli.run_main's host set-up
    cluster = "single process"
    if args.multihost or args.coordinator_address:
      cluster = distributed.initialize(args.coordinator_address, args.num_processes,
                                       args.process_id)
    print(distributed.layout(cluster), flush=True)
    if args.check_cluster:
      import jax  # lazy: after cli.run_main
      total, n = distributed.check_all_reduce(), jax.device_count()
      print(f"[vmx] all-reduce over {n} devices: {total:g} ({'ok' if total == n else 'WRONG'})",
            flush=True)
      sys.exit(0 if total == n else 1)
  from vmx.training.trainer import train  # lazy: jax/TF, after cli.run_main's host set-up
  with signals.activity("preparing or running the training"):
    _, metrics = train()
  return metrics


if __name__ == "__main__":
  cli.run_main(main)
