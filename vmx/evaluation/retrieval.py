"""Query → knowledge-base retrieval with gold ids (VMSST's NQ / MKQA-PAQ, LAReQA, Mewsli-X style).

Data: a directory with three UTF-8 tab-separated files (no header):
  queries.tsv   qid<TAB>text[<TAB>lang]
  corpus.tsv    doc_id<TAB>text[<TAB>lang]
  qrels.tsv     qid<TAB>doc_id            (one line per relevant document)
`lang` (ISO 639-3 or 639-1) defaults to `eng`. Queries without a relevant document
are skipped (and counted); qrels naming an unknown qid or doc_id are an error.

Metrics (×100), from the top 20 documents by cosine similarity:
  R@k     fraction of queries with at least one relevant document in the top k;
  mAP@20  mean over queries of AP@20 = sum_{i<=20} P@i · rel_i / min(#relevant, 20);
  MRR@10  mean reciprocal rank of the first relevant document within the top 10.
Scores are given for all queries and per query language.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from vmx.data.languages import iso3
from vmx.errors import DataError
from vmx.evaluation import common, knn, mining

KS = (1, 5, 10, 20)
DEPTH = 20


def _read_table(path: Path, task: str, min_cols: int, max_cols: int):
  rows = []
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if not (min_cols <= len(parts) <= max_cols) or not parts[0]:
      raise DataError(f"task {task}: {path}:{i}: expected {min_cols}"
                      f"{'-' + str(max_cols) if max_cols > min_cols else ''} tab-separated "
                      f"fields, got {len(parts)}")
    rows.append((i, parts))
  return rows


def read_collection(path: Path, task="retrieval"):
  """(ids, texts, langs); duplicate ids are an error."""
  ids, texts, langs, seen = [], [], [], {}
  for i, parts in _read_table(path, task, 2, 3):
    if parts[0] in seen:
      raise DataError(f"task {task}: {path}:{i}: id {parts[0]!r} repeats line {seen[parts[0]]}")
    seen[parts[0]] = i
    ids.append(parts[0])
    texts.append(parts[1])
    langs.append(iso3(parts[2]) if len(parts) > 2 and parts[2] else "eng")
  return ids, texts, langs


def read_qrels(path: Path, qids, dids, task="retrieval") -> dict[str, set[str]]:
  qset, dset = set(qids), set(dids)
  rel = defaultdict(set)
  for i, parts in _read_table(path, task, 2, 2):
    if parts[0] not in qset:
      raise DataError(f"task {task}: {path}:{i}: unknown query id {parts[0]!r}")
    if parts[1] not in dset:
      raise DataError(f"task {task}: {path}:{i}: unknown document id {parts[1]!r}")
    rel[parts[0]].add(parts[1])
  return rel


def encode_by_language(encode, texts: Sequence[str], langs: Sequence[str]) -> np.ndarray:
  """One encode call per language; rows back in input order."""
  out = None
  for lang in dict.fromkeys(langs):
    idx = [i for i, l in enumerate(langs) if l == lang]
    e = encode([texts[i] for i in idx], lang)
    if out is None:
      out = np.zeros((len(texts), e.shape[1]), np.float32)
    out[idx] = e
  return out


def ranking_metrics(ranked_ids: Sequence[Sequence[str]], relevant: Sequence[set],
                    ks: Sequence[int] = KS) -> dict:
  """R@k, mAP@20 and MRR@10 (×100) of ranked id lists against relevant-id sets."""
  r_at = {k: [] for k in ks}
  ap, rr = [], []
  for ranked, rel in zip(ranked_ids, relevant):
    hits = np.array([d in rel for d in ranked[:DEPTH]], bool)
    for k in ks:
      r_at[k].append(hits[:k].any())
    prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    ap.append(float(np.sum(prec * hits)) / min(len(rel), DEPTH))
    first = np.flatnonzero(hits[:10])
    rr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
  out = {f"recall_at_{k}": 100 * float(np.mean(v)) for k, v in r_at.items()}
  out["map_at_20"] = 100 * float(np.mean(ap))
  out["mrr_at_10"] = 100 * float(np.mean(rr))
  out["n"] = len(ap)
  return out


def evaluate(encode, directory: str, ks: Sequence[int] = KS, progress: bool = False,
             files: Optional[common.DataFiles] = None, name: Optional[str] = None) -> dict:
  d = Path(directory)
  if not d.is_dir():
    raise DataError(f"task retrieval: {d} is not a directory (expected queries.tsv, "
                    f"corpus.tsv, qrels.tsv)")
  files = files or common.DataFiles("retrieval")
  path = lambda n: files.path(str((d / n).absolute()))
  qids, qtexts, qlangs = read_collection(path("queries.tsv"))
  dids, dtexts, dlangs = read_collection(path("corpus.tsv"))
  rel = read_qrels(path("qrels.tsv"), qids, dids)
  keep = [i for i, q in enumerate(qids) if rel.get(q)]
  if not keep:
    raise DataError(f"task retrieval: {d / 'qrels.tsv'}: no query has a relevant document")
  q_emb = encode_by_language(encode, [qtexts[i] for i in keep], [qlangs[i] for i in keep])
  d_emb = encode_by_language(encode, dtexts, dlangs)
  depth = min(DEPTH, len(dids))
  nn = knn.topk(mining.normalize(q_emb), mining.normalize(d_emb), k=depth, progress=progress)
  ranked = [[dids[j] for j in row] for row in nn.row_idx]
  relevant = [rel[qids[i]] for i in keep]
  langs = [qlangs[i] for i in keep]
  all_langs = sorted(set(langs) | set(dlangs))
  subsets = [{"hf_subset": "all", "languages": all_langs,
              **ranking_metrics(ranked, relevant, ks)}]
  if len(set(langs)) > 1:
    for lang in sorted(set(langs)):
      idx = [i for i, l in enumerate(langs) if l == lang]
      subsets.append({"hf_subset": lang, "languages": sorted({lang} | set(dlangs)),
                      **ranking_metrics([ranked[i] for i in idx], [relevant[i] for i in idx], ks)})
  for s in subsets:
    s["main_score"] = s["map_at_20"]
  return {"scores": {"test": subsets}, "main_score": subsets[0]["main_score"],
          "n_skipped_queries": len(qids) - len(keep), "name": name or d.name}
