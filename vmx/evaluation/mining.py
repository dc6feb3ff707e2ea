"""Bitext mining by cosine or margin scoring (Artetxe & Schwenk 2019a; LASER's mine_bitexts.py).

For sources x and targets y (rows L2-normalized inside), with k nearest
neighbours found in both directions from one pass (`knn.bidirectional_topk`):

  score(x, y) = margin( cos(x, y), (mean_k cos(x, NN_k(x)) + mean_k cos(y, NN_k(y))) / 2 )

margin is  ratio: a / b  (the paper's and LASER's default),  distance: a - b,
absolute: a  (plain cosine). Each source's candidates are its k nearest targets,
rescored; the best one is its forward pair (`forward`), each target's best source
is its backward pair (`backward`); `intersect` keeps pairs that are both;
`max` merges forward and backward pairs greedily by score, each sentence used
once (LASER's `--retrieval max`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from vmx.evaluation import knn as knn_lib

MARGINS = ("ratio", "distance", "absolute")
RETRIEVALS = ("forward", "backward", "intersect", "max")


def normalize(x) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def apply_margin(a, b, margin: str):
  if margin == "ratio":
    return a / b
  if margin == "distance":
    return a - b
  if margin == "absolute":
    return a
  raise ValueError(f"margin={margin!r}: expected one of {MARGINS}")


class Scored(NamedTuple):
  """fwd_idx/fwd_scores [N, k]: each source's candidate targets and their scores;
  bwd_idx/bwd_scores [M, k] the converse."""
  fwd_idx: np.ndarray
  fwd_scores: np.ndarray
  bwd_idx: np.ndarray
  bwd_scores: np.ndarray


def score_candidates(nn: knn_lib.TopK, margin: str = "ratio") -> Scored:
  """Margin scores of every source's k candidates and every target's k candidates."""
  x_mean = nn.row_vals.mean(axis=1)      # mean similarity of x_i to its k NN in y
  y_mean = nn.col_vals.mean(axis=1)
  fwd = apply_margin(nn.row_vals, (x_mean[:, None] + y_mean[nn.row_idx]) / 2, margin)
  bwd = apply_margin(nn.col_vals, (y_mean[:, None] + x_mean[nn.col_idx]) / 2, margin)
  return Scored(nn.row_idx, fwd, nn.col_idx, bwd)


def margin_scores(x_NxD, y_MxD, k: int = 4, margin: str = "ratio", **knn_kw) -> Scored:
  """Candidates and margin scores from normalized embeddings (one blocked kNN pass)."""
  nn = knn_lib.topk(normalize(x_NxD), normalize(y_MxD), k=k, **knn_kw)
  return score_candidates(nn, margin)


def best_pairs(sc: Scored, retrieval: str = "max"):
  """(src_idx, tgt_idx, score) arrays of the mined pairs, best score first."""
  n, m = len(sc.fwd_idx), len(sc.bwd_idx)
  fb = sc.fwd_scores.argmax(axis=1)
  fwd_best = sc.fwd_idx[np.arange(n), fb]
  fwd_score = sc.fwd_scores[np.arange(n), fb]
  bb = sc.bwd_scores.argmax(axis=1)
  bwd_best = sc.bwd_idx[np.arange(m), bb]
  bwd_score = sc.bwd_scores[np.arange(m), bb]
  if retrieval == "forward":
    src, tgt, score = np.arange(n), fwd_best, fwd_score
  elif retrieval == "backward":
    src, tgt, score = bwd_best, np.arange(m), bwd_score
  elif retrieval == "intersect":
    keep = bwd_best[fwd_best] == np.arange(n)
    src, tgt, score = np.arange(n)[keep], fwd_best[keep], fwd_score[keep]
  elif retrieval == "max":
    src_all = np.concatenate([np.arange(n), bwd_best])
    tgt_all = np.concatenate([fwd_best, np.arange(m)])
    score_all = np.concatenate([fwd_score, bwd_score])
    seen_s, seen_t = np.zeros(n, bool), np.zeros(m, bool)
    keep = []
    for i in np.argsort(-score_all, kind="stable"):
      s, t = src_all[i], tgt_all[i]
      if not seen_s[s] and not seen_t[t]:
        seen_s[s] = seen_t[t] = True
        keep.append(i)
    keep = np.asarray(keep, np.int64)
    src, tgt, score = src_all[keep], tgt_all[keep], score_all[keep]
  else:
    raise ValueError(f"retrieval={retrieval!r}: expected one of {RETRIEVALS}")
  order = np.argsort(-score, kind="stable")
  return src[order], tgt[order], score[order]


def prf(n_correct: int, n_extracted: int, n_gold: int) -> tuple[float, float, float]:
  """Precision, recall, F1, ×100."""
  p = n_correct / n_extracted if n_extracted else 0.0
  r = n_correct / n_gold if n_gold else 0.0
  f = 2 * p * r / (p + r) if p + r else 0.0
  return 100 * p, 100 * r, 100 * f


def optimize_threshold(scores, correct, n_gold: int) -> float:
  """The threshold maximizing F1 when keeping candidates with score >= threshold.

  `scores`/`correct` describe the candidate pairs (any order). As in LASER's
  bucc.py the threshold is the midpoint between the score of the last kept
  candidate at the best F1 and the next one (or just below it, if it is last).
  """
  scores = np.asarray(scores, np.float64)
  order = np.argsort(-scores, kind="stable")
  s = scores[order]
  c = np.cumsum(np.asarray(correct, bool)[order])
  extracted = np.arange(1, len(s) + 1)
  with np.errstate(invalid="ignore", divide="ignore"):
    f1 = np.where(c > 0, 2 * c / (extracted + n_gold), 0.0)   # = 2PR/(P+R)
  # ties: a threshold keeps all candidates of equal score, so only score changes count
  last_of_run = np.r_[s[1:] != s[:-1], True]
  f1 = np.where(last_of_run, f1, -1.0)
  if len(s) == 0 or f1.max() <= 0:
    return float("inf")
  i = int(np.argmax(f1))
  if i + 1 < len(s):
    return float((s[i] + s[i + 1]) / 2)
  return float(np.nextafter(s[i], -np.inf))


def evaluate_pairs(pairs_scores: dict, gold: set, threshold: float):
  """P/R/F1 ×100 of the candidate pairs with score >= threshold against gold."""
  kept = [p for p, s in pairs_scores.items() if s >= threshold]
  n_correct = sum(p in gold for p in kept)
  return prf(n_correct, len(kept), len(gold))


def xsim_errors(nn: knn_lib.TopK, margin: str = "ratio", gold: Optional[np.ndarray] = None):
  """xSIM (LASER): number of sources whose best-scoring target is not the gold one.

  With margin 'absolute' this is the nearest neighbour by cosine; otherwise the
  source's k candidates are rescored with the margin. Gold target of source i
  is `gold[i]` (default i: aligned rows). Returns (errors, n).
  """
  sc = score_candidates(nn, margin)
  pred = sc.fwd_idx[np.arange(len(sc.fwd_idx)), sc.fwd_scores.argmax(axis=1)]
  gold = np.arange(len(pred)) if gold is None else np.asarray(gold)
  return int(np.sum(pred != gold)), len(pred)
