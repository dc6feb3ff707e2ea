#!/usr/bin/env python
"""Write the tokenized caches of vmx tasks, in one process.

The index reader's cache of an experiment (vmx/data/arrays.py; every task of every phase,
at the run's lengths and feature converter). A local run builds it itself on first use;
build it ahead for a pod run whose hosts share a gs:// dir:

  VMX_DATA_DIR=../shared/data python launch/cache_tasks.py \
      --gin_file=contrastive_small_1h.gin --array_cache_dir=gs://bucket/vmx_arrays
  python launch/train.py --gin_file=contrastive_small_1h.gin \
      --gin.train/DatasetConfig.array_cache_dir="'gs://bucket/vmx_arrays'" ...

SeqIO's offline cache of tasks or mixtures (the seqio reader's `use_cached=True`; also the
input of the array cache when the run sets it, so that tokenizing runs on Beam):

  VMX_DATA_DIR=../shared/data VMX_VOCABULARY=/tmp/vocab.model \
      python launch/cache_tasks.py --tasks=tatoeba_challenge.mix_all_a0.3 \
      --output_cache_dir=/tmp/seqio_cache
  python launch/train.py --gin_file=... --seqio_additional_cache_dirs=/tmp/seqio_cache \
      --gin.DatasetConfig.use_cached=True
"""
import importlib.util  # noqa: F401
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv):
  from vmx import gin_utils
  bindings, argv = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--array_cache_dir", default=None,
                 help="with --gin_file: where to write (default: the run's "
                      "DatasetConfig.array_cache_dir, else vmx.data.arrays.default_root())")
  p.add_argument("--tasks", default="", help="comma-separated task or mixture names")
  p.add_argument("--output_cache_dir", default="")
  p.add_argument("--splits", default="", help="comma-separated (default: every split)")
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  if args.gin_file:
    return cache_experiment(args, bindings)
  if not (args.tasks and args.output_cache_dir):
    p.error("give --gin_file (the index reader's cache of an experiment) or --tasks and "
            "--output_cache_dir (SeqIO's offline cache)")
  import seqio  # lazy: seqio/TensorFlow, after cli.run_main's host set-up
  import tasks  # lazy: seqio
  from vmx.data import cache  # lazy: seqio
  if not tasks.DEFAULT_MIXTURES:
    p.error("no tasks registered: set VMX_VOCABULARY (and VMX_DATA_DIR), see tasks/defaults.py")
  names = []
  for name in [n for n in args.tasks.split(",") if n]:
    if name not in seqio.TaskRegistry.names() and name not in seqio.MixtureRegistry.names():
      p.error(f"--tasks: {name!r} is not registered; registered mixtures: "
              f"{', '.join(tasks.DEFAULT_MIXTURES)}")
    names += [t for t in cache.cached_tasks(name) if t not in names]
  splits = [s for s in args.splits.split(",") if s] or None
  for name in names:
    out = cache.cache_task(name, args.output_cache_dir, splits, args.overwrite,
                           progress=not args.no_progress)
    print(f"[vmx] {name}: {out}", flush=True)


def cache_experiment(args, bindings):
  """Opens (building what is missing) the array cache of every phase's training data."""
  import dataclasses
  from collections.abc import Mapping
  from vmx import experiment  # lazy: jax, seqio
  from vmx.data import arrays, index, pipeline  # lazy: seqio, grain
  for phase, model, cfg, _ in experiment.training_inputs(args.gin_file, bindings,
                                                         args.gin_search_paths):
    fcs = model.FEATURE_CONVERTER_CLS
    for key, c in pipeline.task_configs(cfg).items():
      if c.reader != "index":
        continue
      root = args.array_cache_dir or c.array_cache_dir or arrays.default_root()
      c = dataclasses.replace(c, array_cache_dir=root)
      fc = (fcs[key] if isinstance(fcs, Mapping) else fcs)(pack=c.pack)
      _, _, tables = index.open_tables(c, fc, progress=not args.no_progress, build=True)
      n = sum(len(t) for t in tables)
      print(f"[vmx] {phase}{'/' + key if key else ''}: {len(tables)} task(s), {n} examples "
            f"in {root}", flush=True)


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
