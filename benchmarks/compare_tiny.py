#!/usr/bin/env python
"""CONTRASTIVE vs BITRANSLATION vs VMSST vs VMSST-CONTRASTIVE vs VMSST no-KL on one CPU budget.

  VMX_DATA_DIR=../shared/data python benchmarks/compare_tiny.py --out=/tmp/vmx/compare

Trains each method with launch/train.py on the same data, vocabulary, encoder size,
batch, length, optimizer and number of steps (the *_tiny.gin settings; CONTRASTIVE is
contrastive_tiny.gin brought to the same batch/length/steps), one after the other,
then prints a markdown table of Tatoeba accuracy (mean of xx->en and en->xx, x100) on
the trained languages, with the wall time of each run. A run whose model_dir already
holds the final checkpoint is not retrained (train.py resumes), so the script can be
re-run to print the table. Extra --gin.X=V flags apply to every run.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, BATCH, LENGTH = 600, 64, 24
SAME_BUDGET = [f"--gin.TRAIN_STEPS={STEPS}", f"--gin.BATCH_SIZE={BATCH}",
               f"--gin.MAX_LENGTH={LENGTH}", f"--gin.EVAL_PERIOD={STEPS // 2}",
               f"--gin.CHECKPOINT_PERIOD={STEPS // 2}"]
RUNS = {  # name -> (gin file, extra bindings)
    "CONTRASTIVE": ("contrastive_tiny.gin", []),
    "BITRANSLATION": ("bitranslation_tiny.gin", []),
    "VMSST": ("vmsst_tiny.gin", []),
    "VMSST-CONTRASTIVE": ("vmsst_contrastive_tiny.gin", []),
    "VMSST no KL": ("vmsst_tiny.gin", ["--gin.KL_WEIGHT=0.0"]),
}


def final_scores(model_dir: Path) -> dict:
  rows = [json.loads(l) for l in (model_dir / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if "tatoeba/mean" in r]
  return {"init": evals[0], "final": evals[-1]}


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="/tmp/vmx/compare", help="parent of the runs' model_dirs")
  p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(RUNS))
  args, extra = p.parse_known_args()
  names = [n.strip() for n in args.only.split(",") if n.strip()] or list(RUNS)
  for n in names:
    if n not in RUNS:
      raise SystemExit(f"error: --only: unknown run {n!r}; expected some of {list(RUNS)}")
  results = {}
  for name in names:
    gin_file, bindings = RUNS[name]
    model_dir = Path(args.out) / name.lower().replace(" ", "_").replace("-", "_")
    cmd = [sys.executable, str(REPO / "launch/train.py"), f"--gin_file={gin_file}",
           f"--gin.MODEL_DIR={model_dir}", *SAME_BUDGET, *bindings, *extra]
    print(f"[compare] {name}: {' '.join(cmd[1:])}", flush=True)
    t = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    results[name] = {**final_scores(model_dir), "wall_s": time.time() - t}
  langs = [k.split("/")[1] for k in next(iter(results.values()))["final"]
           if k.startswith("tatoeba/") and k != "tatoeba/mean"]
  print(f"\n| method (step {STEPS}, batch {BATCH}, length {LENGTH}) | "
        + " | ".join(langs) + " | mean | random init | wall |")
  print("|---" * (len(langs) + 4) + "|")
  for name, r in results.items():
    f = r["final"]
    print(f"| {name} | " + " | ".join(f"{f[f'tatoeba/{l}']:.1f}" for l in langs)
          + f" | **{f['tatoeba/mean']:.2f}** | {r['init']['tatoeba/mean']:.2f} "
          f"| {r['wall_s'] / 60:.1f} min |")
  print(json.dumps({n: {"tatoeba_mean": r["final"]["tatoeba/mean"], "wall_s": r["wall_s"]}
                    for n, r in results.items()}))


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  main()
