"""Vocabularies: training, lookup and batch tokenization (no TensorFlow).

vmx's own vocabularies are SentencePiece models. Conventions (T5/mT5, so an mT5
`.model` also works): pad=0, eos=1, unk=2, no bos. Language tags such as `<2deu>`
are user-defined symbols: always one piece.

An imported Hugging Face checkpoint keeps its own tokenizer (`HfTokenizer`, described
by `vmx_tokenizer.json` next to its files): the fast tokenizer's `tokenizer.json`
(`tokenizers` package), BERT's WordPiece `vocab.txt`, mT5's `spiece.model`, or
XLM-R's `sentencepiece.bpe.model` with fairseq's id offset, all giving the ids Hugging
Face's tokenizer gives, special tokens included. vmx reserves id 0 for padding, so a
vocabulary whose padding id is another (XLM-R: 1) has that id and 0 swapped in
vmx's id space (`to_vmx_ids`; the imported embedding rows are swapped to match).
`load_tokenizer(path)` opens either kind.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

import gin
import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import BertWordPieceTokenizer

from vmx import storage
from vmx.data.readers import iter_lines
from vmx.errors import CheckpointError, ConfigError, DataError
from vmx.gin_utils import binding_source
from vmx.storage import cache_dir

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def language_tag(lang: str) -> str:
  return f"<2{lang}>"


def train_sentencepiece(input_files: Sequence[str], model_path: str, vocab_size: int,
                        languages: Sequence[str] = (), model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        max_sentences_per_file: int = 200_000, seed: int = 0) -> str:
  """Trains a SentencePiece model on (a seeded sample of) `input_files` (.gz ok)."""

  rng = random.Random(seed)
  sentences = []
  for path in input_files:
    lines = [l for _, l in iter_lines(path) if l.strip()]
    if len(lines) > max_sentences_per_file:
      lines = rng.sample(lines, max_sentences_per_file)
    sentences.extend(lines)
  if not sentences:
    raise DataError(f"no text to train a vocabulary on in {list(input_files)}")
  rng.shuffle(sentences)
  model_path = Path(model_path)
  model_path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=model_path.parent) as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=vocab_size,
          model_type=model_type, character_coverage=character_coverage,
          pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
          user_defined_symbols=[language_tag(l) for l in languages],
          input_sentence_size=len(sentences), shuffle_input_sentence=False,
          hard_vocab_limit=False, minloglevel=2, num_threads=os.cpu_count() or 1)
    except (RuntimeError, OSError, ValueError) as e:
      why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
      raise ConfigError(f"building a {vocab_size}-piece SentencePiece vocabulary from "
                        f"{len(sentences)} sentences failed "
                        f"({binding_source('vocabulary_path', 'vocab_size')}): {why}") from None
    os.replace(prefix + ".model", model_path)  # atomic: never a half-written model
  return str(model_path)


@gin.configurable
def vocabulary_path(path: Optional[str] = None, train_files: Sequence[str] = (),
                    vocab_size: int = 32000, languages: Sequence[str] = (),
                    max_sentences_per_file: int = 200_000) -> str:
  """An existing vocabulary, or a SentencePiece model built from `train_files` and cached.

  `max_sentences_per_file`: a seeded sample of at most that many lines from each file
  (lower: the languages of small files weigh more against the large ones).

  `path` a vmx model directory (e.g. launch/import_checkpoint.py's output): its
  vocabulary (`vmx_tokenizer.json` or `vocab.model`). `path` a file that exists: used
  as is (e.g. mT5's `.model`). `path` set and absent: built there. `path` unset: built
  under the cache, keyed by inputs, size and languages.
  """
  if path and storage.path(path).is_dir():
    for name in (TOKENIZER_SPEC, "vocab.model"):
      if (storage.path(path) / name).is_file():
        return str(storage.path(path) / name)
    raise ConfigError(f"VOCAB_PATH={str(path)!r} is a directory without {TOKENIZER_SPEC} or "
                      f"vocab.model")
  if path and storage.path(path).exists():
    return str(path)
  if path and (not str(path).endswith(".model") or storage.is_remote(path)):
    raise ConfigError(f"VOCAB_PATH={str(path)!r} does not exist (an imported model directory, "
                      f"or a SentencePiece .model to use, or a local one to build)")
  if not train_files:
    raise DataError(f"vocabulary {path!r} does not exist and no train_files to build it from")
  if not path:
    cap = [] if max_sentences_per_file == 200_000 else [f"cap={max_sentences_per_file}"]
    key = hashlib.sha256("|".join([*map(str, train_files), str(vocab_size), *languages, *cap])
                         .encode()).hexdigest()[:16]
    path = cache_dir().parent / "vocab" / f"spm_{vocab_size}_{key}.model"
    if path.exists():
      return str(path)
  print(f"[vmx] building SentencePiece vocabulary ({vocab_size} pieces) -> {path}", flush=True)
  return train_sentencepiece(list(train_files), str(path), vocab_size, languages,
                             max_sentences_per_file=max_sentences_per_file)


class Tokenizer:
  """Batch tokenization into fixed-shape, zero-padded int32 arrays."""

  def __init__(self, model_path: str):
    if not storage.path(model_path).exists():
      raise DataError(f"{model_path}: no such SentencePiece model")
    self.model_path = str(model_path)
    self.sp = spm.SentencePieceProcessor(model_proto=storage.path(model_path).read_bytes())

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def unknown_only(self, ids_NxL: np.ndarray) -> np.ndarray:
    """[N] bool: rows with tokens, all of them the unknown piece (two such sentences get
    the same vector)."""
    # The word-boundary piece '▁' alone carries nothing either ("😀" -> ['▁', <unk>]).
    blank = [0, self.sp.piece_to_id("\u2581")]
    unk = self.sp.unk_id()
    has_unk = (ids_NxL == unk).any(axis=1)
    return has_unk & np.isin(ids_NxL, blank + [unk]).all(axis=1)

  def piece_id(self, piece: str) -> int:
    i = self.sp.piece_to_id(piece)
    if i == self.sp.unk_id() and piece != self.sp.id_to_piece(self.sp.unk_id()):
      raise KeyError(f"{piece!r} is not in vocabulary {self.model_path}")
    return i

  def encode(self, texts: Iterable[str], max_length: int) -> np.ndarray:
    """[n, max_length] ids, zero-padded; longer texts keep their first max_length ids."""
    return self.encode_counting(texts, max_length)[0]

  def encode_counting(self, texts: Iterable[str], max_length: int) -> tuple[np.ndarray, int]:
    """(ids as in `encode`, how many texts were truncated)."""
    ids = self.sp.encode(list(texts))
    out = np.zeros((len(ids), max_length), np.int32)
    cut = 0
    for i, row in enumerate(ids):
      cut += len(row) > max_length
      row = row[:max_length]
      out[i, :len(row)] = row
    return out, cut


def copy_vocabulary(src: str, model_dir: str) -> str:
  """Copies the .model next to the checkpoints (checkpoints stay self-contained)."""
  dest = storage.path(model_dir) / "vocab.model"
  if not dest.exists():
    dest.parent.mkdir(parents=True, exist_ok=True)
    storage.copy_file(src, dest)
  return str(dest)


# ----------------------------------------------------------------------------
# Imported tokenizers (Hugging Face checkpoints).

TOKENIZER_SPEC = "vmx_tokenizer.json"
TOKENIZER_KINDS = ("tokenizers", "wordpiece", "t5_spm", "fairseq_spm")


def load_tokenizer(path: str):
  """`Tokenizer` for a SentencePiece `.model`, `HfTokenizer` for a `vmx_tokenizer.json`."""
  if storage.path(path).name == TOKENIZER_SPEC:
    return HfTokenizer(path)
  return Tokenizer(path)


class HfTokenizer:
  """A Hugging Face checkpoint's own tokenizer behind `Tokenizer`'s interface.

  `hf_ids(texts)`: exactly Hugging Face's ids (special tokens added, no truncation);
  `encode(texts, max_length)`: vmx ids (padding id swapped with 0), zero-padded;
  a longer text keeps its first max_length - 1 ids and its closing special token
  ([SEP], </s>), as Hugging Face's truncation does.
  """

  def __init__(self, spec_path: str):
    spec_path = storage.path(spec_path)
    try:
      spec = json.loads(spec_path.read_text())
      self.kind, file = spec["kind"], spec_path.parent / spec["file"]
      self.pad_id, self.closing_special = int(spec["pad_id"]), bool(spec["closing_special"])
    except (OSError, ValueError, KeyError) as e:
      raise CheckpointError(f"{spec_path}: not a readable vmx tokenizer spec ({e})") from None
    if self.kind not in TOKENIZER_KINDS:
      raise CheckpointError(f"{spec_path}: kind {self.kind!r}; expected one of {TOKENIZER_KINDS}")
    if not file.exists():
      raise CheckpointError(f"{file}: missing (named by {spec_path})")
    self.model_path, self.spec = str(spec_path), spec
    try:
      self._load(storage.local_copy(file), spec)
    except Exception as e:  # noqa: BLE001  (tokenizers/sentencepiece raise many kinds)
      raise CheckpointError(f"{file}: not a usable {self.kind} tokenizer file "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                            ) from None
    self._size = max(self._size, int(spec.get("vocab_size", 0)))

  def _load(self, file: str, spec: dict):
    if self.kind == "tokenizers":
      self.tok = tokenizers.Tokenizer.from_file(str(file))
      self.tok.no_truncation()
      self.tok.no_padding()
      self._size = self.tok.get_vocab_size(with_added_tokens=True)
    elif self.kind == "wordpiece":
      self.tok = BertWordPieceTokenizer(str(file), lowercase=bool(spec.get("lowercase", False)))
      self._size = self.tok.get_vocab_size(with_added_tokens=True)
    else:
      self.sp = spm.SentencePieceProcessor(model_file=str(file))
      # fairseq (XLM-R): <s>=0 <pad>=1 </s>=2 <unk>=3, piece i -> i + 1, then <mask>
      self._size = self.sp.get_piece_size() + (2 if self.kind == "fairseq_spm" else 0)

  @property
  def vocab_size(self) -> int:
    return self._size

  def hf_ids(self, texts: Iterable[str]) -> list[list[int]]:
    texts = list(texts)
    if self.kind in ("tokenizers", "wordpiece"):
      return [e.ids for e in self.tok.encode_batch(texts)]
    pieces = self.sp.encode(texts)
    if self.kind == "t5_spm":
      return [row + [self.sp.eos_id()] for row in pieces]   # mT5: </s> = 1
    return [[0] + [i + 1 if i else 3 for i in row] + [2] for row in pieces]

  def to_vmx_ids(self, ids):
    """HF ids -> vmx ids (an involution: also vmx -> HF)."""
    ids = np.asarray(ids, np.int32)
    if self.pad_id == 0:
      return ids
    return np.where(ids == self.pad_id, 0, np.where(ids == 0, self.pad_id, ids)).astype(np.int32)

  def truncate(self, row: list[int], max_length: int) -> list[int]:
    if len(row) <= max_length:
      return row
    return row[:max_length - 1] + row[-1:] if self.closing_special else row[:max_length]

  def encode(self, texts: Iterable[str], max_length: int) -> np.ndarray:
    return self.encode_counting(texts, max_length)[0]

  def encode_counting(self, texts: Iterable[str], max_length: int) -> tuple[np.ndarray, int]:
    rows = self.hf_ids(texts)
    out = np.zeros((len(rows), max_length), np.int32)
    cut = 0
    for i, row in enumerate(rows):
      cut += len(row) > max_length
      row = self.truncate(row, max_length)
      out[i, :len(row)] = self.to_vmx_ids(row)
    return out, cut

  def decode(self, vmx_ids) -> str:
    ids = [int(i) for i in self.to_vmx_ids(vmx_ids) if i != self.pad_id]
    if self.kind in ("tokenizers", "wordpiece"):
      return self.tok.decode(ids)
    if self.kind == "fairseq_spm":
      ids = [i - 1 for i in ids if i > 3 and i - 1 < self.sp.get_piece_size()]
    return self.sp.decode([i for i in ids if i != self.sp.eos_id()])


def copy_tokenizer(src_spec: str, model_dir: str) -> str:
  """Copies an imported tokenizer (spec + its file) into model_dir; returns the spec's name
  relative to model_dir."""
  src = storage.path(src_spec)
  spec = json.loads(src.read_text())
  dest = storage.path(model_dir) / src.name
  if src != dest:
    dest.parent.mkdir(parents=True, exist_ok=True)
    for name in (spec["file"], src.name):
      storage.copy_file(src.parent / name, storage.path(model_dir) / name)
  return src.name


def copy_any_vocabulary(vocabulary: str, model_dir: str) -> str:
  """Copies a SentencePiece model or an imported tokenizer next to the checkpoints;
  returns its file name in model_dir (what vmx_model.json records)."""
  if storage.path(vocabulary).name == TOKENIZER_SPEC:
    return copy_tokenizer(vocabulary, model_dir)
  return storage.path(copy_vocabulary(vocabulary, model_dir)).name
