#!/usr/bin/env python
r"""Distil a static encoder from any vmx model directory (Model2Vec's way: each token's
vector from the teacher, PCA, frequency weights; vmx/static_distill.py).

  python launch/distill_static.py --teacher_dir=/tmp/vmx/small_1h_packed --step=best \
      --output_dir=/tmp/vmx/static_distilled [--dim=256] [--sif=1e-4]

The output is a vmx model directory: launch/eval.py scores it, Encoder.from_checkpoint
serves it, launch/export_checkpoint.py writes it as a sentence-transformers StaticEmbedding,
and `static_1h.gin --gin.INITIAL_CHECKPOINT_PATH=OUTPUT_DIR` fine-tunes it with the recipe.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli, signals
  signals.install()
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--teacher_dir", required=True, help="vmx model directory (any method)")
  p.add_argument("--output_dir", required=True, help="the static model directory to write")
  p.add_argument("--step", default=None, help="the teacher's step: a number, 'best' or "
                                              "the newest (default)")
  p.add_argument("--dim", type=int, default=256, help="PCA dimensions (at most the teacher's)")
  p.add_argument("--sif", type=float, default=1e-4, help="SIF's a in a / (a + p(token))")
  args = p.parse_args(argv)
  step = int(args.step) if args.step and args.step.isdigit() else args.step
  from vmx import static_distill  # lazy: jax, after cli.run_main's host set-up
  with signals.activity("distilling a static encoder"):
    summary = static_distill.distill(args.teacher_dir, args.output_dir, args.dim, args.sif,
                                     step=step)
  print("[vmx distill_static] " + json.dumps(summary))


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
