"""BUCC 2018 bitext mining (Zweigenbaum et al.; the LASER / XTREME protocol).

Layout (as distributed): `eval/bucc2018/<xx>-en/<xx>-en.<split>.{<xx>,en}` hold
`id<TAB>sentence` lines of two comparable corpora, `<xx>-en.<split>.gold` holds
`id_xx<TAB>id_en` lines of the true translation pairs. Splits are `sample`,
`training`, `test`.

Sentences are de-duplicated by text (LASER's --unify) and embedded; every
source–target pair is scored by cosine (`absolute`) or ratio margin over the
k = 4 nearest neighbours in both directions, each sentence keeps its best
candidate (`forward`, `backward`, `intersect`, `max`), and a mined text pair
counts for every id pair carrying those texts. P/R/F1 are ×100.

Threshold, as in XTREME (whose dev set is BUCC's `sample` split and whose test set is
BUCC's `training` split, the official test gold being unreleased): the margin threshold
that maximizes F1 is chosen on `sample` and applied to `test` if its gold is supplied,
else to `training`. Without `sample` it is chosen on `training`. With one split only,
it is chosen and reported on that split (optimistic; both splits are named in the
results: `threshold_split`, `split`).

Pairs: XTREME's four (de, fr, ru, zh with English). By default every pair whose gold is
supplied is evaluated and the others are listed under `pairs_missing` (the shared data
has de-en and fr-en); a pair asked for by name must be there.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

import numpy as np

from vmx.data.languages import iso3
from vmx.errors import DataError
from vmx.evaluation import common, knn, mining

PAIRS = ("de-en", "fr-en", "ru-en", "zh-en")
SCORINGS = {"cosine": "absolute", "margin": "ratio"}


def read_corpus(path, task="bucc") -> tuple[list[str], list[str]]:
  ids, sents = [], []
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if len(parts) != 2 or not parts[0]:
      raise DataError(f"task {task}: {path}:{i}: expected 'id<TAB>sentence', got {line[:80]!r}")
    ids.append(parts[0])
    sents.append(parts[1])
  return ids, sents


def read_gold(path, task="bucc") -> set[tuple[str, str]]:
  gold = set()
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if len(parts) != 2:
      raise DataError(f"task {task}: {path}:{i}: expected 'id_src<TAB>id_tgt', got {line[:80]!r}")
    gold.add((parts[0], parts[1]))
  return gold


def _unify(ids, sents):
  """Unique texts, and for each text the ids carrying it."""
  text_ids = defaultdict(list)
  for i, s in zip(ids, sents):
    text_ids[s].append(i)
  texts = list(text_ids)
  return texts, [text_ids[t] for t in texts]


def candidate_pairs(scored: mining.Scored, src_ids, tgt_ids,
                    retrieval: str) -> dict[tuple[str, str], float]:
  """{(src_id, tgt_id): score} of the mined pairs (ids expanded from unique texts)."""
  s_idx, t_idx, score = mining.best_pairs(scored, retrieval)
  out = {}
  for s, t, v in zip(s_idx, t_idx, score):
    for a in src_ids[s]:
      for b in tgt_ids[t]:
        key = (a, b)
        out[key] = max(out.get(key, -np.inf), float(v))
  return out


def _split_data(files: common.DataFiles, pair: str, split: str):
  src = pair.split("-")[0]
  base = f"eval/bucc2018/{pair}/{pair}.{split}"
  return (read_corpus(files.path(f"{base}.{src}")), read_corpus(files.path(f"{base}.en")),
          read_gold(files.path(f"{base}.gold")))


SPLITS = ("sample", "training", "test")


def _gold_splits(files: common.DataFiles, pair: str) -> list[str]:
  return [s for s in SPLITS if files.exists(f"eval/bucc2018/{pair}/{pair}.{s}.gold")]


def threshold_and_report_splits(splits: Sequence[str]) -> tuple[str, str]:
  """(split the threshold is chosen on, split reported) among the splits with gold."""
  fit = "sample" if "sample" in splits else splits[0]
  rest = [s for s in ("test", "training") if s in splits and s != fit]
  return fit, (rest[0] if rest else fit)


def evaluate(encode: common.EncodeFn, pairs: Optional[Sequence[str]] = None,
             data_dir: Optional[str] = None, k: int = 4, progress: bool = False,
             files: Optional[common.DataFiles] = None,
             rescoring: Optional[knn.Rescoring] = None) -> dict:
  """`pairs` None: every pair of PAIRS whose gold is supplied (at least one). `rescoring`:
  `encode`'s float vectors are searched in its quantized geometry and the candidates
  rescored (`knn.rescored_topk`)."""
  files = files or common.DataFiles("bucc", data_dir)
  missing = []
  if pairs is None:
    missing = [p for p in PAIRS if not _gold_splits(files, p)]
    pairs = [p for p in PAIRS if p not in missing]
    if not pairs:
      raise DataError(f"task bucc: no gold file for any of {', '.join(PAIRS)} (looked for "
                      f"eval/bucc2018/<pair>/<pair>.{{{','.join(SPLITS)}}}.gold)")
  subsets = []
  for pair in pairs:
    src = pair.split("-")[0]
    splits = _gold_splits(files, pair)
    if not splits:
      raise DataError(f"task bucc: no gold file for {pair} (looked for "
                      f"eval/bucc2018/{pair}/{pair}.{{{','.join(SPLITS)}}}.gold)")
    fit, report = threshold_and_report_splits(splits)
    mined = {}   # split -> (knn, id maps, gold)
    for split in dict.fromkeys((fit, report)):
      (s_ids, s_txt), (t_ids, t_txt), gold = _split_data(files, pair, split)
      s_u, s_map = _unify(s_ids, s_txt)
      t_u, t_map = _unify(t_ids, t_txt)
      x, y = mining.normalize(encode(s_u, iso3(src))), mining.normalize(encode(t_u, "eng"))
      kk = min(k, len(s_u), len(t_u))
      nn = (knn.rescored_topk(x, y, rescoring, kk, progress=progress) if rescoring
            else knn.topk(x, y, k=kk, progress=progress))
      mined[split] = (nn, s_map, t_map, gold)
    row = {"hf_subset": pair, "languages": [iso3(src), "eng"],
           "threshold_split": fit, "split": report}
    for scoring, margin in SCORINGS.items():
      scored = {sp: mining.score_candidates(m[0], margin) for sp, m in mined.items()}
      for retrieval in mining.RETRIEVALS:
        cand = {sp: candidate_pairs(scored[sp], m[1], m[2], retrieval) for sp, m in mined.items()}
        gold = mined[fit][3]
        th = mining.optimize_threshold(list(cand[fit].values()),
                                       [p in gold for p in cand[fit]], len(gold))
        p, r, f = mining.evaluate_pairs(cand[report], mined[report][3], th)
        row[f"{scoring}_{retrieval}"] = {"precision": p, "recall": r, "f1": f,
                                         "threshold": th}
    row["main_score"] = row["margin_max"]["f1"]
    row["n_gold"] = len(mined[report][3])
    subsets.append(row)
  return {"scores": {"test": subsets}, "pairs_missing": missing,
          "main_score": common.mean([r["main_score"] for r in subsets])}
