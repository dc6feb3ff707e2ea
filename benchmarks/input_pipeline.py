#!/usr/bin/env python
"""The training input pipeline of a gin experiment on its real data: seconds until the
first batch (registering the tasks, opening their sources and filters, filling the
shuffle buffers), batches per second after it, and the seconds a run resumed at step
`--skip` spends reaching its data position (`DataIterator.restore` replays the stream).

  VMX_DATA_DIR=../shared/data python benchmarks/input_pipeline.py \
      --gin_file=contrastive_small_1h.gin --batches=200 --skip=1000

Same flags as launch/train.py; MODEL_DIR may stay unset. A recipe whose vocabulary or
teacher cache is not built yet builds it first (not counted). Phased runs: the first
phase. Prints one JSON line: first_batch_s, batches_per_s, examples_per_s, skip_s,
skip_batches_per_s.
"""
import importlib.util  # noqa: F401  (gin-config 0.5 needs it imported first)
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402

from vmx import cli, gin_utils  # noqa: E402


@gin.configurable
def input_objects(model=gin.REQUIRED, train_dataset_cfg=None, phases=None, random_seed=0):
  """(model, dataset config, seed) of the parsed experiment (phased: its first phase's)."""
  if train_dataset_cfg is None:
    if not phases:
      raise SystemExit("error: the experiment sets neither train.train_dataset_cfg nor "
                       "train.phases")
    return phases[0].model or model, phases[0].train_dataset_cfg, random_seed
  return model, train_dataset_cfg, random_seed


def main(argv):
  bindings, rest = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--batches", type=int, default=100, help="batches timed after the first")
  p.add_argument("--skip", type=int, default=0, help="also time a resume at this step")
  args = p.parse_args(rest)
  from vmx import experiment  # lazy: jax only after cli.run_main's host set-up
  experiment.parse_experiment(args.gin_file, [*bindings, "input_objects.model = %MODEL"],
                             args.gin_search_paths)
  for name in ("train_dataset_cfg", "phases", "random_seed"):
    try:
      gin.bind_parameter(f"input_objects.{name}", gin.query_parameter(f"train.{name}"))
    except ValueError:   # not bound in this experiment
      pass
  from vmx.data import pipeline
  model, cfg, seed = input_objects()
  fc = model.FEATURE_CONVERTER_CLS
  batch_size = sum(c.batch_size for c in pipeline.task_configs(cfg).values())

  t0 = time.perf_counter()
  it = pipeline.train_iterator(cfg, fc, seed)
  next(it)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(args.batches):
    next(it)
  rate = args.batches / (time.perf_counter() - t0)
  out = {"first_batch_s": round(first, 2), "batches_per_s": round(rate, 2),
         "examples_per_s": round(rate * batch_size, 1), "batch_size": batch_size}
  if args.skip:
    t0 = time.perf_counter()
    it = pipeline.train_iterator(cfg, fc, seed)
    it.restore({"position": args.skip})
    next(it)
    skip_s = time.perf_counter() - t0
    out.update(skip_s=round(skip_s, 2), skip_batches=args.skip,
               skip_batches_per_s=round(args.skip / skip_s, 2))
  print(json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  cli.run_main(main)
