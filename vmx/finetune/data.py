"""Fine-tuning's data: the sentence-pair benchmarks, their files, and `ArrayInput`.

`BENCHMARKS` names each benchmark's files in the user's directory (the layouts
docs/evaluation.md shows), `read_pairs` reads one file (a bad line is one DataError naming
file:line and the layout), and `ArrayInput` is the training loop's `Input`
(vmx/training/inputs.py) over rows tokenized once into memory: the batch of step s is a
pure function of (seed, s) (`RowBatches`), so a resume at step s reads it at once.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from vmx.data.languages import XNLI
from vmx.errors import DataError
from vmx.gin_utils import check_range

# English (the training language) first, then the others in XNLI's order
XNLI_LANGUAGES = ("en",) + tuple(l for l in XNLI if l != "en")


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


class RowBatches:
  """Global batches of in-memory rows for the training loop: rows [s B, (s + 1) B) of the
  endless sequence of epochs, epoch e a permutation seeded by (seed, e): the batch of
  step s is a function of (seed, s) alone, so a resume at step s reads it at once.
  `arrays`: feature name -> [N, ...] array; `position`: the batches handed out;
  `state_at(p)` what a checkpoint stores."""
  rows = None     # every process holds the global batch (the data are small)

  def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int,
               digest: str, position: int = 0):
    self.arrays = dict(arrays)
    self.n = len(next(iter(self.arrays.values())))
    self.batch_size, self.seed, self.digest = batch_size, seed, digest
    self.position = position
    self._epoch, self._order = None, None

  def _rows(self, start: int, stop: int) -> np.ndarray:
    out = []
    for i in range(start, stop):
      e = i // self.n
      if e != self._epoch:
        self._epoch, self._order = e, np.random.default_rng([self.seed, e]).permutation(self.n)
      out.append(self._order[i % self.n])
    return np.asarray(out)

  def batch(self, step: int) -> dict:
    rows = self._rows(step * self.batch_size, (step + 1) * self.batch_size)
    return {k: v[rows] for k, v in self.arrays.items()}

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    out = self.batch(self.position)
    self.position += 1
    return out

  def state_at(self, position: int) -> dict:
    return {"reader": "finetune", "position": int(position), "data": self.digest}


class ArrayInput:
  """Rows in memory as a training input (`Input`, vmx/training/inputs.py): `arrays`, a
  feature name -> [N, ...] array (pairs: `tokens` [N, L], the pairs joined in the
  tokenizer's pair format, and `label` [N]; extractive QA: `tokens`, `start`, `end`), read
  in `RowBatches`' order. `digest` names the data (files, languages, length, seed): a
  checkpoint of other data is refused at resume unless the run allows data changes."""

  def __init__(self, name: str, arrays: Mapping[str, np.ndarray], batch_size: int,
               digest: str):
    sizes = {k: len(v) for k, v in arrays.items()}
    if len(set(sizes.values())) != 1 or "tokens" not in arrays:
      raise ValueError(f"ArrayInput({name}): features of one length with `tokens`, not {sizes}")
    self.name, self.arrays = name, dict(arrays)
    self.batch_size, self.digest = batch_size, digest

  def check(self, model, data_parallel_size: int) -> None:
    del model
    check_range(self.batch_size % data_parallel_size == 0, "finetune", "batch_size",
                self.batch_size, f"a multiple of the {data_parallel_size} data-parallel "
                f"devices")

  def batch_shapes(self, model) -> dict:
    del model
    return {k: (self.batch_size,) + v.shape[1:] for k, v in self.arrays.items()}

  def token_features(self, model) -> list[str]:
    del model
    return []

  def packed_features(self, model, shapes: Mapping[str, tuple]) -> dict:
    del model, shapes
    return {}

  def token_lengths(self, model) -> list[int]:
    del model
    return [int(self.arrays["tokens"].shape[1])]

  def changes(self, state: Mapping, seed: int) -> list[str]:
    del state, seed   # the digest is compared when the run resumes (`start`)
    return []

  def start(self, model, seed: int, rows: Optional[Mapping], state: Optional[Mapping] = None,
            allow_change: bool = False, progress: bool = True) -> RowBatches:
    del model, rows, progress   # every process reads the (small) global batch
    position = 0
    if state is not None:
      if state.get("reader") != "finetune" or (state.get("data") != self.digest
                                               and not allow_change):
        raise DataError("this MODEL_DIR's checkpoints were trained on other fine-tuning data "
                        "(files, languages, length or seed); use another MODEL_DIR, or "
                        "--gin.ALLOW_DATA_CHANGE=True to go on")
      position = int(state["position"])
    return RowBatches(self.arrays, self.batch_size, seed, self.digest, position)


def digest(parts) -> str:
  """A short name of what the data are made of (JSON-able `parts`)."""
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def stamp(paths: Sequence[Path]) -> list:
  """The files as a digest sees them: path, size and modification time."""
  return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
