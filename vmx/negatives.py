"""Hard negatives mined by the model itself, with false negatives filtered by rules that
hold whatever the sign of the scores (sentence-transformers' `mine_hard_negatives`;
NV-Retriever's positive-aware filtering, Moreira et al. 2024).

For each training pair (source_i, positive_i), the `candidates` targets of the file
nearest to source_i (cosine, `knn.topk`: exact), best first. A candidate t is dropped when
- **exact text**: it is the pair's positive, or its text equals the positive's (whitespace
  and case folded);
- **duplicate translation**: it is the positive of another pair whose source text equals
  this pair's (the same sentence translated twice is no negative of itself);
- **absolute margin**: s(t) > s(pos) - absolute_margin;
- **relative margin**: (1 + s(t)) / 2 > (1 - relative_margin) * (1 + s(pos)) / 2: both
  cosines shifted to [0, 1] before the ratio. On raw cosines the ratio rule flips where
  the positive's score is negative (sentence-transformers #3819/#3821: s(t) = -0.1 passes
  s(t) <= 0.95 * s(pos) for s(pos) = -0.2, a "negative" more similar than the positive).
The first `negatives` candidates kept are the pair's hard negatives; a pair with fewer is
left out and counted.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from vmx import storage
from vmx.data import readers
from vmx.errors import DataError, InputError


@dataclasses.dataclass(frozen=True)
class Filter:
  negatives: int = 1             # hard negatives a pair
  candidates: int = 30           # nearest targets looked at
  absolute_margin: float = 0.0   # a negative scores at most s(pos) - this
  relative_margin: float = 0.05  # ... and at most (1 - this) x s(pos), on [0, 1]-shifted cosines

  def check(self):
    if self.negatives < 1 or self.candidates < self.negatives:
      raise InputError(f"negatives={self.negatives}, candidates={self.candidates}: expected "
                       "1 <= negatives <= candidates")
    if not 0.0 <= self.relative_margin < 1.0:
      raise InputError(f"relative_margin={self.relative_margin}: expected a value in [0, 1)")
    if self.absolute_margin < 0.0:
      raise InputError(f"absolute_margin={self.absolute_margin}: expected >= 0")


def _fold(text: str) -> str:
  return " ".join(text.split()).casefold()


def keep_mask(pos_N, cand_NxC, f: Filter) -> np.ndarray:
  """[N, C] bool: candidates whose score passes both margins (the rules above)."""
  pos = np.asarray(pos_N, np.float64)[:, None]
  cand = np.asarray(cand_NxC, np.float64)
  absolute = cand <= pos - f.absolute_margin
  relative = (1.0 + cand) / 2.0 <= (1.0 - f.relative_margin) * (1.0 + pos) / 2.0
  return absolute & relative


def select(sources: Sequence[str], targets: Sequence[str], src_vecs, tgt_vecs, f: Filter):
  """([N, negatives] target indices, -1 where a pair has too few, counts of what each rule
  dropped) from unit vectors of the pairs' sources and targets."""
  from vmx.evaluation import knn   # jax: the mining job's, not the mined file's readers
  f.check()
  n = len(sources)
  if n != len(targets) or n < 2:
    raise InputError(f"{n} sources and {len(targets)} targets: expected as many, and 2 or more")
  c = min(f.candidates, n)
  nn = knn.topk(np.asarray(src_vecs, np.float32), np.asarray(tgt_vecs, np.float32), k=c)
  pos = np.sum(np.asarray(src_vecs, np.float64) * np.asarray(tgt_vecs, np.float64), axis=1)
  folded_t = [_fold(t) for t in targets]
  folded_s = [_fold(s) for s in sources]
  translations: dict = {}          # source text -> the folded positives it has
  for s, t in zip(folded_s, folded_t):
    translations.setdefault(s, set()).add(t)
  by_score = keep_mask(pos, nn.row_vals, f)
  out = np.full((n, f.negatives), -1, np.int64)
  dropped = {"own_or_same_text": 0, "duplicate_translation": 0, "margin": 0}
  for i in range(n):
    got = 0
    for j, ok in zip(nn.row_idx[i].tolist(), by_score[i].tolist()):
      if j == i or folded_t[j] == folded_t[i]:
        dropped["own_or_same_text"] += 1
      elif folded_t[j] in translations[folded_s[i]]:
        dropped["duplicate_translation"] += 1
      elif not ok:
        dropped["margin"] += 1
      else:
        out[i, got] = j
        got += 1
        if got == f.negatives:
          break
  return out, dropped


def read_pairs(path) -> tuple[list, list]:
  """(sources, targets) of a `source<TAB>target` file; a line without exactly one tab, or
  an empty side, is an error naming path:line; empty lines are skipped."""
  sources, targets = [], []
  for i, line in readers.iter_lines(path):
    if not line.strip():
      continue
    parts = line.split("\t")
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
      raise DataError(f"{path}:{i}: expected 'source<TAB>target', got {line[:80]!r}")
    sources.append(parts[0])
    targets.append(parts[1])
  if len(sources) < 2:
    raise DataError(f"{path}: {len(sources)} pair(s); hard negatives need 2 or more")
  return sources, targets


def mine(encoder, pairs_path: str, output: str, f: Filter, source_lang: Optional[str] = None,
         target_lang: Optional[str] = None, overwrite: bool = False) -> dict:
  """Writes OUTPUT: `source<TAB>positive<TAB>negative_1...` lines for the pairs that have
  `f.negatives` hard negatives, in the file's order; returns the counts."""
  out = storage.path(output)
  if out.exists() and not overwrite:
    raise InputError(f"{output} exists: pass --overwrite to replace it")
  f.check()
  sources, targets = read_pairs(pairs_path)
  src = encoder.encode_counting(sources, lang=source_lang)[0]
  tgt = encoder.encode_counting(targets, lang=target_lang)[0]
  idx, dropped = select(sources, targets, src, tgt, f)
  full = (idx >= 0).all(axis=1)
  lines = ["\t".join([sources[i], targets[i], *(targets[j] for j in idx[i])]) + "\n"
           for i in np.flatnonzero(full)]
  storage.write_atomic(out, "".join(lines))
  return {"pairs": len(sources), "written": len(lines), "left_out": int((~full).sum()),
          "dropped": dropped, "output": str(out)}
