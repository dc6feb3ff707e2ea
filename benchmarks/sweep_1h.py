#!/usr/bin/env python
r"""The sweep behind contrastive_small_1h.gin: settings compared at one wall-clock budget
on the dev sets and Tatoeba (the data the project selects on; never a held-out test set).

  VMX_DATA_DIR=../shared/data python benchmarks/sweep_1h.py --out=/tmp/vmx/sweep \
      [--minutes=6] [--round=3 | --only="recipe,recipe lr 4e-3"]

Every setting is contrastive_small_1h.gin with its own bindings on top: in round 1
(2026-11-24) on top of the sweep's base (`SMALL`: Adam 1e-3, alpha 0.3), in round 2
(2026-11-26) on top of the recipe as it was then (`RECIPE`: alpha 0.5), in round 3
(2026-11-26, the default) on top of the recipe round 2 chose (alpha 0.7). Each is
trained for as many steps as fit `--minutes` of training on this machine: a 40-step
calibration run per distinct shape (layers, width, length, batch) measures steps/s, then
the run gets steps = minutes x 60 x steps/s (so the learning-rate schedule ends with the
budget).
The final checkpoint is scored with the harness's `dev` task (newstest2013 and the
first 1,000 TICO-19 sentences, both held out from training; the first 1,000 sentences
of each) and with Tatoeba over its 112 languages (`launch/eval.py --tasks=tatoeba`, ~1
min; kept in the run's eval/ and not redone): its mean, and its mean over the 98 languages
outside multilingual USE's 16 (its `outside_use` group), the languages the recipe is for. The
table printed: setting, steps, dev mean, newstest2013, tico19, Tatoeba, Tatoeba outside
USE, wall time (training). Run on an otherwise idle machine: the calibration decides the
steps. A run whose model_dir already holds the final checkpoint is not retrained
(train.py resumes).
Extra --gin.X=V flags apply to every run.
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
BASE = "contrastive_small_1h.gin"
SHAPE_KEYS = ("NUM_LAYERS", "EMB_DIM", "MLP_DIM", "NUM_HEADS", "MAX_LENGTH", "BATCH_SIZE",
              "VOCAB_SIZE")
# The sweep's base (what contrastive_small_1h.gin was before the sweep): Adam 1e-3, p ∝ n^0.3.
SMALL = {"NUM_LAYERS": 2, "EMB_DIM": 128, "NUM_HEADS": 4, "MLP_DIM": 512,
         "LEARNING_RATE": 1e-3, "ALPHA": 0.3}
# Round 2's base: contrastive_small_1h.gin before round 2 (it chose α 0.7 over this).
RECIPE = {"ALPHA": 0.5}
SETTINGS = {  # name -> bindings on top of contrastive_small_1h.gin
    "2L d128": {**SMALL},
    "4L d256": {**SMALL, "NUM_LAYERS": 4, "EMB_DIM": 256, "NUM_HEADS": 8, "MLP_DIM": 1024},
    "2L d128 length 48": {**SMALL, "MAX_LENGTH": 48},
    "2L d128 batch 256": {**SMALL, "BATCH_SIZE": 256},
    "2L d128 alpha 0.5": {**SMALL, "ALPHA": 0.5},
    "2L d128 alpha 0.5 lr 2e-3": {**SMALL, "ALPHA": 0.5, "LEARNING_RATE": 2e-3},
    "2L d128 lr 2e-3": {**SMALL, "LEARNING_RATE": 2e-3},
    "2L d128 tatoeba-challenge only": {
        **SMALL, "PAIR_CORPORA": "{'tatoeba-challenge': %TRAIN_LANGUAGES}"},
    # Round 2 (issue 45): the recipe as round 2 found it (`RECIPE`: α 0.5, Adam 2e-3, τ 0.05,
    # false negatives masked) with today's input path, ~5 steps/s instead of ~3.
    "recipe": {**RECIPE},
    "recipe lr 4e-3": {**RECIPE, "LEARNING_RATE": 4e-3},
    "recipe temperature 0.1": {**RECIPE, "TEMPERATURE": 0.1},
    "recipe temperature 0.03": {**RECIPE, "TEMPERATURE": 0.03},
    "recipe alpha 0.7": {**RECIPE, "ALPHA": 0.7},
    "recipe alpha 1.0": {**RECIPE, "ALPHA": 1.0},
    "recipe 3 layers": {**RECIPE, "NUM_LAYERS": 3},
    "recipe d 192": {**RECIPE, "EMB_DIM": 192, "NUM_HEADS": 6, "MLP_DIM": 768},
    "recipe batch 256": {**RECIPE, "BATCH_SIZE": 256},
    # Round 3 (issue 45): on top of the recipe round 2 chose (α 0.7; its base is round 2's
    # "recipe alpha 0.7" run), scored on Tatoeba outside USE as well as on the dev sets.
    "recipe alpha 0.7 temperature 0.03": {**RECIPE, "ALPHA": 0.7, "TEMPERATURE": 0.03},
    "recipe alpha 0.7 lr 3e-3": {**RECIPE, "ALPHA": 0.7, "LEARNING_RATE": 3e-3},
    "recipe alpha 0.7 d 192": {**RECIPE, "ALPHA": 0.7, "EMB_DIM": 192, "NUM_HEADS": 6,
                               "MLP_DIM": 768},
}
ROUND3 = ["recipe alpha 0.7"] + [n for n in SETTINGS if n.startswith("recipe alpha 0.7 ")]
ROUND2 = [n for n in SETTINGS if n.startswith("recipe") and n not in ROUND3[1:]]
ROUND1 = [n for n in SETTINGS if not n.startswith("recipe")]


def flags(bindings: dict) -> list[str]:
  return [f"--gin.{k}={v}" for k, v in bindings.items()]


def run(cmd):
  print("[sweep] " + " ".join(cmd[1:]), flush=True)
  subprocess.run(cmd, check=True, cwd=REPO)


def metrics(model_dir: Path) -> list[dict]:
  return common.metrics_rows(model_dir)


def tatoeba_scores(model_dir: Path, step: int) -> tuple[float, float]:
  """(Tatoeba mean over its 112 languages, its `outside_use` group's mean) of a checkpoint:
  launch/eval.py's result file, evaluated first where it is not there yet (or predates the
  group)."""
  out = model_dir / "eval" / f"checkpoint_{step}" / "tatoeba.json"
  if not out.exists() or "outside_use" not in json.loads(out.read_text())["groups"]:
    run([sys.executable, "launch/eval.py", f"--checkpoint_dir={model_dir}", f"--step={step}",
         "--tasks=tatoeba", "--languages=all", "--no_progress", "--no_plots"])
  res = json.loads(out.read_text())
  return res["main_score"], res["groups"]["outside_use"]["mean"]


def steps_per_sec(out: Path, bindings: dict, extra) -> float:
  """Steps/s of `bindings`' shape (SHAPE_KEYS) from a 40-step run of that shape alone
  (the other bindings do not change the speed); an earlier calibration of the shape under
  `out` is read, not rerun."""
  shape = {k: bindings[k] for k in SHAPE_KEYS if k in bindings}
  d = out / ("calibrate_" + "_".join(f"{k.lower()}{v}" for k, v in sorted(shape.items())))
  rows = [r for r in metrics(d) if "train/steps_per_sec" in r] if d.exists() else []
  if not rows or rows[-1]["step"] < 40:
    run(common.train_command(BASE, d, *flags(shape), "--gin.TRAIN_STEPS=40",
                             "--gin.LOG_PERIOD=20", "--gin.EVAL_PERIOD=0",
                             "--gin.BEST_METRIC=None", "--gin.CHECKPOINT_PERIOD=40", *extra))
    rows = [r for r in metrics(d) if "train/steps_per_sec" in r]
  return rows[-1]["train/steps_per_sec"]     # steps 21-40: compiled, buffers filled


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="/tmp/vmx/sweep")
  p.add_argument("--minutes", type=float, default=6.0, help="training budget per setting")
  p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(SETTINGS))
  p.add_argument("--round", type=int, choices=(1, 2, 3), default=3,
                 help="without --only: the settings of round 1 (2026-11-24, on top of the "
                      "sweep's base), round 2 (2026-11-26, on top of the recipe at α 0.5) or "
                      "round 3 (2026-11-26, on top of the recipe at α 0.7)")
  args, extra = p.parse_known_args()
  names = [n.strip() for n in args.only.split(",") if n.strip()] or (
      {1: ROUND1, 2: ROUND2, 3: ROUND3}[args.round])
  for n in names:
    if n not in SETTINGS:
      raise SystemExit(f"error: --only: unknown setting {n!r}; expected some of {list(SETTINGS)}")
  out = Path(args.out)
  speeds, results = {}, {}
  for name in names:
    b = SETTINGS[name]
    key = tuple(sorted((k, v) for k, v in b.items() if k in SHAPE_KEYS))
    if key not in speeds:
      speeds[key] = steps_per_sec(out, b, extra)
    steps = max(100, int(args.minutes * 60 * speeds[key]) // 100 * 100)
    d = out / name.lower().replace(" ", "_").replace("-", "_")
    t = time.time()
    run(common.train_command(BASE, d, *flags(b), f"--gin.TRAIN_STEPS={steps}",
                             f"--gin.WARMUP_STEPS={max(10, steps // 20)}",
                             f"--gin.EVAL_PERIOD={steps}", f"--gin.CHECKPOINT_PERIOD={steps}",
                             *extra))
    last = [r for r in metrics(d) if "dev/main_score" in r][-1]
    wall = time.time() - t
    tatoeba, outside = tatoeba_scores(d, steps)
    results[name] = {"steps": steps, "steps_per_sec": speeds[key], "wall_s": wall,
                     "dev": last["dev/main_score"], "newstest2013": last["dev/newstest2013"],
                     "tico19": last["dev/tico19"], "tatoeba": tatoeba,
                     "tatoeba_outside_use": outside}
  print(f"\n| setting ({args.minutes:g} min of training each) | steps | steps/s | **dev mean** "
        f"| newstest2013 | tico19 | Tatoeba | Tatoeba outside USE | wall |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, r in results.items():
    print(f"| {name} | {r['steps']} | {r['steps_per_sec']:.2f} | **{r['dev']:.2f}** | "
          f"{r['newstest2013']:.2f} | {r['tico19']:.2f} | {r['tatoeba']:.2f} | "
          f"{r['tatoeba_outside_use']:.2f} | {r['wall_s'] / 60:.1f} min |")
  print(json.dumps(results))


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  main()
