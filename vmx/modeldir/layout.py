"""The layout of a vmx model directory (MODEL_DIR), local or `gs://`:

  vmx_model.json            model config, languages, max length, vocabulary file name
  vocab.model | vmx_tokenizer.json (+ its tokenizer file)   the vocabulary (vmx/data/vocab.py)
  config.gin                the operative gin config of the run that wrote it
  metrics.jsonl             one row per logged step (append-only history)
  train/                    TensorBoard event files
  checkpoint_<step>/        orbax items params, train_state, data + vmx_checksums.json
                            (a t5x run's: state/ or checkpoint, vmx/modeldir/t5x_format.py)
  best/                     the best evaluated step's params (best/best.json: the record)
  best-<metric>/            ... by each further metric of train.best_metric, '/' written
                            '.' (best-bucc.main_score/); `step='best:<metric>'` reads it
  damaged/                  checkpoints that failed verification, kept for inspection
  decoder/                  an imported T5 / mT5 decoder (import_checkpoint --decoder):
                            checkpoint_0/params, read by initial checkpoints as `decoder/...`
  vmx.lock                  the running trainer (host, pid, start time); vmx/modeldir/run.py
Every name of that list is defined here and nowhere else; the modules of this package
(and the trainer, inference, the converters) use these constants and functions.
"""
from __future__ import annotations

import json
from typing import Sequence

from vmx import storage
from vmx.data.vocab import copy_any_vocabulary
from vmx.errors import CheckpointError

MODEL_INFO_FILE = "vmx_model.json"
CONFIG_FILE = "config.gin"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "train"
CHECKPOINT_PREFIX = "checkpoint"          # checkpoint_<step>/
CHECKPOINT_ITEMS = ("params", "train_state", "data")
MANIFEST = "vmx_checksums.json"
BEST_DIR = "best"
BEST_STEP = BEST_DIR                      # the `step` argument naming best/'s checkpoint
BEST_RECORD = "best.json"
BEST_BY = ":"                             # step 'best:<metric>': the step best by <metric>
DAMAGED_DIR = "damaged"
PRETRAINED_DECODER_DIR = "decoder"        # an imported model directory's T5 / mT5 decoder
PRETRAINED_MLM_HEAD_DIR = "mlm_head"     # ... and its masked-LM head (XLM-R's lm_head)
LOCK_FILE = "vmx.lock"                    # the run's one writer (vmx/modeldir/run.py)
PREVIOUS_SUFFIX = ".previous-"            # --fresh moves a run aside to MODEL_DIR.previous-<time>
T5X_STATE_DIR = "state"                   # t5x's Orbax layout: checkpoint_<step>/state/
T5X_LEGACY_FILE = "checkpoint"            # t5x's legacy layout: checkpoint_<step>/checkpoint


def step_dir(model_dir, step: int):
  return storage.path(model_dir) / f"{CHECKPOINT_PREFIX}_{step}"


def best_dir(model_dir, metric: str, first: bool):
  """Where the best step by `metric` is kept: best/ for train.best_metric's first metric,
  best-<metric>/ for the others ('/' written '.')."""
  return storage.path(model_dir) / (BEST_DIR if first else
                                    f"{BEST_DIR}-{metric.replace('/', '.')}")


def find_best_dir(model_dir, metric: str):
  """The directory keeping the best step by `metric` (best-<metric>/, or best/ when its
  record names it); None if the run kept none."""
  d = best_dir(model_dir, metric, first=False)
  if (d / BEST_RECORD).exists():
    return d
  first = best_dir(model_dir, metric, first=True)
  try:
    if json.loads((first / BEST_RECORD).read_text()).get("metric") == metric:
      return first
  except (OSError, ValueError, AttributeError):
    pass
  return None


def metrics_path(model_dir):
  return storage.path(model_dir) / METRICS_FILE


def write_model_info(model_dir, model, languages: Sequence[str], max_length: int,
                     vocabulary: str = "vocab.model"):
  """Everything `Encoder.from_checkpoint` needs besides the parameters."""
  info = {"model": model.get_config(), "languages": list(languages),
          "max_length": int(max_length), "vocabulary": vocabulary}
  storage.path(model_dir).mkdir(parents=True, exist_ok=True)
  storage.write_atomic(storage.path(model_dir) / MODEL_INFO_FILE, json.dumps(info, indent=1))


def read_model_info(model_dir) -> dict:
  path = storage.path(model_dir) / MODEL_INFO_FILE
  if not path.exists():
    raise CheckpointError(f"{path}: not found; is {model_dir} a vmx model_dir?")
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def write_inference_files(model_dir, model, languages: Sequence[str], max_length: int,
                          vocabulary: str):
  """Makes `model_dir` self-contained for inference: a copy of the vocabulary (a
  SentencePiece model, or an imported tokenizer and its spec) and vmx_model.json."""
  storage.path(model_dir).mkdir(parents=True, exist_ok=True)
  write_model_info(model_dir, model, languages, max_length,
                   copy_any_vocabulary(vocabulary, model_dir))


def write_config(model_dir, text: str):
  """The run's operative gin config, `config.gin`."""
  storage.write_atomic(storage.path(model_dir) / CONFIG_FILE, text)
