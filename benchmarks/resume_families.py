#!/usr/bin/env python
"""Resume equals uninterrupted, bit for bit, for every model family, through the real CLI
(`launch/train.py`) on the real data: for each family's tiny config, shrunk to a 1-layer
64-wide model and a few steps, one run goes uninterrupted to --steps; another stops at
--stop (`train.stop_at_step`, as a preempted job that saved), restarts with the same
command and finishes. The final checkpoints must be equal bit for bit.
EMMA-X stops inside its EM phase after the phase switch (warm-up --stop - 2 steps).

  VMX_DATA_DIR=../shared/data python benchmarks/resume_families.py [--families=ems,mpcl]

Prints one JSON line per family ({"family", "equal", "differ", "resumed", "seconds"}: the
checkpoints compared as benchmarks/kill_campaign.py does, params, optimizer and model
state bitwise, and the data state) and a summary;
exits 1 if any family differs. kill -9 and SIGTERM at random moments:
benchmarks/kill_campaign.py. The distillation family needs its teacher cache (the
MiniLM teacher, minutes to build); `--families=distill` runs it.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402  (the repository root first on sys.path)
SMALL = ["--gin.NUM_LAYERS=1", "--gin.EMB_DIM=64", "--gin.NUM_HEADS=2", "--gin.MLP_DIM=128",
         "--gin.MAX_LENGTH=16", "--gin.EVAL_PERIOD=0", "--gin.train.eval_cfg=None",
         "--gin.LOG_PERIOD=2", "--gin.BEST_METRIC=None"]
FAMILIES = {
    "contrastive": ("contrastive_tiny.gin", ["--gin.BATCH_SIZE=16"]),
    "vmsst": ("vmsst_tiny.gin", ["--gin.BATCH_SIZE=16"]),
    "ems": ("ems_tiny.gin", ["--gin.BATCH_SIZE=16"]),
    "mpcl": ("mpcl_tiny.gin", ["--gin.BATCH_SIZE=8"]),
    "infoxlm": ("infoxlm_tiny.gin", ["--gin.BATCH_SIZE=8", "--gin.QUEUE_SIZE=32",
                                    "--gin.NUM_LAYERS=3"]),  # its XLCO layer is 2
    "emmax": ("emmax_tiny.gin", ["--gin.BATCH_SIZE=16", "--gin.QUEUE_SIZE=32",
                                 "--gin.EM_TEXT_BATCH_SIZE=8", "--gin.EM_PAIRS_BATCH_SIZE=4"]),
    "distill": ("distill_minilm_1h.gin", ["--gin.BATCH_SIZE=16"]),
}
DEFAULT = "contrastive,vmsst,ems,mpcl,infoxlm,emmax"


def _train(gin_file, extra, model_dir, steps, stop=None):
  stop_flag = [] if stop is None else [f"--gin.train.stop_at_step={stop}"]
  out = common.run(common.train_command(gin_file, model_dir, *SMALL, *extra,
                                        f"--gin.TRAIN_STEPS={steps}",
                                        f"--gin.CHECKPOINT_PERIOD={steps}",
                                        "--gin.train.progress=False", *stop_flag),
                   common.train_env(None), check=True)
  return out.stdout


def run_family(name, steps, stop, work):
  gin_file, extra = FAMILIES[name]
  if name == "emmax":
    extra = [*extra, f"--gin.WARMUP_STEPS_PHASE={stop - 2}",
             f"--gin.EM_STEPS_PHASE={steps - stop + 2}"]
  t0 = time.time()
  full, split = os.path.join(work, name, "full"), os.path.join(work, name, "split")
  _train(gin_file, extra, full, steps)
  _train(gin_file, extra, split, steps, stop=stop)
  log = _train(gin_file, extra, split, steps)
  diffs = common.same_final_state(full, split, steps)
  return {"family": name, "equal": not diffs, "differ": diffs[:3],
          "resumed": f"checkpoint_{stop}" in log, "seconds": round(time.time() - t0, 1)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--families", default=DEFAULT, help=f"comma-separated of {list(FAMILIES)}")
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--stop", type=int, default=5)
  p.add_argument("--work_dir", default=None)
  args = p.parse_args(argv)
  names = [n for n in args.families.split(",") if n]
  unknown = [n for n in names if n not in FAMILIES]
  if unknown:
    p.error(f"--families: unknown {unknown}; known: {list(FAMILIES)}")
  work = args.work_dir or tempfile.mkdtemp(prefix="vmx_resume_")
  results = []
  for name in names:
    r = run_family(name, args.steps, args.stop, work)
    print(json.dumps(r), flush=True)
    results.append(r)
  ok = all(r["equal"] and r["resumed"] for r in results)
  print(json.dumps({"families": len(results), "all_equal": ok}), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
