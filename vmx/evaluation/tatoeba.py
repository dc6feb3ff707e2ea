"""Tatoeba similarity search (LASER Tatoeba v1, XTREME): accuracy both ways and xSIM.

For language xx with aligned files tatoeba.xx-eng.{xx,eng}: cosine similarity of
every xx sentence to every English one; xx→en accuracy is the fraction whose
nearest English sentence is its translation, en→xx the converse; `mean` is their
average. xSIM (LASER) is the xx→en ERROR rate when candidates are rescored with
the ratio margin (k = 4; `mining.xsim_errors`). Results are ×100.

Averages: `mean` over every language evaluated (all 112 of Tatoeba v1 with
`--languages=all`: VMSST's and LASER's figure; `n_languages` says how many), and groups:
`xtreme36` (XTREME's 36 languages, its Tatoeba figure), `head` / `long_tail` (EMMA-X's
split: A.1's head list of 42 codes, XTREME's 36 plus en az lt pl uk ro, and the rest),
`outside_use` (the languages outside multilingual USE's 16, Yang et al. 2020, "Multilingual
Universal Sentence Encoder for Semantic Retrieval", §2: the long tail a small model has to
win on) and `own` (the model's training languages, when given, under their code or another:
`pes` counts for a model trained on `fas`, vmx.data.languages.resolve). A group's mean
is over its languages that were evaluated; compare figures only at equal `n_languages`.
"""
from __future__ import annotations

import re
import time
from typing import Callable, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from vmx.data import download, readers
from vmx.data.languages import resolve
from vmx.errors import DataError
from vmx.evaluation import knn, mining

EncodeFn = Callable[[list, str], np.ndarray]

# XTREME's Tatoeba languages, as Tatoeba v1 (ISO 639-3) codes.
XTREME36 = ("afr", "ara", "ben", "bul", "cmn", "deu", "ell", "est", "eus", "fin", "fra", "heb",
            "hin", "hun", "ind", "ita", "jav", "jpn", "kat", "kaz", "kor", "mal", "mar", "nld",
            "pes", "por", "rus", "spa", "swh", "tam", "tel", "tgl", "tha", "tur", "urd", "vie")
# EMMA-X A.1's head languages (its 42 codes less English, the pivot): XTREME's 36 plus
# az, lt, pl, uk and ro.
EMMAX_HEAD = tuple(sorted(set(XTREME36) | {"aze", "lit", "pol", "ukr", "ron"}))
# InfoXLM's 14 languages with parallel data (§4.1, Table 9): its Tables 2 / 3 split and the
# languages of its Fig. 1 (accuracy per layer, xx->en).
INFOXLM_PARALLEL14 = ("ara", "bul", "deu", "ell", "spa", "fra", "hin", "rus", "swh", "tha",
                      "tur", "urd", "vie", "cmn")
# The 15 non-English languages of multilingual USE (Yang et al. 2020, §2: ar, zh-cn, zh-tw,
# nl, fr, de, it, ja, ko, pl, pt, es, th, tr, ru), as Tatoeba v1 codes (both Chinese: cmn).
USE16 = ("ara", "cmn", "deu", "fra", "ita", "jpn", "kor", "nld", "pol", "por", "rus", "spa",
         "tha", "tur")
METRICS = ("xx2en", "en2xx", "mean", "xsim")


def tatoeba_files(lang: str, data_dir: Optional[str] = None):
  rel = f"eval/tatoeba/v1/tatoeba.{lang}-eng"
  if not download.available(f"{rel}.{lang}", data_dir):
    raise DataError(f"tatoeba: no test set for language {lang!r} ({rel}.{lang})")
  return download.resolve(f"{rel}.{lang}", data_dir), download.resolve(f"{rel}.eng", data_dir)


def available_languages(data_dir: Optional[str] = None) -> list[str]:
  """Languages with a Tatoeba test set (in the data dir, else in the registry)."""
  names = download.file_names("eval/tatoeba/v1", data_dir)
  return sorted({m.group(1) for n in names if (m := re.fullmatch(r"tatoeba\.(\w+)-eng\.\1", n))})


def load_tatoeba(lang: str, data_dir: Optional[str] = None):
  src, eng = tatoeba_files(lang, data_dir)
  pairs = list(readers.read_parallel(src, eng, empty_lines="error"))
  return [p[0] for p in pairs], [p[1] for p in pairs]


def score_language(src_NxD, eng_NxD, margin: str = "ratio", k: int = 4,
                   rescoring: Optional[knn.Rescoring] = None) -> dict:
  """Top-1 accuracy both ways and xSIM, from one kNN search of the aligned rows (with
  `rescoring`: of float vectors, searched quantized and rescored, `knn.rescored_topk`;
  xSIM's margin then mixes the two directions' scores, each a float query against the
  other side's quantized vectors)."""
  src, eng, k = mining.normalize(src_NxD), mining.normalize(eng_NxD), min(k, len(src_NxD))
  nn = knn.rescored_topk(src, eng, rescoring, k) if rescoring else knn.topk(src, eng, k=k)
  gold = np.arange(len(src_NxD))
  a = 100.0 * float(np.mean(nn.row_idx[:, 0] == gold))
  b = 100.0 * float(np.mean(nn.col_idx[:, 0] == gold))
  err, n = mining.xsim_errors(nn, margin)
  return {"xx2en": a, "en2xx": b, "mean": (a + b) / 2, "xsim": 100.0 * err / n, "n": n}


def group_means(per: dict, langs) -> dict:
  """Means of METRICS over the languages of `langs` that `per` has, and their count."""
  rows = [per[l] for l in langs if l in per]
  out = {m: float(np.mean([r[m] for r in rows])) if rows else float("nan") for m in METRICS}
  out["n_languages"] = len(rows)
  return out


def evaluate(encode: EncodeFn, languages: Sequence[str], data_dir: Optional[str] = None,
             english: str = "eng", progress: bool = False, margin: str = "ratio",
             own_languages: Optional[Sequence[str]] = None,
             rescoring: Optional[knn.Rescoring] = None) -> dict:
  """{"languages": {xx: {xx2en, en2xx, mean, xsim, n}}, "mean": {...}, "groups":
  {"xtreme36": ..., "head": ..., "long_tail": ..., "outside_use": ..., ["own": ...]},
  "seconds": t}.

  `encode(sentences, lang)` returns one vector per sentence; `english` is the
  language code the encoder knows English by. `rescoring`: `encode`'s float vectors are
  searched in its quantized geometry and the candidates rescored (`knn.rescored_topk`).
  """
  t0 = time.time()
  per = {}
  it = languages
  if progress:
    it = tqdm(languages, desc="tatoeba", unit="lang", leave=False)
  for lang in it:
    xx, en = load_tatoeba(lang, data_dir)
    per[lang] = score_language(encode(xx, lang), encode(en, english), margin,
                               rescoring=rescoring)
  mean = group_means(per, list(per))
  groups = {"xtreme36": group_means(per, XTREME36), "head": group_means(per, EMMAX_HEAD),
            "long_tail": group_means(per, [l for l in per if l not in EMMAX_HEAD]),
            "outside_use": group_means(per, [l for l in per if l not in USE16])}
  if own_languages:
    groups["own"] = group_means(per, [l for l in per if resolve(l, own_languages)])
  return {"languages": per, "mean": mean, "groups": groups, "seconds": time.time() - t0}
