"""SeqIO preprocessors of vmx's tasks (what runs between a source and the converter).

- `tokenize_step`: the tokenizing step of a task (seqio's `tokenize`;
  `tokenize_by_language` for a vocabulary that pre-tokenizes by language, EMS §4.2;
  `tokenize_in_batches` for an imported tokenizer, which tokenizes in Python);
- `add_language_ids`: the languages' indices in the run's LANGUAGES (after the cache
  placeholder: they depend on the run);
- `truncate_keeping_last`: an imported tokenizer's truncation (the closing token kept);
- `add_teacher_embeddings`: the cached teacher vector of the pair's pivot sentence
  (distillation, vmx/data/teacher.py).
"""
from __future__ import annotations

import functools
from typing import Mapping, Optional

import numpy as np
import seqio
import tensorflow as tf

from vmx.data import teacher
from vmx.data.seqio_vocab import HfVocabulary, PretokenizingVocabulary
from vmx.data.teacher import text_fingerprint
from vmx.errors import ConfigError


def add_language_ids(dataset: tf.data.Dataset, src_lang_id: int, tgt_lang_id: int):
  """Preprocessor: constant language ids for both sides of a pair task."""
  return dataset.map(lambda ex: {**ex, "inputs_lang": tf.constant(src_lang_id, tf.int32),
                                 "targets_lang": tf.constant(tgt_lang_id, tf.int32)},
                     num_parallel_calls=tf.data.AUTOTUNE)


def truncate_keeping_last(dataset: tf.data.Dataset, sequence_length,
                          features=("inputs", "targets")):
  """Preprocessor (imported tokenizers): a sequence longer than its feature length keeps
  its first L-1 ids and its closing special token ([SEP], </s>), as Hugging Face's
  truncation and vmx inference do; seqio's own trimming would cut the closing token."""
  def trim(ex):
    ex = dict(ex)
    for k in features:
      n = sequence_length[k]
      x = ex[k]
      ex[k] = tf.cond(tf.size(x) > n, lambda x=x, n=n: tf.concat([x[:n - 1], x[-1:]], 0),
                      lambda x=x: x)
    return ex
  return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


def add_teacher_embeddings(dataset: tf.data.Dataset, cache: str, task: str = ""):
  """Preprocessor (after tokenizing): `teacher` [D] float32, the cached teacher embedding
  of the pair's pivot (`targets`) sentence (vmx.data.teacher)."""
  d = teacher.dim(cache)

  def find(keys):
    return teacher.lookup(cache, keys, f"task {task}: ").astype(np.float32)

  def add(ex):
    key = text_fingerprint(ex["targets_pretokenized"])
    vec = tf.numpy_function(find, [tf.reshape(key, [1])], tf.float32, stateful=False)
    return {**ex, "teacher": tf.reshape(vec, [d])}
  return dataset.map(add, num_parallel_calls=tf.data.AUTOTUNE)


def tokenize_by_language(dataset: tf.data.Dataset, output_features,
                         languages: Mapping[str, str]) -> tf.data.Dataset:
  """seqio.preprocessors.tokenize for a pre-tokenizing vocabulary: feature k's text is in
  language `languages[k]`; the raw text is kept as `k_pretokenized`."""
  def tokenize(ex):
    ex = dict(ex)
    for k, lang in languages.items():
      ex[f"{k}_pretokenized"] = ex[k]
      ex[k] = output_features[k].vocabulary.encode_tf_in(ex[k], lang)
    return ex
  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


def tokenize_in_batches(dataset: tf.data.Dataset, output_features,
                        batch_size: int = 1024) -> tf.data.Dataset:
  """seqio.preprocessors.tokenize (the text kept as `k_pretokenized`, no EOS added) with one
  tokenizer call per `batch_size` examples instead of one per example: for a vocabulary
  that tokenizes in Python through `tf.numpy_function` (HfVocabulary), where the per-call
  cost dominates (2026-11-26, 20,000 Bible pairs, MiniLM's tokenizer, 2 shared cores:
  ~970 examples/s per example, ~1,900 in batches; docs/performance.md). The same examples
  in the same order. A task whose text features are not one string an example (N-way
  views) is tokenized example by example, as seqio does."""
  if any(dataset.element_spec[k].shape.rank != 0
         for k in output_features if k in dataset.element_spec):
    return seqio.preprocessors.tokenize(dataset, output_features)
  tokenize = functools.partial(seqio.preprocessors.tokenize_impl,
                               output_features=output_features)
  return (dataset.ragged_batch(batch_size)
          .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE).unbatch())


def tokenize_step(vocabulary: seqio.Vocabulary, languages: Mapping[str, Optional[str]],
                  task: str):
  """The tokenizing preprocessor of a task whose features `languages` ({feature:
  language}) use `vocabulary`. A pre-tokenizing vocabulary needs every language, and
  what it needs to segment them (checked now: ConfigError)."""
  if isinstance(vocabulary, HfVocabulary):
    return tokenize_in_batches
  if not isinstance(vocabulary, PretokenizingVocabulary):
    return seqio.preprocessors.tokenize
  missing = sorted(k for k, l in languages.items() if not l)
  if missing:
    raise ConfigError(f"task {task}: its vocabulary ({vocabulary.spec_path}) pre-tokenizes by "
                      f"language and feature(s) {missing} name no language")
  vocabulary.pretokenizer.check(list(languages.values()), f"task {task}")
  return functools.partial(tokenize_by_language, languages=dict(languages))
