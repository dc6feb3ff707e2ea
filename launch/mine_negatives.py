#!/usr/bin/env python
"""Mine hard negatives for training pairs with a model itself, false negatives filtered.

  python launch/mine_negatives.py --checkpoint_dir=DIR --pairs=train.deu-eng.tsv \\
      --output=hard.tsv [--negatives=1] [--candidates=30] [--relative_margin=0.05] \\
      [--absolute_margin=0] [--source_lang=deu --target_lang=eng]

  python launch/mine_negatives.py --checkpoint_dir=DIR --pairs=PAIRS_DIR --output=OUT_DIR

PAIRS: `source<TAB>target` lines; or a directory of `<source>-<target>.tsv` files (a
mixture's tasks: each mined on its own, languages from its name, into OUT_DIR under the
same name; a file already in OUT_DIR is kept, so a killed run resumes, and
OUT_DIR/mine_negatives.json refuses a rerun with other settings;
tasks.mined_negatives_mixture trains on OUT_DIR). For each pair, the targets of the file nearest to its
source (cosine, exact), best first, lose the pair's own target and any equal text, the
other translations of the same source, and those scoring above the positive by either
margin (the relative one on cosines shifted to [0, 1], so a negative score cannot flip
it); the first --negatives kept are written: `source<TAB>positive<TAB>negative...`
(vmx/negatives.py). A pair with fewer is left out and counted. The hard-negative variants
of CONTRASTIVE and MPCL train on the file (contrastive_mined_negatives_tiny.gin,
mpcl_mined_negatives_tiny.gin: tasks.mined_negatives_task) or the directory
(tasks.mined_negatives_mixture).
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
  p.add_argument("--pairs", required=True,
                 help="source<TAB>target lines, or a directory of <source>-<target>.tsv files")
  p.add_argument("--output", required=True, help="a file (a directory for a --pairs directory)")
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--negatives", type=int, default=1, help="hard negatives a pair")
  p.add_argument("--candidates", type=int, default=30, help="nearest targets looked at")
  p.add_argument("--relative_margin", type=float, default=0.05,
                 help="a negative's shifted cosine at most (1 - this) x the positive's")
  p.add_argument("--absolute_margin", type=float, default=0.0,
                 help="a negative's cosine at most the positive's minus this")
  p.add_argument("--empty_sides", choices=("error", "skip"), default="error",
                 help="a pair with an empty side: an error naming file:line, or skipped and "
                      "counted")
  p.add_argument("--source_lang", default=None)
  p.add_argument("--target_lang", default=None)
  p.add_argument("--batch_size", type=int, default=256)
  args = p.parse_args(argv)
  from vmx import negatives
  from vmx.errors import InputError
  f = negatives.Filter(args.negatives, args.candidates, args.absolute_margin,
                       args.relative_margin)
  f.check()
  from vmx import storage
  from vmx.inference import Encoder   # lazy: jax, after cli.run_main's host set-up
  if storage.path(args.pairs).is_dir():
    if args.source_lang or args.target_lang:
      raise InputError("--source_lang/--target_lang: a --pairs directory takes each file's "
                       "languages from its name (<source>-<target>.tsv)")
    negatives.pair_files(args.pairs)   # a misnamed file refused before the model loads
    enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step,
                                  batch_size=args.batch_size)
    where = (args.checkpoint_dir if storage.is_remote(args.checkpoint_dir)
             else os.path.abspath(args.checkpoint_dir))
    model = {"checkpoint_dir": where, "revision": enc.revision}   # (the step resolved)
    s = negatives.mine_directory(enc, args.pairs, args.output, f, args.overwrite,
                                 args.empty_sides, model=model)
    print(f"{s['written']:,} of {s['pairs']:,} pairs in {s['files'] - s['kept']} file(s) "
          f"with {args.negatives} hard negative(s) -> {s['output']} ({s['kept']} file(s) "
          f"mined before kept; {s['left_out']:,} left out with too few, "
          f"{s['skipped_empty']:,} with an empty side; candidates "
          f"dropped: {json.dumps(s['dropped'])})")
    return
  enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step, batch_size=args.batch_size)
  s = negatives.mine(enc, args.pairs, args.output, f, args.source_lang, args.target_lang,
                     args.overwrite, args.empty_sides)
  print(f"{s['written']:,} of {s['pairs']:,} pairs with {args.negatives} hard negative(s) "
        f"-> {s['output']} ({s['left_out']:,} left out with too few, "
        f"{s['skipped_empty']:,} with an empty side; candidates dropped: "
        f"{json.dumps(s['dropped'])})")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main, host_malloc="off")   # memory, not step speed (vmx/cli.py)
