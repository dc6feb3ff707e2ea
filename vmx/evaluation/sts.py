"""Semantic textual similarity: cosine of the two sentence embeddings vs gold scores.

* STS 2012–2016 (SentEval layout: `eval/sts/STS1x-en-test/STS.input.<set>.txt`, two
  tab-separated sentences a line, and `STS.gs.<set>.txt`, a gold score a line,
  empty where unscored; unscored lines are skipped). Two protocols:
  - `vmsst`: Pearson ×100 per dataset, averaged within each year, then across years
    (every dataset of the year that has both files);
  - `sbert`: Spearman ×100 on each year's concatenation (2013 `SMT` excluded, as
    SBERT/SentEval do), averaged across years.
* STS benchmark (`eval/sts/STSBenchmark/sts-{dev,test}.csv`): Pearson and Spearman ×100.
* Cross-lingual SemEval-2017 layout (a directory with `STS.input.trackN.xx-yy.txt`
  and `STS.gs.trackN.xx-yy.txt`): Pearson and Spearman ×100 per track; sentence 1 is
  encoded as language xx, sentence 2 as yy.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from vmx.data import download
from vmx.errors import DataError
from vmx.evaluation import common, mining

YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
SBERT_EXCLUDE = {("STS13", "SMT")}


def cosine_rows(a_NxD, b_NxD) -> np.ndarray:
  return np.sum(mining.normalize(a_NxD) * mining.normalize(b_NxD), axis=1)


def correlations(pred, gold) -> dict:
  pred, gold = np.asarray(pred, np.float64), np.asarray(gold, np.float64)
  return {"pearson": 100 * float(stats.pearsonr(pred, gold)[0]),
          "spearman": 100 * float(stats.spearmanr(pred, gold)[0]), "n": int(len(gold))}


def read_senteval(input_path: Path, gs_path: Path, task="sts"):
  """(sentences1, sentences2, scores) of the scored lines of one dataset."""
  inp = common.read_lines(input_path, task)
  gs = common.read_lines(gs_path, task)
  if len(inp) != len(gs):
    raise DataError(f"task {task}: {input_path} has {len(inp)} lines but {gs_path} has "
                    f"{len(gs)}")
  s1, s2, y = [], [], []
  for i, (line, g) in enumerate(zip(inp, gs), 1):
    if not g.strip():
      continue
    parts = line.split("\t")
    if len(parts) < 2:
      raise DataError(f"task {task}: {input_path}:{i}: expected two tab-separated sentences")
    try:
      y.append(float(g.strip()))
    except ValueError:
      raise DataError(f"task {task}: {gs_path}:{i}: not a score: {g[:40]!r}") from None
    s1.append(parts[0].strip())
    s2.append(parts[1].strip())
  return s1, s2, np.asarray(y)


def read_stsb(path: Path, task="stsb"):
  s1, s2, y = [], [], []
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if len(parts) < 7:
      raise DataError(f"task {task}: {path}:{i}: expected 7 tab-separated fields "
                      f"(genre, file, year, id, score, sentence1, sentence2)")
    try:
      y.append(float(parts[4]))
    except ValueError:
      raise DataError(f"task {task}: {path}:{i}: score {parts[4][:20]!r} is not a number") from None
    s1.append(parts[5])
    s2.append(parts[6])
  return s1, s2, np.asarray(y)


def _predict(encode, s1, s2, lang1="eng", lang2="eng"):
  return cosine_rows(encode(s1, lang1), encode(s2, lang2))


def _datasets(files: common.DataFiles, year: str) -> list[str]:
  """Datasets of a year that have both an input and a gold file."""
  root = f"eval/sts/{year}-en-test"
  data_root = download.configured_data_dir(files.data_dir)
  if data_root is not None:
    names = [p.name for p in (data_root / root).glob("STS.input.*.txt")]
  else:
    names = [r.rsplit("/", 1)[1] for r in download.registry() if r.startswith(root + "/")]
  sets = sorted(m.group(1) for n in names if (m := re.fullmatch(r"STS\.input\.(.+)\.txt", n)))
  sets = [s for s in sets if files.exists(f"{root}/STS.gs.{s}.txt")]
  if not sets:
    raise DataError(f"task sts: no STS.input.*.txt with STS.gs.*.txt in {root} "
                    f"(data dir: {data_root or 'registry/cache'})")
  return sets


def evaluate_sts12_16(encode, years: Sequence[str] = YEARS, data_dir: Optional[str] = None,
                      progress: bool = False, files: Optional[common.DataFiles] = None) -> dict:
  files = files or common.DataFiles("sts12-16", data_dir)
  subsets, vmsst_years, sbert_years = [], {}, {}
  for year in common.progress_iter(years, "sts", progress):
    preds, golds = [], []
    per_set = {}
    for name in _datasets(files, year):
      root = f"eval/sts/{year}-en-test"
      s1, s2, y = read_senteval(files.path(f"{root}/STS.input.{name}.txt"),
                                files.path(f"{root}/STS.gs.{name}.txt"))
      p = _predict(encode, s1, s2)
      per_set[name] = correlations(p, y)
      if (year, name) not in SBERT_EXCLUDE:
        preds.append(p)
        golds.append(y)
    vmsst_years[year] = common.mean([r["pearson"] for r in per_set.values()])
    sbert_years[year] = correlations(np.concatenate(preds), np.concatenate(golds))["spearman"]
    subsets.append({"hf_subset": year, "languages": ["eng"], "main_score": vmsst_years[year],
                    "vmsst_pearson_mean": vmsst_years[year],
                    "sbert_spearman_all": sbert_years[year], "datasets": per_set})
  return {"scores": {"test": subsets},
          "main_score": common.mean(list(vmsst_years.values())),
          "vmsst_pearson": common.mean(list(vmsst_years.values())),
          "sbert_spearman": common.mean(list(sbert_years.values()))}


def evaluate_stsb(encode, splits=("test", "dev"), data_dir: Optional[str] = None,
                  progress: bool = False, files: Optional[common.DataFiles] = None) -> dict:
  files = files or common.DataFiles("stsb", data_dir)
  scores = {}
  for split in splits:
    s1, s2, y = read_stsb(files.path(f"eval/sts/STSBenchmark/sts-{split}.csv"))
    c = correlations(_predict(encode, s1, s2), y)
    scores[split] = [{"hf_subset": "default", "languages": ["eng"],
                      "main_score": c["spearman"], **c}]
  return {"scores": scores, "main_score": scores[splits[0]][0]["main_score"]}


def evaluate_sts17(encode, directory: str, gs_directory: Optional[str] = None,
                   progress: bool = False, files: Optional[common.DataFiles] = None) -> dict:
  """Every `STS.input.trackN.xx-yy.txt` in `directory` (gold in `gs_directory`)."""
  files = files or common.DataFiles("sts17", None)
  d = Path(directory)
  if not d.is_dir():
    raise DataError(f"task sts17: {d} is not a directory")
  gs_d = Path(gs_directory) if gs_directory else d
  inputs = sorted(d.glob("STS.input.track*.txt"))
  if not inputs:
    raise DataError(f"task sts17: no STS.input.trackN.xx-yy.txt files in {d}")
  subsets, failed = [], {}
  for inp in common.progress_iter(inputs, "sts17", progress):
    m = re.fullmatch(r"STS\.input\.(track[\w]+)\.([a-z]+)-([a-z]+)\.txt", inp.name)
    if not m:
      failed[inp.name] = f"{inp}: name is not STS.input.trackN.xx-yy.txt"
      continue
    track, l1, l2 = m.groups()
    try:   # a track that cannot be read is reported alone; the others are scored
      s1, s2, y = read_senteval(
          files.path(str(inp.absolute())),
          files.path(str((gs_d / f"STS.gs.{track}.{l1}-{l2}.txt").absolute())), task="sts17")
    except DataError as e:
      failed[f"{track}.{l1}-{l2}"] = str(e)
      continue
    c = correlations(_predict(encode, s1, s2, common.iso3(l1), common.iso3(l2)), y)
    subsets.append({"hf_subset": f"{track}.{l1}-{l2}",
                    "languages": sorted({common.iso3(l1), common.iso3(l2)}),
                    "main_score": c["spearman"], **c})
  if not subsets:
    raise DataError(f"task sts17: no track of {d} could be read: "
                    + "; ".join(f"{k}: {v}" for k, v in failed.items()))
  return {"scores": {"test": subsets}, "tracks_failed": failed,
          "main_score": common.mean([s["main_score"] for s in subsets])}
