"""SeqIO building blocks for parallel-text tasks: sources, preprocessors, registration.

A pair task yields, per example:
  inputs [L] int32, targets [L] int32   SentencePiece ids (no EOS)
  inputs_lang, targets_lang  int32      index of the language in `languages`
Concrete corpora (which files, which languages) are registered in the top-level
`tasks` package; this module holds the machinery they share.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from typing import Sequence

import seqio
import tensorflow as tf

from vmx.data import readers
from vmx.data.download import DataError

DEFAULT_SHUFFLE_BUFFER = 20_000


class _QuietUncachedWarning(logging.Filter):
  """seqio warns once per task about uncached FunctionDataSources; our sources are
  validated text files shuffled with a seeded buffer, and resumption replays the
  seeded stream, so the warning's concern (reshuffling on restart) does not apply."""

  def filter(self, record):
    return "uncached FunctionDataset" not in str(record.msg)


logging.getLogger("absl").addFilter(_QuietUncachedWarning())


def _text_lines(path: str) -> tf.data.Dataset:
  return tf.data.TextLineDataset(str(path), compression_type="GZIP" if str(path).endswith(".gz")
                                 else None)


def _drop_empty(ex):
  return tf.logical_and(tf.strings.length(tf.strings.strip(ex["inputs"])) > 0,
                        tf.strings.length(tf.strings.strip(ex["targets"])) > 0)


def moses_source(src_path: str, tgt_path: str, empty_lines: str = "error"
                 ) -> seqio.FunctionDataSource:
  """Aligned line files; validated (line counts, empty lines, UTF-8) before use."""
  n = readers.validate_parallel(src_path, tgt_path, empty_lines)

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed  # one file per side: order is shuffled downstream
    ds = tf.data.Dataset.zip({"inputs": _text_lines(src_path), "targets": _text_lines(tgt_path)})
    return ds.filter(_drop_empty) if empty_lines == "skip" else ds

  return seqio.FunctionDataSource(dataset_fn, splits=("train",),
                                  num_input_examples={"train": n})


def tsv_source(path: str, columns: Sequence[int] = (0, 1), empty_lines: str = "error"
               ) -> seqio.FunctionDataSource:
  """`source<TAB>target` lines (columns configurable); validated before use."""
  columns = tuple(columns)
  n = readers.validate_tsv(path, columns, empty_lines)

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed

    def parse(line):
      fields = tf.strings.split(line, "\t")
      return {"inputs": fields[columns[0]], "targets": fields[columns[1]]}

    ds = _text_lines(path).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.filter(_drop_empty) if empty_lines == "skip" else ds

  return seqio.FunctionDataSource(dataset_fn, splits=("train",),
                                  num_input_examples={"train": n})


def add_language_ids(dataset: tf.data.Dataset, src_lang_id: int, tgt_lang_id: int):
  """Preprocessor: constant language ids for both sides of a pair task."""
  return dataset.map(lambda ex: {**ex, "inputs_lang": tf.constant(src_lang_id, tf.int32),
                                 "targets_lang": tf.constant(tgt_lang_id, tf.int32)},
                     num_parallel_calls=tf.data.AUTOTUNE)


def language_id(lang: str, languages: Sequence[str], where: str = "") -> int:
  if lang not in languages:
    raise DataError(f"{where}language {lang!r} is not in LANGUAGES ({len(languages)} "
                    f"languages: {', '.join(languages[:12])}{'…' if len(languages) > 12 else ''})"
                    f"; add it to the LANGUAGES gin macro")
  return list(languages).index(lang)


def short_hash(text: str) -> str:
  """8 hex digits naming a vocabulary or language set inside task names."""
  return hashlib.sha256(str(text).encode()).hexdigest()[:8]


def _unregister(registry, name):
  """Re-registration replaces: a gin run may register the same name again."""
  if name in registry.names():
    registry.remove(name)


def register_pair_task(name: str, source: seqio.DataSource, src_lang: str, tgt_lang: str,
                       vocab_path: str, languages: Sequence[str],
                       shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER) -> str:
  """Registers (or re-registers) a tokenized pair task; returns its name."""
  vocab = seqio.SentencePieceVocabulary(str(vocab_path))
  features = {k: seqio.Feature(vocab, add_eos=False, dtype=tf.int32)
              for k in ("inputs", "targets")}
  preprocessors = [
      functools.partial(add_language_ids,
                        src_lang_id=language_id(src_lang, languages, f"task {name}: "),
                        tgt_lang_id=language_id(tgt_lang, languages, f"task {name}: ")),
      seqio.preprocessors.tokenize,
  ]
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(name, source=source, preprocessors=preprocessors,
                         output_features=features, shuffle_buffer_size=shuffle_buffer_size)
  return name


def temperature_rates(sizes: Sequence[int], alpha: float) -> list[float]:
  """Sampling probabilities p_i ∝ n_i^alpha (alpha=1: proportional, 0: uniform)."""
  w = [float(n) ** alpha for n in sizes]
  total = sum(w)
  return [x / total for x in w]


def register_mixture(name: str, task_names: Sequence[str], alpha: float) -> str:
  sizes = [seqio.get_mixture_or_task(t).num_input_examples("train") for t in task_names]
  rates = temperature_rates(sizes, alpha)
  _unregister(seqio.MixtureRegistry, name)
  seqio.MixtureRegistry.add(name, list(zip(task_names, rates)))
  return name
