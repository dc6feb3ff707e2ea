"""Vocabularies: training, lookup and batch tokenization (no TensorFlow).

vmx's own vocabularies are SentencePiece models. Conventions (T5/mT5, so an mT5
`.model` also works): pad=0, eos=1, unk=2, no bos. Language tags such as `<2deu>`
are user-defined symbols: always one piece.

An imported Hugging Face checkpoint keeps its own tokenizer (`HfTokenizer`,
vmx/data/hf_tokenizer.py, described by `vmx_tokenizer.json` next to its files).
`load_tokenizer(path)` opens either kind.

A vmx vocabulary may normalize text as EMS §4.2 does (vmx/data/normalize.py):
lowercasing is SentencePiece's `nmt_nfkc_cf` rule inside the `.model`
(`lowercase=True`); pre-tokenization by language (Moses, jieba, Juman++) is recorded in
a `vmx_tokenizer.json` of kind `sentencepiece` next to the `.model` (its sha256 and the
`Pretokenizer` settings), and `Tokenizer` applies it in `encode(texts, L, lang=...)`.
Such a vocabulary is a directory (`vocab.model` + `vmx_tokenizer.json`) and travels into
MODEL_DIR with both files, so training, the caches and inference see the same text.
"""
from __future__ import annotations

import hashlib
import json
import os
import io
import random
import warnings
from pathlib import Path
from typing import Iterable, Optional, Sequence

import gin
import numpy as np
import sentencepiece as spm

from vmx import signals, storage
# the imported tokenizer and what both kinds share (also reachable as vmx.data.vocab.X)
from vmx.data.hf_tokenizer import (TOKENIZER_SPEC, HfTokenizer, join_pairs, read_spec,
                                   sentencepiece_spans, word_spans)
from vmx.data.normalize import JAPANESE_MODES, Pretokenizer, file_language
from vmx.data.readers import iter_lines, stamp
from vmx.data.token_rows import RaggedIds, in_chunks, ragged_rows
from vmx.errors import CheckpointError, ConfigError, DataError
from vmx.gin_utils import binding_source, check_range
from vmx.storage import cache_dir

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
SENTENCEPIECE_KIND = "sentencepiece"   # a spec of vmx's own model (+ its pre-tokenization)
SPM_FILE = "vocab.model"
LOWERCASE_RULE = "nmt_nfkc_cf"   # SentencePiece's NFKC + case folding (default: nmt_nfkc)


def language_tag(lang: str) -> str:
  return f"<2{lang}>"


def train_sentencepiece(input_files: Sequence[str], model_path: str, vocab_size: int,
                        languages: Sequence[str] = (), model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        max_sentences_per_file: int = 200_000, seed: int = 0,
                        lowercase: bool = False, pretokenizer: Optional[Pretokenizer] = None,
                        file_languages: Optional[Sequence[Optional[str]]] = None) -> str:
  """Trains a SentencePiece model on (a seeded sample of) `input_files` (.gz ok).

  `lowercase`: the model case-folds (`nmt_nfkc_cf`) whatever it encodes. `pretokenizer`:
  the sampled lines of each file are pre-tokenized in that file's language
  (`file_languages`, default: from the names, `normalize.file_language`) before training;
  the model alone does not record it (see `train_vocabulary`)."""
  if pretokenizer is None:
    file_languages = [None] * len(input_files)      # (read only to pre-tokenize)
  elif file_languages is None:
    file_languages = [file_language(p) for p in input_files]
  if len(file_languages) != len(input_files):
    raise ConfigError(f"{len(file_languages)} file languages for {len(input_files)} files")
  rng = random.Random(seed)
  sentences = []
  for path, lang in zip(input_files, file_languages):
    lines = [l for _, l in iter_lines(path) if l.strip()]
    if len(lines) > max_sentences_per_file:
      lines = rng.sample(lines, max_sentences_per_file)
    if pretokenizer is not None:
      lines = [l for l in pretokenizer(lines, lang) if l.strip()]
    sentences.extend(lines)
  if not sentences:
    raise DataError(f"no text to train a vocabulary on in {list(input_files)}")
  rng.shuffle(sentences)
  model_path = Path(model_path)
  model_path.parent.mkdir(parents=True, exist_ok=True)
  proto = io.BytesIO()   # (SentencePiece's own file writing ignores a full disk)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=proto, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        normalization_rule_name=LOWERCASE_RULE if lowercase else "nmt_nfkc",
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        user_defined_symbols=[language_tag(l) for l in languages],
        input_sentence_size=len(sentences), shuffle_input_sentence=False,
        hard_vocab_limit=False, minloglevel=2, num_threads=os.cpu_count() or 1)
  except (RuntimeError, OSError, ValueError) as e:
    why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
    raise ConfigError(f"building a {vocab_size}-piece SentencePiece vocabulary from "
                      f"{len(sentences)} sentences failed "
                      f"({binding_source('vocabulary_path', 'vocab_size')}): {why}") from None
  try:
    storage.write_atomic(model_path, proto.getvalue())   # never a half-written model
  except OSError as e:
    if storage.disk_full(model_path.parent, e):
      raise _no_space(model_path, e) from None
    raise
  return str(model_path)


def _no_space(model_path, e) -> DataError:
  return DataError(f"{model_path}: no space left on the device while building the "
                   f"vocabulary ({str(e).strip().splitlines()[-1][:120] if str(e).strip() else e}"
                   f"); nothing was written: free space and run again")


def train_vocabulary(input_files: Sequence[str], output: str, vocab_size: int,
                     languages: Sequence[str] = (), lowercase: bool = False,
                     pretokenizer: Optional[Pretokenizer] = None,
                     file_languages: Optional[Sequence[Optional[str]]] = None,
                     max_sentences_per_file: int = 200_000) -> str:
  """A vmx vocabulary at `output`; returns what to pass as VOCAB_PATH / `load_tokenizer`.

  Without `pretokenizer`: the SentencePiece `.model` `output`. With it: the directory
  `output` holding `vocab.model` and `vmx_tokenizer.json` (kind `sentencepiece`: the
  model's sha256 and the pre-tokenization settings, written last); returns the spec."""
  if pretokenizer is None:
    return train_sentencepiece(input_files, output, vocab_size, languages,
                               max_sentences_per_file=max_sentences_per_file,
                               lowercase=lowercase, file_languages=file_languages)
  out = Path(output)
  if out.suffix == ".model" or (out.exists() and not out.is_dir()):
    raise ConfigError(f"{output}: a pre-tokenizing vocabulary is a directory (vocab.model + "
                      f"{TOKENIZER_SPEC}); name a directory")
  if file_languages is None:
    file_languages = [file_language(p) for p in input_files]
  unnamed = [p for p, l in zip(input_files, file_languages) if l is None]
  if unnamed:
    print(f"[vmx] {len(unnamed)} vocabulary file(s) name no language (e.g. {unnamed[0]}): "
          f"pre-tokenized with Moses's generic rules", flush=True)
  pretokenizer.check([*languages, *(l for l in file_languages if l)], "the vocabulary's text")
  model = train_sentencepiece(input_files, str(out / SPM_FILE), vocab_size, languages,
                              max_sentences_per_file=max_sentences_per_file,
                              lowercase=lowercase, pretokenizer=pretokenizer,
                              file_languages=file_languages)
  return write_sentencepiece_spec(model, pretokenizer)


def write_sentencepiece_spec(model_path: str, pretokenizer: Pretokenizer) -> str:
  """`vmx_tokenizer.json` (kind `sentencepiece`) beside a SentencePiece model: the model's
  file name and sha256, and the pre-tokenization it is used with."""
  model = storage.path(model_path)
  spec = {"kind": SENTENCEPIECE_KIND, "file": model.name,
          "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), **pretokenizer.settings}
  dest = model.parent / TOKENIZER_SPEC
  storage.write_atomic(dest, json.dumps(spec, indent=1))
  return str(dest)


def _existing_vocabulary(path: Optional[str]) -> Optional[str]:
  """The vocabulary file VOCAB_PATH names when it exists (a model directory: its spec or
  vocab.model), None when it is to be built."""
  if path and storage.path(path).is_dir():
    for name in (TOKENIZER_SPEC, SPM_FILE):
      if (storage.path(path) / name).is_file():
        return str(storage.path(path) / name)
    raise ConfigError(f"VOCAB_PATH={str(path)!r} is a directory without {TOKENIZER_SPEC} or "
                      f"{SPM_FILE}")
  if path and storage.path(path).exists():
    return str(path)
  return None


def check_normalization(vocabulary: str, lowercase: bool,
                        pretokenizer: Optional[Pretokenizer]):
  """An existing vocabulary brings its own normalization; what the run asks for must be
  part of it (ConfigError naming the binding otherwise). Returns its tokenizer."""
  tok = load_tokenizer(vocabulary)
  has = getattr(tok, "pretokenizer", None)
  if lowercase and not getattr(tok, "lowercases", False):
    raise ConfigError(f"{binding_source('vocabulary_path', 'lowercase')} = True, but the "
                      f"vocabulary {vocabulary} does not lowercase (not built with it): build "
                      f"one (VOCAB_PATH = None or a new path) or drop the setting")
  if pretokenizer is not None and has != pretokenizer:
    raise ConfigError(f"{binding_source('vocabulary_path', 'pretokenize')} = "
                      f"{pretokenizer.settings}, but the vocabulary {vocabulary} records "
                      f"{has.settings if has else 'no pre-tokenization'}: build one "
                      f"(VOCAB_PATH = None or a new path) or drop the setting")
  return tok


@gin.configurable
def vocabulary_path(path: Optional[str] = None, train_files: Sequence[str] = (),
                    vocab_size: int = 32000, languages: Sequence[str] = (),
                    max_sentences_per_file: int = 200_000, lowercase: bool = False,
                    pretokenize: Optional[str] = None, japanese: str = "jumanpp") -> str:
  """An existing vocabulary, or a SentencePiece model built from `train_files` and cached.

  `max_sentences_per_file`: a seeded sample of at most that many lines from each file
  (lower: the languages of small files weigh more against the large ones).

  Normalization (EMS §4.2, vmx/data/normalize.py), part of the vocabulary built:
  `lowercase` (the model case-folds), `pretokenize` ('moses': Moses, jieba for Chinese,
  Juman++ for Japanese, in each file's language; None: none) and `japanese` ('jumanpp',
  or 'none': Japanese left to SentencePiece). A pre-tokenizing vocabulary is a directory
  (`vocab.model` + `vmx_tokenizer.json`). Languages of `languages` that cannot be
  pre-tokenized here (Juman++ not on PATH, a package missing) are a ConfigError now.

  `path` a vmx model directory (e.g. launch/import_checkpoint.py's output): its
  vocabulary (`vmx_tokenizer.json` or `vocab.model`). `path` a file that exists: used
  as is (e.g. mT5's `.model`). An existing vocabulary keeps its own normalization; one
  asked for here must be part of it. `path` set and absent: built there. `path` unset:
  built under the cache, keyed by what it is built from: the files' contents (sizes and
  content hashes), the size, the languages and the normalization.
  """
  check_range(isinstance(lowercase, bool), "vocabulary_path", "lowercase", lowercase,
              "True or False")
  check_range(japanese in JAPANESE_MODES, "vocabulary_path", "japanese", japanese,
              f"one of {JAPANESE_MODES}")
  pretok = None
  if pretokenize is not None:
    pretok = Pretokenizer(pretokenize, japanese, "vocabulary_path")
  existing = _existing_vocabulary(path)
  if existing:
    # (an existing vocabulary is opened only where there is normalization to check)
    if lowercase or pretok or spec_kind(existing) == SENTENCEPIECE_KIND:
      has = getattr(check_normalization(existing, lowercase, pretok), "pretokenizer", None)
      if has is not None:
        has.check(languages, f"the languages of vocabulary {existing}")
    return existing
  if path and not pretok and (not str(path).endswith(".model") or storage.is_remote(path)):
    raise ConfigError(f"VOCAB_PATH={str(path)!r} does not exist (an imported model directory, "
                      f"or a SentencePiece .model to use, or a local one to build)")
  if path and pretok and (str(path).endswith(".model") or storage.is_remote(path)):
    raise ConfigError(f"VOCAB_PATH={str(path)!r}: a pre-tokenizing vocabulary "
                      f"({binding_source('vocabulary_path', 'pretokenize')}) is built as a "
                      f"local directory (vocab.model + {TOKENIZER_SPEC}); name a directory")
  if not train_files:
    raise DataError(f"vocabulary {path!r} does not exist and no train_files to build it from")
  if pretok is not None:
    pretok.check(languages, "LANGUAGES")
  if not path:
    cap = [] if max_sentences_per_file == 200_000 else [f"cap={max_sentences_per_file}"]
    norm = (["lowercase"] if lowercase else []) + (
        [json.dumps(pretok.settings, sort_keys=True)] if pretok else [])
    # keyed on what the files hold (sizes and content hashes), not their names alone: an
    # edited corpus builds a new vocabulary
    key = hashlib.sha256("|".join([stamp(train_files), str(vocab_size), *languages, *cap,
                                   *norm]).encode()).hexdigest()[:16]
    path = cache_dir().parent / "vocab" / f"spm_{vocab_size}_{key}{'' if pretok else '.model'}"
    done = path / TOKENIZER_SPEC if pretok else path
    if done.exists():
      return str(done)
  print(f"[vmx] building SentencePiece vocabulary ({vocab_size} pieces"
        f"{', lowercased' if lowercase else ''}"
        f"{', pre-tokenized: ' + pretok.method if pretok else ''}) -> {path}", flush=True)
  with signals.activity("building the vocabulary"):
    return train_vocabulary(list(train_files), str(path), vocab_size, languages, lowercase,
                            pretok, max_sentences_per_file=max_sentences_per_file)


class Tokenizer:
  """Batch tokenization into fixed-shape, zero-padded int32 arrays.

  `pretokenizer` (a vocabulary whose `vmx_tokenizer.json` records one, see
  `load_tokenizer`): texts are pre-tokenized in their language before SentencePiece;
  `encode(texts, L, lang=...)` takes one language code, one per text, or None (Moses's
  generic rules, with a warning: Chinese and Japanese are then not segmented as in
  training)."""

  def __init__(self, model_path: str, pretokenizer: Optional[Pretokenizer] = None,
               model_bytes: Optional[bytes] = None):
    if model_bytes is None:
      if not storage.path(model_path).exists():
        raise DataError(f"{model_path}: no such SentencePiece model")
      model_bytes = storage.path(model_path).read_bytes()
    self.model_path = str(model_path)
    self.sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    self.pretokenizer = pretokenizer

  @classmethod
  def from_spec(cls, spec_path: str, spec: dict) -> "Tokenizer":
    """vmx's own SentencePiece model described by a `vmx_tokenizer.json` (kind
    `sentencepiece`); the model must be the one the spec names (its sha256)."""
    file = storage.path(spec_path).parent / str(spec.get("file", ""))
    if not spec.get("file") or not file.is_file():
      raise CheckpointError(f"{file}: missing (named by {spec_path})")
    data = file.read_bytes()
    if spec.get("sha256") and hashlib.sha256(data).hexdigest() != spec["sha256"]:
      raise CheckpointError(f"{file} is not the SentencePiece model {spec_path} describes "
                            f"(sha256 differs): the two files must be copied together")
    pretok = None
    if spec.get("pretokenize") is not None:
      try:
        pretok = Pretokenizer.from_settings(spec, f"{spec_path}", recorded=True)
      except ConfigError as e:
        raise CheckpointError(f"{spec_path}: {e}") from None
    return cls(str(spec_path), pretok, model_bytes=data)

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  @property
  def lowercases(self) -> bool:
    """Whether the model case-folds what it encodes (built with `lowercase=True`)."""
    return self.sp.normalize("ABC") == self.sp.normalize("abc")

  def unknown_only(self, ragged: RaggedIds) -> np.ndarray:
    """[N] bool: rows with tokens, all of them the unknown piece (two such sentences get
    the same vector)."""
    # The word-boundary piece '▁' alone carries nothing either ("😀" -> ['▁', <unk>]).
    unk = self.sp.unk_id()
    row = ragged.row_of_each_id()
    n = len(ragged.lengths)
    has_unk = np.bincount(row[ragged.ids == unk], minlength=n) > 0
    carries = ~np.isin(ragged.ids, [0, unk, self.sp.piece_to_id("\u2581")])
    return has_unk & (np.bincount(row[carries], minlength=n) == 0)

  def unigram_scores(self, ids: np.ndarray) -> np.ndarray:
    """[len(ids)] float64: each piece's score in the SentencePiece model, its unigram
    log-probability (0 for the special pieces, which are not in the distribution)."""
    return np.asarray([self.sp.get_score(int(i)) for i in ids], np.float64)

  def piece_id(self, piece: str) -> int:
    i = self.sp.piece_to_id(piece)
    if i == self.sp.unk_id() and piece != self.sp.id_to_piece(self.sp.unk_id()):
      raise KeyError(f"{piece!r} is not in vocabulary {self.model_path}")
    return i

  def pretokenize(self, texts: Iterable[str], lang=None) -> list[str]:
    """What SentencePiece is given: the texts pre-tokenized (unchanged without a
    pre-tokenizer)."""
    texts = list(texts)
    if self.pretokenizer is None:
      return texts
    if lang is None:
      warnings.warn(f"the vocabulary {self.model_path} pre-tokenizes by language "
                    f"(Moses; jieba for Chinese; Juman++ for Japanese) and no lang= was "
                    f"given: Moses's generic rules were used", stacklevel=3)
    return self.pretokenizer(texts, lang)

  def encode(self, texts: Iterable[str], max_length: int, lang=None) -> np.ndarray:
    """[n, max_length] ids, zero-padded; longer texts keep their first max_length ids."""
    return self.encode_counting(texts, max_length, lang)[0]

  def encode_pairs(self, a: Iterable[str], b: Iterable[str], max_length: int,
                   lang=None) -> np.ndarray:
    """[N, max_length] ids of each pair joined as vmx's models read two segments:
    `a </s> b` (the end-of-sentence id between them), zero-padded (`join_pairs`)."""
    return join_pairs(self.sp.encode(self.pretokenize(a, lang)),
                      self.sp.encode(self.pretokenize(b, lang)), [], [self.sp.eos_id()], [],
                      max_length)

  def pair_template(self) -> tuple[list[int], list[int], list[int]]:
    """(opening, middle, closing) ids around a pair's two segments (`encode_pairs`)."""
    return [], [self.sp.eos_id()], []

  def encode_spans(self, text: str, lang=None) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids of `text`, each id's [start, end) in characters of `text`): where an answer
    span lies (extractive QA, vmx/finetune/qa.py). A vocabulary with a language
    pre-tokenizer, which rewrites the text, is tokenized a word at a time, each id spanning
    its word."""
    if self.pretokenizer is None:
      return sentencepiece_spans(self.sp, text)
    return word_spans(text, lambda words: self.sp.encode(self.pretokenize(words, lang)))

  def encode_counting(self, texts: Iterable[str], max_length: int,
                      lang=None) -> tuple[np.ndarray, int]:
    """(ids as in `encode`, how many texts were truncated)."""
    ragged = self.encode_ragged(texts, max_length, lang)
    return ragged.padded(max_length), ragged.truncated

  def encode_ragged(self, texts: Iterable[str], max_length: int,
                    lang=None) -> RaggedIds:
    """Each text's first max_length ids, end to end with no padding (`in_chunks`)."""
    return in_chunks(list(texts), lambda chunk: ragged_rows(
        self.sp.encode(self.pretokenize(chunk, lang)), max_length))


def copy_vocabulary(src: str, model_dir: str) -> str:
  """Copies the .model next to the checkpoints (checkpoints stay self-contained)."""
  dest = storage.path(model_dir) / "vocab.model"
  if not dest.exists():
    dest.parent.mkdir(parents=True, exist_ok=True)
    storage.copy_file(src, dest)
  return str(dest)


# ----------------------------------------------------------------------------
# Tokenizer specs: imported tokenizers (Hugging Face checkpoints), and vmx's own
# SentencePiece models with a pre-tokenization (kind `sentencepiece`).

def spec_kind(path: str) -> Optional[str]:
  """The `kind` of a `vmx_tokenizer.json`; None for a SentencePiece `.model`."""
  if storage.path(path).name != TOKENIZER_SPEC:
    return None
  return read_spec(path).get("kind")


def load_tokenizer(path: str):
  """`Tokenizer` for a SentencePiece `.model` or a `vmx_tokenizer.json` of kind
  `sentencepiece` (vmx's own, with its pre-tokenization), `HfTokenizer` for an imported
  checkpoint's `vmx_tokenizer.json`."""
  if storage.path(path).name == TOKENIZER_SPEC:
    spec = read_spec(path)
    if spec.get("kind") == SENTENCEPIECE_KIND:
      return Tokenizer.from_spec(path, spec)
    return HfTokenizer(path)
  return Tokenizer(path)


def copy_tokenizer(src_spec: str, model_dir: str) -> str:
  """Copies a tokenizer spec and its file (an imported tokenizer, or vmx's own model with
  its pre-tokenization) into model_dir; returns the spec's name relative to model_dir."""
  src = storage.path(src_spec)
  spec = json.loads(src.read_text())
  dest = storage.path(model_dir) / src.name
  if src != dest:
    dest.parent.mkdir(parents=True, exist_ok=True)
    for name in (spec["file"], src.name):
      storage.copy_file(src.parent / name, storage.path(model_dir) / name)
  return src.name


def vocabulary_bytes(vocabulary: str) -> bytes:
  """What a vocabulary is, as bytes: a SentencePiece model's, or a tokenizer spec's and
  its file's (what two vocabularies must share to give the same ids)."""
  src = storage.path(vocabulary)
  if src.name != TOKENIZER_SPEC:
    return src.read_bytes()
  spec = read_spec(vocabulary)
  return src.read_bytes() + b"\0" + (src.parent / str(spec.get("file", ""))).read_bytes()


def differs_from_stored(vocabulary: str, model_dir, stored_name: str) -> bool:
  """Whether `vocabulary` is not the one a run keeps in `model_dir` as `stored_name`
  (False when the run keeps none)."""
  stored = storage.path(model_dir) / stored_name
  if not stored.exists():
    return False
  try:
    return vocabulary_bytes(vocabulary) != vocabulary_bytes(str(stored))
  except (OSError, CheckpointError):
    return False


def copy_any_vocabulary(vocabulary: str, model_dir: str) -> str:
  """Copies a SentencePiece model or a tokenizer spec (+ its file) next to the checkpoints;
  returns its file name in model_dir (what vmx_model.json records)."""
  if storage.path(vocabulary).name == TOKENIZER_SPEC:
    return copy_tokenizer(vocabulary, model_dir)
  return storage.path(copy_vocabulary(vocabulary, model_dir)).name
