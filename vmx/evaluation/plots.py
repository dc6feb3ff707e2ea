"""Figures of the evaluation harness (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import io

import numpy as np

from vmx import storage
from vmx.evaluation.mining import normalize


def _plt():
  import matplotlib  # lazy: matplotlib (slow import, plots only)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # lazy: matplotlib
  return plt


def _save(fig, path):
  """PNG at `path` (local or remote: vmx/storage.py), written whole."""
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=120)
  _plt().close(fig)
  storage.write_atomic(path, buf.getvalue())


def tatoeba_bars(result: dict, path):
  """Per-language Tatoeba accuracy (xx→en and en→xx), languages sorted by their mean."""
  plt = _plt()
  rows = sorted(result["scores"]["test"], key=lambda s: -s["main_score"])
  langs = [s["languages"][0] for s in rows]
  x = np.arange(len(langs))
  fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(langs) + 2), 4))
  ax.bar(x - 0.2, [s["accuracy_xx2en"] for s in rows], 0.4, label="xx→en")
  ax.bar(x + 0.2, [s["accuracy_en2xx"] for s in rows], 0.4, label="en→xx")
  ax.set_xticks(x, langs, rotation=90, fontsize=7)
  ax.set_ylabel("accuracy (%)")
  ax.set_ylim(0, 100)
  ax.set_title(f"Tatoeba: mean {result['main_score']:.1f} over {len(langs)} languages")
  ax.legend()
  fig.tight_layout()
  _save(fig, path)


def projection(embs: dict, path, n_points: int = 200, seed: int = 0):
  """2-D PCA of N-way parallel embeddings, coloured by language (EMMA-X Fig. 2 style).

  Translations of one sentence should fall together; language clusters mean the
  space encodes language rather than meaning.
  """
  from sklearn.decomposition import PCA  # lazy: scikit-learn
  plt = _plt()
  n = len(next(iter(embs.values())))
  idx = np.random.default_rng(seed).permutation(n)[:n_points]
  langs = sorted(embs)
  x = np.concatenate([normalize(embs[l])[idx] for l in langs])
  xy = PCA(n_components=2, random_state=seed).fit_transform(x)
  fig, ax = plt.subplots(figsize=(6, 6))
  for i, l in enumerate(langs):
    p = xy[i * len(idx):(i + 1) * len(idx)]
    ax.scatter(p[:, 0], p[:, 1], s=6, alpha=0.6, label=l)
  ax.set_title(f"{len(idx)} sentences x {len(langs)} languages (PCA)")
  ax.legend(markerscale=3, fontsize=8)
  fig.tight_layout()
  _save(fig, path)
