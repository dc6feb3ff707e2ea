"""Metric writers: stdout/logging + TensorBoard (clu) + a JSONL file."""
from __future__ import annotations

import json
import time
from pathlib import Path

import jax
from clu import metric_writers


class JsonlWriter(metric_writers.MetricWriter):
  """Appends {"step": s, "time": t, name: value, ...} lines to a file."""

  def __init__(self, path):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
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


def create_writer(model_dir) -> metric_writers.MetricWriter:
  """TensorBoard under MODEL_DIR/train, MODEL_DIR/metrics.jsonl; process 0 only."""
  if jax.process_index() > 0:
    return metric_writers.LoggingWriter()
  return metric_writers.MultiWriter([
      metric_writers.SummaryWriter(str(Path(model_dir) / "train")),
      JsonlWriter(Path(model_dir) / "metrics.jsonl"),
  ])
