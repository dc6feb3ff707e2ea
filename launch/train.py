#!/usr/bin/env python
"""Train a vmx model from gin files (t5x's shape).

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

from vmx import gin_utils  # noqa: E402


def require_training_extra():
  """`pip install vmx` is inference only; say how to get the training pipeline."""
  missing = [m for m in ("seqio", "tensorflow") if importlib.util.find_spec(m) is None]
  if missing:
    raise gin_utils.ConfigError(
        f"training needs {' and '.join(missing)}, which the base install leaves out "
        "(it is inference and evaluation only): pip install 'vmx[train]' "
        "(in a checkout: pip install -e '.[train]')")


def main(argv):
  bindings, rest = gin_utils.split_gin_bindings(argv)
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(parser)
  parser.add_argument("--multihost", action="store_true",
                      help="call jax.distributed.initialize() (TPU pods, multi-node GPU; "
                           "cluster auto-detected unless the three flags below are given)")
  parser.add_argument("--coordinator_address", default=None,
                      help="host:port of process 0 (explicit multi-process set-up)")
  parser.add_argument("--num_processes", type=int, default=None)
  parser.add_argument("--process_id", type=int, default=None)
  args = parser.parse_args(rest)
  require_training_extra()
  # Config errors first: nothing is initialized, built or written for a bad config.
  gin_utils.parse_gin(args.gin_file, bindings, args.gin_search_paths)
  if args.multihost or args.coordinator_address:
    import jax
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if any(x is not None for x in explicit) and any(x is None for x in explicit):
      raise gin_utils.ConfigError("--coordinator_address, --num_processes and --process_id "
                                  "go together")
    if explicit[0]:
      jax.distributed.initialize(*explicit)
    else:
      jax.distributed.initialize()
    print(f"[vmx] process {jax.process_index()} of {jax.process_count()}: "
          f"{jax.local_device_count()} local / {jax.device_count()} devices", flush=True)
  from vmx.training.trainer import train
  _, metrics = train()
  return metrics


if __name__ == "__main__":
  gin_utils.run_main(main)
