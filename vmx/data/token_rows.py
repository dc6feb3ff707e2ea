"""Token ids of a batch of texts, ragged (end to end, no padding) or padded to one length.

A tokenizer (vmx/data/vocab.py's SentencePiece `Tokenizer`, vmx/data/hf_tokenizer.py's
`HfTokenizer`) gives `RaggedIds`; a model reading fixed shapes pads them, a bag-of-tokens
model sums them as they are (vmx/inference.py).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RaggedIds:
  """N rows of token ids laid end to end, with no padding: row i is
  `ids[offsets[i]:offsets[i + 1]]`. What a tokenizer gives before rows are padded to one
  length; a bag-of-tokens model sums them as they are (vmx/inference.py)."""
  ids: np.ndarray         # [T] int32, no 0 (the padding id)
  lengths: np.ndarray     # [N] int64, after truncation
  truncated: int          # how many texts were longer than max_length

  def offsets(self) -> np.ndarray:
    """[N + 1] int64: where each row starts, then the end."""
    out = np.zeros((len(self.lengths) + 1,), np.int64)
    np.cumsum(self.lengths, out=out[1:])
    return out

  def row_of_each_id(self) -> np.ndarray:
    """[T]: the row each id belongs to."""
    return np.repeat(np.arange(len(self.lengths)), self.lengths)

  def padded(self, max_length: int) -> np.ndarray:
    """[N, max_length] int32, each row's ids then zeros."""
    out = np.zeros((len(self.lengths), max_length), np.int32)
    out[np.arange(max_length) < self.lengths[:, None]] = self.ids
    return out


def ragged_rows(rows: Sequence[Sequence[int]], max_length: int) -> RaggedIds:
  """`rows` (lists of ids) with each row's first max_length ids, without a Python loop over
  rows (a static model's encoding of 20,000 short sentences spent a fifth of its time in
  one)."""
  lengths = np.fromiter(map(len, rows), np.int64, len(rows))
  flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
  longer = lengths > max_length
  if not longer.any():
    return RaggedIds(flat, lengths, 0)
  kept = np.minimum(lengths, max_length)
  # a row's ids past max_length: each id's position in its row against the row's limit
  starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
  keep = (np.arange(flat.size) - starts) < np.repeat(kept, lengths)
  return RaggedIds(flat[keep], kept, int(longer.sum()))


CHUNK_TEXTS = 8192


def in_chunks(texts: Sequence[str], encode: Callable[[Sequence[str]], RaggedIds],
              chunk: int | None = None) -> RaggedIds:
  """`encode` over `chunk` (default CHUNK_TEXTS) texts at a time, joined: a tokenizer's output for many texts at
  once (Python lists of ids, the library's own buffers) is transient memory that grows
  with the texts; a mining shard of 100,000 sentences tokenized at once added 0.43 GB to
  its process's peak (docs/performance.md, "A fused kernel on CPU")."""
  chunk = chunk or CHUNK_TEXTS
  if len(texts) <= chunk:
    return encode(texts)
  parts = [encode(texts[a:a + chunk]) for a in range(0, len(texts), chunk)]
  return RaggedIds(np.concatenate([p.ids for p in parts]),
                   np.concatenate([p.lengths for p in parts]),
                   sum(p.truncated for p in parts))
