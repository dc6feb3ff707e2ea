"""Zero-shot cross-lingual transfer probe on frozen embeddings (MLDoc / XNLI style).

A scikit-learn classifier (standardized features, multinomial logistic
regression) is trained on embeddings of ONE language and tested on the others.
Files: UTF-8 TSV per language, `text<TAB>label` (single sentences) or
`text_a<TAB>text_b<TAB>label` (pairs; features [u, v, |u - v|, u * v] as in
SentEval/InferSent), named by a pattern with `{lang}`.

With only a test pattern (XNLI's dev files, line-aligned across languages), the
source language's first `n_train` lines train the probe and lines `n_train:` of
every language are the test set, so no test item (in any language) is a
translation of a training item. With a train pattern, the probe trains on the
source language's train file and tests on each language's whole test file.
Accuracy ×100; main score = mean over the target languages (source excluded).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from vmx.errors import DataError
from vmx.evaluation import common

XNLI_LANGS = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi",
              "zh")
XNLI_PATTERN = "eval/xnli/dev-{lang}.tsv"
XNLI_N_TRAIN = 1494   # 498 premises x 3 hypotheses; the remaining 996 lines are the test set


def read_labeled(path, task="transfer"):
  """(columns: list of text lists, labels). 2 fields = single text, 3 = pair."""
  rows = []
  n_fields = None
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if n_fields is None:
      n_fields = len(parts)
      if n_fields not in (2, 3):
        raise DataError(f"task {task}: {path}:{i}: expected text<TAB>label or "
                        f"text_a<TAB>text_b<TAB>label, got {len(parts)} fields")
    if len(parts) != n_fields:
      raise DataError(f"task {task}: {path}:{i}: {len(parts)} fields, line 1 had {n_fields}")
    rows.append(parts)
  if not rows:
    raise DataError(f"task {task}: {path}: empty")
  cols = [[r[j] for r in rows] for j in range(n_fields - 1)]
  return cols, [r[-1] for r in rows]


def features(encode, cols, lang) -> np.ndarray:
  if len(cols) == 1:
    return encode(cols[0], lang)
  u, v = encode(cols[0], lang), encode(cols[1], lang)
  return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def make_probe(seed: int = 0, c: float = 1.0):
  from sklearn.linear_model import LogisticRegression  # lazy: scikit-learn (slow import, used by this task only)
  from sklearn.pipeline import make_pipeline  # lazy: scikit-learn
  from sklearn.preprocessing import StandardScaler  # lazy: scikit-learn
  return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000,
                                                            random_state=seed))


def evaluate(encode, test_pattern: str = XNLI_PATTERN, languages: Sequence[str] = XNLI_LANGS,
             source: str = "en", train_pattern: Optional[str] = None,
             n_train: Optional[int] = XNLI_N_TRAIN, c: float = 1.0,
             data_dir: Optional[str] = None, progress: bool = False,
             files: Optional[common.DataFiles] = None, name: str = "xnli") -> dict:
  files = files or common.DataFiles(f"transfer/{name}", data_dir)
  task = files.task
  if train_pattern:
    tr_cols, tr_y = read_labeled(files.path(train_pattern.format(lang=source)), task)
    test_slice = slice(None)
  else:
    cols, y = read_labeled(files.path(test_pattern.format(lang=source)), task)
    if not n_train or n_train >= len(y):
      raise DataError(f"task {task}: n_train={n_train} must be in [1, {len(y)}) to split "
                      f"{test_pattern.format(lang=source)}")
    tr_cols, tr_y = [c_[:n_train] for c_ in cols], y[:n_train]
    n_source = len(y)
    test_slice = slice(n_train, None)
  probe = make_probe(c=c).fit(features(encode, tr_cols, common.iso3(source)), tr_y)
  subsets = []
  for lang in common.progress_iter(languages, f"transfer {name}", progress):
    cols, y = read_labeled(files.path(test_pattern.format(lang=lang)), task)
    if not train_pattern and len(y) != n_source:
      raise DataError(f"task {task}: {test_pattern.format(lang=lang)} has {len(y)} lines, "
                      f"{test_pattern.format(lang=source)} has {n_source}: the files must be "
                      f"line-aligned translations to split them at n_train={n_train}")
    cols, y = [c_[test_slice] for c_ in cols], y[test_slice]
    unknown = sorted(set(y) - set(probe.classes_))
    if unknown:
      raise DataError(f"task {task}: {test_pattern.format(lang=lang)}: labels {unknown} not "
                      f"in the training labels {list(probe.classes_)}")
    acc = 100 * float(np.mean(probe.predict(features(encode, cols, common.iso3(lang))) ==
                              np.asarray(y)))
    subsets.append({"hf_subset": f"{source}-{lang}", "languages": [common.iso3(lang)],
                    "main_score": acc, "accuracy": acc, "n": len(y),
                    "zero_shot": lang != source})
  targets = [s["accuracy"] for s in subsets if s["zero_shot"]]
  return {"scores": {"test": subsets}, "main_score": common.mean(targets),
          "source": source, "n_train": len(tr_y)}
