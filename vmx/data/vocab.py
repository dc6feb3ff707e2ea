"""SentencePiece vocabularies: training, lookup and batch tokenization (no TensorFlow).

Conventions (T5/mT5, so an mT5 `.model` also works): pad=0, eos=1, unk=2, no bos.
Language tags such as `<2deu>` are user-defined symbols: always one piece.
"""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

import gin
import numpy as np

from vmx.data.download import DataError, cache_dir
from vmx.data.readers import iter_lines
from vmx.errors import ConfigError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def language_tag(lang: str) -> str:
  return f"<2{lang}>"


def train_sentencepiece(input_files: Sequence[str], model_path: str, vocab_size: int,
                        languages: Sequence[str] = (), model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        max_sentences_per_file: int = 200_000, seed: int = 0) -> str:
  """Trains a SentencePiece model on (a seeded sample of) `input_files` (.gz ok)."""
  import sentencepiece as spm

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
      from vmx.gin_utils import binding_source
      why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
      raise ConfigError(f"building a {vocab_size}-piece SentencePiece vocabulary from "
                        f"{len(sentences)} sentences failed "
                        f"({binding_source('vocabulary_path', 'vocab_size')}): {why}") from None
    os.replace(prefix + ".model", model_path)  # atomic: never a half-written model
  return str(model_path)


@gin.configurable
def vocabulary_path(path: Optional[str] = None, train_files: Sequence[str] = (),
                    vocab_size: int = 32000, languages: Sequence[str] = ()) -> str:
  """An existing SentencePiece model, or one built from `train_files` and cached.

  `path` set and present: used as is (e.g. mT5's). `path` set and absent: built
  there. `path` unset: built under the cache, keyed by inputs, size and languages.
  """
  if path and Path(path).exists():
    return str(path)
  if not train_files:
    raise DataError(f"vocabulary {path!r} does not exist and no train_files to build it from")
  if not path:
    key = hashlib.sha256("|".join([*map(str, train_files), str(vocab_size), *languages])
                         .encode()).hexdigest()[:16]
    path = cache_dir().parent / "vocab" / f"spm_{vocab_size}_{key}.model"
    if path.exists():
      return str(path)
  print(f"[vmx] building SentencePiece vocabulary ({vocab_size} pieces) -> {path}", flush=True)
  return train_sentencepiece(list(train_files), str(path), vocab_size, languages)


class Tokenizer:
  """Batch tokenization into fixed-shape, zero-padded int32 arrays."""

  def __init__(self, model_path: str):
    import sentencepiece as spm
    if not Path(model_path).exists():
      raise DataError(f"{model_path}: no such SentencePiece model")
    self.model_path = str(model_path)
    self.sp = spm.SentencePieceProcessor(model_file=self.model_path)

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

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
  dest = Path(model_dir) / "vocab.model"
  if not dest.exists():
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, str(dest) + ".tmp")
    os.replace(str(dest) + ".tmp", dest)
  return str(dest)
