"""ParaCrawl cross-lingual sentence retrieval (EMS §5.3, Table 9).

EMS draws, for each of 21 languages paired with English, 2,000 query sentences in one
language and searches their translations among 200k candidate sentences in the other,
from ParaCrawl v5.0 (OPUS), scoring by ratio margin (Artetxe & Schwenk 2019a, k = 4) and
reporting P@1 per language pair and their mean.

Layout: OPUS's ParaCrawl v5.0 Moses files, as unzipped from
`https://object.pouta.csc.fi/OPUS-ParaCrawl/v5/moses/<pair>.txt.zip` into one directory:

  PARACRAWL_DIR/ParaCrawl.<pair>.<xx>    line i is the translation of
  PARACRAWL_DIR/ParaCrawl.<pair>.en      line i of the other file

where <pair> is OPUS's alphabetical order of the two ISO 639-1 codes (`bg-en`, `en-fr`);
`.gz` copies (`ParaCrawl.<pair>.<xx>.gz`) are read as well.

The draw, reproducible from (the files, `seed`): a line count of both files (they must
match), then `numpy.random.default_rng(seed).choice(n, min(n, 2 * n_candidates),
replace=False)` line numbers; in that order, lines with an empty side, and lines whose
source or target text was already taken, are skipped (a duplicate text would make a
correct retrieval count as a miss), and the first `n_candidates` lines left are the
candidate pool. The first `n_queries` of them are the queries; each query's gold is its
own line's other side, among the pool. Both sides of the pool are embedded once and both
directions are scored: `en2xx` (queries in English, candidates in xx) and `xx2en`. EMS
does not say which direction Table 9 reports (its earlier study, Mao et al. 2021, reports
en→xx first); vmx reports both and takes `en2xx` as the main score of a pair.

Retrieval: each query's k = 4 nearest candidates by cosine (one exact kNN pass both ways,
`knn.topk`) rescored by the ratio margin, the best one retrieved (`mining.xsim_errors`:
the candidate side's neighbourhood is its k nearest queries, as in margin mining);
P@1 ×100 = 100 − the error rate.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from vmx.data import readers
from vmx.data.languages import iso3
from vmx.errors import DataError
from vmx.evaluation import common, knn, mining

# Table 9's 21 languages, each paired with English (ISO 639-1, as OPUS names the files).
LANGUAGES = ("bg", "cs", "da", "de", "el", "es", "et", "fi", "fr", "hr", "hu", "it", "lt",
             "lv", "nl", "pl", "pt", "ro", "sk", "sl", "sv")
N_QUERIES, N_CANDIDATES, K = 2000, 200_000, 4
LAYOUT = ("--paracrawl.dir=DIR: OPUS ParaCrawl v5.0 Moses files ParaCrawl.<pair>.{<xx>,en} "
          "(<pair> = bg-en, ..., en-fr: the two codes in alphabetical order), line i "
          "parallel (vmx/evaluation/paracrawl.py)")


def pair_name(lang: str) -> str:
  """OPUS's name of the `lang`-English pair: the two codes in alphabetical order."""
  return "-".join(sorted((lang, "en")))


def pair_files(directory, lang: str) -> Optional[tuple[Path, Path]]:
  """(the `lang` file, the English file) of the pair, plain or .gz; None if absent."""
  d = Path(directory)
  pair = pair_name(lang)
  for suffix in ("", ".gz"):
    xx, en = d / f"ParaCrawl.{pair}.{lang}{suffix}", d / f"ParaCrawl.{pair}.en{suffix}"
    if xx.exists() or en.exists():
      return xx, en
  return None


def count_lines(path) -> int:
  n, last = 0, b"\n"
  with readers.open_text(path) as f:
    for chunk in iter(lambda: f.read(1 << 24), b""):
      n += chunk.count(b"\n")
      last = chunk[-1:]
  return n + (last != b"\n")     # a last line without its newline still counts


def draw(src_path, tgt_path, n_queries: int = N_QUERIES, n_candidates: int = N_CANDIDATES,
         seed: int = 0, task: str = "paracrawl"):
  """(source texts, target texts, their 1-based line numbers, the files' line count) of
  the candidate pool: the first `n_queries` are the queries (the draw: module docstring)."""
  if not 0 < n_queries <= n_candidates:
    raise DataError(f"task {task}: n_queries={n_queries} must be in [1, n_candidates="
                    f"{n_candidates}]")
  for p in (src_path, tgt_path):
    if not Path(p).is_file():
      raise DataError(f"task {task}: {p}: no such file")
  n, m = count_lines(src_path), count_lines(tgt_path)
  if n != m:
    raise DataError(f"task {task}: {src_path} has {n} lines, {tgt_path} has {m}: the two "
                    f"sides must be line-aligned")
  if n < n_candidates:
    raise DataError(f"task {task}: {src_path} has {n} lines, fewer than the {n_candidates} "
                    f"candidates to draw")
  order = np.random.default_rng(seed).choice(n, size=min(n, 2 * n_candidates), replace=False)
  wanted = np.sort(order)
  lines = {}      # 0-based line -> (source, target)
  j = 0
  for (i, a), (_, b) in zip(readers.raw_lines(src_path), readers.raw_lines(tgt_path)):
    if j == len(wanted):
      break
    if i - 1 == wanted[j]:
      lines[i - 1] = (readers.decode_line(a, src_path, i), readers.decode_line(b, tgt_path, i))
      j += 1
  src, tgt, kept, seen_s, seen_t = [], [], [], set(), set()
  for i in order:
    s, t = lines[int(i)]
    if not s.strip() or not t.strip() or s in seen_s or t in seen_t:
      continue
    seen_s.add(s)
    seen_t.add(t)
    src.append(s)
    tgt.append(t)
    kept.append(int(i) + 1)
    if len(src) == n_candidates:
      return src, tgt, np.asarray(kept), n
  raise DataError(f"task {task}: {src_path}: only {len(src)} distinct non-empty pairs among "
                  f"{len(order)} drawn lines, {n_candidates} needed")


def p_at_1(query_NxD, cand_MxD, k: int = K, margin: str = "ratio") -> float:
  """P@1 ×100 of query i retrieving candidate i (margin-rescored k nearest)."""
  nn = knn.topk(mining.normalize(query_NxD), mining.normalize(cand_MxD),
                k=min(k, len(query_NxD), len(cand_MxD)))
  errors, n = mining.xsim_errors(nn, margin)
  return 100.0 * (1.0 - errors / n)


def evaluate(encode: common.EncodeFn, directory, languages: Optional[Sequence[str]] = None,
             n_queries: int = N_QUERIES, n_candidates: int = N_CANDIDATES, seed: int = 0,
             k: int = K, progress: bool = False,
             files: Optional[common.DataFiles] = None) -> dict:
  """`languages` None: every one of LANGUAGES whose pair files are in `directory` (at
  least one; the others are listed under `languages_missing`); a language asked for by
  name must be there."""
  files = files or common.DataFiles("paracrawl")
  task = files.task
  directory = Path(directory).resolve()
  if not directory.is_dir():
    raise DataError(f"task {task}: {directory}: no such directory ({LAYOUT})")
  missing = []
  if languages is None:
    missing = [l for l in LANGUAGES if pair_files(directory, l) is None]
    languages = [l for l in LANGUAGES if l not in missing]
    if not languages:
      raise DataError(f"task {task}: no ParaCrawl.<pair>.<xx> / .en files for any of "
                      f"{', '.join(LANGUAGES)} in {directory} ({LAYOUT})")
  subsets, t0 = [], time.time()
  for lang in common.progress_iter(languages, "paracrawl", progress):
    found = pair_files(directory, lang)
    if found is None:
      raise DataError(f"task {task}: {directory}/ParaCrawl.{pair_name(lang)}.{lang}: no such "
                      f"file ({LAYOUT})")
    xx_path, en_path = (files.path(str(p)) for p in found)
    xx, en, lines, n_lines = draw(xx_path, en_path, n_queries, n_candidates, seed, task)
    xx_emb, en_emb = encode(xx, iso3(lang)), encode(en, "eng")
    en2xx = p_at_1(en_emb[:n_queries], xx_emb, k)
    xx2en = p_at_1(xx_emb[:n_queries], en_emb, k)
    subsets.append({"hf_subset": f"{lang}-en", "languages": [iso3(lang), "eng"],
                    "main_score": en2xx, "p_at_1_en2xx": en2xx, "p_at_1_xx2en": xx2en,
                    "p_at_1_mean": (en2xx + xx2en) / 2, "n_queries": n_queries,
                    "n_candidates": n_candidates, "n_lines": n_lines,
                    "first_query_lines": lines[:5].tolist()})
  return {"scores": {"test": subsets}, "languages_missing": missing, "seed": seed, "k": k,
          "main_score": common.mean([s["main_score"] for s in subsets]),
          "p_at_1_xx2en": common.mean([s["p_at_1_xx2en"] for s in subsets]),
          "seconds": time.time() - t0}
