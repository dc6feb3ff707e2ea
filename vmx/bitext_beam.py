"""A mining job's embedding and search on Apache Beam workers (launch/mine.py
--beam_runner): vmx/bitext.py's stages 2 and 3 as shard jobs, the same files as a local
job, and OUTPUT byte for byte the same.

  python launch/mine.py ... --beam_runner=DirectRunner --beam_workers=2   # this machine
  python launch/mine.py --checkpoint_dir=gs://b/model --source=gs://b/de.txt \\
      --target=gs://b/en.txt --output=gs://b/mined.tsv --beam_runner=DataflowRunner \\
      --beam_options="--project=P --region=us-central1 --temp_location=gs://b/tmp \\
      --requirements_file=requirements.txt"

What runs where:
- **The driver** (the machine running launch/mine.py) scans both corpora (counts, bad
  lines), loads the checkpoint for the job's record (WORK_DIR/job.json), plans the shards
  without a finished record, submits the two pipelines, merges the backward lists, and
  scores and writes OUTPUT: stage 4, as a local job does.
- **Embedding** (pipeline 1): one job a shard of either corpus. A worker loads the
  checkpoint once (its setup), checks WORK_DIR's record (the same checkpoint revision,
  corpora and settings as the driver's), reads its shard's lines (a worker reads the
  corpus up to its shard: a .gz has no random access) and writes the shard's vectors and
  record (`Job.embed_shard`, the local job's function).
- **Search** (pipeline 2): one job a source shard, against every target shard in order
  (`Job.search_shard`: on a CPU worker the fused kernel, vmx/evaluation/knn_cpu.py). It
  writes each target shard's backward lists over it to WORK_DIR/knn/beam/, then its
  forward lists (knn/fwd_NNNNN.npz) last: a job is done once they exist.
- The driver then merges the backward lists in source-shard order into
  knn/bwd_0_of_1.npz (a local single-process job's file; the order a local job merges
  in, so ties break the same way) and removes knn/beam/. Its memory: the [M, k] lists,
  as a local job's.

A killed pipeline is rerun by rerunning the command: finished shards are kept (each
result is written whole or not at all, `storage.write_atomic`). Every worker reads and
writes the same WORK_DIR, so with a runner other than the DirectRunner the checkpoint, the
corpora and WORK_DIR must be on storage every worker reads (gs://), which the driver
checks first. Workers need vmx installed (Dataflow: `--requirements_file` or
`--setup_file` in --beam_options); a CPU worker searches with the fused kernel when its
vmx was built with a C compiler, else with the XLA pass.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from vmx import beam_runs, bitext, storage
from vmx.errors import DataError

BEAM_DIR = "beam"     # under WORK_DIR/knn: the search jobs' backward lists


@dataclasses.dataclass(frozen=True)
class ShardJob:
  """Embed shard `shard` of `side`, or (stage "knn") search source shard `shard`."""
  stage: str
  side: str
  shard: int


def _partial(job: bitext.Job, i: int, j: int):
  """Target shard j's backward lists over source shard i."""
  return job.dir / "knn" / BEAM_DIR / f"bwd_{i:05d}_{j:05d}.npz"


def _searched(job: bitext.Job, i: int) -> bool:
  return ((job.dir / "knn" / f"fwd_{i:05d}.npz").exists()
          and all(_partial(job, i, j).exists() for j in range(job.corpora["target"].shards)))


def worker_job(spec: dict) -> bitext.Job:
  """The driver's job, rebuilt on a worker from `spec` (plain values: pickled to Beam):
  the checkpoint loaded, the corpora's counts taken from the driver's scan, WORK_DIR's
  record checked against this worker's view."""
  from vmx.inference import Encoder   # lazy: jax, on the worker
  enc = Encoder.from_checkpoint(spec["checkpoint_dir"], **spec["encoder"])
  settings = bitext.Settings(**spec["settings"])
  corpora = {side: bitext.Corpus(c["path"], settings.shard_size, (c["kept"], c["empty"]))
             for side, c in spec["corpora"].items()}
  job = bitext.Job(spec["work_dir"], enc, spec["checkpoint"], corpora["source"],
                   corpora["target"], settings)
  job.check()
  return job


def run_shard(job: bitext.Job, item: ShardJob):
  """One shard job on a worker: writes its results (the record or forward lists last)."""
  if item.stage == "embed":
    lang = job.settings.source_lang if item.side == "source" else job.settings.target_lang
    for i, lines in job.corpora[item.side].shard_lines():
      if i == item.shard:
        job.embed_shard(item.side, i, lines, lang)
        return
    raise DataError(f"{job.corpora[item.side].path} has no shard {item.shard}: it changed "
                    "since the driver read it")
  i = item.shard

  def backward(rows, vals, idx):
    bitext.save_arrays(_partial(job, i, rows.start // job.settings.shard_size),
                       vals=vals, idx=idx)

  fwd_v, fwd_i = job.search_shard(i, backward)
  bitext.save_arrays(job.dir / "knn" / f"fwd_{i:05d}.npz", vals=fwd_v, idx=fwd_i)


def _fn_class():
  import apache_beam as beam  # lazy: the beam extra

  class MineShard(beam.DoFn):
    """Runs shard jobs; its setup loads the checkpoint once per worker."""

    def __init__(self, spec: dict):
      super().__init__()
      self.spec = spec

    def setup(self):
      self.job = worker_job(self.spec)

    def process(self, item: ShardJob):
      run_shard(self.job, item)
      yield item

  return MineShard


class BeamEngine:
  """bitext.Engine on Beam: stages 2 and 3 as pipelines of shard jobs (module doc)."""

  def __init__(self, runner: str, workers: int, options: str, checkpoint_dir: str,
               encoder_options: dict, progress: bool = True):
    self.runner, self.workers, self.options = runner, workers, options
    self.checkpoint_dir, self.encoder_options = checkpoint_dir, dict(encoder_options)
    self.progress = progress

  def _spec(self, job: bitext.Job) -> dict:
    return {"checkpoint_dir": self.checkpoint_dir, "encoder": self.encoder_options,
            "checkpoint": job.record["checkpoint"], "work_dir": str(job.dir),
            "settings": dataclasses.asdict(job.settings),
            "corpora": {side: {"path": c.path, "kept": c.kept, "empty": c.empty}
                        for side, c in job.corpora.items()}}

  def _run(self, job: bitext.Job, jobs: list, count, what: str):
    bitext.log(f"{len(jobs)} shard(s) to {what} on Beam ({self.runner}"
               + (f", {self.workers} workers" if self.runner == "DirectRunner" else "") + ")")
    beam_runs.run(jobs, _fn_class()(self._spec(job)), self.runner, self.workers,
                  self.options, count, f"[mine] shards to {what}", self.progress)

  def embed(self, job: bitext.Job):
    jobs = []
    for side in bitext.SIDES:
      (job.dir / side).mkdir(parents=True, exist_ok=True)
      storage.remove_leftovers(job.dir / side)     # a killed worker's temporary files
      for i, lines in job.corpora[side].shard_lines():
        if job.embedded(side, i):     # on disk: the same lines? (encodes nothing)
          job.embed_shard(side, i, lines, None)
        else:
          jobs.append(ShardJob("embed", side, i))

    def count():
      return sum(job.embedded(side, i) for side in bitext.SIDES
                 for i in range(job.corpora[side].shards))

    self._run(job, jobs, count, "embed")
    for item in jobs:        # the records the workers wrote, checked against the corpora
      if not job.embedded(item.side, item.shard):
        raise DataError(f"{job.shard_path(item.side, item.shard)}: the pipeline ended "
                        "without writing it")

  def knn(self, job: bitext.Job):
    state, done, bwd_v, bwd_i = job.backward_state()
    beam_dir = job.dir / "knn" / BEAM_DIR
    beam_dir.mkdir(parents=True, exist_ok=True)
    storage.remove_leftovers(beam_dir)
    todo = [i for i in range(job.corpora["source"].shards) if i not in done]
    jobs = [ShardJob("knn", "source", i) for i in todo if not _searched(job, i)]
    self._run(job, jobs, lambda: sum(_searched(job, i) for i in todo), "search")
    k, size = job.settings.k, job.settings.shard_size
    for i in todo:            # in source order: the local job's merge order
      for j in range(job.corpora["target"].shards):
        p = _partial(job, i, j)
        if not p.exists():
          raise DataError(f"{p}: the pipeline ended without writing it")
        z = bitext.load_arrays(p)
        rows = slice(j * size, j * size + len(z["vals"]))
        bwd_v[rows], bwd_i[rows] = bitext.merge_lists(bwd_v[rows], bwd_i[rows], z["vals"],
                                                      z["idx"], k)
      done.add(i)
    if todo:
      bitext.save_arrays(state, shards=np.array(sorted(done), np.int64), vals=bwd_v,
                         idx=bwd_i)
    for f in list(beam_dir.glob("*.npz")):
      f.unlink()


def engine_from_flags(args, encoder_options: dict) -> Optional[BeamEngine]:
  """launch/mine.py's --beam_* flags: a BeamEngine (paths checked), or None."""
  if not args.beam_runner:
    return None
  beam_runs.require_beam()
  beam_runs.check_shared_storage(
      args.beam_runner, [args.checkpoint_dir, args.source, args.target,
                         args.work_dir or args.output + ".work", args.output],
      "the checkpoint, the corpora, --work_dir and --output")
  return BeamEngine(args.beam_runner, args.beam_workers, args.beam_options,
                    args.checkpoint_dir, encoder_options)
