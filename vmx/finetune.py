"""Cross-lingual transfer fine-tuning: `launch/finetune.py`'s gin-configured run.

  python launch/finetune.py --gin_file=finetune/xnli_infoxlm_base.gin \
      --gin.INITIAL_CHECKPOINT_PATH="'gs://BUCKET/infoxlm_base'" --gin.XNLI_DIR="'DIR'" \
      --gin.MODEL_DIR="'gs://BUCKET/infoxlm_base_xnli'" [--protocol=infoxlm]

What InfoXLM's Tables 1, 7 and 10 report (XNLI after fine-tuning on English, scored on
every language zero-shot, §4.2 and App. D) and EMMA-X's fine-tuned XRETE classification
tasks (XNLI, AmericasNLI, PAWS-X; Table 1 "translate-train-all": `train_languages` all of
them). Sentence-pair classification benchmarks share one code path (`BENCHMARKS`): the
pairs are read from the user's files, joined in the tokenizer's own pair format
(the tokenizer's `encode_pairs`) and classified by `vmx.models.classifier.ClassifierModel`, whose encoder
starts from any vmx model directory, a finished run of any method or one written by
launch/import_checkpoint.py (its encoder, wherever the method keeps it: `source_encoder`).

The run is a training run (vmx/training/loop.py `TrainingRun`, over vmx/training/step.py's
`Trainer`): the same mesh and sharding (`Partitioner`), checkpoints and resume
(vmx/modeldir/checkpoints.py: a killed run resumes at its step, bit for bit; the data
position is the step), run lock and restart contract, preemption, non-finite checks,
metrics and best checkpoint. Only the input differs: the pairs are few and labelled, so
they are tokenized once into memory and the batch of step s is a pure function of (seed,
s) (`PairBatches`: epoch e is a seeded permutation of the training pairs), instead of the
SeqIO / token-cache pipeline. Model selection as InfoXLM's App. D: every `eval_period`
steps the accuracy on the joint dev set of the evaluated languages, the best step kept in
MODEL_DIR/best/ (#M=1: one model for all languages). At the end every language's test
set is scored with it (without dev files: the last step) and
MODEL_DIR/finetune_<benchmark>.json written.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from vmx import storage
from vmx.data import pipeline
from vmx.data.languages import iso3
from vmx.data.vocab import load_tokenizer
from vmx.errors import ConfigError, DataError
from vmx.evaluation import vectors
from vmx.gin_utils import check_range, positive_int
from vmx.models.base import model_from_config
from vmx.models.classifier import ClassifierModel, SequenceClassifier
from vmx.modeldir import checkpoints
from vmx.modeldir import run as run_lib
from vmx.modeldir.layout import BEST_DIR, read_model_info
from vmx.training import optimizers, partitioning
from vmx.training.loop import TrainingRun
from vmx.training.phases import Phase, resolve_phases
from vmx.training.prefetch import Prefetcher
from vmx.training.step import Trainer, host_params

XNLI_LANGUAGES = ("en", "ar", "bg", "de", "el", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur",
                  "vi", "zh")


@dataclasses.dataclass(frozen=True)
class PairBenchmark:
  """A sentence-pair classification benchmark in one directory (`flag`, a gin macro):
  `files[split]` names each split's file per language ({lang}; the training file of
  another language than English: `translated_train`). `columns`: header names of (text a,
  text b, label) in the files, or () for the first three tab-separated fields (a header
  line naming them, `header`, is skipped)."""
  name: str
  flag: str
  languages: tuple                 # evaluated (dev / test) languages, as the files name them
  labels: tuple
  files: Mapping[str, str]         # train, dev, test
  translated_train: str = ""       # the train file of a language other than English
  columns: tuple = ()
  header: tuple = ()
  aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
  source: str = ""                 # where the files come from, for the layout line

  def path(self, directory, split: str, lang: str) -> Path:
    pattern = self.files[split]
    if split == "train" and lang != "en" and self.translated_train:
      pattern = self.translated_train
    return Path(str(directory)) / pattern.format(lang=lang)

  def layout(self) -> str:
    cols = ("<TAB>".join(self.columns) + " columns (a header line names them)"
            if self.columns else "<TAB>".join(self.header) + " (a header line of these "
            "names is skipped)")
    extra = (f", {self.translated_train} for translate-train" if self.translated_train else "")
    return (f"--gin.{self.flag}=DIR: DIR/{self.files['train'].format(lang='en')} (English "
            f"training pairs{extra.replace('{lang}', '<lang>')}), "
            f"DIR/{self.files['dev'].format(lang='<lang>')}, "
            f"DIR/{self.files['test'].format(lang='<lang>')} for lang in "
            f"{' '.join(self.languages)}; {cols}, labels {'/'.join(self.labels)}"
            + (f"; {self.source}" if self.source else ""))


BENCHMARKS = {b.name: b for b in (
    PairBenchmark("xnli", "XNLI_DIR", XNLI_LANGUAGES, ("entailment", "neutral", "contradiction"),
                  {"train": "train-{lang}.tsv", "dev": "dev-{lang}.tsv",
                   "test": "test-{lang}.tsv"},
                  header=("premise", "hypo", "label"),
                  aliases={"contradictory": "contradiction"},
                  source="train-en.tsv: XNLI-MT 1.0's multinli.train.en.tsv (MultiNLI; "
                         "train-<lang>.tsv its translations), dev / test: XNLI 1.0's "
                         "xnli.{dev,test}.tsv split by language (docs/evaluation.md)"),
    PairBenchmark("anli", "ANLI_DIR",
                  ("aym", "bzd", "cni", "gn", "hch", "nah", "oto", "quy", "shp", "tar"),
                  ("entailment", "neutral", "contradiction"),
                  {"train": "train-{lang}.tsv", "dev": "dev-{lang}.tsv",
                   "test": "test-{lang}.tsv"},
                  header=("premise", "hypo", "label"),
                  aliases={"contradictory": "contradiction"},
                  source="AmericasNLI's dev / test files split by language; train-en.tsv "
                         "(and train-es.tsv): MultiNLI as for XNLI"),
    PairBenchmark("pawsx", "PAWSX_DIR", ("en", "de", "es", "fr", "ja", "ko", "zh"), ("0", "1"),
                  {"train": "{lang}/train.tsv", "dev": "{lang}/dev_2k.tsv",
                   "test": "{lang}/test_2k.tsv"},
                  translated_train="{lang}/translated_train.tsv",
                  columns=("sentence1", "sentence2", "label"),
                  source="PAWS-X 1.0's x-final/ as distributed"),
)}


def read_pairs(bench: PairBenchmark, directory, split: str, lang: str,
               limit: Optional[int] = None):
  """(texts a, texts b, label ids, pairs skipped for an empty text) of one file; a file
  that is missing or does not parse is a DataError naming the flag and the layout."""
  path = bench.path(directory, split, lang)
  if not path.is_file():
    raise DataError(f"{bench.flag}={directory}: no {path.relative_to(Path(str(directory)))} "
                    f"({bench.layout()})")
  try:
    text = path.read_bytes().decode("utf-8").lstrip("\ufeff")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
  lines = [l.rstrip("\r") for l in text.split("\n")]
  while lines and not lines[-1].strip():
    lines.pop()
  cols = (0, 1, 2)
  start = 0
  if lines:
    first = [f.strip().lower() for f in lines[0].split("\t")]
    if bench.columns:
      missing = [c for c in bench.columns if c not in first]
      if missing:
        raise DataError(f"{path}:1: no column(s) {missing} in the header line ({bench.layout()})")
      cols, start = tuple(first.index(c) for c in bench.columns), 1
    elif first[:3] == list(bench.header):
      start = 1
  index = {lab: i for i, lab in enumerate(bench.labels)}
  a, b, y, skipped = [], [], [], 0
  for i, line in enumerate(lines[start:], start + 1):
    f = line.split("\t")
    if len(f) <= max(cols):
      raise DataError(f"{path}:{i}: {len(f)} tab-separated field(s), expected "
                      f"{max(cols) + 1} ({bench.layout()})")
    label = f[cols[2]].strip()
    label = bench.aliases.get(label, label)
    if label not in index:
      raise DataError(f"{path}:{i}: label {f[cols[2]].strip()!r}, expected one of "
                      f"{list(bench.labels)}")
    ta, tb = f[cols[0]].strip(), f[cols[1]].strip()
    if not ta or not tb:    # PAWS-X's translations have a few empty sentences
      skipped += 1
      continue
    a.append(ta)
    b.append(tb)
    y.append(index[label])
    if limit and len(y) == limit:
      break
  if not y:
    raise DataError(f"{path}: no pair")
  return a, b, np.asarray(y, np.int32), skipped


def source_encoder(model):
  """(TransformerEncoder, where its parameters are, where its token table is (None: in
  the encoder), its pooling) of a vmx model's sentence encoder: `encoder/` (dual
  encoders, MPCL, InfoXLM, EMMA-X, imported checkpoints), EMS's `sentence_encoder/` and
  VMSST's `semantic_encoder/` (both with the shared `token_embed/`)."""
  module = getattr(model, "module", None)
  enc = getattr(module, "encoder", None)
  if enc is None or not hasattr(module, "pooling"):
    raise ConfigError(f"fine-tuning starts from a model with a sentence encoder; "
                      f"{type(model).__name__} has none")
  prefix, table = getattr(type(model), "ENCODER_PARAMS", ("encoder", None))
  return enc, prefix, table, module.pooling


class PairBatches:
  """Global batches of tokenized pairs for the training loop: rows [s B, (s + 1) B) of the
  endless sequence of epochs, epoch e a permutation seeded by (seed, e): the batch of
  step s is a function of (seed, s) alone, so a resume at step s reads it at once.
  `position`: the batches handed out; `state_at(p)` what a checkpoint stores."""
  rows = None     # every process holds the global batch (the data are small)

  def __init__(self, tokens_NxL, labels_N, batch_size: int, seed: int, digest: str,
               position: int = 0):
    self.tokens, self.labels = tokens_NxL, labels_N
    self.batch_size, self.seed, self.digest = batch_size, seed, digest
    self.position = position
    self._epoch, self._order = None, None

  def _rows(self, start: int, stop: int) -> np.ndarray:
    n = len(self.labels)
    out = []
    for i in range(start, stop):
      e = i // n
      if e != self._epoch:
        self._epoch, self._order = e, np.random.default_rng([self.seed, e]).permutation(n)
      out.append(self._order[i % n])
    return np.asarray(out)

  def batch(self, step: int) -> dict:
    rows = self._rows(step * self.batch_size, (step + 1) * self.batch_size)
    return {"tokens": self.tokens[rows], "label": self.labels[rows]}

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    out = self.batch(self.position)
    self.position += 1
    return out

  def state_at(self, position: int) -> dict:
    return {"reader": "finetune", "position": int(position), "data": self.digest}


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


class FinetuneRun(TrainingRun):
  """A `TrainingRun` whose input is `PairBatches` (the rest of the loop is training's)."""

  def __init__(self, *, batches: PairBatches, **kw):
    super().__init__(**kw)
    self.batches = batches

  def phase_data(self, i: int, data_state=None) -> Prefetcher:
    position = 0
    if data_state is not None:
      if data_state.get("reader") != "finetune" or (
          data_state.get("data") != self.batches.digest and not self.allow_data_change):
        raise DataError(f"MODEL_DIR={self.model_dir}: its checkpoints were trained on other "
                        f"fine-tuning data (files, languages, length or seed); use another "
                        f"MODEL_DIR, or --gin.ALLOW_DATA_CHANGE=True to go on")
      position = int(data_state["position"])
    self.batches.position = position
    return Prefetcher(self.batches, self.trainers[i].placer(None), self.prefetch_batches)


def _digest(parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _stamp(paths) -> list:
  return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


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
  partitioner = partitioner or partitioning.Partitioner()
  checkpoint_cfg = checkpoint_cfg or checkpoints.CheckpointConfig()

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
  digest = _digest({"benchmark": bench.name, "files": _stamp(train_files),
                    "languages": list(train_languages), "max_length": max_length,
                    "limit": max_train_examples, "batch_size": batch_size, "seed": random_seed,
                    "vocabulary": Path(vocabulary).name})
  batches = PairBatches(tokens, labels, batch_size, random_seed, digest)

  # -- the model, optimizer and trainer (training's)
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
  shapes = {"tokens": (batch_size, max_length), "label": (batch_size,)}
  check_range(batch_size % partitioner.data_parallel_size == 0, "finetune", "batch_size",
              batch_size, f"a multiple of the {partitioner.data_parallel_size} data-parallel "
              f"devices")
  trainer = Trainer(model, tx, partitioner, shapes, lr)
  described = pipeline.DatasetConfig(f"finetune.{bench.name}", {"tokens": max_length},
                                     batch_size)
  phases = resolve_phases([Phase("finetune", steps, described)], model, None, tx, lr, steps)
  evaluator = DevAccuracy(dev) if dev and eval_period else None
  languages = [iso3(l) for l in dict.fromkeys([*train_languages, *langs])]
  operative = gin.operative_config_str()
  primary = jax.process_index() == 0
  lock = run_lib.open_run(model_dir, model, operative, allow_config_change, fresh, primary,
                          None, allow_data_change, vocabulary)
  try:
    state, _ = FinetuneRun(
        batches=batches, model=model, phases=phases, trainers=[trainer], model_dir=model_dir,
        total_steps=steps, vocabulary=vocabulary, languages=languages,
        partitioner=partitioner, checkpoint_cfg=checkpoint_cfg, eval_cfg=evaluator,
        eval_period=eval_period if evaluator else 0, log_period=log_period,
        random_seed=random_seed, progress=progress, stop_at_step=stop_at_step,
        initial_checkpoint_path=initial_checkpoint_path,
        initial_checkpoint_assignment=rules,
        best_metric="dev/accuracy" if evaluator else None, best_mode="max",
        max_length=max_length, operative_config=operative, lock=lock,
        prefetch_batches=prefetch_batches, allow_data_change=allow_data_change).run()
  finally:
    if lock is not None:
      lock.release()
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
                  f"translate-train ({len(train_languages)} training languages)"),
      "train_languages": list(train_languages), "n_train": int(len(labels)),
      "steps": steps, "selected": selected, "step": int(step), "model": {
          "name": storage.path(model_dir).name, "initial_checkpoint": str(
              initial_checkpoint_path)},
      "vector": vectors.of_model(model) + ", fine-tuned with a classification head "
                "(dense, tanh, dense)",
      "scores": {"test": rows, "dev": dev_rows}}
  if primary:
    storage.write_atomic(storage.path(model_dir) / f"finetune_{bench.name}.json",
                         json.dumps(results, indent=1))
  return results
