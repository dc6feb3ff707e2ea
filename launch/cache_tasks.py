#!/usr/bin/env python
r"""Write the token cache of an experiment (every task of every phase), in this process or
on Apache Beam; or SeqIO's offline cache of tasks.

A local run builds its token cache itself on first use. Build it ahead for a pod run
whose hosts read a shared gs:// dir, and on Beam past one machine (the `beam` extra):

  VMX_DATA_DIR=../shared/data python launch/cache_tasks.py \
      --gin_file=contrastive_small_1h.gin --beam_runner=DirectRunner --beam_workers=2
  python launch/cache_tasks.py --gin_file=ems.gin --gin.DATA_DIR="'gs://bucket/data'" \
      --token_cache_dir=gs://bucket/vmx_arrays --beam_runner=DataflowRunner \
      --beam_options="--project=P --region=us-central1 --temp_location=gs://bucket/tmp"
  python launch/train.py --gin_file=ems.gin \
      --gin.train/DatasetConfig.token_cache_dir="'gs://bucket/vmx_arrays'" ...

The same command with --beam_runner=FlinkRunner or SparkRunner (and their
--beam_options) runs there. A rerun writes only the shards that are missing. The last
line is `content digest: <hex>`: a digest of every example of every task in stream order,
the same whatever the builder and the shard layout.

SeqIO's offline cache of tasks or mixtures (the seqio reader's `use_cached=True`):

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
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--token_cache_dir", default=None,
                 help="with --gin_file: where to write (default: the run's "
                      "DatasetConfig.token_cache_dir, else ~/.cache/vmx/arrays)")
  p.add_argument("--array_cache_dir", default=None, help=argparse.SUPPRESS)   # earlier name
  cli.add_beam_flags(p, "build")
  p.add_argument("--shard_rows", type=int, default=None,
                 help="input examples per shard (a multiple of 256; default 1,048,576)")
  p.add_argument("--tasks", default="", help="comma-separated task or mixture names")
  p.add_argument("--output_cache_dir", default="")
  p.add_argument("--splits", default="", help="comma-separated (default: every split)")
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  if args.array_cache_dir:
    from vmx import _deprecated
    _deprecated.flag("--array_cache_dir", "--token_cache_dir")
    args.token_cache_dir = args.token_cache_dir or args.array_cache_dir
  from vmx import signals
  signals.install()   # SIGTERM / SIGINT: exit 75, one `preempted:` line, finished shards kept
  signals.saved("the finished shards and tasks of the cache are kept (each file appears "
                "whole); rerun the same command to build the rest")
  if args.gin_file:
    return cache_experiment(args, bindings)
  if not (args.tasks and args.output_cache_dir):
    p.error("give --gin_file (the token cache of an experiment) or --tasks and "
            "--output_cache_dir (SeqIO's offline cache)")
  import seqio  # lazy: seqio/TensorFlow, after cli.run_main's host set-up
  import tasks  # lazy: seqio
  from vmx.data import seqio_cache  # lazy: seqio
  if not tasks.DEFAULT_MIXTURES:
    p.error("no tasks registered: set VMX_VOCABULARY (and VMX_DATA_DIR), see tasks/defaults.py")
  names = []
  for name in [n for n in args.tasks.split(",") if n]:
    if name not in seqio.TaskRegistry.names() and name not in seqio.MixtureRegistry.names():
      p.error(f"--tasks: {name!r} is not registered; registered mixtures: "
              f"{', '.join(tasks.DEFAULT_MIXTURES)}")
    names += [t for t in seqio_cache.cached_tasks(name) if t not in names]
  splits = [s for s in args.splits.split(",") if s] or None
  from vmx import signals
  for name in names:
    with signals.activity(f"caching task {name}"):
      out = seqio_cache.cache_task(name, args.output_cache_dir, splits, args.overwrite,
                                   progress=not args.no_progress)
    print(f"[vmx] {name}: {out}", flush=True)


def cache_experiment(args, bindings):
  """Builds what is missing of the token cache of every phase's training data."""
  import hashlib
  import time
  from collections.abc import Mapping
  from vmx import beam_runs, experiment, signals  # lazy: jax, seqio
  from vmx.data import pipeline  # lazy
  from vmx.data.token_cache import beam, build, disk_format, lookup  # lazy
  from vmx.data.token_cache.table import Table  # lazy
  from vmx.errors import ConfigError, Interrupted
  if args.beam_runner:
    beam_runs.require_beam()
  shard_rows = args.shard_rows or disk_format.SHARD_ROWS
  if shard_rows <= 0 or shard_rows % disk_format.BLOCK_ROWS:
    raise ConfigError(f"--shard_rows={shard_rows}: a positive multiple of {disk_format.BLOCK_ROWS}")
  t0 = time.time()
  inputs = experiment.training_inputs(args.gin_file, bindings, args.gin_search_paths)
  seen, order, jobs, pending, shared, records = set(), [], [], [], [], []
  for i, (phase, model, cfg, _) in enumerate(inputs):
    layouts = model.feature_layout()
    for key, c in pipeline.task_configs(cfg).items():
      if c.reader != "index":
        continue
      root = args.token_cache_dir or c.token_cache_dir or lookup.default_root()
      layout = layouts[key] if isinstance(layouts, Mapping) else layouts
      converter = layout.converter()
      tasks, rates = build.config_tasks(c)
      records.append((c, layout, tasks, rates, root, []))
      shared += [root, *[p for t in tasks for p in getattr(t.source, "paths", [])]]
      for t in tasks:
        parts, digest, directory = build.locate(t, c.split, c.task_feature_lengths, converter,
                                                root)
        order.append((f"{phase}{'/' + key if key else ''}", t.name, c.split, directory, root))
        records[-1][-1].append(directory)
        if str(directory) in seen or build.built(directory):
          seen.add(str(directory))
          continue
        seen.add(str(directory))
        if not args.beam_runner:
          with signals.activity(f"building the token cache of {t.name}"):
            build.build_local(t, c.split, c.task_feature_lengths, converter, directory,
                              parts, c.use_cached, not args.no_progress, shard_rows)
          continue
        build.collect_leftovers(directory)    # a killed worker's temporary files
        plan = build.shard_plan(t, c.split, c.use_cached, shard_rows)
        todo = build.missing_shards(directory, digest, plan)
        jobs += [beam.ShardJob(i, key, t.name, c.split, str(directory), digest, *job,
                               c.use_cached) for job in todo]
        pending.append((directory, digest, parts, plan, [job[0] for job in todo]))
  if args.beam_runner:
    beam_runs.check_shared_storage(args.beam_runner, shared, "the data, the vocabulary and "
                                   "--token_cache_dir")
    print(f"[vmx] {len(jobs)} shard(s) of {len(pending)} task(s) to write on Beam "
          f"({args.beam_runner}"
          + (f", {args.beam_workers} workers" if args.beam_runner == "DirectRunner" else "")
          + ")", flush=True)
    try:
      with signals.activity(f"writing {len(jobs)} token cache shard(s) on Beam "
                            f"({args.beam_runner})"):
        beam.run(jobs, args.gin_file, bindings, args.gin_search_paths, args.beam_runner,
                 args.beam_workers, args.beam_options, experiment.training_inputs,
                 progress=not args.no_progress)
    except Interrupted:
      for directory, *_ in pending:     # the killed workers' unfinished shards
        build.collect_leftovers(directory)
      raise
    for directory, digest, parts, plan, written in pending:
      build.assemble(directory, digest, parts, plan, f"beam:{args.beam_runner}", written)
  for c, layout, tasks, rates, root, directories in records:   # found later without SeqIO
    pipeline.record_caches(c, layout, tasks, rates, [Table(d) for d in directories], root)
  whole = hashlib.sha256()
  groups = {}
  for where, name, split, directory, root in order:
    table = Table(directory)
    whole.update(f"{where}|{name}|{split}|{table.info['content_digest']}\n".encode())
    n, rows, _ = groups.get(where, (0, 0, root))
    groups[where] = (n + 1, rows + len(table), root)
  for where, (n, rows, root) in groups.items():
    print(f"[vmx] {where}: {n} task(s), {rows} examples in {root}", flush=True)
  print(f"[vmx] token cache ready in {time.time() - t0:.1f} s", flush=True)
  print(f"content digest: {whole.hexdigest()}", flush=True)


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
