"""Metric writers: TensorBoard event files and a JSONL file, local or remote (MODEL_DIR on
gs://: see vmx/storage.py).

The trainer writes scalars only (`write_scalars`, `flush`, `close`). TensorBoard's files
are written by the `tensorboard` package's own pure-Python event writer (what
torch.utils.tensorboard uses), not through TensorFlow's tf.summary as clu's
SummaryWriter does: a run whose token cache is built never imports TensorFlow
(vmx/data/pipeline.py). Without the `tensorboard` package (a bare accelerator image) the
run writes metrics.jsonl only, and says so once.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import tempfile
import time

import jax
import numpy as np

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


class JsonlWriter:
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

  def flush(self):
    if self._f:
      self._f.flush()

  def close(self):
    if self._f:
      self._f.close()


class TensorBoardWriter:
  """Scalars as a TensorBoard event file under `logdir`: TFRecord-framed Event protos
  written by tensorboard's pure-Python RecordWriter (its EventFileWriter would open the
  file through TensorFlow's gfile, importing TensorFlow where it is installed)."""

  def __init__(self, logdir):
    # lazy: `tensorboard` is optional (create_writer checks it)
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata
    from tensorboard.summary.writer.record_writer import RecordWriter
    from tensorboard.util import tensor_util
    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    self._metadata, self._tensor = metadata.create_summary_metadata, tensor_util.make_tensor_proto
    os.makedirs(logdir, exist_ok=True)
    name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.vmx"
    self._file = open(os.path.join(logdir, name), "wb")
    self._w = RecordWriter(self._file)
    self._w.write(self._event(wall_time=time.time(), file_version="brain.Event:2")
                  .SerializeToString())

  def write_scalars(self, step, scalars):
    """Each scalar as tf.summary.scalar writes it: a float32 tensor of the `scalars`
    plugin (what clu's SummaryWriter wrote before; EventAccumulator.Tensors reads it)."""
    values = [self._summary.Value(tag=k, tensor=self._tensor(np.float32(v)),
                                  metadata=self._metadata(display_name=k, description=""))
              for k, v in scalars.items()]
    self._w.write(self._event(wall_time=time.time(), step=int(step),
                              summary=self._summary(value=values)).SerializeToString())

  def flush(self):
    self._w.flush()

  def close(self):
    self._w.close()


class UploadingTensorBoardWriter(TensorBoardWriter):
  """TensorBoardWriter into a local staging directory, whose event files are uploaded
  whole to `remote_dir` at every flush (the trainer flushes at each log line) and at
  close, so MODEL_DIR/train shows the run up to its last flush."""

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


class MultiWriter:
  """Writes to every writer it holds."""

  def __init__(self, writers):
    self.writers = list(writers)

  def write_scalars(self, step, scalars):
    for w in self.writers:
      w.write_scalars(step, scalars)

  def flush(self):
    for w in self.writers:
      w.flush()

  def close(self):
    for w in self.writers:
      w.close()


def create_writer(model_dir, resume_step: int = 0) -> MultiWriter:
  """TensorBoard under MODEL_DIR/train (where `tensorboard` is installed) and
  MODEL_DIR/metrics.jsonl; process 0 only (the others write nothing)."""
  if jax.process_index() > 0:
    return MultiWriter([])
  model_dir = storage.path(model_dir)
  writers = [JsonlWriter(layout.metrics_path(model_dir), resume_step)]
  board = model_dir / layout.TENSORBOARD_DIR
  if importlib.util.find_spec("tensorboard") is None:
    print("[vmx] no `tensorboard` package: metrics go to metrics.jsonl only", flush=True)
  else:
    writers.append(UploadingTensorBoardWriter(board) if storage.is_remote(model_dir)
                   else TensorBoardWriter(board))
  return MultiWriter(writers)
