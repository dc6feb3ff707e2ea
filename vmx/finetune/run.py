"""`finetune()`: the gin-configured fine-tuning run (see the package docstring).

It reads the benchmark's files (vmx/finetune/data.py), builds a classifier over the
starting encoder, and hands `run_phases` (vmx/training/trainer.py) one phase whose input
is an `ArrayInput`, with `DevAccuracy` as its evaluator; then it scores every language's
test set with the selected step and writes MODEL_DIR/finetune_<benchmark>.json.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from vmx import storage
from vmx.data.languages import iso3
from vmx.data.vocab import load_tokenizer
from vmx.errors import ConfigError, DataError
from vmx.evaluation import vectors
from vmx.finetune.data import BENCHMARKS, ArrayInput, digest, read_pairs, stamp
from vmx.gin_utils import check_range, positive_int
from vmx.models.base import model_from_config
from vmx.models.classifier import ClassifierModel, SequenceClassifier
from vmx.modeldir import checkpoints
from vmx.modeldir.layout import BEST_DIR, read_model_info
from vmx.training import optimizers, partitioning
from vmx.training.loop import LoopSettings, RunFiles
from vmx.training.phases import Phase, resolve_phases
from vmx.training.step import host_params
from vmx.training.trainer import run_phases


def source_encoder(model):
  """(TransformerEncoder, where its parameters are, where its token table is (None: in
  the encoder), its pooling) of a vmx model's sentence encoder: `encoder/` (dual
  encoders, MPCL, InfoXLM, EMMA-X, imported checkpoints), EMS's `sentence_encoder/` and
  VMSST's `semantic_encoder/` (both with the shared `token_embed/`)."""
  try:
    v = model.sentence_vector()
  except ConfigError:
    raise ConfigError(f"fine-tuning starts from a model with a sentence encoder; "
                      f"{type(model).__name__} has none") from None
  return v.encoder, v.params, v.token_table, v.pooling


def predict(model, params, tokens_NxL, batch_size: int = 256) -> np.ndarray:
  """Predicted label ids [N] (deterministic), in batches of `batch_size` rows (the last
  one padded: one compilation)."""
  fn = _predict_fn(model)
  out = []
  for i in range(0, len(tokens_NxL), batch_size):
    chunk = tokens_NxL[i:i + batch_size]
    pad = batch_size - len(chunk)
    if pad:
      chunk = np.concatenate([chunk, np.ones((pad, chunk.shape[1]), chunk.dtype)])
    out.append(np.asarray(fn(params, jnp.asarray(chunk)))[:batch_size - pad])
  return np.concatenate(out) if out else np.zeros((0,), np.int32)


_PREDICT = {}


def _predict_fn(model):
  key = id(model)
  if key not in _PREDICT:
    _PREDICT[key] = jax.jit(lambda p, t: jnp.argmax(model.logits(p, t), axis=-1))
  return _PREDICT[key]


class DevAccuracy:
  """The periodic evaluation (vmx/evaluation/periodic.py's interface): accuracy on the
  joint dev set of the evaluated languages (`dev/accuracy`, the model selection of
  InfoXLM's App. D, #M=1) and on each one (`dev/<lang>`)."""

  def __init__(self, sets: Mapping[str, tuple], batch_size: int = 256):
    self.sets, self.batch_size = dict(sets), batch_size

  def metric_names(self) -> list[str]:
    return ["dev/accuracy"] + [f"dev/{l}" for l in self.sets]

  def metric_prefixes(self) -> list[str]:
    return ["dev/"]

  def run(self, encoder) -> tuple[dict, str]:
    right, total, scalars = 0, 0, {}
    for lang, (tokens, labels) in self.sets.items():
      hit = predict(encoder.model, encoder.params, tokens, self.batch_size) == labels
      scalars[f"dev/{lang}"] = 100.0 * float(np.mean(hit))
      right, total = right + int(hit.sum()), total + len(hit)
    scalars["dev/accuracy"] = 100.0 * right / total
    return scalars, (f"dev accuracy {scalars['dev/accuracy']:.2f} (" + ", ".join(
        f"{l} {scalars[f'dev/{l}']:.1f}" for l in self.sets) + ")")


@gin.configurable
def finetune(*, benchmark: str = gin.REQUIRED, data_dir: Optional[str] = gin.REQUIRED,
             initial_checkpoint_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED,
             train_languages: Sequence[str] = ("en",),
             eval_languages: Optional[Sequence[str]] = None, max_length: int = 128,
             batch_size: int = 32, epochs: float = 10, total_steps: Optional[int] = None,
             max_train_examples: Optional[int] = None, optimizer: str = "adam",
             learning_rate: float = 7e-6, lr_schedule: str = "linear",
             warmup_steps: int = 12500, weight_decay: float = 0.0,
             clip_grad_norm: Optional[float] = None, dropout_rate: float = 0.1,
             pooling: Optional[str] = None, eval_period: int = 5000, log_period: int = 100,
             checkpoint_cfg: Optional[checkpoints.CheckpointConfig] = None,
             partitioner: Optional[partitioning.Partitioner] = None, random_seed: int = 0,
             stop_at_step: Optional[int] = None, progress: bool = True,
             allow_config_change: bool = False, allow_data_change: bool = False,
             fresh: bool = False, prefetch_batches: int = 2) -> Optional[dict]:
  """Fine-tunes the encoder of `initial_checkpoint_path` on `benchmark`'s training pairs in
  `train_languages` (English: cross-lingual transfer; every language: translate-train-all)
  and scores every language of `eval_languages` (default the benchmark's) zero-shot; see
  the module docstring. `epochs` of the training pairs unless `total_steps`;
  `max_train_examples`: the first that many pairs of each training file. Returns the
  results (None when `stop_at_step` ended the run early)."""
  if benchmark not in BENCHMARKS:
    raise ConfigError(f"finetune.benchmark={benchmark!r}; expected one of {sorted(BENCHMARKS)}")
  bench = BENCHMARKS[benchmark]
  if not data_dir:
    raise ConfigError(f"{bench.flag} is not set: {bench.layout()}")
  if not Path(str(data_dir)).is_dir():
    raise DataError(f"{bench.flag}={data_dir}: no such directory ({bench.layout()})")
  for name, value in (("max_length", max_length), ("batch_size", batch_size),
                      ("log_period", log_period)):
    check_range(positive_int(value), "finetune", name, value, "a positive integer")
  check_range(isinstance(eval_period, int) and eval_period >= 0, "finetune", "eval_period",
              eval_period, "a number of steps >= 0 (0: no evaluation, the last step scored)")
  langs = list(eval_languages or bench.languages)
  unknown = [l for l in langs if l not in bench.languages]
  if unknown:
    raise ConfigError(f"finetune.eval_languages: {unknown} not among {bench.name}'s "
                      f"{list(bench.languages)}")

  # -- the starting encoder and its tokenizer
  info = read_model_info(initial_checkpoint_path)
  enc, prefix, table, source_pooling = source_encoder(model_from_config(info["model"]))
  if enc.num_languages:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH={initial_checkpoint_path}: its encoder reads "
                      f"language ids, which fine-tuned classification does not give")
  if max_length > enc.max_length:
    raise ConfigError(f"finetune.max_length={max_length}: the encoder's positions end at "
                      f"{enc.max_length}")
  vocabulary = str(storage.path(initial_checkpoint_path) / info["vocabulary"])
  tokenizer = load_tokenizer(vocabulary)

  # -- the data, tokenized once
  train_files, tok_parts, lab_parts = [], [], []
  for lang in train_languages:
    a, b, y, _ = read_pairs(bench, data_dir, "train", lang, max_train_examples)
    tok_parts.append(tokenizer.encode_pairs(a, b, max_length, iso3(lang)))
    lab_parts.append(y)
    train_files.append(bench.path(data_dir, "train", lang))
  tokens, labels = np.concatenate(tok_parts), np.concatenate(lab_parts)
  dev = {}
  for lang in langs:
    if bench.path(data_dir, "dev", lang).is_file():
      a, b, y, _ = read_pairs(bench, data_dir, "dev", lang)
      dev[lang] = (tokenizer.encode_pairs(a, b, max_length, iso3(lang)), y)
  tests = {}
  for lang in langs:
    a, b, y, skipped = read_pairs(bench, data_dir, "test", lang)
    tests[lang] = (tokenizer.encode_pairs(a, b, max_length, iso3(lang)), y, skipped)
  steps = total_steps or math.ceil(epochs * len(labels) / batch_size)
  check_range(positive_int(steps), "finetune", "total_steps", steps, "a positive number of steps")
  data = ArrayInput(f"finetune.{bench.name}", tokens, labels, batch_size, digest({
      "benchmark": bench.name, "files": stamp(train_files),
      "languages": list(train_languages), "max_length": max_length,
      "limit": max_train_examples, "batch_size": batch_size, "seed": random_seed,
      "vocabulary": Path(vocabulary).name}))

  # -- the model, optimizer and run (training's)
  module = SequenceClassifier(
      enc.clone(parent=None, dropout_rate=dropout_rate, attention_dropout_rate=dropout_rate,
                shared_embedding=None, output_layer=None),
      len(bench.labels), pooling or source_pooling, dropout_rate)
  model = ClassifierModel(module)
  rules = ([(r"encoder/token_embed/(.*)", rf"{table}/\1")] if table else []) + [
      (r"encoder/(.*)", rf"{prefix}/\1")]
  lr = optimizers.learning_rate_schedule(lr_schedule, learning_rate, min(warmup_steps, steps),
                                         steps)
  tx = optimizers.create_optimizer(optimizer, lr, weight_decay=weight_decay,
                                   clip_grad_norm=clip_grad_norm)
  phases = resolve_phases([Phase("finetune", steps, data)], model, None, tx, lr, steps)
  evaluator = DevAccuracy(dev) if dev and eval_period else None
  files = RunFiles(str(model_dir), vocabulary,
                   [iso3(l) for l in dict.fromkeys([*train_languages, *langs])],
                   checkpoint_cfg or checkpoints.CheckpointConfig(), initial_checkpoint_path,
                   rules, "dev/accuracy" if evaluator else None, "max", allow_config_change,
                   allow_data_change, fresh)
  settings = LoopSettings(steps, log_period, eval_period if evaluator else 0, random_seed,
                          stop_at_step, progress, prefetch_batches)
  state, _ = run_phases(model, phases, partitioner or partitioning.Partitioner(), files,
                        settings, evaluator)
  if stop_at_step is not None and stop_at_step < steps:
    return None

  # -- zero-shot scores of every language with the selected step
  if evaluator:
    params, step = checkpoints.restore_params(storage.path(model_dir) / BEST_DIR, model,
                                              None, max_length)
    selected = f"{BEST_DIR}/checkpoint_{step} (best dev/accuracy)"
  else:
    params, step, selected = host_params(state.params), steps, f"checkpoint_{steps} (last)"
  rows = []
  for lang, (tok, y, skipped) in tests.items():
    acc = 100.0 * float(np.mean(predict(model, params, tok) == y))
    rows.append({"hf_subset": lang, "languages": [iso3(lang)], "main_score": acc,
                 "accuracy": acc, "n": int(len(y)), "skipped_empty": skipped,
                 "zero_shot": lang not in train_languages})
  dev_rows = [{"hf_subset": lang, "accuracy": 100.0 * float(np.mean(
      predict(model, params, t) == y)), "n": int(len(y))} for lang, (t, y) in dev.items()]
  zero = [r["accuracy"] for r in rows if r["zero_shot"]]
  results = {
      "task_name": f"finetune_{bench.name}", "benchmark": bench.name,
      "model_dir": str(model_dir),
      "main_score": float(np.mean([r["accuracy"] for r in rows])),
      "zero_shot_mean": float(np.mean(zero)) if zero else None,
      "setting": ("cross-lingual transfer (English training data)"
                  if list(train_languages) == ["en"] else
                  f"translate-train-all ({len(train_languages)} training languages, every "
                  f"evaluated one)" if set(langs) <= set(train_languages) else
                  f"translate-train ({len(train_languages)} training languages)"),
      "train_languages": list(train_languages), "n_train": int(len(labels)),
      "steps": steps, "selected": selected, "step": int(step), "model": {
          "name": storage.path(model_dir).name, "initial_checkpoint": str(
              initial_checkpoint_path)},
      "vector": vectors.of_model(model) + ", fine-tuned with a classification head "
                "(dense, tanh, dense)",
      "scores": {"test": rows, "dev": dev_rows}}
  if jax.process_index() == 0:
    storage.write_atomic(storage.path(model_dir) / f"finetune_{bench.name}.json",
                         json.dumps(results, indent=1))
  return results
