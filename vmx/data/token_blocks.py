"""Text blocks: the rows of a monolingual token cache read as blocks of consecutive sentences.

XLM-R, and InfoXLM after it (App. A), train the masked LM on blocks of 512 tokens of
running text, not on single sentences. `TokenBlocks` reads a text task's token cache that
way: consecutive rows of the cache (the corpus's own order, line after line), each
sentence whole, joined until the next one would not fit in `length` tokens (fairseq's
`TokenBlockDataset` with `break_mode="complete"`, which XLM-R's data uses). Each sentence
is followed by `separator` where its tokenizer does not close it itself (vmx's own
vocabulary: `</s>`, `vocab.EOS_ID`; an imported XLM-R tokenizer's rows are already
`<s> ... </s>`: no separator), and attention sees the whole block. A block is an
example of the stream (vmx/data/stream.py), so the batch holds `batch_size` blocks and
every block is read once an epoch.

The block boundaries are a pure function of the rows' lengths, computed once when the
stream opens: one pass over every row of the cache (its lengths only are kept, 8 bytes a
block). Rows are zero-padded to the cache's length; a row's length is its count of
non-zero tokens (the cache's padding is 0).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from vmx.errors import ConfigError

READ_ROWS = 1 << 16   # rows read at a time while the lengths are counted


def separator(vocabulary) -> Optional[int]:
  """The token after each sentence of a block, by the task's vocabulary: a path (a
  SentencePiece model, or a vmx_tokenizer.json) or a SeqIO vocabulary (its `eos_id`).
  vmx's own vocabularies: </s>; an imported Hugging Face tokenizer closes every sentence
  itself (XLM-R's </s>, BERT's [SEP]): None."""
  if not isinstance(vocabulary, str):
    return vocabulary.eos_id     # vmx/data/seqio_vocab.py: None for imported tokenizers
  from vmx import storage
  from vmx.data import vocab  # lazy: SentencePiece, only for a config with blocks
  if storage.path(vocabulary).name != vocab.TOKENIZER_SPEC:
    return vocab.EOS_ID
  kind = vocab.read_spec(vocabulary).get("kind")
  return vocab.EOS_ID if kind == vocab.SENTENCEPIECE_KIND else None


def block_starts(lengths_N: np.ndarray, length: int) -> np.ndarray:
  """[blocks + 1] the first row of each block and the row count at the end: consecutive
  rows joined while their lengths sum to at most `length` (a row is never split; an
  empty row joins the block it falls in)."""
  starts, used = [0], 0
  for i, n in enumerate(np.asarray(lengths_N, np.int64).tolist()):
    if used + n > length and used > 0:
      starts.append(i)
      used = 0
    used += n
  starts.append(len(lengths_N))
  return np.asarray(starts, np.int64)


class TokenBlocks:
  """A table of blocks over a token cache's table (`table`: len, take, prefetch, remote;
  vmx/data/token_cache/table.py) whose rows hold the token feature `feature` ([L],
  zero-padded): `take(indices)` gives {feature: [R, length]}, each row block `i`'s
  sentences one after the other, zero-padded."""

  def __init__(self, table, feature: str, length: int, separator: Optional[int] = None,
               lengths_N: Optional[np.ndarray] = None):
    self.table, self.feature, self.length = table, feature, int(length)
    self.separator = separator
    self.remote = bool(getattr(table, "remote", False))
    if lengths_N is None:
      lengths_N = np.concatenate([
          np.count_nonzero(table.take(np.arange(i, min(i + READ_ROWS, len(table))))[feature],
                           axis=1) for i in range(0, len(table), READ_ROWS)]
          or [np.zeros(0, np.int64)])
    self.lengths = np.asarray(lengths_N, np.int64)
    # a sentence's slots in its block: its tokens and the separator after it
    self.sizes = self.lengths + (separator is not None)
    if len(self.sizes) and self.sizes.max() > self.length:
      raise ConfigError(f"DatasetConfig.block_length={self.length}: a sentence of the cache "
                        f"fills {int(self.sizes.max())} tokens with its separator")
    self.starts = block_starts(self.sizes, self.length)

  def __len__(self) -> int:
    return len(self.starts) - 1

  def rows_of(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """(the rows of blocks `indices`, in order [n], the block of each [n])."""
    idx = np.asarray(indices, np.int64)
    first, count = self.starts[idx], self.starts[idx + 1] - self.starts[idx]
    block = np.repeat(np.arange(len(idx)), count)
    offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + offset, block

  def prefetch(self, indices):
    fetch = getattr(self.table, "prefetch", None)
    if fetch is not None:
      fetch(self.rows_of(indices)[0])

  def take(self, indices) -> dict:
    rows, block = self.rows_of(indices)
    tokens = self.table.take(rows)[self.feature]                    # [n, L]
    n, size = self.lengths[rows], self.sizes[rows]
    # where each sentence starts in its block: the sizes before it, within the block
    ends = np.cumsum(size)
    before = np.zeros(len(rows), np.int64)
    if len(rows):
      first = np.r_[True, block[1:] != block[:-1]]
      base = np.maximum.accumulate(np.where(first, ends - size, 0))
      before = ends - size - base
    out = np.zeros((len(np.atleast_1d(indices)), self.length), tokens.dtype)
    col = np.arange(tokens.shape[1])
    keep = col[None, :] < n[:, None]                                 # a row's real tokens
    r, c = np.nonzero(keep)
    out[block[r], before[r] + c] = tokens[r, c]
    if self.separator is not None:
      out[block, before + n] = self.separator
    return {self.feature: out}
