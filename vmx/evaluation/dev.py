"""Retrieval on the dev sets carved from the training corpora (model selection).

For every dev set (`vmx.data.devsets`: newstest2013, tico19) and language xx: the xx
sentences and their English translations are encoded, and each side searches the other
by cosine similarity, as Tatoeba (`tatoeba.score_language`): accuracy xx→en, en→xx,
their mean, and xSIM (ratio-margin error rate), ×100. A set's score is its languages'
mean; `mean` is the mean over every (set, language) evaluated. With `max_sentences` each
language is scored on the first that many sentences (the candidates are as many:
accuracy falls as the pool grows, so compare runs at one `max_sentences`).

Languages: the sets' own (`languages=None`), or those of the model (`model_languages`,
ISO 639-3, a language also under another code: vmx.data.languages.resolve) when given;
a set with none of them is skipped (listed in `skipped`).
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

from vmx.data import devsets
from vmx.data.languages import iso3, resolve
from vmx.evaluation import common, tatoeba


def evaluate(encode: common.EncodeFn, sets: Sequence[str] = devsets.DEFAULT_DEV_SETS,
             data_dir: Optional[str] = None, max_sentences: Optional[int] = 1000,
             languages: Optional[Sequence[str]] = None,
             model_languages: Optional[Sequence[str]] = None, progress: bool = False) -> dict:
  """{"scores": {"dev": [subset per (set, language)]}, "main_score", "sets": {set: mean},
  "skipped": [...], "seconds"}; subsets are named `<set>/<file code>` (e.g. `tico19/pt_BR`)."""
  t0 = time.time()
  sets = devsets.check_names(sets, "dev sets")
  subsets, per_set, skipped = [], {}, []
  for name in sets:
    d = devsets.dev_set(name)
    langs = [l for l in d.languages if languages is None or l in languages
             or iso3(l) in languages]
    if model_languages:
      langs = [l for l in langs if resolve(iso3(l), model_languages)]
    if not langs:
      skipped.append(name)
      continue
    texts, english = devsets.read(name, data_dir, langs, max_sentences)
    rows = {i: j for j, i in enumerate(i for i, e in enumerate(english) if e)}
    eng_vecs = encode([e for e in english if e], "eng")
    scores = []
    for lang in common.progress_iter(langs, f"dev {name}", progress):
      keep = [i for i, x in enumerate(texts[lang]) if x and i in rows]
      if len(keep) < 2:
        continue
      code = iso3(lang)
      r = tatoeba.score_language(encode([texts[lang][i] for i in keep], code),
                                 eng_vecs[[rows[i] for i in keep]])
      scores.append(r["mean"])
      subsets.append({"hf_subset": f"{name}/{lang}", "languages": [code, "eng"],
                      "main_score": r["mean"], "accuracy_xx2en": r["xx2en"],
                      "accuracy_en2xx": r["en2xx"], "xsim_error": r["xsim"], "n": r["n"]})
    per_set[name] = common.mean(scores)
  return {"scores": {"dev": subsets},
          "main_score": common.mean([s["main_score"] for s in subsets]),
          "sets": per_set, "skipped": skipped, "max_sentences": max_sentences,
          "seconds": time.time() - t0}
