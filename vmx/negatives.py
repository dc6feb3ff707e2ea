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
import json
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
  if n != len(targets) or n < 1:   # (one pair: its only candidate is its own target)
    raise InputError(f"{n} sources and {len(targets)} targets: expected as many, and 1 or more")
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


EMPTY_SIDES = ("error", "skip")


def read_pairs(path, empty_sides: str = "error") -> tuple[list, list, int]:
  """(sources, targets, pairs skipped) of a `source<TAB>target` file; a line without
  exactly one tab is an error naming path:line, as is a pair with an empty side unless
  `empty_sides='skip'` (then it is skipped and counted: e.g. wmt-newstest's hu-en has one,
  which the one-hour recipe's task skips too); empty lines are skipped."""
  if empty_sides not in EMPTY_SIDES:
    raise InputError(f"empty_sides={empty_sides!r}: expected one of {EMPTY_SIDES}")
  sources, targets, skipped = [], [], 0
  for i, line in readers.iter_lines(path):
    if not line.strip():
      continue
    parts = line.split("\t")
    empty = len(parts) == 2 and not (parts[0].strip() and parts[1].strip())
    if len(parts) != 2 or (empty and empty_sides == "error"):
      raise DataError(f"{path}:{i}: expected 'source<TAB>target', got {line[:80]!r}")
    if empty:
      skipped += 1
      continue
    sources.append(parts[0])
    targets.append(parts[1])
  if not sources:
    raise DataError(f"{path}: no 'source<TAB>target' pair")
  return sources, targets, skipped


def mine(encoder, pairs_path: str, output: str, f: Filter, source_lang: Optional[str] = None,
         target_lang: Optional[str] = None, overwrite: bool = False,
         empty_sides: str = "error") -> dict:
  """Writes OUTPUT: `source<TAB>positive<TAB>negative_1...` lines for the pairs that have
  `f.negatives` hard negatives, in the file's order; returns the counts."""
  out = storage.path(output)
  if out.exists() and not overwrite:
    raise InputError(f"{output} exists: pass --overwrite to replace it")
  f.check()
  sources, targets, skipped = read_pairs(pairs_path, empty_sides)
  src = encoder.encode_counting(sources, lang=source_lang)[0]
  tgt = encoder.encode_counting(targets, lang=target_lang)[0]
  idx, dropped = select(sources, targets, src, tgt, f)
  full = (idx >= 0).all(axis=1)
  lines = ["\t".join([sources[i], targets[i], *(targets[j] for j in idx[i])]) + "\n"
           for i in np.flatnonzero(full)]
  storage.write_atomic(out, "".join(lines))
  return {"pairs": len(sources), "written": len(lines), "left_out": int((~full).sum()),
          "skipped_empty": skipped, "dropped": dropped, "output": str(out)}


def pair_files(directory) -> list[tuple]:
  """[(path, source language, target language)] of the `<source>-<target>.tsv` files of a
  directory, sorted by name (e.g. one file per task of a mixture: deu-eng.tsv, de-en.tsv);
  a .tsv file not so named is an error naming it."""
  d = storage.path(directory)
  if not d.is_dir():
    raise InputError(f"{directory}: no such directory")
  out = []
  for p in sorted(d.glob("*.tsv"), key=lambda q: q.name):
    langs = p.name[:-len(".tsv")].split("-")
    if len(langs) != 2 or not all(langs):
      raise InputError(f"{p}: expected a file named <source>-<target>.tsv (its languages)")
    out.append((p, langs[0], langs[1]))
  if not out:
    raise InputError(f"{directory}: no <source>-<target>.tsv file")
  return out


SETTINGS_FILE = "mine_negatives.json"


def mine_directory(encoder, pairs_dir: str, output_dir: str, f: Filter,
                   overwrite: bool = False, empty_sides: str = "error", log=print,
                   model: Optional[dict] = None) -> dict:
  """`mine` for every `pair_files(pairs_dir)` file into OUTPUT_DIR/<the same name>, the
  file's languages from its name. A file already there is a finished one (each is written
  whole or not at all): kept, so a killed run resumes where it stopped; `overwrite` mines
  every file again. OUTPUT_DIR/mine_negatives.json records the settings (the filter, and
  `model`: e.g. the checkpoint and step); a rerun with others is refused naming both, so
  files of two settings never mix (`overwrite` replaces them all). Returns the counts
  summed, and each file's."""
  files = pair_files(pairs_dir)
  out_dir = storage.path(output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  settings = {"filter": dataclasses.asdict(f), "empty_sides": empty_sides,
              "model": dict(model or {})}
  record = out_dir / SETTINGS_FILE
  if record.exists() and not overwrite:
    before = json.loads(record.read_text())
    if before != settings:
      raise InputError(f"{record} holds files mined with {json.dumps(before, sort_keys=True)}, "
                       f"not {json.dumps(settings, sort_keys=True)}: pass --overwrite to mine "
                       "them all again, or another --output")
  storage.write_atomic(record, json.dumps(settings, indent=1, sort_keys=True) + "\n")
  total = {"files": len(files), "kept": 0, "pairs": 0, "written": 0, "left_out": 0,
           "skipped_empty": 0, "dropped": {}, "per_file": {}, "output": str(out_dir)}
  for n, (path, src, tgt) in enumerate(files, 1):
    out = out_dir / path.name
    if out.exists() and not overwrite:
      total["kept"] += 1
      log(f"[mine_negatives] {n}/{len(files)} {path.name}: kept (mined before)")
      continue
    s = mine(encoder, str(path), str(out), f, src, tgt, overwrite=True,
             empty_sides=empty_sides)
    counts = ("pairs", "written", "left_out", "skipped_empty")
    total["per_file"][path.name] = {k: s[k] for k in counts}
    for k in counts:
      total[k] += s[k]
    for k, v in s["dropped"].items():
      total["dropped"][k] = total["dropped"].get(k, 0) + v
    log(f"[mine_negatives] {n}/{len(files)} {path.name}: {s['written']:,} of {s['pairs']:,} "
        f"pairs")
  return total

