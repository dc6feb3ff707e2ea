"""Metric writers: stdout/logging + TensorBoard (clu) + a JSONL file, local or remote
(MODEL_DIR on gs://: see vmx/storage.py)."""
from __future__ import annotations

import json
import tempfile
import time

import jax
from clu import metric_writers

from vmx import storage
from vmx.modeldir import layout


def read_rows(path) -> list[dict]:
  """The rows of a metrics.jsonl (a torn last line from a kill is skipped)."""
  rows = []
  try:
    lines = storage.path(path).read_text(encoding="utf-8").splitlines()
  except FileNotFoundError:
    return rows
  for line in lines:
    try:
      rows.append(json.loads(line))
    except ValueError:
      continue
  return rows


def has_row(model_dir, step: int, *keys: str) -> bool:
  """Whether metrics.jsonl has a row of `step` with any of `keys` (one read)."""
  return any(r.get("step") == step and any(k in r for k in keys)
             for r in read_rows(layout.metrics_path(model_dir)))


class JsonlWriter(metric_writers.MetricWriter):
  """Appends {"step": s, "time": t, name: value, ...} lines to a file.

  `resume_step`: the step the run (re)starts from. Rows of later steps, and of that
  step when it is 0, were written by a stopped run after its last checkpoint; they
  are dropped (atomic rewrite) since the run writes them again, so the file has one
  row per logged step and kind however often the run is resumed.

  A local file is appended to, a line at a time. A remote object cannot be appended to:
  the writer keeps the rows and uploads the whole file at each write (one object upload,
  atomic; the file is at most a few MB: one row per logged step).
  """

  def __init__(self, path, resume_step: int = 0):
    self.path = storage.path(path)
    self.remote = storage.is_remote(self.path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._rows = []
    if self.path.exists():
      self._rows = [r for r in read_rows(self.path)
                    if resume_step > 0 and r.get("step", 0) <= resume_step]
      storage.write_atomic(self.path, self._text(self._rows))
    self._f = None if self.remote else open(self.path, "a", encoding="utf-8")

  @staticmethod
  def _text(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)

  def write_scalars(self, step, scalars):
    row = {"step": int(step), "time": time.time(),
           **{k: float(v) for k, v in scalars.items()}}
    if self.remote:
      self._rows.append(row)
      storage.write_atomic(self.path, self._text(self._rows))
    else:
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
    if self._f:
      self._f.flush()

  def close(self):
    if self._f:
      self._f.close()


class UploadingSummaryWriter(metric_writers.SummaryWriter):
  """clu's TensorBoard SummaryWriter into a local staging directory, whose event files
  are uploaded whole to `remote_dir` at every flush (the trainer flushes at each log
  line) and at close, so MODEL_DIR/train shows the run up to its last flush, through
  whichever filesystem epath uses (TensorFlow's or gcsfs: see vmx/storage.py)."""

  def __init__(self, remote_dir):
    self.remote_dir = storage.path(remote_dir)
    self._staging = tempfile.TemporaryDirectory(prefix="vmx-tb-")
    super().__init__(self._staging.name)

  def flush(self):
    super().flush()
    for rel, f in storage.files_under(self._staging.name):
      storage.copy_file(f, self.remote_dir / rel)

  def close(self):
    self.flush()
    super().close()
    self._staging.cleanup()


def create_writer(model_dir, resume_step: int = 0) -> metric_writers.MetricWriter:
  """TensorBoard under MODEL_DIR/train, MODEL_DIR/metrics.jsonl; process 0 only."""
  if jax.process_index() > 0:
    return metric_writers.LoggingWriter()
  model_dir = storage.path(model_dir)
  board = model_dir / layout.TENSORBOARD_DIR
  tensorboard = (UploadingSummaryWriter(board) if storage.is_remote(model_dir)
                 else metric_writers.SummaryWriter(str(board)))
  return metric_writers.MultiWriter([
      tensorboard, JsonlWriter(layout.metrics_path(model_dir), resume_step)])
