"""Sources of vmx's SeqIO tasks: text files read as examples, split by content.

Corpora come as Moses files (aligned lines, `moses_source`), TSV (`tsv_source`) or
monolingual text (`text_source`); every one is validated on first use (vmx/data/readers.py:
line counts, empty lines, UTF-8, columns), which raises DataError naming the file and
line. Concrete corpora (which files, which languages) are registered in the top-level
`tasks` package (vmx/data/registration.py).

Splits: every text source has a `train` and a `validation` split. An example is in
`validation` when the FarmHash fingerprint of its text falls in the first
`validation_percent` (default 1) of 100 buckets: the split is by content, so it does not
depend on file order, and a repeated pair is on one side only. `validation_percent=0`
gives a `train` split of every example and no `validation` split. Sources given
`holdout` (a `devsets.HeldOut`) skip every example with a sentence of those dev sets.
A source's `fingerprint()` (its files' sizes and content hashes, filters) keys the token
cache (vmx/data/token_cache).
"""
from __future__ import annotations

import logging
import warnings
from typing import Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from vmx.data import devsets, readers, teacher
from vmx.data.teacher import text_fingerprint
from vmx.errors import DataError


class _QuietUncachedWarning(logging.Filter):
  """seqio warns once per task about uncached FunctionDataSources; our sources are
  validated text files read in file order (the index reader caches them and shuffles by
  position; the seqio reader replays its seeded stream on resume), so the warning's
  concern (reshuffling on restart) does not apply."""

  def filter(self, record):
    return "uncached FunctionDataset" not in str(record.msg)


logging.getLogger("absl").addFilter(_QuietUncachedWarning())


def _text_lines(path: str) -> tf.data.Dataset:
  return tf.data.TextLineDataset(str(path), compression_type="GZIP" if str(path).endswith(".gz")
                                 else None)


def _drop_empty(ex):
  return tf.logical_and(tf.strings.length(tf.strings.strip(ex["inputs"])) > 0,
                        tf.strings.length(tf.strings.strip(ex["targets"])) > 0)


from vmx.data.task_settings import VALIDATION_PERCENT  # noqa: E402  (re-exported)


def in_validation(text: tf.Tensor, validation_percent: int) -> tf.Tensor:
  """Whether the example whose text is `text` belongs to the `validation` split: its
  FarmHash fingerprint falls in the first `validation_percent` of 100 buckets."""
  return tf.strings.to_hash_bucket_fast(text, 100) < validation_percent


# What an example filter (hold-out, teacher pivots) that removes every example of a source
# gets: an error, or (the user's opt-in) one warning line.
EMPTIED = ("error", "warn")


class SplitSource(seqio.FunctionDataSource):
  """The examples of `make_dataset()` (finite, text features) split by content into
  `train` and `validation` (`key(example)` is the text hashed, see `in_validation`).

  Nothing is read when the source is made: `check()` (the readers' validation, which
  raises DataError naming the file and line) runs and the split sizes are counted on
  first use, so registering many tasks (`import tasks`) is instant; `counts()` forces it.
  """

  def __init__(self, make_dataset, key, check, validation_percent: int = VALIDATION_PERCENT,
               description: str = "source", paths: Sequence[str] = (), kind: str = "",
               holdout: Optional[devsets.HeldOut] = None, pivots_in: Optional[str] = None,
               emptied: str = "error", switch: str = "emptied"):
    if (isinstance(validation_percent, bool) or not isinstance(validation_percent, int)
        or not 0 <= validation_percent < 100):
      raise DataError(f"{description}: validation_percent={validation_percent!r}; expected an "
                      f"integer in [0, 100) (the share of examples held out as `validation`)")
    if emptied not in EMPTIED:
      raise DataError(f"{switch}={emptied!r}; expected one of {EMPTIED}")
    self._check = check
    self._raw = make_dataset
    # what may remove examples after the files are read (an emptied source is an error)
    self._filters = ([f"the hold-out of {', '.join(holdout.names)}"] if holdout else []) + (
        [f"the teacher cache {pivots_in}'s pivots"] if pivots_in else [])
    self._emptied, self._switch = emptied, switch
    self._make = _without_held_out(make_dataset, holdout) if holdout else make_dataset
    self._kind = f"{kind}:holdout={holdout.key}" if holdout else kind
    if pivots_in:
      self._make = _only_pivots_in(self._make, pivots_in)
      self._kind += f":pivots={teacher.info(pivots_in)['stamp']}"
    self._key = key
    self._paths = [str(p) for p in paths]
    self.validation_percent = validation_percent
    self.description = description
    self._counts = None
    super().__init__(self._split_dataset,
                     splits=("train", "validation") if validation_percent else ("train",))

  def _in_split(self, split):
    want_validation = tf.constant(split == "validation")
    return lambda ex: tf.equal(in_validation(self._key(ex), self.validation_percent),
                               want_validation)

  def _split_dataset(self, split, shuffle_files, seed=None):
    del shuffle_files, seed  # read in file order: shuffled downstream with a seeded buffer
    if split not in self.splits:
      raise DataError(f"{self.description}: no split {split!r}; it has {list(self.splits)}")
    self.counts()   # validated before anything is read
    ds = self._make()
    return ds.filter(self._in_split(split)) if self.validation_percent else ds

  def counts(self) -> dict:
    """{split: examples}; validates the files on the first call."""
    if self._counts is None:
      self._check()
      if self._paths:
        self._counts = readers.remember(f"splits:{self.validation_percent}:{self._kind}",
                                      self._paths, self._count)
      else:
        self._counts = self._count()
      self._check_not_emptied()
    return self._counts

  def _check_not_emptied(self):
    """A filter that removed every training example of non-empty files: DataError (the
    language would silently drop out of its mixture: the builder drops a task of rate 0),
    or, with `emptied='warn'` (the user's opt-in), one warning line."""
    if sum(self._counts.values()) or not self._filters:   # (train may be empty by the split)
      return
    raw = int(self._raw().reduce(np.int64(0), lambda n, _: n + 1))
    if not raw:
      return
    what = (f"{self.description}: {' and '.join(self._filters)} removed every one of its "
            f"{raw} examples")
    if self._emptied == "error":
      raise DataError(f"{what}; the task would train on nothing and its mixture without it. "
                      f"Drop it from the mixture, or set {self._switch}='warn' to train "
                      f"without it")
    warnings.warn(f"{what}; training without it ({self._switch}='warn')", stacklevel=2)

  def _count(self) -> dict:
    if not self.validation_percent:
      return {"train": int(self._make().reduce(np.int64(0), lambda n, _: n + 1))}
    total, held = self._make().map(
        lambda ex: tf.cast(in_validation(self._key(ex), self.validation_percent), tf.int64)
    ).reduce((np.int64(0), np.int64(0)), lambda acc, v: (acc[0] + 1, acc[1] + v))
    return {"train": int(total - held), "validation": int(held)}

  def num_input_examples(self, split: str) -> int:
    return self.counts()[split]

  @property
  def paths(self) -> list[str]:
    """The files the examples are read from."""
    return list(self._paths)

  def fingerprint(self) -> str:
    """What the examples are made of: the reader, filters and held-out dev sets, the
    validation share, and the files' sizes and content hashes (vmx/data/token_cache)."""
    if not self._paths:
      raise DataError(f"{self.description}: a source without files cannot be fingerprinted; "
                      f"set DatasetConfig.reader = 'seqio'")
    return f"{self._kind}|validation={self.validation_percent}|{readers.stamp(self._paths)}"


def _pair_key(ex):
  return tf.strings.join([ex["inputs"], ex["targets"]], "\t")


def _without_held_out(make_dataset, holdout: devsets.HeldOut):
  """`make_dataset` minus the examples with a sentence of the held-out dev sets (by the
  FarmHash fingerprint of each stripped text feature)."""
  def make():
    sentences = sorted(holdout.sentences())
    keys = text_fingerprint(tf.constant(sentences or [""], tf.string))
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.ones_like(keys)), default_value=0)

    def keep(ex):
      hits = [table.lookup(text_fingerprint(v)) for k, v in ex.items()
              if k in ("inputs", "targets")]
      return tf.equal(tf.add_n(hits), 0)
    return make_dataset().filter(keep)
  return make


def _only_pivots_in(make_dataset, cache: str):
  """`make_dataset` restricted to the pairs whose pivot (`targets`) sentence the teacher
  cache `cache` embeds (a partial cache: `vmx.data.teacher.partial`)."""
  def make():
    keys = tf.constant(teacher.load(cache)[0])
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.ones_like(keys)), default_value=0)
    return make_dataset().filter(
        lambda ex: tf.equal(table.lookup(text_fingerprint(ex["targets"])), 1))
  return make


def moses_source(src_path: str, tgt_path: str, empty_lines: str = "error",
                 validation_percent: int = VALIDATION_PERCENT,
                 holdout: Optional[devsets.HeldOut] = None,
                 pivots_in: Optional[str] = None, emptied: str = "error",
                 switch: str = "emptied") -> SplitSource:
  """Aligned line files; validated (line counts, empty lines, UTF-8) on first use.
  `holdout`: dev sets whose sentences the source skips. `pivots_in`: a teacher cache;
  the source keeps the pairs whose target sentence it embeds."""
  def make():
    ds = tf.data.Dataset.zip({"inputs": _text_lines(src_path), "targets": _text_lines(tgt_path)})
    return ds.filter(_drop_empty) if empty_lines == "skip" else ds

  return SplitSource(make, _pair_key,
                     lambda: readers.validate_parallel(src_path, tgt_path, empty_lines),
                     validation_percent, f"{src_path} + {tgt_path}", [src_path, tgt_path],
                     f"moses:{empty_lines}", holdout, pivots_in, emptied, switch)


def tsv_source(path: str, columns: Sequence[int] = (0, 1), empty_lines: str = "error",
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None, emptied: str = "error",
               switch: str = "emptied") -> SplitSource:
  """`source<TAB>target` lines (columns configurable); validated on first use."""
  columns = tuple(columns)

  def parse(line):
    fields = tf.strings.split(line, "\t")
    return {"inputs": fields[columns[0]], "targets": fields[columns[1]]}

  def make():
    ds = _text_lines(path).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.filter(_drop_empty) if empty_lines == "skip" else ds

  return SplitSource(make, _pair_key, lambda: readers.validate_tsv(path, columns, empty_lines),
                     validation_percent, str(path), [path], f"tsv:{columns}:{empty_lines}",
                     holdout, emptied=emptied, switch=switch)


def text_source(paths: Sequence[str], line_parity: int | None = None,
                validation_percent: int = VALIDATION_PERCENT,
                holdout: Optional[devsets.HeldOut] = None, emptied: str = "error",
                switch: str = "emptied") -> SplitSource:
  """Monolingual text: the non-empty lines of one or more files as `inputs` (validated
  on first use: UTF-8, at least one line per file). `line_parity` 0 or 1 keeps only the
  even or odd lines of each file (line numbers from 0, empty lines counted): two sides
  of a parallel corpus read with different parities never yield both sides of a pair."""
  paths = [str(p) for p in paths]
  if line_parity not in (None, 0, 1):
    raise ValueError(f"text_source: line_parity={line_parity!r}; expected None, 0 or 1")

  def one(path):
    ds = _text_lines(path)
    if line_parity is not None:
      ds = ds.enumerate().filter(lambda i, _: i % 2 == line_parity).map(lambda _, line: line)
    return ds

  def make():
    ds = one(paths[0])
    for path in paths[1:]:
      ds = ds.concatenate(one(path))
    ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
    return ds.map(lambda line: {"inputs": line})

  def check():
    for p in paths:
      readers.validate_text(p)

  return SplitSource(make, lambda ex: ex["inputs"], check, validation_percent,
                     ", ".join(paths[:3]) + (" …" if len(paths) > 3 else ""), paths,
                     f"text:{line_parity}", holdout, emptied=emptied, switch=switch)
