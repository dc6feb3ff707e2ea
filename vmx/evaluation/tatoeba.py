"""Tatoeba similarity search (LASER Tatoeba v1, XTREME): accuracy in both directions.

For language xx with aligned files tatoeba.xx-eng.{xx,eng}: cosine similarity of
every xx sentence to every English one; xx→en accuracy is the fraction whose
nearest English sentence is its translation, en→xx the converse; `mean` is
their average. Results are ×100.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np

from vmx.data import download, readers

EncodeFn = Callable[[list, str], np.ndarray]


def tatoeba_files(lang: str, data_dir: Optional[str] = None):
  rel = f"eval/tatoeba/v1/tatoeba.{lang}-eng"
  if download.configured_data_dir(data_dir) is None and f"{rel}.{lang}" not in download.registry():
    raise download.DataError(f"tatoeba: no test set for language {lang!r} ({rel}.{lang})")
  return download.resolve(f"{rel}.{lang}", data_dir), download.resolve(f"{rel}.eng", data_dir)


def load_tatoeba(lang: str, data_dir: Optional[str] = None):
  src, eng = tatoeba_files(lang, data_dir)
  pairs = list(readers.read_parallel(src, eng, empty_lines="error"))
  return [p[0] for p in pairs], [p[1] for p in pairs]


def _normalize(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def retrieval_accuracy(src_NxD: np.ndarray, tgt_NxD: np.ndarray) -> tuple[float, float]:
  """(src→tgt, tgt→src) top-1 accuracy ×100 of aligned rows under cosine similarity."""
  sim = _normalize(src_NxD) @ _normalize(tgt_NxD).T
  gold = np.arange(sim.shape[0])
  return (100.0 * float(np.mean(sim.argmax(1) == gold)),
          100.0 * float(np.mean(sim.argmax(0) == gold)))


def evaluate(encode: EncodeFn, languages: Sequence[str], data_dir: Optional[str] = None,
             english: str = "eng", progress: bool = False) -> dict:
  """{"languages": {xx: {xx2en, en2xx, mean, n}}, "mean": {...}, "seconds": t}.

  `encode(sentences, lang)` returns one vector per sentence; `english` is the
  language code the encoder knows English by.
  """
  t0 = time.time()
  per = {}
  it = languages
  if progress:
    from tqdm.auto import tqdm
    it = tqdm(languages, desc="tatoeba", unit="lang")
  for lang in it:
    xx, en = load_tatoeba(lang, data_dir)
    a, b = retrieval_accuracy(encode(xx, lang), encode(en, english))
    per[lang] = {"xx2en": a, "en2xx": b, "mean": (a + b) / 2, "n": len(xx)}
  mean = {k: float(np.mean([v[k] for v in per.values()])) for k in ("xx2en", "en2xx", "mean")}
  return {"languages": per, "mean": mean, "seconds": time.time() - t0}


def format_table(results: dict) -> str:
  lines = [f"{'lang':<10}{'xx→en':>8}{'en→xx':>8}{'mean':>8}{'n':>7}"]
  for lang, r in results["languages"].items():
    lines.append(f"{lang:<10}{r['xx2en']:>8.2f}{r['en2xx']:>8.2f}{r['mean']:>8.2f}{r['n']:>7}")
  m = results["mean"]
  lines.append(f"{'mean':<10}{m['xx2en']:>8.2f}{m['en2xx']:>8.2f}{m['mean']:>8.2f}")
  return "\n".join(lines)
