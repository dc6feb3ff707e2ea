#!/usr/bin/env python
"""Write SeqIO's offline cache of vmx tasks (tokenized examples), in one process.

  VMX_DATA_DIR=../shared/data VMX_VOCABULARY=/tmp/vocab.model \
      python launch/cache_tasks.py --tasks=tatoeba_challenge.mix_all_a0.3 \
      --output_cache_dir=/tmp/seqio_cache
  python launch/train.py --gin_file=... --seqio_additional_cache_dirs=/tmp/seqio_cache \
      --gin.DatasetConfig.use_cached=True

Tasks are those `import tasks` registers (VMX_VOCABULARY, VMX_DATA_DIR; see
tasks/defaults.py): a gin run that trains on the same corpus and languages with the same
vocabulary finds them under the same names. Mixtures are expanded to their tasks; a
task already cached is kept (--overwrite writes it again). The output dir may be gs://.
Beyond one machine, seqio's Beam pipeline writes the same layout:
  python -m seqio.scripts.cache_tasks_main --module_import=tasks --tasks=... \
      --output_cache_dir=...
"""
import importlib.util  # noqa: F401
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tasks", required=True, help="comma-separated task or mixture names")
  p.add_argument("--output_cache_dir", required=True)
  p.add_argument("--splits", default="", help="comma-separated (default: every split)")
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
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


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
