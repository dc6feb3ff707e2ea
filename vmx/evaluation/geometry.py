"""Geometry of the embedding space on an N-way parallel set (EMMA-X, appendix B).

Input: embeddings E[l] [n, d] of the same n sentences in each language l.
* invariance (EMMA-X Eq. 16): mean over ordered language pairs a != b of
  KL(P_a || P_b) between Gaussians fitted to each language's embeddings, i.e. half
  the mean symmetric KL over unordered pairs (lower = languages share one
  distribution). Covariance `diag` (default: well-defined when n < d) or `full`
  (Ledoit–Wolf shrinkage).
* canonical form: Calinski–Harabasz index (scikit-learn) of all embeddings with
  the sentence id as cluster label (higher = translations cluster tightly and
  apart from other sentences).
* isotropy: principal ratio (Mu & Viswanath 2018), min_c Z(c) / max_c Z(c) with
  Z(c) = sum_i exp(c^T w_i) over the eigenvectors c of W^T W (both signs, so the
  value does not depend on the solver's sign choice); 1 = isotropic.
Embeddings are L2-normalized first (the cosine geometry that retrieval uses).

The paper's equations exactly, beside these variants (`*_eq16`, `*_eq17`, `*_eq18`):
* Eq. 16: each language's Gaussian has the full scatter matrix Σ (x − μ)(x − μ)^T, with no
  1/n, as its covariance. With n ≤ d sentences the scatter is singular and the KL is
  infinite: NaN, reported as such.
* Eq. 17: c_h = [L · Σ_k ‖c_k − c‖²] / [Σ_k Σ_{s∈k} ‖s − c_k‖²], with n clusters (the
  sentences) of L translations: between- over within-cluster scatter, without the
  Calinski–Harabasz factor (N − K) / (K − 1). So eq17 = CH · (K − 1) / (N − K).
* Eq. 18: the principal ratio over the eigenvectors as the solver returns them (no
  negatives), so it depends on the solver's sign choice; the variant above does not.
"""
from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
from scipy.special import logsumexp

from vmx.data.languages import iso3
from vmx.errors import DataError
from vmx.evaluation import common, mining

# newstest2013 is 6-way parallel (cs de en es fr ru): the default N-way set.
DEFAULT_FILES = {l: f"train/wmt-newstest-multiway/2013/newstest2013.{l}.gz"
                 for l in ("cs", "de", "en", "es", "fr", "ru")}


def gaussian(x_NxD, cov: str = "diag"):
  x = np.asarray(x_NxD, np.float64)
  mu = x.mean(axis=0)
  if cov == "diag":
    return mu, x.var(axis=0) + 1e-8
  if cov == "full":
    from sklearn.covariance import LedoitWolf  # lazy: scikit-learn (slow import, used by this task only)
    return mu, LedoitWolf().fit(x).covariance_
  raise ValueError(f"cov={cov!r}: expected 'diag' or 'full'")


def kl_gaussian(p, q) -> float:
  """KL(N(mu_p, S_p) || N(mu_q, S_q)); S diagonal (1-D variances) or full."""
  (mp, sp), (mq, sq) = p, q
  diff = mq - mp
  if sp.ndim == 1:
    return 0.5 * float(np.sum(sp / sq + diff ** 2 / sq - 1 + np.log(sq) - np.log(sp)))
  return _kl_full(_prepared(p), _prepared(q))


def _prepared(g):
  """(mean, covariance, its inverse, its log-determinant): a full Gaussian ready for many
  KLs (each then costs O(d^2), not an inversion)."""
  mu, cov = g
  return mu, cov, np.linalg.inv(cov), np.linalg.slogdet(cov)[1]


def _kl_full(p, q) -> float:
  (mp, sp, _, logdet_p), (mq, _, sq_inv, logdet_q) = p, q
  diff = mq - mp
  # trace(S_q^-1 S_p) as an elementwise sum (S_p symmetric)
  return 0.5 * float(np.sum(sq_inv * sp) + diff @ sq_inv @ diff - len(mp) + logdet_q
                     - logdet_p)


def _mean_kl(g: dict) -> float:
  """Mean over ordered pairs of languages of KL(g[a] || g[b])."""
  if next(iter(g.values()))[1].ndim == 1:
    return float(np.mean([kl_gaussian(g[a], g[b])
                          for a, b in itertools.permutations(sorted(g), 2)]))
  prep = {l: _prepared(v) for l, v in g.items()}
  return float(np.mean([_kl_full(prep[a], prep[b])
                        for a, b in itertools.permutations(sorted(prep), 2)]))


def invariance(embs: dict, cov: str = "diag") -> float:
  return _mean_kl({l: gaussian(mining.normalize(e), cov) for l, e in embs.items()})


def canonical_form(embs: dict) -> float:
  from sklearn.metrics import calinski_harabasz_score  # lazy: scikit-learn (slow import, used by this task only)
  x = np.concatenate([mining.normalize(e) for e in embs.values()])
  labels = np.concatenate([np.arange(len(e)) for e in embs.values()])
  return float(calinski_harabasz_score(x, labels))


def principal_ratios(w_NxD) -> tuple[float, float]:
  """min_c Z(c) / max_c Z(c), Z(c) = sum_i exp(c^T w_i), over the eigenvectors c of W^T W:
  (with their negatives too: vmx's variant, independent of the solver's signs; the
  eigenvectors as numpy's eigh returns them: Eq. 18). One eigendecomposition for both."""
  w = np.asarray(w_NxD, np.float64)
  _, vecs = np.linalg.eigh(w.T @ w)
  proj = w @ vecs                                        # [n, d]: c^T w_i for each c
  pos, neg = logsumexp(proj, axis=0), logsumexp(-proj, axis=0)
  both = np.concatenate([pos, neg])
  return float(np.exp(both.min() - both.max())), float(np.exp(pos.min() - pos.max()))


def principal_ratio(w_NxD) -> float:
  return principal_ratios(w_NxD)[0]


def _stacked(embs: dict) -> np.ndarray:
  return np.concatenate([mining.normalize(e) for e in embs.values()])


def isotropy(embs: dict) -> float:
  return principal_ratio(_stacked(embs))


def invariance_eq16(embs: dict) -> float:
  """Eq. 16: mean over ordered pairs of KL between Gaussians with the full scatter matrix
  (no 1/n) as covariance; NaN when a scatter matrix is singular (n <= d)."""
  g = {}
  for l, e in embs.items():
    x = np.asarray(mining.normalize(e), np.float64)
    mu = x.mean(axis=0)
    scatter = (x - mu).T @ (x - mu)
    if np.linalg.slogdet(scatter)[0] <= 0:
      return float("nan")
    g[l] = (mu, scatter)
  return _mean_kl(g)


def canonical_form_eq17(embs: dict) -> float:
  """Eq. 17: L · Σ_k ‖c_k − c‖² / Σ_k Σ_{s∈k} ‖s − c_k‖² (clusters: the sentences)."""
  x_LxNxD = np.stack([mining.normalize(e) for e in embs.values()]).astype(np.float64)
  c_NxD = x_LxNxD.mean(axis=0)
  between = x_LxNxD.shape[0] * np.sum((c_NxD - c_NxD.mean(axis=0)) ** 2)
  within = np.sum((x_LxNxD - c_NxD) ** 2)
  return float(between / within)


def isotropy_eq18(embs: dict) -> float:
  """Eq. 18: min_v Σ_e exp(v^T e) / max_v Σ_e exp(v^T e) over the eigenvectors v (as
  numpy's eigh returns them) of W^T W."""
  return principal_ratios(_stacked(embs))[1]


def all_metrics(embs: dict, cov: str = "diag") -> dict:
  """The equations as printed and vmx's variants, of {language: embeddings [n, d]}."""
  pr, pr_eq18 = principal_ratios(_stacked(embs))
  return {"invariance_kl": invariance(embs, cov), "canonical_form_ch": canonical_form(embs),
          "isotropy_pr": pr, "invariance_kl_eq16": invariance_eq16(embs),
          "canonical_form_eq17": canonical_form_eq17(embs), "isotropy_eq18": pr_eq18}


def load_nway(files: common.DataFiles, paths: dict, n: Optional[int] = None):
  """{lang3: sentences} of line-aligned files; unequal lengths are an error."""
  texts = {}
  for lang, rel in paths.items():
    lines = common.read_lines(files.path(rel), files.task)
    texts[iso3(lang)] = lines[:n] if n else lines
  lens = {l: len(t) for l, t in texts.items()}
  if len(set(lens.values())) != 1:
    raise DataError(f"task {files.task}: N-way files differ in length: {lens} ({paths})")
  if len(texts) < 2:
    raise DataError(f"task {files.task}: need at least 2 languages, got {list(paths)}")
  return texts


def evaluate(encode, paths: Optional[dict] = None, n: int = 1000, cov: str = "diag",
             data_dir: Optional[str] = None, progress: bool = False,
             files: Optional[common.DataFiles] = None) -> dict:
  files = files or common.DataFiles("geometry", data_dir)
  texts = load_nway(files, paths or DEFAULT_FILES, n)
  embs = {l: encode(t, l) for l, t in common.progress_iter(texts.items(), "geometry", progress)}
  scores = {**all_metrics(embs, cov), "n_sentences": len(next(iter(texts.values()))),
            "covariance": cov}
  subset = {"hf_subset": "default", "languages": sorted(embs), "main_score":
            scores["invariance_kl"], **scores}
  return {"scores": {"test": [subset]}, "main_score": subset["main_score"],
          "embeddings": embs}
