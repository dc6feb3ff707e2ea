"""Semantic textual similarity: cosine of the two sentence embeddings vs gold scores.

* STS 2012–2016 (SentEval layout: `eval/sts/STS1x-en-test/STS.input.<set>.txt`, two
  tab-separated sentences a line, and `STS.gs.<set>.txt`, a gold score a line,
  empty where unscored; unscored lines are skipped). Two protocols:
  - `vmsst`: Pearson ×100 per dataset, averaged within each year, then across years
    (every dataset of the year that has both files);
  - `sbert`: Spearman ×100 on each year's concatenation (2013 `SMT` excluded, as
    SBERT/SentEval do), averaged across years.
* STS benchmark (`eval/sts/STSBenchmark/sts-{dev,test}.csv`): Pearson and Spearman ×100.
* SemEval-2017 Task 1 (STS17), its test release as distributed: `Sts2017.eval.v1.1.zip`
  (`STS2017.eval.v1.1/STS.input.trackN.xx-yy.txt`) and `Sts2017.gs.zip`
  (`STS2017.gs/STS.gs.trackN.xx-yy.txt`), read from the zips themselves, from their
  unzipped directories, or from one directory holding both kinds of file. Pearson and
  Spearman ×100 per track. The track files are not all alike, and are read as they are:
  - the input's columns are not always in the name's order: track2 ar-en, track4b es-en
    and track6 tr-en have English first (track4a es-en has Spanish first), so each
    column is encoded as its own language (`SEMEVAL2017_COLUMNS`);
  - track6 tr-en has 500 input lines and 250 gold scores: the first 250 lines are the
    scored ones (as MTEB's copy, via sentence-transformers' STS2017-extended, takes them);
  - track4b's gold scores are integers, the others' have six decimals;
  - the Arabic fields have leading / trailing spaces and no-break spaces: each field is
    stripped (as MTEB's copy is); track4b's fields may start with a double quote, which
    is text (no CSV quoting);
  - MTEB's STS17 has one es-en set, track4a (`mteb` in each track's row);
  - copies of the release differ in what else a line holds: more tab-separated fields
    than the two sentences (a source, an id, a score of another copy, empty trailing
    fields). A line's sentences are its first two non-empty fields; the others are not
    used, and no error. The gold scores are read from the gs files only.
  A track that cannot be read (no gold file, a scored line without two sentences, a gold
  line that is not a number, input and gold of different lengths) is reported in
  `tracks_failed`; the others are scored.
* STS2017-extended (Reimers & Gurevych 2020, sentence-transformers' `STS2017-extended.zip`,
  the zip or its directory): `STS.<l1>-<l2>.txt`, a line `sentence 1<TAB>sentence 2<TAB>
  score`, column 1 in language l1. It adds four cross-lingual pairs made from track 5's
  English ones (en-de, fr-en, it-en, nl-en; MTEB's STS17 has them,
  EMMA-X Table 12 scores them); given beside the release, those four are scored from it as
  `extended.<l1>-<l2>` (the pairs the release has are read from the release); given alone,
  every pair it holds.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from vmx.data import download, readers
from vmx.data.languages import iso3
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
  return scored_pairs(common.read_lines(input_path, task), common.read_lines(gs_path, task),
                      str(input_path), str(gs_path), task)


def scored_pairs(lines: Sequence[str], gold: Sequence[str], inp_where: str, gs_where: str,
                 task: str, sentences_in_fields: bool = False):
  """(sentences1, sentences2, scores) of the lines whose gold line holds a score (an empty
  one: unscored, skipped); each sentence stripped. The sentences are a line's first two
  tab-separated fields; `sentences_in_fields`: its first two non-empty ones (a line may
  hold more fields than the two sentences, which are not used). Errors name the file and
  line."""
  if len(lines) != len(gold):
    raise DataError(f"task {task}: {inp_where} has {len(lines)} lines but {gs_where} has "
                    f"{len(gold)}")
  s1, s2, y = [], [], []
  for i, (line, g) in enumerate(zip(lines, gold), 1):
    if not g.split("\t")[0].strip():
      continue
    parts = line.split("\t")
    if sentences_in_fields:
      parts = [p for p in parts if p.strip()]
    if len(parts) < 2:
      raise DataError(f"task {task}: {inp_where}:{i}: expected two tab-separated sentences, "
                      f"got {len(parts)} {'non-empty ' * sentences_in_fields}"
                      f"field{'s' * (len(parts) != 1)}")
    try:   # the score is the gold line's first field
      y.append(float(g.split("\t")[0].strip()))
    except ValueError:
      raise DataError(f"task {task}: {gs_where}:{i}: not a score: {g[:40]!r}") from None
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
  names = download.file_names(root, files.data_dir)
  sets = sorted(m.group(1) for n in names if (m := re.fullmatch(r"STS\.input\.(.+)\.txt", n)))
  sets = [s for s in sets if files.exists(f"{root}/STS.gs.{s}.txt")]
  if not sets:
    where = download.configured_data_dir(files.data_dir) or "registry/cache"
    raise DataError(f"task sts: no STS.input.*.txt with STS.gs.*.txt in {root} "
                    f"(data dir: {where})")
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


# SemEval-2017 Task 1 tracks: the language of each input column, as the release has them
# (the file names give the pair, not the order), and whether MTEB's STS17 includes it.
SEMEVAL2017_COLUMNS = {"track1": ("ar", "ar"), "track2": ("en", "ar"), "track3": ("es", "es"),
                       "track4a": ("es", "en"), "track4b": ("en", "es"),
                       "track5": ("en", "en"), "track6": ("en", "tr")}
SEMEVAL2017_NOT_IN_MTEB = ("track4b",)
# Tracks whose input has more lines than the gold file, the first ones being scored.
SEMEVAL2017_SCORED_PREFIX = {"track6": 250}
_STS17_NAME = re.compile(r"STS\.(input|gs)\.(track\w+)\.([a-z]+)-([a-z]+)\.txt")


def _sts17_sources(locations) -> dict:
  """{file name: (where, read_bytes, the file holding it)} for the STS17 files under each
  location: a directory (searched one level down as well, for unzipped release
  directories) or a zip file (any member path)."""
  found = {}
  for loc in locations:
    loc = Path(loc)
    if loc.is_file() and zipfile.is_zipfile(loc):
      with zipfile.ZipFile(loc) as z:
        for info in z.infolist():
          name = info.filename.rsplit("/", 1)[-1]
          if _STS17_NAME.fullmatch(name):
            found.setdefault(name, (f"{loc}:{info.filename}",
                                    lambda loc=loc, m=info.filename: _zip_member(loc, m), loc))
    elif loc.is_dir():
      for p in sorted(list(loc.glob("STS.*.txt")) + list(loc.glob("*/STS.*.txt"))):
        if _STS17_NAME.fullmatch(p.name):
          found.setdefault(p.name, (str(p), p.read_bytes, p))
    else:
      raise DataError(f"task sts17: {loc} is neither a directory nor a zip file")
  return found


def _zip_member(path: Path, member: str) -> bytes:
  with zipfile.ZipFile(path) as z:
    return z.read(member)


def _sts17_lines(where: str, read) -> list[str]:
  """The file's lines, split at newlines only (a sentence may hold other line separators,
  U+2028 or a form feed, which `str.splitlines` would split at); a byte order mark, which
  some copies have, is not text."""
  raw = read().split(b"\n")
  if raw and raw[0].startswith(b"\xef\xbb\xbf"):
    raw[0] = raw[0][3:]
  if raw and not raw[-1]:
    raw.pop()
  return [readers.decode_line(r, f"task sts17: {where}", i) for i, r in enumerate(raw, 1)]


def read_sts17_track(track: str, inp: tuple, gs: tuple):
  """(sentences of column 1, of column 2, gold scores) of one track, as distributed."""
  (inp_where, inp_read, _), (gs_where, gs_read, _) = inp, gs
  lines, gold = _sts17_lines(inp_where, inp_read), _sts17_lines(gs_where, gs_read)
  # blank lines at the end of one file (some copies have them) pair with nothing
  while len(lines) > len(gold) and not lines[-1].strip():
    lines.pop()
  while len(gold) > len(lines) and not gold[-1].strip():
    gold.pop()
  scored = SEMEVAL2017_SCORED_PREFIX.get(track)
  if scored and len(lines) > len(gold) == scored:
    lines = lines[:scored]
  s1, s2, y = scored_pairs(lines, gold, inp_where, gs_where, "sts17", sentences_in_fields=True)
  if not len(y):
    raise DataError(f"task sts17: {gs_where}: no scored line")
  return s1, s2, y


_EXTENDED_NAME = re.compile(r"STS\.([a-z]+)-([a-z]+)\.txt")


def _extended_sources(location) -> dict:
  """{(l1, l2): (where, read_bytes, the file holding it)} of an STS2017-extended copy."""
  loc = Path(location)
  found = {}
  if loc.is_file() and zipfile.is_zipfile(loc):
    with zipfile.ZipFile(loc) as z:
      for info in z.infolist():
        m = _EXTENDED_NAME.fullmatch(info.filename.rsplit("/", 1)[-1])
        if m:
          found.setdefault(m.groups(), (f"{loc}:{info.filename}", lambda loc=loc,
                                        n=info.filename: _zip_member(loc, n), loc))
  elif loc.is_dir():
    for p in sorted(list(loc.glob("STS.*.txt")) + list(loc.glob("*/STS.*.txt"))):
      m = _EXTENDED_NAME.fullmatch(p.name)
      if m:
        found.setdefault(m.groups(), (str(p), p.read_bytes, p))
  else:
    raise DataError(f"task sts17: --sts17.extended={loc} is neither a directory nor a zip file")
  if not found:
    raise DataError(f"task sts17: no STS.xx-yy.txt files in --sts17.extended={loc} "
                    f"(STS2017-extended.zip or its directory)")
  return found


def read_sts17_extended(where: str, read) -> tuple:
  """(sentences 1, sentences 2, scores) of one STS2017-extended file; a line without
  three tab-separated fields or a score is a DataError naming file and line."""
  lines = [l for l in _sts17_lines(where, read)]
  while lines and not lines[-1].strip():
    lines.pop()
  s1, s2, y = [], [], []
  for i, line in enumerate(lines, 1):
    parts = line.split("\t")
    try:
      if len(parts) < 3:
        raise ValueError
      y.append(float(parts[2]))
    except ValueError:
      raise DataError(f"task sts17: {where}:{i}: expected sentence 1<TAB>sentence 2<TAB>"
                      f"score") from None
    s1.append(parts[0].strip())
    s2.append(parts[1].strip())
  if not y:
    raise DataError(f"task sts17: {where}: no scored line")
  return s1, s2, np.asarray(y)


def _same_pair(a: str, b: str) -> bool:
  return sorted(a.split("-")) == sorted(b.split("-"))


def evaluate_sts17(encode, directory: Optional[str], gs_directory: Optional[str] = None,
                   progress: bool = False, files: Optional[common.DataFiles] = None,
                   extended: Optional[str] = None) -> dict:
  """Every track of the SemEval-2017 release at `directory` (a directory or the inputs'
  zip; the gold files in it or at `gs_directory`, a directory or the gold zip), and the
  pairs of STS2017-extended at `extended` that the release does not have (module
  docstring)."""
  files = files or common.DataFiles("sts17", None)   # records what was read (revision)
  subsets, failed = (_sts17_release(encode, directory, gs_directory, progress, files)
                     if directory else ([], {}))
  if extended:
    have = [s["hf_subset"].split(".", 1)[1] for s in subsets]
    for (l1, l2), (where, read, path) in sorted(_extended_sources(extended).items()):
      if any(_same_pair(f"{l1}-{l2}", h) for h in have):
        continue
      key = f"extended.{l1}-{l2}"
      try:
        s1, s2, y = read_sts17_extended(where, read)
      except DataError as e:
        failed[key] = str(e)
        continue
      files.used[str(path)] = Path(path)
      c1, c2 = iso3(l1), iso3(l2)
      c = correlations(_predict(encode, s1, s2, c1, c2), y)
      subsets.append({"hf_subset": key, "languages": sorted({c1, c2}), "columns": [c1, c2],
                      "mteb": True, "main_score": c["spearman"], **c})
  if not subsets:
    raise DataError(f"task sts17: nothing could be read from {directory or extended}: "
                    + "; ".join(f"{k}: {v}" for k, v in failed.items()))
  return {"scores": {"test": subsets}, "tracks_failed": failed,
          "main_score": common.mean([s["main_score"] for s in subsets])}


def _sts17_release(encode, directory: str, gs_directory: Optional[str], progress: bool,
                   files: common.DataFiles) -> tuple[list, dict]:
  """(scored subsets, failed tracks) of the SemEval-2017 release."""
  locations = [directory] + ([gs_directory] if gs_directory else [])
  found = _sts17_sources(locations)
  inputs = sorted(n for n in found if n.startswith("STS.input."))
  if not inputs:
    raise DataError(f"task sts17: no STS.input.trackN.xx-yy.txt files in "
                    f"{' or '.join(map(str, locations))}")
  subsets, failed = [], {}
  for name in common.progress_iter(inputs, "sts17", progress):
    _, track, l1, l2 = _STS17_NAME.fullmatch(name).groups()
    key = f"{track}.{l1}-{l2}"
    gs_name = f"STS.gs.{track}.{l1}-{l2}.txt"
    try:   # a track that cannot be read is reported alone; the others are scored
      if gs_name not in found:
        raise DataError(f"task sts17: no {gs_name} for {found[name][0]}")
      s1, s2, y = read_sts17_track(track, found[name], found[gs_name])
      for _, _, path in (found[name], found[gs_name]):   # a zip counts once
        files.used[str(path)] = Path(path)
    except DataError as e:
      failed[key] = str(e)
      continue
    c1, c2 = (iso3(l) for l in SEMEVAL2017_COLUMNS.get(track, (l1, l2)))
    c = correlations(_predict(encode, s1, s2, c1, c2), y)
    subsets.append({"hf_subset": key, "languages": sorted({c1, c2}), "columns": [c1, c2],
                    "mteb": track not in SEMEVAL2017_NOT_IN_MTEB,
                    "main_score": c["spearman"], **c})
  if not subsets:
    raise DataError(f"task sts17: no track of {directory} could be read: "
                    + "; ".join(f"{k}: {v}" for k, v in failed.items()))
  return subsets, failed
