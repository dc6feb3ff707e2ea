#!/usr/bin/env python
"""Packed against unpacked training, the same experiment one run after the other.

  VMX_DATA_DIR=../shared/data python benchmarks/packing.py --gin_file=contrastive_small_1h.gin --steps=400
  VMX_DATA_DIR=../shared/data python benchmarks/packing.py --gin_file=vmsst_tiny.gin --steps=200

Trains `--steps` steps with PACKING = True, then with PACKING = False (launch/train.py, no
evaluation, one checkpoint at the end, LOG_PERIOD = 50) and prints one JSON line per run
and a comparison: useful_token_fraction (non-pad positions over all positions the step
computes), examples/s over the log periods after the first (the first holds the
compilation; a packed run also compiles each new row count once: `shapes` says how often
each ran and what its first step took), the loss logged at step 50 (the same examples: equal
up to float rounding) and the relative difference. Extra `--gin.X=Y` flags go to both runs.
Figures: docs/performance.md, "Packing".
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(gin_file: str, steps: int, packing: bool, extra: list[str], model_dir: str) -> dict:
  args = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--gin_file={gin_file}",
          f"--gin.MODEL_DIR={model_dir}", f"--gin.TRAIN_STEPS={steps}", "--gin.EVAL_PERIOD=0",
          f"--gin.CHECKPOINT_PERIOD={steps}", "--gin.LOG_PERIOD=50",
          f"--gin.PACKING={packing}", "--gin.BEST_METRIC=None", "--gin.train.progress=False",
          *extra]
  t0 = time.time()
  proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
  wall = time.time() - t0
  if proc.returncode:
    sys.exit(f"packing benchmark: {' '.join(args[1:])} failed:\n{proc.stderr[-3000:]}")
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  train = [r for r in rows if "train/loss" in r]
  later = train[1:] or train
  seconds = sum(50 / r["train/steps_per_sec"] for r in later)
  batch = later[0]["train/examples_per_sec"] / later[0]["train/steps_per_sec"]
  shapes = re.search(r"packed batches: (.*)", proc.stdout + proc.stderr)
  rates = sorted(r["train/examples_per_sec"] for r in later)
  # the compilations of the row counts first met after the first log period
  compiles = sum(float(sec) for at, sec in re.findall(r"first: step (\d+) of this run, "
                                                      r"([\d.]+) s", proc.stdout + proc.stderr)
                 if int(at) > 50)
  return {"gin_file": gin_file, "packing": packing, "steps": steps, "wall_s": round(wall, 1),
          "examples_per_s": round(len(later) * 50 * batch / seconds, 1),
          "examples_per_s_median": round(rates[len(rates) // 2], 1),
          "examples_per_s_past_compilations": round(
              len(later) * 50 * batch / max(seconds - compiles, 1e-9), 1),
          "useful_token_fraction": round(sum(r["train/useful_token_fraction"] for r in train)
                                         / len(train), 4),
          "loss_at_50": next(r["train/loss"] for r in train if r["step"] == 50),
          "shapes": shapes.group(1) if shapes else None}


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--gin_file", required=True)
  p.add_argument("--steps", type=int, default=400)
  args, extra = p.parse_known_args()
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for packing in (True, False):
      out[packing] = run(args.gin_file, args.steps, packing, extra,
                         os.path.join(tmp, f"packed_{packing}"))
      print(json.dumps(out[packing]), flush=True)
  a, b = out[True], out[False]
  print(json.dumps({"gin_file": args.gin_file,
                    "speedup_examples_per_s": round(a["examples_per_s"] / b["examples_per_s"], 3),
                    "speedup_median_period": round(a["examples_per_s_median"]
                                                   / b["examples_per_s_median"], 3),
                    "speedup_past_compilations": round(
                        a["examples_per_s_past_compilations"]
                        / b["examples_per_s_past_compilations"], 3),
                    "useful_token_fraction": [a["useful_token_fraction"],
                                              b["useful_token_fraction"]],
                    "loss_at_50_relative_difference": abs(a["loss_at_50"] - b["loss_at_50"])
                    / abs(b["loss_at_50"])}))


if __name__ == "__main__":
  main()
