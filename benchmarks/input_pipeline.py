#!/usr/bin/env python
r"""The training input of a gin experiment on its real data: seconds until the first batch,
examples per second after it, and the seconds a run resumed at step `--skip` takes to
its first batch.

  VMX_DATA_DIR=../shared/data python benchmarks/input_pipeline.py \
      --gin_file=contrastive_small_1h.gin --batches=200 --skip=100000

Same flags as launch/train.py; MODEL_DIR may stay unset. The reader is the config's
(`DatasetConfig.reader`, default `index`; `--gin.train/DatasetConfig.reader="'seqio'"`
times the replaying tf.data reader). A recipe whose vocabulary or teacher cache is not
built yet builds it first (not counted); the index reader's tokenized cache likewise
(`cache_s`: the first opening of the iterator, which builds what is missing). `--processes=P --process=p`: the rows of
process p of P (each process reads 1/P of every batch). Phased runs: the first phase.
Prints one JSON line: first_batch_s (building the iterator over the built cache and
reading one batch), batches_per_s, examples_per_s (whole global batches: per process
times P), skip_s (from building the iterator to the first batch of a run resumed at
--skip), cache_s.
"""
import importlib.util  # noqa: F401  (gin-config 0.5 needs it imported first)
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmx import cli, gin_utils  # noqa: E402


def main(argv):
  bindings, rest = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--batches", type=int, default=100, help="batches timed after the first")
  p.add_argument("--skip", type=int, default=0, help="also time a resume at this step")
  p.add_argument("--processes", type=int, default=1, help="read the rows of one of P processes")
  p.add_argument("--process", type=int, default=0)
  args = p.parse_args(rest)
  import numpy as np  # lazy: after cli.run_main's host set-up
  from vmx import experiment  # lazy: jax
  from vmx.data import pipeline  # lazy: seqio
  _, model, cfg, seed = experiment.training_inputs(args.gin_file, bindings,
                                                   args.gin_search_paths)[0]
  fc = model.FEATURE_CONVERTER_CLS
  batch_size = sum(c.batch_size for c in pipeline.task_configs(cfg).values())
  rows = {k: np.array_split(np.arange(c.batch_size), args.processes)[args.process]
          for k, c in pipeline.task_configs(cfg).items()}

  def make():
    return pipeline.train_iterator(cfg, fc, seed, rows)

  t0 = time.perf_counter()
  make()                          # builds the index reader's cache where it is missing
  cache_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  it = make()
  next(it)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(args.batches):
    next(it)
  rate = args.batches / (time.perf_counter() - t0)
  out = {"reader": pipeline.reader_of(cfg), "first_batch_s": round(first, 2),
         "batches_per_s": round(rate, 2), "examples_per_s": round(rate * batch_size, 1),
         "batch_size": batch_size, "processes": args.processes,
         "cache_s": round(cache_s, 2)}
  if args.skip:
    t0 = time.perf_counter()
    it = make()
    it.restore(it.state_at(args.skip))
    next(it)
    skip_s = time.perf_counter() - t0
    out.update(skip_s=round(skip_s, 2), skip_batches=args.skip,
               skip_batches_per_s=round(args.skip / skip_s, 2))
  print(json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  cli.run_main(main)
