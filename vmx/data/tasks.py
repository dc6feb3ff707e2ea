"""SeqIO building blocks for parallel-text tasks: sources, preprocessors, registration.

A pair task yields, per example:
  inputs [L] int32, targets [L] int32   SentencePiece ids (no EOS), or an imported
                                        tokenizer's ids with its special tokens
  inputs_lang, targets_lang  int32      index of the language in `languages`
Concrete corpora (which files, which languages) are registered in the top-level
`tasks` package; this module holds the machinery they share.

Splits: every text source has a `train` and a `validation` split. An example is in
`validation` when the FarmHash fingerprint of its text falls in the first
`validation_percent` (default 1) of 100 buckets: the split is by content, so it does not
depend on file order, and a repeated pair is on one side only. `validation_percent=0`
gives a `train` split of every example and no `validation` split. Sources given
`holdout` (a `devsets.HeldOut`) skip every example with a sentence of those dev sets.

Caching: pair and monolingual tasks tokenize before a `seqio.CacheDatasetPlaceholder`
(what follows it, language ids and truncation, depends on the run), so seqio's offline
cache (`launch/cache_tasks.py`, or seqio's Beam `cache_tasks_main`) and
`DatasetConfig.use_cached=True` work on them. N-way tasks sample their views at random
before tokenizing and are not cacheable.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from vmx import storage
from vmx.data import devsets, readers, teacher
from vmx.data.teacher import text_fingerprint  # noqa: F401  (also vmx.data.tasks.text_fingerprint)
from vmx.data.pretokenized import PretokenizingVocabulary, tokenize_step
from vmx.data.vocab import SENTENCEPIECE_KIND, TOKENIZER_SPEC, HfTokenizer, spec_kind
from vmx.errors import DataError

DEFAULT_SHUFFLE_BUFFER = 20_000


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


VALIDATION_PERCENT = 1


def in_validation(text: tf.Tensor, validation_percent: int) -> tf.Tensor:
  """Whether the example whose text is `text` belongs to the `validation` split: its
  FarmHash fingerprint falls in the first `validation_percent` of 100 buckets."""
  return tf.strings.to_hash_bucket_fast(text, 100) < validation_percent


class SplitSource(seqio.FunctionDataSource):
  """The examples of `make_dataset()` (finite, text features) split by content into
  `train` and `validation` (`key(example)` is the text hashed, see `in_validation`).

  Nothing is read when the source is made: `check()` (the readers' validation, which
  raises DataError naming the file and line) runs and the split sizes are counted on
  first use, so registering many tasks (`import tasks`) is instant; `counts()` forces it.
  """

  def __init__(self, make_dataset, key, check, validation_percent: int = VALIDATION_PERCENT,
               description: str = "source", paths: Sequence[str] = (), kind: str = "",
               holdout: Optional[devsets.HeldOut] = None, pivots_in: Optional[str] = None):
    if (isinstance(validation_percent, bool) or not isinstance(validation_percent, int)
        or not 0 <= validation_percent < 100):
      raise DataError(f"{description}: validation_percent={validation_percent!r}; expected an "
                      f"integer in [0, 100) (the share of examples held out as `validation`)")
    self._check = check
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
        self._counts = readers.cached(f"splits:{self.validation_percent}:{self._kind}",
                                      self._paths, self._count)
      else:
        self._counts = self._count()
    return self._counts

  def _count(self) -> dict:
    if not self.validation_percent:
      return {"train": int(self._make().reduce(np.int64(0), lambda n, _: n + 1))}
    total, held = self._make().map(
        lambda ex: tf.cast(in_validation(self._key(ex), self.validation_percent), tf.int64)
    ).reduce((np.int64(0), np.int64(0)), lambda acc, v: (acc[0] + 1, acc[1] + v))
    return {"train": int(total - held), "validation": int(held)}

  def num_input_examples(self, split: str) -> int:
    return self.counts()[split]

  def fingerprint(self) -> str:
    """What the examples are made of: the reader, filters and held-out dev sets, the
    validation share, and the files' sizes and content hashes (vmx/data/arrays.py)."""
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
                 pivots_in: Optional[str] = None) -> SplitSource:
  """Aligned line files; validated (line counts, empty lines, UTF-8) on first use.
  `holdout`: dev sets whose sentences the source skips. `pivots_in`: a teacher cache;
  the source keeps the pairs whose target sentence it embeds."""
  def make():
    ds = tf.data.Dataset.zip({"inputs": _text_lines(src_path), "targets": _text_lines(tgt_path)})
    return ds.filter(_drop_empty) if empty_lines == "skip" else ds

  return SplitSource(make, _pair_key,
                     lambda: readers.validate_parallel(src_path, tgt_path, empty_lines),
                     validation_percent, f"{src_path} + {tgt_path}", [src_path, tgt_path],
                     f"moses:{empty_lines}", holdout, pivots_in)


def tsv_source(path: str, columns: Sequence[int] = (0, 1), empty_lines: str = "error",
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None) -> SplitSource:
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
                     holdout)


def text_source(paths: Sequence[str], line_parity: int | None = None,
                validation_percent: int = VALIDATION_PERCENT,
                holdout: Optional[devsets.HeldOut] = None) -> SplitSource:
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
                     f"text:{line_parity}", holdout)


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


class HfVocabulary(seqio.Vocabulary):
  """An imported checkpoint's own tokenizer (vmx.data.vocab.HfTokenizer) as a seqio
  vocabulary: vmx ids, special tokens included, tokenized in tf.data via numpy."""

  def __init__(self, spec_path: str):
    self.tokenizer = HfTokenizer(spec_path)
    self.spec_path = str(spec_path)
    # what the vocabulary is, kept with it: the file may move once it is loaded
    self.spec_bytes = storage.path(spec_path).read_bytes()
    super().__init__(extra_ids=0)

  @property
  def eos_id(self):
    return None   # the tokenizer adds its own closing token

  @property
  def unk_id(self):
    return None

  @property
  def _base_vocab_size(self):
    return self.tokenizer.vocab_size

  def _encode(self, s):
    return [int(i) for i in self.tokenizer.to_vmx_ids(self.tokenizer.hf_ids([s])[0])]

  def _decode(self, ids):
    return self.tokenizer.decode(ids)

  def _encode_tf(self, s):
    def encode(texts):
      rows = [self._encode(t.decode("utf-8")) for t in np.atleast_1d(texts)]
      return (np.array([i for r in rows for i in r], np.int32),
              np.array([len(r) for r in rows], np.int64))
    flat, lengths = tf.numpy_function(encode, [s], (tf.int32, tf.int64), stateful=False)
    flat.set_shape([None])
    if s.shape.rank == 0:
      return flat
    return tf.RaggedTensor.from_row_lengths(flat, tf.reshape(lengths, [-1]))

  def _decode_tf(self, ids):
    return tf.numpy_function(lambda x: np.array(self._decode(x), object), [ids], tf.string)

  def __eq__(self, other):
    return isinstance(other, HfVocabulary) and other.spec_path == self.spec_path


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


def seqio_vocabulary(vocab_path: str) -> seqio.Vocabulary:
  """seqio vocabulary of a SentencePiece `.model` or a `vmx_tokenizer.json` (imported, or
  vmx's own model with its pre-tokenization: vmx/data/pretokenized.py). One object per
  file version, shared by the tasks of a mixture (one tokenizer load, one Juman++
  process, not one per task)."""
  stamp = None
  if not storage.is_remote(vocab_path):
    st = os.stat(vocab_path)
    stamp = (st.st_size, st.st_mtime_ns)
  return _seqio_vocabulary(str(vocab_path), stamp)


@functools.lru_cache(maxsize=16)
def _seqio_vocabulary(vocab_path: str, stamp) -> seqio.Vocabulary:
  del stamp   # the file's size and time: a rewritten file is another vocabulary
  if Path(vocab_path).name == TOKENIZER_SPEC:
    if spec_kind(vocab_path) == SENTENCEPIECE_KIND:
      return PretokenizingVocabulary(vocab_path)
    return HfVocabulary(vocab_path)
  return seqio.SentencePieceVocabulary(str(vocab_path))


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


def nway_split(row: Sequence[str], validation_percent: int) -> str:
  """`validation` or `train` for an N-way group, by the hash of its texts."""
  digest = hashlib.sha256("\t".join(row).encode("utf-8")).digest()
  return "validation" if int.from_bytes(digest[:8], "big") % 100 < validation_percent else "train"


class NwaySource(seqio.FunctionDataSource):
  """N-way groups as string vectors `texts` [N] ("" = language missing): `train` repeats
  without end (with a running `draw` number: each pass samples new views), `validation`
  is one pass; groups with fewer than `min_views` languages, and (`holdout`) groups with
  a sentence of those dev sets, are dropped here.

  For the index-based input (vmx/data/arrays.py, index.py) the groups are cached
  tokenized, every language ([N, L] ids, `stored_examples`), and `draw_views` draws the
  views of each example when it is read, from a seed that is a function of its position
  in the stream: the rule of `sample_views` below, in numpy.
  """

  def __init__(self, languages: Sequence[str], rows: Sequence[Sequence[str]], min_views: int,
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None):
    if holdout:
      rows = [r for r in rows if holdout.keeps(r)]
    kept = [r for r in rows if sum(bool(t) for t in r) >= min_views]
    if not kept:
      raise DataError(f"no N-way group has {min_views} languages (of {list(languages)})")
    splits = {"train": [], "validation": []}
    for r in kept:
      splits[nway_split(r, validation_percent)].append([t.encode("utf-8") for t in r])
    if not validation_percent:
      del splits["validation"]
    self.languages, self.num_views = list(languages), min_views
    self._width = len(languages)   # texts a row holds (a subclass may store more per row)
    self._rows = splits
    self._fingerprint = None
    self._holdout = holdout.key if holdout else ""
    self._validation_percent = validation_percent
    super().__init__(self._dataset, splits=tuple(splits),
                     num_input_examples={k: len(v) for k, v in splits.items()})

  def _table(self, split) -> tf.Tensor:
    if split not in self._rows:
      raise DataError(f"N-way source: no split {split!r}; it has {list(self._rows)}")
    return tf.constant(np.array(self._rows[split], dtype=object).reshape(-1, self._width),
                       tf.string)

  def _dataset(self, split, shuffle_files, seed=None):
    del shuffle_files, seed  # one in-memory table: order is shuffled downstream
    ds = tf.data.Dataset.from_tensor_slices(self._table(split))
    # Training is endless, with a running draw number: each pass over the groups samples
    # new views (seqio's own repeat would replay the same per-example seeds every epoch).
    if split == "train":
      ds = ds.repeat()
    return ds.enumerate().map(lambda i, t: {"texts": t, "draw": i})

  def fingerprint(self) -> str:
    if self._fingerprint is None:
      h = hashlib.sha256(repr((self.languages, self.num_views, self._validation_percent,
                               self._holdout)).encode())
      for split in sorted(self._rows):
        for r in self._rows[split]:
          h.update(b"\x00".join(r) + b"\x01")
      self._fingerprint = h.hexdigest()
    return self._fingerprint

  def stored_examples(self, task: seqio.Task, split: str, lengths):
    """Batches of `tokens` [n, N, L] (every language tokenized, zero-padded, cut to L)
    and `present` [n, N] (the group has that language)."""
    vocab, length = task.output_features["views"].vocabulary, int(lengths["views"])

    def tokenize(texts):
      ids = vocab.encode_tf(texts)   # as seqio.preprocessors.tokenize (add_eos=False)
      return {"tokens": ids.to_tensor(0, shape=[self._width, length]),
              "present": tf.strings.length(texts) > 0}
    ds = tf.data.Dataset.from_tensor_slices(self._table(split)).map(
        tokenize, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(4096).as_numpy_iterator()

  def draw_views(self, stored: dict, seeds_B) -> dict:
    """`views` [B, V * L]: per example, V distinct languages of its group drawn uniformly
    (view 0 the anchor), from the generator seeded by its row of `seeds_B` [B, k]."""
    tokens, present = stored["tokens"], stored["present"]
    v = self.num_views
    out = np.empty((len(tokens), v * tokens.shape[-1]), tokens.dtype)
    for b, seed in enumerate(seeds_B):
      out[b] = tokens[b, _drawn_np(present[b], seed, v)].reshape(-1)
    return {"views": out}


def _drawn_np(present_N, seed, k: int) -> np.ndarray:
  """[k] indices of distinct present entries, uniformly at random from the generator
  seeded by `seed` (`sample_views`'s rule, in numpy)."""
  scores = np.random.default_rng(seed).random(len(present_N))
  scores[~present_N] = -1.0
  return np.argsort(-scores, kind="stable")[:k]


def _drawn_tf(texts_N, seed, k: int):
  """[k] indices of distinct non-empty texts, uniformly at random (stateless, `seed`)."""
  scores = tf.random.stateless_uniform(tf.shape(texts_N), seed)
  scores = tf.where(tf.strings.length(texts_N) > 0, scores, -1.0)
  return tf.math.top_k(scores, k=k)[1]


def nway_source(languages: Sequence[str], rows: Sequence[Sequence[str]], min_views: int,
                validation_percent: int = VALIDATION_PERCENT,
                holdout: Optional[devsets.HeldOut] = None) -> NwaySource:
  """The N-way source of `rows` (see NwaySource)."""
  return NwaySource(languages, rows, min_views, validation_percent, holdout)


@seqio.map_over_dataset(num_seeds=1)
def sample_views(ex, seed, num_views: int):
  """V = num_views distinct languages of the group, uniformly at random: view 0 is the
  anchor (so every language is equally likely to be the anchor), the rest positives."""
  texts = ex["texts"]
  seed = tf.random.experimental.stateless_fold_in(seed, ex["draw"])
  return {"views": tf.gather(texts, _drawn_tf(texts, seed, num_views))}


def pad_views(dataset: tf.data.Dataset, sequence_length):
  """Tokenized views (ragged [V, None]) -> dense [V, L], truncated and zero-padded."""
  length = sequence_length["views"]

  def pad(ex):
    v = ex["views"]
    return {"views": v.to_tensor(0, shape=[v.nrows(), length])}
  return dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)


def register_nway_task(name: str, languages: Sequence[str], rows, vocab_path: str,
                       num_views: int, shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                       validation_percent: int = VALIDATION_PERCENT,
                       holdout: Optional[devsets.HeldOut] = None) -> str:
  """Registers a task of N-way groups yielding `views` [num_views, L] token ids."""
  vocab = seqio_vocabulary(vocab_path)
  features = {"views": seqio.Feature(vocab, add_eos=False, dtype=tf.int32, rank=2)}
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(
      name, source=nway_source(languages, rows, num_views, validation_percent, holdout),
      preprocessors=[functools.partial(sample_views, num_views=num_views),
                     # the views' languages are drawn per example: a pre-tokenizing
                     # vocabulary is refused (tokenize_step)
                     tokenize_step(vocab, {"views": None}, name), pad_views],
      output_features=features, shuffle_buffer_size=shuffle_buffer_size)
  return name


# Hard negatives for N-way groups (MPCL's "XLM-R w/ hard negative" variant, §3.5).

HARD_NEGATIVE_STREAM = 1   # the index reader's hard-negative draw: generator (seed, g, 1)


class NwayHardNegativeSource(NwaySource):
  """N-way groups, each with a sentence that contradicts it: `rows[i]` the group's
  sentence in the N `languages` (the views, as NwaySource) and `negatives[i]` the
  contradicting sentence in the same N languages ("" = missing), e.g. an XNLI premise and
  one of its contradiction hypotheses (tasks/xnli_mt.py). Groups with fewer than
  `min_views` languages or no hard negative are dropped; `holdout` and the
  validation split look at both.

  An example is NwaySource's V views, then the hard negative in ONE language drawn
  uniformly from those it has (§3.5: "randomly selected from all languages"): in the
  tf.data stream `texts` [N], `negatives` [N] and `draw`, and after
  `sample_views_and_hard_negative` `views` [V + 1, L], the hard negative last
  (MultiViewHardNegativeFeatureConverter splits it off).

  Index reader: the cache also holds `negative_tokens` [n, N, L] and `negative_present`
  [n, N]; `draw_views` draws the views exactly as NwaySource does from the example's
  seed, and the hard negative's language from the generator of (seed, HARD_NEGATIVE_STREAM):
  a function of (seed, position), as the views.
  """
  hard_negatives = True   # vmx/data/index.py checks it against the model's converter

  def __init__(self, languages: Sequence[str], rows: Sequence[Sequence[str]],
               negatives: Sequence[Sequence[str]], min_views: int,
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None):
    if len(rows) != len(negatives):
      raise DataError(f"N-way hard negatives: {len(rows)} groups but {len(negatives)} rows of "
                      f"hard negatives")
    n = len(languages)
    if any(len(r) != n for r in rows) or any(len(g) != n for g in negatives):
      raise DataError(f"N-way hard negatives: every group and hard negative needs {n} texts "
                      f"(one per language of {list(languages)})")
    joined = [[*r, *g] for r, g in zip(rows, negatives)
              if sum(bool(t) for t in r) >= min_views and any(g)]
    if not joined:
      raise DataError(f"no N-way group has {min_views} languages (of {list(languages)}) and "
                      f"a hard negative")
    # NwaySource's table, holdout and split over the 2N columns [group; hard negative]
    # (every joined row has >= min_views texts, so its own filter keeps them all).
    super().__init__([*languages, *languages], joined, min_views, validation_percent, holdout)
    self.languages = list(languages)   # (rows keep their 2N texts: self._width)

  def _dataset(self, split, shuffle_files, seed=None):
    n = len(self.languages)
    return super()._dataset(split, shuffle_files, seed).map(
        lambda ex: {"texts": ex["texts"][:n], "negatives": ex["texts"][n:], "draw": ex["draw"]})

  def stored_examples(self, task: seqio.Task, split: str, lengths):
    """NwaySource's `tokens` [n, N, L] and `present` [n, N], and the hard negatives'
    `negative_tokens` [n, N, L] and `negative_present` [n, N]."""
    n = len(self.languages)
    for b in super().stored_examples(task, split, lengths):   # [n, 2N, L], [n, 2N]
      yield {"tokens": b["tokens"][:, :n], "present": b["present"][:, :n],
             "negative_tokens": b["tokens"][:, n:], "negative_present": b["present"][:, n:]}

  def draw_views(self, stored: dict, seeds_B) -> dict:
    """NwaySource's `views` [B, V * L] and `hard_negative` [B, L]: the hard negative in a
    language drawn uniformly from those it has."""
    out = super().draw_views(stored, seeds_B)
    tokens, present = stored["negative_tokens"], stored["negative_present"]
    neg = np.empty((len(tokens), tokens.shape[-1]), tokens.dtype)
    for b, seed in enumerate(seeds_B):
      neg[b] = tokens[b, _drawn_np(present[b], [*seed, HARD_NEGATIVE_STREAM], 1)[0]]
    return {**out, "hard_negative": neg}


@seqio.map_over_dataset(num_seeds=1)
def sample_views_and_hard_negative(ex, seed, num_views: int):
  """`sample_views`'s V views (the same rule), then the hard negative in one language
  drawn uniformly from those it has: `views` [V + 1] (the hard negative last)."""
  texts, negatives = ex["texts"], ex["negatives"]
  seed = tf.random.experimental.stateless_fold_in(seed, ex["draw"])
  neg_seed = tf.random.experimental.stateless_fold_in(seed, HARD_NEGATIVE_STREAM)
  return {"views": tf.concat([tf.gather(texts, _drawn_tf(texts, seed, num_views)),
                              tf.gather(negatives, _drawn_tf(negatives, neg_seed, 1))],
                             axis=0)}


def register_nway_hard_negative_task(name: str, languages: Sequence[str], rows, negatives,
                                     vocab_path: str, num_views: int,
                                     shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                                     validation_percent: int = VALIDATION_PERCENT,
                                     holdout: Optional[devsets.HeldOut] = None) -> str:
  """Registers a task of N-way groups with hard negatives (NwayHardNegativeSource)
  yielding `views` [num_views + 1, L] token ids, the hard negative last."""
  vocab = seqio_vocabulary(vocab_path)
  features = {"views": seqio.Feature(vocab, add_eos=False, dtype=tf.int32, rank=2)}
  _unregister(seqio.TaskRegistry, name)
  seqio.TaskRegistry.add(
      name, source=NwayHardNegativeSource(languages, rows, negatives, num_views,
                                          validation_percent, holdout),
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
