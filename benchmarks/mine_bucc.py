#!/usr/bin/env python
"""Held-out bitext mining: launch/mine.py's job on a BUCC split against the BUCC
evaluation's own figure from the same encoder's vectors.

  VMX_DATA_DIR=../shared/data python benchmarks/mine_bucc.py --checkpoint_dir=DIR [--pair=de-en]

The reference is vmx/evaluation/bucc.py (ratio margin, k = 4, max retrieval, the threshold
chosen on the split's gold, texts unified as LASER's --unify). The job gets the split's
sentences without their ids, in two text files, and that threshold; its mined text pairs
are mapped back to ids (a text carries every id it has) and scored against the same gold.
Prints one JSON line: both F1s, their difference (bar: within 0.5), the job's stage times.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True)
  p.add_argument("--step", type=int, default=None)
  p.add_argument("--pair", default="de-en")
  p.add_argument("--split", default="sample")
  p.add_argument("--shard_size", type=int, default=10_000)
  args = p.parse_args(argv)
  from vmx import bitext
  from vmx.evaluation import bucc, common, mining
  from vmx.data.languages import iso3
  from vmx.inference import Encoder
  enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step, batch_size=256)
  t0 = time.time()
  ref = bucc.evaluate(lambda s, lang: enc.encode(s, lang=lang), pairs=[args.pair])
  row = ref["scores"]["test"][0]
  threshold, f1_ref = row["margin_max"]["threshold"], row["margin_max"]["f1"]
  t_ref = time.time() - t0
  files = common.DataFiles("bucc", None)
  (s_ids, s_txt), (t_ids, t_txt), gold = bucc._split_data(files, args.pair, args.split)
  src_lang = args.pair.split("-")[0]
  with tempfile.TemporaryDirectory() as d:
    for name, lines in (("src.txt", s_txt), ("tgt.txt", t_txt)):
      with open(os.path.join(d, name), "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    t0 = time.time()
    summary = bitext.mine(enc, args.checkpoint_dir, os.path.join(d, "src.txt"),
                          os.path.join(d, "tgt.txt"), os.path.join(d, "out.tsv"),
                          os.path.join(d, "work"), bitext.Settings(
                              k=4, margin="ratio", retrieval="max", threshold=threshold,
                              shard_size=args.shard_size, source_lang=iso3(src_lang),
                              target_lang="eng"))
    t_job = time.time() - t0
    with open(os.path.join(d, "out.tsv"), encoding="utf-8") as f:
      mined = [line.rstrip("\n").split("\t") for line in f]
  ids = {side: defaultdict(list) for side in ("s", "t")}
  for i, s in zip(s_ids, s_txt):
    ids["s"][s].append(i)
  for i, s in zip(t_ids, t_txt):
    ids["t"][s].append(i)
  pairs = {(a, b) for _, s, t in mined for a in ids["s"][s] for b in ids["t"][t]}
  _, _, f1_job = mining.prf(len(pairs & gold), len(pairs), len(gold))
  print(json.dumps({"pair": args.pair, "split": args.split, "checkpoint": args.checkpoint_dir,
                    "sentences": [len(s_txt), len(t_txt)], "gold": len(gold),
                    "threshold": threshold, "f1_reference": round(f1_ref, 3),
                    "f1_job": round(f1_job, 3), "f1_difference": round(f1_job - f1_ref, 3),
                    "within_0.5": abs(f1_job - f1_ref) <= 0.5, "pairs_mined": len(mined),
                    "seconds_reference": round(t_ref, 1), "seconds_job": round(t_job, 1),
                    "job": {k: summary[k] for k in ("source_truncated", "target_truncated")}}))


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
