"""An imported checkpoint's own tokenizer (`HfTokenizer`), and what vmx's tokenizers share.

A Hugging Face checkpoint keeps its tokenizer: the fast tokenizer's `tokenizer.json`
(`tokenizers` package), BERT's WordPiece `vocab.txt`, mT5's `spiece.model`, or XLM-R's
`sentencepiece.bpe.model` with fairseq's id offset, described by a `vmx_tokenizer.json`
next to its files (`read_spec`; TOKENIZER_KINDS) and giving the ids Hugging Face's
tokenizer gives, special tokens included. vmx reserves id 0 for padding, so a vocabulary
whose padding id is another (XLM-R: 1) has that id and 0 swapped in vmx's id space
(`to_vmx_ids`; the imported embedding rows are swapped to match). `join_pairs` is the
sentence-pair layout both this and vmx's own `Tokenizer` (vmx/data/vocab.py) use.
vmx/data/vocab.py's `load_tokenizer` opens either kind.
"""
from __future__ import annotations

import json
import re
from typing import Iterable

import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import BertWordPieceTokenizer

from vmx import storage
from vmx.data.token_rows import RaggedIds, in_chunks, ragged_rows
from vmx.errors import CheckpointError, ConfigError

TOKENIZER_SPEC = "vmx_tokenizer.json"
TOKENIZER_KINDS = ("tokenizers", "wordpiece", "t5_spm", "fairseq_spm")


def read_spec(spec_path: str) -> dict:
  """A `vmx_tokenizer.json`'s content (CheckpointError when unreadable)."""
  try:
    spec = json.loads(storage.path(spec_path).read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{spec_path}: not a readable vmx tokenizer spec ({e})") from None
  if not isinstance(spec, dict):
    raise CheckpointError(f"{spec_path}: not a vmx tokenizer spec (a JSON object)")
  return spec


def join_pairs(rows_a, rows_b, opening: list, middle: list, closing: list, max_length: int,
               to_ids=lambda row: row) -> np.ndarray:
  """[N, max_length] ids of `opening a middle b closing` for each pair of id rows, zero
  padded; too long a pair loses tokens from its longer text first (Hugging Face's
  `longest_first`; a tie: the second's)."""
  room = max_length - len(opening) - len(middle) - len(closing)
  if room < 2:
    raise ConfigError(f"max_length={max_length}: too short for a pair")
  out = np.zeros((len(rows_a), max_length), np.int32)
  for i, (x, z) in enumerate(zip(rows_a, rows_b)):
    x, z = list(x), list(z)
    while len(x) + len(z) > room:
      (x if len(x) > len(z) else z).pop()
    row = opening + x + middle + z + closing
    out[i, :len(row)] = to_ids(row)
  return out


def sentencepiece_spans(sp, text: str) -> tuple[list[int], list[tuple[int, int]]]:
  """(SentencePiece's ids of `text`, each piece's [start, end) in characters of `text`).
  A piece with no characters of its own (the word-boundary '▁' before a word) gets an
  empty span at its place."""
  try:
    proto = sp.encode(text, return_type="proto")
  except (TypeError, ValueError):   # sentencepiece before 0.2.1
    proto = sp.encode(text, out_type="immutable_proto")
  char_of, at = {}, 0     # byte offset -> character offset
  for i, ch in enumerate(text):
    char_of[at] = i
    at += len(ch.encode("utf-8"))
  char_of[at] = len(text)
  return ([p.id for p in proto.pieces],
          [(char_of.get(p.begin, 0), char_of.get(p.end, len(text))) for p in proto.pieces])


def word_spans(text: str, encode_words) -> tuple[list[int], list[tuple[int, int]]]:
  """(ids, spans) of `text` tokenized one whitespace-separated word at a time
  (`encode_words(words) -> [ids of each]`, one call), each id spanning its whole word: for
  tokenizers that cannot say where a piece came from (a vmx vocabulary with a language
  pre-tokenizer)."""
  words = list(re.finditer(r"\S+", text))
  ids, spans = [], []
  for m, row in zip(words, encode_words([m.group() for m in words]) if words else []):
    ids += row
    spans += [(m.start(), m.end())] * len(row)
  return ids, spans


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
      first = str(e).splitlines()[0][:200] if str(e) else ""
      raise CheckpointError(f"{file}: not a usable {self.kind} tokenizer file "
                            f"({type(e).__name__}: {first})") from None
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

  def encode(self, texts: Iterable[str], max_length: int, lang=None) -> np.ndarray:
    return self.encode_counting(texts, max_length, lang)[0]

  def encode_counting(self, texts: Iterable[str], max_length: int,
                      lang=None) -> tuple[np.ndarray, int]:
    """(ids as in `encode`, how many texts were truncated)."""
    ragged = self.encode_ragged(texts, max_length, lang)
    return ragged.padded(max_length), ragged.truncated

  def encode_ragged(self, texts: Iterable[str], max_length: int, lang=None) -> RaggedIds:
    """vmx ids of each text, truncated as `truncate` does, end to end with no padding
    (`in_chunks`). `lang` is not used: an imported tokenizer normalizes text its own way."""
    del lang
    return in_chunks(list(texts), lambda chunk: self._ragged(chunk, max_length))

  def _ragged(self, texts: list, max_length: int) -> RaggedIds:
    rows = self.hf_ids(texts)
    cut = sum(len(row) > max_length for row in rows)
    if cut:
      rows = [self.truncate(row, max_length) for row in rows]
    ragged = ragged_rows(rows, max_length)
    return RaggedIds(self.to_vmx_ids(ragged.ids), ragged.lengths, cut)

  def unigram_scores(self, ids: np.ndarray) -> None:
    """None: an imported tokenizer's ids carry no unigram probabilities vmx reads (a
    static table's frequency weights then follow Zipf's law, vmx/static_encoder.py)."""
    del ids

  def unknown_only(self, ragged: RaggedIds) -> np.ndarray:
    """[N] False: an imported tokenizer's texts are not checked for unknown-only rows (its
    special tokens carry a vector of their own)."""
    return np.zeros((len(ragged.lengths),), bool)

  def encode_pairs(self, a: Iterable[str], b: Iterable[str], max_length: int,
                   lang=None) -> np.ndarray:
    """[N, max_length] vmx ids of each pair joined in the checkpoint's own pair template
    (Hugging Face `tokenizers`: its post-processor; XLM-R's SentencePiece
    `<s> a </s></s> b </s>`; mT5's `a </s> b </s>`), too long a pair cut `longest_first`."""
    del lang   # (an imported tokenizer does not pre-tokenize by language)
    a, b = list(a), list(b)
    if self.kind in ("tokenizers", "wordpiece"):
      self.tok.enable_truncation(max_length, strategy="longest_first")
      try:
        rows = [e.ids for e in self.tok.encode_batch(list(zip(a, b)))]
      finally:
        self.tok.no_truncation()
      out = np.zeros((len(rows), max_length), np.int32)
      for i, row in enumerate(rows):
        out[i, :len(row)] = self.to_vmx_ids(row)
      return out
    if self.kind == "fairseq_spm":     # XLM-R ids: <s>=0 </s>=2 <unk>=3, piece i -> i + 1
      shift = lambda rows: [[i + 1 if i else 3 for i in r] for r in rows]  # noqa: E731
      return join_pairs(shift(self.sp.encode(a)), shift(self.sp.encode(b)), [0], [2, 2], [2],
                        max_length, self.to_vmx_ids)
    eos = self.sp.eos_id()             # t5_spm (mT5)
    return join_pairs(self.sp.encode(a), self.sp.encode(b), [], [eos], [eos], max_length,
                      self.to_vmx_ids)

  def pair_template(self) -> tuple[list[int], list[int], list[int]]:
    """(opening, middle, closing) vmx ids around a pair's two segments (`encode_pairs`)."""
    if self.kind in ("tokenizers", "wordpiece"):
      e = self.tok.encode("a", "b")
      seq = e.sequence_ids
      first, last = seq.index(0), len(seq) - 1 - seq[::-1].index(1)
      between = [i for i in range(first, last) if seq[i] is None]
      parts = (e.ids[:first], [e.ids[i] for i in between], e.ids[last + 1:])
    elif self.kind == "fairseq_spm":
      parts = ([0], [2, 2], [2])
    else:
      parts = ([], [self.sp.eos_id()], [self.sp.eos_id()])
    return tuple([int(i) for i in self.to_vmx_ids(p)] for p in parts)

  def encode_spans(self, text: str, lang=None) -> tuple[list[int], list[tuple[int, int]]]:
    """(vmx ids of `text` without special tokens, each id's [start, end) in characters
    of `text`): where an answer span lies (extractive QA, vmx/finetune/qa.py)."""
    del lang
    if self.kind in ("tokenizers", "wordpiece"):
      e = self.tok.encode(text, add_special_tokens=False)
      return [int(i) for i in self.to_vmx_ids(e.ids)], [tuple(o) for o in e.offsets]
    ids, spans = sentencepiece_spans(self.sp, text)
    if self.kind == "fairseq_spm":
      ids = [i + 1 if i else 3 for i in ids]
    return [int(i) for i in self.to_vmx_ids(ids)], spans

  def decode(self, vmx_ids) -> str:
    ids = [int(i) for i in self.to_vmx_ids(vmx_ids) if i != self.pad_id]
    if self.kind in ("tokenizers", "wordpiece"):
      return self.tok.decode(ids)
    if self.kind == "fairseq_spm":
      ids = [i - 1 for i in ids if i > 3 and i - 1 < self.sp.get_piece_size()]
    return self.sp.decode([i for i in ids if i != self.sp.eos_id()])
