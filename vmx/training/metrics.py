"""Metric writers: stdout/logging + TensorBoard (clu) + a JSONL file."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jax
from clu import metric_writers


def read_rows(path) -> list[dict]:
  """The rows of a metrics.jsonl (a torn last line from a kill is skipped)."""
  rows = []
  try:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
  except FileNotFoundError:
    return rows
  for line in lines:
    try:
      rows.append(json.loads(line))
    except ValueError:
      continue
  return rows


def has_row(model_dir, step: int, key: str) -> bool:
  return any(r.get("step") == step and key in r
             for r in read_rows(Path(model_dir) / "metrics.jsonl"))


class JsonlWriter(metric_writers.MetricWriter):
  """Appends {"step": s, "time": t, name: value, ...} lines to a file.

  `resume_step`: the step the run (re)starts from. Rows of later steps, and of that
  step when it is 0, were written by a stopped run after its last checkpoint; they
  are dropped (atomic rewrite) since the run writes them again, so the file has one
  row per logged step and kind however often the run is resumed.
  """

  def __init__(self, path, resume_step: int = 0):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.path.exists():
      rows = read_rows(self.path)
      kept = [r for r in rows if resume_step > 0 and r.get("step", 0) <= resume_step]
      tmp = self.path.with_suffix(".tmp")
      tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
      os.replace(tmp, self.path)
    self._f = open(self.path, "a", encoding="utf-8")

  def write_scalars(self, step, scalars):
    row = {"step": int(step), "time": time.time(),
           **{k: float(v) for k, v in scalars.items()}}
    self._f.write(json.dumps(row) + "\n")
    self._f.flush()

  def write_summaries(self, step, values, metadata=None):
    pass

  def write_images(self, step, images):
    pass

  def write_videos(self, step, videos):
    pass

  def write_audios(self, step, audios, *, sample_rate):
    pass

  def write_texts(self, step, texts):
    pass

  def write_histograms(self, step, arrays, num_buckets=None):
    pass

  def write_pointcloud(self, step, point_clouds, *, point_colors=None, configs=None):
    pass

  def write_hparams(self, hparams):
    pass

  def flush(self):
    self._f.flush()

  def close(self):
    self._f.close()


def create_writer(model_dir, resume_step: int = 0) -> metric_writers.MetricWriter:
  """TensorBoard under MODEL_DIR/train, MODEL_DIR/metrics.jsonl; process 0 only."""
  if jax.process_index() > 0:
    return metric_writers.LoggingWriter()
  return metric_writers.MultiWriter([
      metric_writers.SummaryWriter(str(Path(model_dir) / "train")),
      JsonlWriter(Path(model_dir) / "metrics.jsonl", resume_step),
  ])
