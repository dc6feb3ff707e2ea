"""Registering vmx's SeqIO tasks and mixtures (the top-level `tasks` package calls these).

A pair task yields, per example:
  inputs [L] int32, targets [L] int32   SentencePiece ids (no EOS), or an imported
                                        tokenizer's ids with its special tokens
  inputs_lang, targets_lang  int32      index of the language in `languages`
a monolingual task `inputs` [L], an N-way task `views` [V, L] (vmx/data/nway.py).
Tokens come before a `seqio.CacheDatasetPlaceholder` (what follows it, language ids and
truncation, depends on the run), so SeqIO's offline cache (vmx/data/seqio_cache.py) and
`DatasetConfig.use_cached=True` work on pair and monolingual tasks. Mixtures sample their
tasks with p ∝ n^alpha. Registering the same name again replaces it (a gin run may).
"""
from __future__ import annotations

import functools
import hashlib
from typing import Optional, Sequence

import seqio
import tensorflow as tf

from vmx.data import devsets
from vmx.data.nway import (NwayHardNegativeSource, nway_source, pad_views, sample_views,
                           sample_views_and_hard_negative)
from vmx.data.preprocessors import (add_language_ids, add_teacher_embeddings,
                                    tokenize_step, truncate_keeping_last)
from vmx.data.seqio_vocab import HfVocabulary, seqio_vocabulary
from vmx.data.sources import VALIDATION_PERCENT
from vmx.data.task_settings import DEFAULT_SHUFFLE_BUFFER
from vmx.errors import DataError



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
                       shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                       teacher: Optional[str] = None) -> str:
  """Registers (or re-registers) a tokenized pair task; returns its name. `teacher`: a
  teacher-embedding cache (vmx.data.teacher); the task then also yields `teacher` [D]."""
  vocab = seqio_vocabulary(vocab_path)
  features = {k: seqio.Feature(vocab, add_eos=False, dtype=tf.int32)
              for k in ("inputs", "targets")}
  # The language ids are output features too, so that every consumer of the task or of a
  # mixture of such tasks keeps them (seqio.get_dataset, t5x's trainer, seqio caching):
  # mixtures keep output features only.
  lang_vocab = seqio.PassThroughVocabulary(size=len(languages))
  features.update({k: seqio.Feature(lang_vocab, add_eos=False, dtype=tf.int32, rank=0)
                   for k in ("inputs_lang", "targets_lang")})
  # Tokens are cacheable; language ids (they index the run's LANGUAGES) come after.
  preprocessors = [
      tokenize_step(vocab, {"inputs": src_lang, "targets": tgt_lang}, name),
      seqio.CacheDatasetPlaceholder(),
      functools.partial(add_language_ids,
                        src_lang_id=language_id(src_lang, languages, f"task {name}: "),
                        tgt_lang_id=language_id(tgt_lang, languages, f"task {name}: ")),
  ]
  if isinstance(vocab, HfVocabulary) and vocab.tokenizer.closing_special:
    preprocessors.append(truncate_keeping_last)
  if teacher:
    preprocessors.append(functools.partial(add_teacher_embeddings, cache=teacher, task=name))
    features["teacher"] = seqio.Feature(seqio.PassThroughVocabulary(size=1), add_eos=False,
                                        dtype=tf.float32, rank=1)
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(name, source=source, preprocessors=preprocessors,
                         output_features=features, shuffle_buffer_size=shuffle_buffer_size)
  return name


def register_text_task(name: str, source: seqio.DataSource, vocab_path: str,
                       shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                       language: Optional[str] = None) -> str:
  """Registers (or re-registers) a tokenized monolingual task (`inputs`); returns its name.
  `language`: the text's, needed by a vocabulary that pre-tokenizes by language."""
  vocab = seqio_vocabulary(vocab_path)
  preprocessors = [tokenize_step(vocab, {"inputs": language}, name),
                   seqio.CacheDatasetPlaceholder()]
  if isinstance(vocab, HfVocabulary) and vocab.tokenizer.closing_special:
    preprocessors.append(functools.partial(truncate_keeping_last, features=("inputs",)))
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(name, source=source, preprocessors=preprocessors,
                         output_features={"inputs": seqio.Feature(vocab, add_eos=False,
                                                                  dtype=tf.int32)},
                         shuffle_buffer_size=shuffle_buffer_size)
  return name


def register_nway_task(name: str, languages: Sequence[str], rows, vocab_path: str,
                       num_views: int, shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                       validation_percent: int = VALIDATION_PERCENT,
                       holdout: Optional[devsets.HeldOut] = None,
                       paths: Sequence[str] = (),
                       pairs_from_groups: Optional[int] = None) -> str:
  """Registers a task of N-way groups yielding `views` [num_views, L] token ids (`paths`:
  the files the rows were read from; `pairs_from_groups`: NwaySource's)."""
  vocab = seqio_vocabulary(vocab_path)
  features = {"views": seqio.Feature(vocab, add_eos=False, dtype=tf.int32, rank=2)}
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(
      name, source=nway_source(languages, rows, num_views, validation_percent, holdout, paths,
                               pairs_from_groups),
      preprocessors=[functools.partial(sample_views, num_views=num_views),
                     # the views' languages are drawn per example: a pre-tokenizing
                     # vocabulary is refused (tokenize_step)
                     tokenize_step(vocab, {"views": None}, name), pad_views],
      output_features=features, shuffle_buffer_size=shuffle_buffer_size)
  return name


def register_nway_hard_negative_task(name: str, languages: Sequence[str], rows, negatives,
                                     vocab_path: str, num_views: int,
                                     shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                                     validation_percent: int = VALIDATION_PERCENT,
                                     holdout: Optional[devsets.HeldOut] = None,
                                     paths: Sequence[str] = ()) -> str:
  """Registers a task of N-way groups with hard negatives (NwayHardNegativeSource)
  yielding `views` [num_views + 1, L] token ids, the hard negative last."""
  vocab = seqio_vocabulary(vocab_path)
  features = {"views": seqio.Feature(vocab, add_eos=False, dtype=tf.int32, rank=2)}
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(
      name, source=NwayHardNegativeSource(languages, rows, negatives, num_views,
                                          validation_percent, holdout, paths),
      preprocessors=[functools.partial(sample_views_and_hard_negative, num_views=num_views),
                     # the views' languages are drawn per example: a pre-tokenizing
                     # vocabulary is refused (tokenize_step)
                     tokenize_step(vocab, {"views": None}, name), pad_views],
      output_features=features, shuffle_buffer_size=shuffle_buffer_size)
  return name


def temperature_rates(sizes: Sequence[int], alpha: float) -> list[float]:
  """Sampling probabilities p_i ∝ n_i^alpha (alpha=1: proportional, 0: uniform)."""
  w = [float(n) ** alpha for n in sizes]
  total = sum(w)
  return [x / total for x in w]


def register_mixture(name: str, task_names: Sequence[str], alpha: float,
                     lazy: bool = False) -> str:
  """Registers tasks mixed with p ∝ n^alpha (n: a task's `train` examples). `lazy`: the
  rates are computed (and the tasks' files validated) on first use, not now."""
  _unregister(seqio.MixtureRegistry, name)
  if lazy:
    rates = [functools.partial(_temperature_rate, alpha=alpha)] * len(task_names)
  else:
    rates = temperature_rates(
        [seqio.get_mixture_or_task(t).num_input_examples("train") for t in task_names], alpha)
  # One pass (num_epochs=1, e.g. over `validation`) reads every task to its end; seqio's
  # default would stop at the first exhausted task. Endless training streams never end.
  seqio.MixtureRegistry.add(name, list(zip(task_names, rates)), sample_fn=functools.partial(
      tf.data.Dataset.sample_from_datasets, stop_on_empty_dataset=False))
  return name


def _temperature_rate(task: seqio.Task, alpha: float) -> float:
  """A lazy mixing rate n^alpha; seqio normalizes the rates of a mixture."""
  return float(task.num_input_examples("train")) ** alpha
