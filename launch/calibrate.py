#!/usr/bin/env python
"""Calibrate a model's int8 vectors: each dimension's range over a corpus's vectors, stored
beside the model (MODEL_DIR/quantization.json, vmx/quantize.py).

  python launch/calibrate.py --checkpoint_dir=DIR --corpus=dev.de --corpus=dev.en \\
      [--langs=deu,eng] [--embedding_dim=64] [--max_sentences=20000]

Then `Encoder.encode(..., precision='int8')`, `launch/eval.py --precision=int8` and
`launch/mine.py --precision=int8` use it. Calibrate on text like the text you will
encode (a dev set in the model's languages, not a test set); each vector size
(`--embedding_dim`, Matryoshka) has its own ranges. Empty lines are skipped.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True)
  p.add_argument("--step", type=cli.step_flag, default=None)
  p.add_argument("--corpus", action="append", required=True,
                 help="a text file, one sentence a line (repeatable)")
  p.add_argument("--langs", default="",
                 help="ISO 639-3 code of each --corpus, comma-separated (models that read "
                      "language ids)")
  p.add_argument("--embedding_dim", type=int, default=None)
  p.add_argument("--max_sentences", type=int, default=20_000,
                 help="the first N sentences of the corpora, shared evenly")
  args = p.parse_args(argv)
  langs = [l for l in args.langs.split(",") if l] or [None] * len(args.corpus)
  if len(langs) != len(args.corpus):
    p.error(f"--langs has {len(langs)} codes for {len(args.corpus)} --corpus files")
  if args.max_sentences < 2:
    p.error(f"--max_sentences={args.max_sentences}: expected at least 2")
  import numpy as np
  from vmx import quantize
  from vmx.data import readers
  from vmx.errors import DataError
  from vmx.inference import Encoder   # lazy: jax, after cli.run_main's host set-up
  enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step, dim=args.embedding_dim)
  per = max(1, args.max_sentences // len(args.corpus))
  vecs = []
  for path, lang in zip(args.corpus, langs):
    lines = []
    for _, line in readers.iter_lines(path):   # invalid UTF-8: one error naming path:line
      if line.strip():
        lines.append(line)
        if len(lines) == per:
          break
    if not lines:
      raise DataError(f"{path}: no sentence to calibrate on")
    vecs.append(enc.encode_counting(lines, lang=lang)[0])
  ranges = quantize.calibrate(np.concatenate(vecs))
  quantize.save(args.checkpoint_dir, ranges)
  print(f"calibrated int8 for {len(ranges['min'])}-dimensional vectors on "
        f"{ranges['sentences']:,} sentences -> "
        f"{os.path.join(args.checkpoint_dir, quantize.FILE)}")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
