#!/usr/bin/env python
"""Mine hard negatives for training pairs with a model itself, false negatives filtered.

  python launch/mine_negatives.py --checkpoint_dir=DIR --pairs=train.deu-eng.tsv \\
      --output=hard.tsv [--negatives=1] [--candidates=30] [--relative_margin=0.05] \\
      [--absolute_margin=0] [--source_lang=deu --target_lang=eng]

PAIRS: `source<TAB>target` lines. For each pair, the targets of the file nearest to its
source (cosine, exact), best first, lose the pair's own target and any equal text, the
other translations of the same source, and those scoring above the positive by either
margin (the relative one on cosines shifted to [0, 1], so a negative score cannot flip
it); the first --negatives kept are written: `source<TAB>positive<TAB>negative...`
(vmx/negatives.py). A pair with fewer is left out and counted. MPCL's hard-negative
variant trains on the file (gin_configs/mpcl_mined_negatives_tiny.gin, tasks.mined_negatives_task).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True)
  p.add_argument("--step", type=cli.step_flag, default=None)
  p.add_argument("--pairs", required=True, help="source<TAB>target lines")
  p.add_argument("--output", required=True)
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--negatives", type=int, default=1, help="hard negatives a pair")
  p.add_argument("--candidates", type=int, default=30, help="nearest targets looked at")
  p.add_argument("--relative_margin", type=float, default=0.05,
                 help="a negative's shifted cosine at most (1 - this) x the positive's")
  p.add_argument("--absolute_margin", type=float, default=0.0,
                 help="a negative's cosine at most the positive's minus this")
  p.add_argument("--source_lang", default=None)
  p.add_argument("--target_lang", default=None)
  p.add_argument("--batch_size", type=int, default=256)
  args = p.parse_args(argv)
  from vmx import negatives
  f = negatives.Filter(args.negatives, args.candidates, args.absolute_margin,
                       args.relative_margin)
  f.check()
  from vmx.inference import Encoder   # lazy: jax, after cli.run_main's host set-up
  enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step, batch_size=args.batch_size)
  s = negatives.mine(enc, args.pairs, args.output, f, args.source_lang, args.target_lang,
                     args.overwrite)
  print(f"{s['written']:,} of {s['pairs']:,} pairs with {args.negatives} hard negative(s) "
        f"-> {s['output']} ({s['left_out']:,} left out with too few; candidates dropped: "
        f"{json.dumps(s['dropped'])})")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main, host_malloc="off")   # memory, not step speed (vmx/cli.py)
