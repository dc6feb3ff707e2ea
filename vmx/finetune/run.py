"""`finetune()`: the gin-configured fine-tuning run (see the package docstring).

It opens the starting encoder and its tokenizer (`Start`), lets the benchmark's kind build
its `Task` (sentence-pair classification here, `pairs_task`; extractive QA in
vmx/finetune/qa.py): the model, an `ArrayInput` of its training rows, the dev evaluator
and how the test sets are scored. `run_phases` (vmx/training/trainer.py) trains one phase
of it; then every language's test set is scored with the selected step and
MODEL_DIR/finetune_<benchmark>.json written.
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
from vmx.errors import ConfigError, DataError
from vmx.evaluation import vectors
from vmx.finetune import qa as qa_kind
from vmx.finetune.data import BENCHMARKS, ArrayInput, digest, read_pairs, stamp
from vmx.finetune.task import Start, Task, in_batches, open_start
from vmx.gin_utils import check_range, positive_int
from vmx.models.classifier import ClassifierModel, SequenceClassifier
from vmx.modeldir import checkpoints
from vmx.modeldir.layout import BEST_DIR
from vmx.training import optimizers, partitioning
from vmx.training.loop import LoopSettings, RunFiles
from vmx.training.phases import Phase, resolve_phases
from vmx.training.step import host_params
from vmx.training.trainer import run_phases


def predict(model, params, tokens_NxL, batch_size: int = 256) -> np.ndarray:
  """Predicted label ids [N] (deterministic), in batches of `batch_size` rows (the last
  one padded: one compilation)."""
  if not len(tokens_NxL):
    return np.zeros((0,), np.int32)
  return in_batches(_predict_fn(model), params, tokens_NxL, batch_size)


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


def pairs_task(bench, start: Start, *, data_dir, train_languages, langs, max_length: int,
               batch_size: int, max_train_examples, seed: int, dropout_rate: float,
               pooling: Optional[str]) -> Task:
  """The `Task` of a sentence-pair classification benchmark (`BENCHMARKS`)."""
  tokenizer = start.tokenizer
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
  data = ArrayInput(f"finetune.{bench.name}", {"tokens": tokens, "label": labels}, batch_size,
                    digest({"benchmark": bench.name, "files": stamp(train_files),
                            "languages": list(train_languages), "max_length": max_length,
                            "limit": max_train_examples, "batch_size": batch_size,
                            "seed": seed, "vocabulary": Path(start.vocabulary).name}))
  module = SequenceClassifier(start.module_encoder(dropout_rate), len(bench.labels),
                              pooling or start.pooling, dropout_rate)
  model = ClassifierModel(module)

  def score(params):
    rows = []
    for lang, (tok, y, skipped) in tests.items():
      acc = 100.0 * float(np.mean(predict(model, params, tok) == y))
      rows.append({"hf_subset": lang, "languages": [iso3(lang)], "main_score": acc,
                   "accuracy": acc, "n": int(len(y)), "skipped_empty": skipped,
                   "zero_shot": lang not in train_languages})
    dev_rows = [{"hf_subset": lang, "accuracy": 100.0 * float(np.mean(
        predict(model, params, t) == y)), "n": int(len(y))} for lang, (t, y) in dev.items()]
    return rows, dev_rows

  return Task(model, data, len(labels), DevAccuracy(dev) if dev else None, "dev/accuracy",
              ("accuracy",), score, {}, "a classification head (dense, tanh, dense)")


@gin.configurable
def finetune(*, benchmark: str = gin.REQUIRED, data_dir: Optional[str] = gin.REQUIRED,
             initial_checkpoint_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED,
             train_data_dir: Optional[str] = None,
             train_languages: Sequence[str] = ("en",),
             eval_languages: Optional[Sequence[str]] = None, max_length: int = 128,
             batch_size: int = 32, epochs: float = 10, total_steps: Optional[int] = None,
             max_train_examples: Optional[int] = None, optimizer: str = "adam",
             learning_rate: float = 7e-6, lr_schedule: str = "linear",
             warmup_steps: int = 12500, warmup_fraction: Optional[float] = None,
             weight_decay: float = 0.0,
             clip_grad_norm: Optional[float] = None, dropout_rate: float = 0.1,
             pooling: Optional[str] = None, eval_period: int = 5000, log_period: int = 100,
             qa: Optional[qa_kind.QaSettings] = None,
             checkpoint_cfg: Optional[checkpoints.CheckpointConfig] = None,
             partitioner: Optional[partitioning.Partitioner] = None, random_seed: int = 0,
             stop_at_step: Optional[int] = None, progress: bool = True,
             allow_config_change: bool = False, allow_data_change: bool = False,
             fresh: bool = False, prefetch_batches: int = 2) -> Optional[dict]:
  """Fine-tunes the encoder of `initial_checkpoint_path` on `benchmark`'s training data in
  `train_languages` (English: cross-lingual transfer; every language: translate-train-all)
  and scores every language of `eval_languages` (default the benchmark's) zero-shot; see
  the package docstring. `data_dir`: the benchmark's files (`train_data_dir`: its training
  files where they are apart, extractive QA's SQuAD); `epochs` of the training rows unless
  `total_steps`; `warmup_fraction` (of the steps) replaces `warmup_steps` when given;
  `max_train_examples`: the first that many of each training file; `qa`: extractive QA's
  windows and answers (`QaSettings`, only for a QA benchmark). Returns the results (None
  when `stop_at_step` ended the run early)."""
  known = sorted(BENCHMARKS) + sorted(qa_kind.QA_BENCHMARKS)
  if benchmark not in known:
    raise ConfigError(f"finetune.benchmark={benchmark!r}; expected one of {known}")
  is_qa = benchmark in qa_kind.QA_BENCHMARKS
  bench = qa_kind.QA_BENCHMARKS[benchmark] if is_qa else BENCHMARKS[benchmark]
  if not data_dir:
    raise ConfigError(f"{bench.flag} is not set: {bench.layout()}")
  if qa is not None and not is_qa:
    raise ConfigError(f"finetune.qa is set for {benchmark}, which is not extractive QA "
                      f"({sorted(qa_kind.QA_BENCHMARKS)})")
  if train_data_dir and not is_qa:
    raise ConfigError(f"finetune.train_data_dir is set for {benchmark}, whose training files "
                      f"are in {bench.flag}")
  for name, value in (("max_length", max_length), ("batch_size", batch_size),
                      ("log_period", log_period)):
    check_range(positive_int(value), "finetune", name, value, "a positive integer")
  check_range(isinstance(eval_period, int) and eval_period >= 0, "finetune", "eval_period",
              eval_period, "a number of steps >= 0 (0: no evaluation, the last step scored)")
  check_range(warmup_fraction is None or 0 <= warmup_fraction < 1, "finetune",
              "warmup_fraction", warmup_fraction, "None or a fraction in [0, 1)")
  langs = list(eval_languages or bench.languages)
  unknown = [l for l in langs if l not in bench.languages]
  if unknown:
    raise ConfigError(f"finetune.eval_languages: {unknown} not among {bench.name}'s "
                      f"{list(bench.languages)}")

  if not Path(str(data_dir)).is_dir():
    raise DataError(f"{bench.flag}={data_dir}: no such directory ({bench.layout()})")
  if is_qa:
    bench.check_train_dir(train_data_dir)
  start = open_start(initial_checkpoint_path, max_length)
  common = dict(data_dir=data_dir, train_languages=list(train_languages), langs=langs,
                max_length=max_length, batch_size=batch_size,
                max_train_examples=max_train_examples, seed=random_seed,
                dropout_rate=dropout_rate, pooling=pooling)
  task = (qa_kind.prepare(bench, start, train_dir=train_data_dir, qa=qa, **common) if is_qa
          else pairs_task(bench, start, **common))
  steps = total_steps or math.ceil(epochs * task.rows / batch_size)
  check_range(positive_int(steps), "finetune", "total_steps", steps, "a positive number of steps")
  warmup = round(warmup_fraction * steps) if warmup_fraction is not None else warmup_steps

  # -- the optimizer and run (training's)
  model = task.model
  lr = optimizers.learning_rate_schedule(lr_schedule, learning_rate, min(warmup, steps), steps)
  tx = optimizers.create_optimizer(optimizer, lr, weight_decay=weight_decay,
                                   clip_grad_norm=clip_grad_norm)
  phases = resolve_phases([Phase("finetune", steps, task.data)], model, None, tx, lr, steps)
  evaluator = task.evaluator if eval_period else None
  files = RunFiles(str(model_dir), start.vocabulary,
                   [iso3(l) for l in dict.fromkeys([*train_languages, *langs])],
                   checkpoint_cfg or checkpoints.CheckpointConfig(), initial_checkpoint_path,
                   start.rules(), task.select_by if evaluator else None, "max",
                   allow_config_change, allow_data_change, fresh)
  settings = LoopSettings(steps, log_period, eval_period if evaluator else 0, random_seed,
                          stop_at_step, progress, prefetch_batches)
  state, _ = run_phases(model, phases, partitioner or partitioning.Partitioner(), files,
                        settings, evaluator)
  if stop_at_step is not None and stop_at_step < steps:
    return None

  # -- every language's test set scored with the selected step
  if evaluator:
    params, step = checkpoints.restore_params(storage.path(model_dir) / BEST_DIR, model,
                                              None, max_length)
    selected = f"{BEST_DIR}/checkpoint_{step} (best {task.select_by})"
  else:
    params, step, selected = host_params(state.params), steps, f"checkpoint_{steps} (last)"
  rows, dev_rows = task.score(params)
  main = task.metrics[0]
  zero = [r[main] for r in rows if r["zero_shot"]]
  results = {
      "task_name": f"finetune_{bench.name}", "benchmark": bench.name,
      "model_dir": str(model_dir), "metrics": list(task.metrics),
      "main_score": float(np.mean([r[main] for r in rows])),
      **{f"{m}_mean": float(np.mean([r[m] for r in rows])) for m in task.metrics[1:]},
      "zero_shot_mean": float(np.mean(zero)) if zero else None,
      "setting": ("cross-lingual transfer (English training data)"
                  if list(train_languages) == ["en"] else
                  f"translate-train-all ({len(train_languages)} training languages, every "
                  f"evaluated one)" if set(langs) <= set(train_languages) else
                  f"translate-train ({len(train_languages)} training languages)"),
      "train_languages": list(train_languages), "n_train": int(task.rows), **task.extra,
      "steps": steps, "warmup_steps": int(min(warmup, steps)), "selected": selected,
      "step": int(step), "model": {
          "name": storage.path(model_dir).name, "initial_checkpoint": str(
              initial_checkpoint_path)},
      "vector": vectors.of_model(model) + f", fine-tuned with {task.head}",
      "scores": {"test": rows, "dev": dev_rows}}
  if jax.process_index() == 0:
    storage.write_atomic(storage.path(model_dir) / f"finetune_{bench.name}.json",
                         json.dumps(results, indent=1))
  return results
