#!/usr/bin/env python
r"""The methods on one CPU budget: VMSST and its baselines, EMS and its ablations, MPCL vs +Single.

  VMX_DATA_DIR=../shared/data python benchmarks/compare_tiny.py --out=/tmp/vmx/compare \
      [--only=EMS,"EMS no XTR"] [--sts]

Trains each method with launch/train.py on the same encoder size, length, optimizer and
number of steps (the *_tiny.gin settings; CONTRASTIVE is contrastive_tiny.gin brought to
the same batch/length/steps), one after the other, then prints a markdown table of
Tatoeba accuracy (mean of xx->en and en->xx, x100) on the trained languages (per
language when the runs share them), with the wall time of each run; `--sts` adds the
STS benchmark (test Spearman x100) of each final checkpoint. Pair models see 64 pairs a
step; MPCL 32 groups x 4 views (128 sentences, on N-way newstest groups, evaluated on
their own 7 languages), "+Single" the very batches of MPCL with one positive each,
"+Single 64 pairs" 64 groups x 2 views; "all anchors" makes every view an anchor. A run
whose model_dir already holds the final checkpoint is not retrained (train.py resumes),
so the script can be re-run to print the table. Extra --gin.X=V flags apply to every run.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)
STEPS, BATCH, LENGTH = 600, 64, 24
SAME_BUDGET = [f"--gin.TRAIN_STEPS={STEPS}", f"--gin.MAX_LENGTH={LENGTH}",
               f"--gin.EVAL_PERIOD={STEPS // 2}", f"--gin.CHECKPOINT_PERIOD={STEPS // 2}"]
PAIR_BATCH = [f"--gin.BATCH_SIZE={BATCH}"]
RUNS = {  # name -> (gin file, extra bindings); pair models get BATCH pairs a step
    "CONTRASTIVE": ("contrastive_tiny.gin", PAIR_BATCH),
    "BITRANSLATION": ("bitranslation_tiny.gin", PAIR_BATCH),
    "VMSST": ("vmsst_tiny.gin", PAIR_BATCH),
    "VMSST-CONTRASTIVE": ("vmsst_contrastive_tiny.gin", PAIR_BATCH),
    "VMSST-CONTRASTIVE summed": ("ablations/vmsst_contrastive_tiny_summed.gin", PAIR_BATCH),
    "VMSST no KL": ("vmsst_tiny.gin", PAIR_BATCH + ["--gin.KL_WEIGHT=0.0"]),
    "EMS": ("ems_tiny.gin", PAIR_BATCH),
    "EMS no XTR": ("ems_tiny.gin", PAIR_BATCH + ["--gin.XTR_WEIGHT=0.0"]),
    "EMS no contrastive": ("ems_tiny.gin", PAIR_BATCH + ["--gin.CONTRASTIVE_WEIGHT=0.0"]),
    "MPCL": ("mpcl_tiny.gin", []),
    # the very batches of MPCL (32 groups x 4 views), one positive each (views paired 0-1, 2-3)
    "MPCL +Single": ("mpcl_single_tiny.gin", []),
    # 64 groups x 2 views: as many sentences a step, twice the meanings
    "MPCL +Single 64 pairs": ("ablations/mpcl_single_pairs_tiny.gin", []),
    "MPCL all anchors": ("mpcl_tiny.gin", ["--gin.ANCHORS='all'"]),
    "MPCL +Single all anchors": ("mpcl_single_tiny.gin", ["--gin.ANCHORS='all'"]),
    "MPCL no rescaling": ("mpcl_tiny.gin", ["--gin.RESCALE_SIMILARITIES=False"]),
    "MPCL +Single no rescaling": ("mpcl_single_tiny.gin", ["--gin.RESCALE_SIMILARITIES=False"]),
    "MPCL +Single 64 pairs no rescaling": ("ablations/mpcl_single_pairs_tiny.gin",
                                           ["--gin.RESCALE_SIMILARITIES=False"]),
}


def sts_benchmark(model_dir: Path) -> float:
  from vmx.evaluation import harness
  from vmx.inference import Encoder
  res = harness.run(Encoder.from_checkpoint(model_dir), tasks=["stsb"],
                    config=harness.EvalConfig(progress=False, plots=False))
  return res["stsb"]["main_score"]


def final_scores(model_dir: Path) -> dict:
  rows = common.metrics_rows(model_dir)
  evals = [r for r in rows if "tatoeba/mean" in r]
  return {"init": evals[0], "final": evals[-1]}


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="/tmp/vmx/compare", help="parent of the runs' model_dirs")
  p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(RUNS))
  p.add_argument("--sts", action="store_true", help="also score the STS benchmark")
  args, extra = p.parse_known_args()
  names = [n.strip() for n in args.only.split(",") if n.strip()] or list(RUNS)
  for n in names:
    if n not in RUNS:
      raise SystemExit(f"error: --only: unknown run {n!r}; expected some of {list(RUNS)}")
  results = {}
  for name in names:
    gin_file, bindings = RUNS[name]
    model_dir = Path(args.out) / name.lower().replace(" ", "_").replace("-", "_").replace("+", "")
    cmd = common.train_command(gin_file, model_dir, *SAME_BUDGET, *bindings, *extra)
    print(f"[compare] {name}: {' '.join(cmd[1:])}", flush=True)
    t = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    results[name] = {**final_scores(model_dir), "wall_s": time.time() - t}
    if args.sts:
      results[name]["stsb"] = sts_benchmark(model_dir)
  lang_sets = {tuple(k.split("/")[1] for k in r["final"]
                     if k.startswith("tatoeba/") and k != "tatoeba/mean")
               for r in results.values()}
  langs = list(next(iter(lang_sets))) if len(lang_sets) == 1 else []
  sts_col = " STS-B |" if args.sts else ""
  print(f"\n| method (step {STEPS}, length {LENGTH}) | " + "".join(f"{l} | " for l in langs)
        + f"Tatoeba mean | random init |{sts_col} wall |")
  print("|---" * (len(langs) + 4 + bool(args.sts)) + "|")
  for name, r in results.items():
    f = r["final"]
    sts = f" {r['stsb']:.2f} |" if args.sts else ""
    print(f"| {name} | " + "".join(f"{f[f'tatoeba/{l}']:.1f} | " for l in langs)
          + f"**{f['tatoeba/mean']:.2f}** | {r['init']['tatoeba/mean']:.2f} |{sts} "
          f"{r['wall_s'] / 60:.1f} min |")
  print(json.dumps({n: {"tatoeba_mean": r["final"]["tatoeba/mean"], "wall_s": r["wall_s"],
                        **({"stsb": r["stsb"]} if args.sts else {})}
                    for n, r in results.items()}))


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  main()
