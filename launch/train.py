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


def main(argv):
  bindings, rest = gin_utils.split_gin_bindings(argv)
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(parser)
  parser.add_argument("--multihost", action="store_true",
                      help="call jax.distributed.initialize() (TPU pods, multi-node GPU)")
  args = parser.parse_args(rest)
  if args.multihost:
    import jax
    jax.distributed.initialize()
  gin_utils.parse_gin(args.gin_file, bindings, args.gin_search_paths)
  from vmx.training.trainer import train
  _, metrics = train()
  return metrics


if __name__ == "__main__":
  gin_utils.run_main(main)
