r"""Building token caches on Apache Beam: the shards of every task are written by workers.

  python launch/cache_tasks.py --gin_file=contrastive_small_1h.gin \
      --beam_runner=DirectRunner --beam_workers=2            # this machine, 2 processes
  python launch/cache_tasks.py --gin_file=ems.gin --gin.DATA_DIR="'gs://bucket/data'" \
      --token_cache_dir=gs://bucket/vmx_arrays --beam_runner=DataflowRunner \
      --beam_options="--project=P --region=us-central1 --temp_location=gs://bucket/tmp"

The pipeline is one ParDo over shard jobs (task, split, shard, input range): each worker
parses the experiment's gin files, which registers the same SeqIO tasks (its setup), and
writes its shards with `writer.write_shard`, the function of the local build, so the
bytes are the same. The driver plans the jobs (only shards without a finished record: a
rerun after an interruption finishes the rest), runs the pipeline, then checks every
shard and writes each manifest (`build.assemble`). A worker that sees other inputs than
the driver (another vocabulary, other files) refuses to write.

The pipeline itself, its workers' errors as one line and their output in a log file are
vmx/beam_runs.py's (shared with mining on Beam). A rerun first removes the temporary files of workers that were killed
(`build.collect_leftovers`), as the local build does.

Every runner reads the same files: with a runner other than the DirectRunner, the data,
the vocabulary and the cache root must be on storage every worker reads (gs://), which
the driver checks before it submits anything. apache-beam is the `beam` extra.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from vmx import beam_runs, storage
from vmx.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ShardJob:
  """One shard to write: phase i's task key `key`, task `task`, split, and the shard."""
  phase: int
  key: str | None
  task: str
  split: str
  directory: str
  fingerprint: str
  index: int
  count: int
  start: int
  end: int
  use_cached: bool


def _write_fn_class():
  import apache_beam as beam  # lazy: the beam extra

  class WriteShard(beam.DoFn):
    """Writes shard jobs; its setup registers the experiment's tasks from gin."""

    def __init__(self, gin_files, bindings, search_paths, inputs_fn):
      super().__init__()
      self.gin_files, self.bindings, self.search_paths = (list(gin_files), list(bindings),
                                                          search_paths)
      self.inputs_fn = inputs_fn   # vmx.experiment.training_inputs (pickled by reference)

    def setup(self):
      import importlib.util  # noqa: F401  (gin-config 0.5: before gin parses)
      self.inputs = self.inputs_fn(self.gin_files, self.bindings, self.search_paths)

    def process(self, job: ShardJob):
      from collections.abc import Mapping
      import seqio  # lazy: in the worker
      from vmx.data.token_cache import fingerprint as fp, writer   # SeqIO: in the worker
      _, model, cfg, _ = self.inputs[job.phase]
      c = cfg if job.key is None else cfg.tasks[job.key]
      fcs = model.FEATURE_CONVERTER_CLS
      converter = (fcs[job.key] if isinstance(fcs, Mapping) else fcs)(pack=False)
      task = seqio.get_mixture_or_task(job.task)
      mine = fp.digest(fp.parts(task, job.split, c.task_feature_lengths, converter))
      if mine != job.fingerprint:
        raise ConfigError(f"task {job.task}: this worker sees other inputs than the driver "
                          f"(fingerprint {mine[:16]}… against {job.fingerprint[:16]}…): every "
                          f"worker must read the same data and vocabulary")
      rec = writer.write_shard(task, job.split, c.task_feature_lengths, converter,
                               job.directory, job.fingerprint, job.index, job.count,
                               job.start, job.end, job.use_cached)
      yield (job.task, job.index, rec["count"])

  return WriteShard


def run(jobs: Sequence[ShardJob], gin_files, bindings, search_paths, runner: str,
        workers: int, extra_options: str, inputs_fn, progress: bool = True) -> int:
  """Writes the shards of `jobs` on Beam; returns the number written. `inputs_fn(gin
  files, bindings, search paths)`: the experiment's [(phase, model, config, seed)], which
  each worker calls once (it registers the tasks): vmx.experiment.training_inputs."""
  beam_runs.require_beam()
  dirs = sorted({j.directory for j in jobs})

  def count() -> int:
    return sum(sum(1 for _ in storage.path(d).glob("rows-*.json")) for d in dirs
               if storage.path(d).exists())

  fn = _write_fn_class()(gin_files, bindings, search_paths, inputs_fn)
  return beam_runs.run(jobs, fn, runner, workers, extra_options, count,
                       "[vmx] shards written on Beam", progress)
