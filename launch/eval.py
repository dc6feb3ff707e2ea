#!/usr/bin/env python
"""Evaluate a trained vmx model (no TensorFlow needed).

  python launch/eval.py --checkpoint_dir=/tmp/vmx/contrastive_tiny --tasks=tatoeba \
      [--languages=deu,fra] [--step=N] [--output=results.json] [--data_dir=...]

Prints a per-language table and writes JSON (default CHECKPOINT_DIR/eval_tatoeba.json).
Languages default to those the model was trained on that have a Tatoeba test set.
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TASKS = ("tatoeba",)


def main(argv):
  from vmx.data import download
  from vmx.evaluation import tatoeba
  from vmx.inference import Encoder, read_model_info

  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True, help="a vmx model_dir")
  p.add_argument("--tasks", default="tatoeba", help=f"comma-separated, of {TASKS}")
  p.add_argument("--languages", default="", help="comma-separated ISO 639-3 codes")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  p.add_argument("--data_dir", default=None, help="default: $VMX_DATA_DIR or the cache")
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--output", default=None, help="JSON results path")
  args = p.parse_args(argv)
  unknown = set(args.tasks.split(",")) - set(TASKS)
  if unknown:
    raise download.DataError(f"--tasks: unknown task(s) {sorted(unknown)}; known: {TASKS}")
  info = read_model_info(args.checkpoint_dir)
  langs = [l for l in args.languages.split(",") if l]
  if not langs:
    langs = [l for l in info["languages"]
             if f"eval/tatoeba/v1/tatoeba.{l}-eng.{l}" in download.registry()]
  enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step,
                                batch_size=args.batch_size)
  res = tatoeba.evaluate(lambda s, l: enc.encode(s, lang=l), langs, args.data_dir,
                         progress=True)
  print(tatoeba.format_table(res))
  out = Path(args.output or Path(args.checkpoint_dir) / "eval_tatoeba.json")
  out.write_text(json.dumps({"task": "tatoeba", "checkpoint_dir": str(args.checkpoint_dir),
                             **res}, indent=1))
  print(f"wrote {out}")
  return res


if __name__ == "__main__":
  from vmx.gin_utils import run_main
  run_main(main)
