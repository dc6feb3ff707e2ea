"""XNLI-MT 1.0 as N-way groups for MPCL (Zhao et al.): its main data (§3.1: the premises
in six languages, en de fr es ru zh; `mpcl_mixture`) and the "XLM-R w/ hard negative"
variant (§3.5: all 15 XNLI languages, "sentences with contradictory labels as hard
negatives"; `xnli_mt_task`).

XNLI-MT 1.0 (Conneau et al. 2018) is MultiNLI's training set machine-translated into the
other 14 XNLI languages. It is not in shared/data (whose eval/xnli holds XNLI dev, an
evaluation set: never train on it); the user downloads XNLI-MT-1.0.zip and points
`directory` at its files, as the zip unpacks them:

  XNLI-MT-1.0/multinli/multinli.train.<lang>.tsv     (.tsv.gz also read)

Each file: a header line `premise<TAB>hypo<TAB>label`, then one pair per line, line i the
same MultiNLI pair in every language (Hugging Face datasets' `xnli` reader, config
`all_languages`, zips the 15 files line by line). Labels: `entailment`, `neutral`, and
`contradictory` in these training files (google-research/bert's and XTREME's XNLI
readers rename it `contradiction`, the spelling of XNLI dev/test); both spellings are
accepted here. A file without the header line is read too; the label of a line must be
the same in every language (else the files are not aligned: a DataError naming both).

Groups of the hard-negative variant: one per contradiction line. Its premise in the N
languages is the group (the views: §3.1 takes "the sentence itself", not its hypotheses),
its hypothesis in the N languages the hard negative's candidates (one language is drawn
per example: vmx.data.nway.NwayHardNegativeSource). Entailment and neutral lines give no
group; a premise with several contradiction hypotheses gives several groups.
Groups of the main data (`groups='premises'`): one per line of the files, its premise in
the N languages (§3.1's "400k data groups" is MultiNLI's 392,702 training lines; a premise
written with three hypotheses is three groups, as the lines are).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

import gin

from vmx import storage
from vmx.data.languages import XNLI
from etils import epy

from vmx.data import readers, task_settings
with epy.lazy_imports():   # SeqIO and TensorFlow: only when a task is registered
  from vmx.data import registration
from vmx.errors import ConfigError, DataError
from tasks.nway import nway_mixture, nway_mixture_text_files, pairs_key
from tasks.parallel import held_out, languages_key

# MPCL §3.1: the six languages of its main experiments (XNLI's, ISO 639-1)
MPCL_LANGUAGES = ("en", "de", "fr", "es", "ru", "zh")

XNLI_LANGUAGES = XNLI
# label as written -> label; "contradictory" is XNLI-MT's training files' spelling
LABELS = {"entailment": "entailment", "neutral": "neutral",
          "contradiction": "contradiction", "contradictory": "contradiction"}
HEADER = ["premise", "hypo", "label"]


def xnli_mt_files(directory: Optional[str], languages: Sequence[str]) -> dict[str, str]:
  """{lang: path} of `multinli.train.<lang>.tsv` (or `.tsv.gz`) in `directory` (the
  `multinli/` folder, or the `XNLI-MT-1.0/` folder above it)."""
  if not directory:
    raise ConfigError("XNLI_MT_DIR (the `directory` of tasks.xnli_mt_task) is not set: the "
                      "folder of XNLI-MT 1.0's multinli.train.<lang>.tsv files "
                      "(XNLI-MT-1.0/multinli)")
  root = Path(str(directory)).expanduser()
  if not root.is_dir():
    raise DataError(f"XNLI-MT directory {str(directory)!r} is not a directory (expected "
                    f"XNLI-MT-1.0/multinli with multinli.train.<lang>.tsv)")
  if (root / "multinli").is_dir():
    root = root / "multinli"
  out, missing = {}, []
  for lang in languages:
    found = [root / f"multinli.train.{lang}.tsv{gz}" for gz in ("", ".gz")]
    found = [p for p in found if p.is_file()]
    if found:
      out[lang] = str(found[0])
    else:
      missing.append(lang)
  if missing:
    raise DataError(f"{root}: no multinli.train.<lang>.tsv for languages {missing}")
  return out


def _fields(path, lineno: int, line: str) -> list[str]:
  f = line.split("\t")
  if len(f) != 3:
    raise DataError(f"{path}:{lineno}: {len(f)} tab-separated field(s), expected 3 "
                    f"(premise, hypo, label)")
  return f


GROUPS = ("contradictions", "premises")


def read_xnli_mt(files: Mapping[str, str], groups: str = "contradictions"):
  """(languages, premises, contradictions) of line-aligned XNLI-MT files {lang: path}:
  for each contradiction line, its premise and its hypothesis in every language
  (rows of len(languages) texts, stripped; "" where a translation is empty).
  `groups='premises'`: every line's premise, and no contradictions (None)."""
  if groups not in GROUPS:
    raise ValueError(f"groups={groups!r}: expected one of {GROUPS}")
  langs = list(files)
  if not langs:
    raise DataError("XNLI-MT: no languages")
  end = object()
  premises, contradictions = [], []
  lines = [readers.iter_lines(files[l]) for l in langs]
  for row in itertools.zip_longest(*lines, fillvalue=end):
    short = [files[l] for l, x in zip(langs, row) if x is end]
    if short:
      longer = next(files[l] for l, x in zip(langs, row) if x is not end)
      raise DataError(f"XNLI-MT files must be aligned line by line: {short[0]} ends before "
                      f"{longer} (line {next(x for x in row if x is not end)[0]})")
    i = row[0][0]
    fields = [_fields(files[l], i, line) for l, (_, line) in zip(langs, row)]
    if i == 1:
      headers = [[x.strip() for x in f] == HEADER for f in fields]
      if any(headers) and not all(headers):
        raise DataError(f"{files[langs[headers.index(False)]]}:1: no header line "
                        f"'premise<TAB>hypo<TAB>label', unlike {files[langs[headers.index(True)]]}")
      if all(headers):
        continue
    labels = [LABELS.get(f[2].strip()) for f in fields]
    for l, f, lab in zip(langs, fields, labels):
      if lab is None:
        raise DataError(f"{files[l]}:{i}: label {f[2]!r}, expected one of {sorted(LABELS)}")
    if len(set(labels)) > 1:
      j = next(k for k, lab in enumerate(labels) if lab != labels[0])
      raise DataError(f"{files[langs[0]]}:{i} and {files[langs[j]]}:{i}: labels "
                      f"{labels[0]!r} and {labels[j]!r} differ: the files are not aligned "
                      f"line by line")
    if groups == "premises":
      premises.append([f[0].strip() for f in fields])
    elif labels[0] == "contradiction":
      premises.append([f[0].strip() for f in fields])
      contradictions.append([f[1].strip() for f in fields])
  if not premises:
    raise DataError(f"XNLI-MT {files[langs[0]]} (and the other languages): no "
                    f"{'line' if groups == 'premises' else 'contradiction line'}")
  return langs, premises, (None if groups == "premises" else contradictions)


def _stamp(files: Mapping[str, str]) -> tuple:
  return tuple((l, str(Path(p).resolve()), os.stat(p).st_size, os.stat(p).st_mtime_ns)
               for l, p in files.items())


@functools.lru_cache(maxsize=2)
def _read_cached(stamp: tuple, groups: str):
  return read_xnli_mt({l: p for l, p, _, _ in stamp}, groups)


def xnli_mt_groups(directory: Optional[str], languages: Sequence[str] = XNLI_LANGUAGES,
                   groups: str = "contradictions"):
  """`read_xnli_mt` of the files in `directory` (read once per process and file state)."""
  return _read_cached(_stamp(xnli_mt_files(directory, languages)), groups)


@gin.configurable(module="tasks")
def xnli_mt_text_files(directory: Optional[str] = gin.REQUIRED,
                       languages: Sequence[str] = XNLI_LANGUAGES) -> list[str]:
  """One plain-text file per language of the groups' sentences (premises and their
  contradiction hypotheses), written once under the cache: to build a vocabulary."""
  files = xnli_mt_files(directory, languages)
  key = hashlib.sha256(readers.stamp(files.values()).encode()).hexdigest()[:12]
  out_dir = storage.cache_dir().parent / "nway_text"
  outs = [out_dir / f"xnli_mt.{key}.{l}.txt" for l in files]
  if not all(p.exists() for p in outs):
    langs, premises, contradictions = xnli_mt_groups(directory, languages)
    out_dir.mkdir(parents=True, exist_ok=True)
    for j, p in enumerate(outs):
      texts = dict.fromkeys(t for rows in (premises, contradictions) for t in
                            (r[j] for r in rows) if t)
      storage.write_atomic(p, "".join(t + "\n" for t in texts))
  return [str(p) for p in outs]


def xnli_mt_task(directory: Optional[str] = gin.REQUIRED, languages: Sequence[str] = XNLI_LANGUAGES,
                 vocabulary: str = gin.REQUIRED, num_views: int = gin.REQUIRED,
                 data_dir: Optional[str] = None,
                 shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                 validation_percent: int = task_settings.VALIDATION_PERCENT,
                 holdout: Sequence[str] = ()) -> str:
  """Registers the MPCL hard-negative task of XNLI-MT, `xnli_mt.hard_negatives.views<V>.
  <languages>`: per example `num_views` translations of a premise (view 0 the anchor) and
  one of its contradiction hypotheses in a random language. `holdout`: dev sets (read
  from `data_dir`) whose sentences' groups are dropped."""
  langs, premises, contradictions = xnli_mt_groups(directory, languages)
  h, suffix = held_out(holdout, data_dir, "tasks.xnli_mt_task")
  return registration.register_nway_hard_negative_task(
      f"xnli_mt.hard_negatives.views{num_views}.{languages_key(langs, XNLI_LANGUAGES)}"
      f"{suffix}", langs, premises, contradictions, vocabulary, num_views,
      shuffle_buffer_size, validation_percent, h,
      list(xnli_mt_files(directory, languages).values()))


def mpcl_mixture(xnli_mt_directory: Optional[str] = None,
                 xnli_languages: Sequence[str] = MPCL_LANGUAGES, corpora=gin.REQUIRED,
                 vocabulary: str = gin.REQUIRED, num_views: int = gin.REQUIRED,
                 alpha: float = 1.0, data_dir: Optional[str] = None,
                 validation_percent: int = task_settings.VALIDATION_PERCENT,
                 holdout: Sequence[str] = (), pairs_from_groups: Optional[int] = None) -> str:
  """MPCL's training groups: with `xnli_mt_directory` (XNLI-MT 1.0's multinli/ folder,
  which the user supplies) the paper's (§3.1), one group per line of the training files,
  its premise in `xnli_languages` (task `xnli_mt.views<V>.<languages>`); without it the
  N-way corpora `corpora` of the data directory (`nway_mixture`: WMT newstest's multiway
  years, with Czech in place of Chinese in mpcl.gin). `holdout`: dev sets whose
  sentences' groups are dropped. `pairs_from_groups` K (+Single's own data, §3.5, with
  `num_views` 2): each group of K languages or more as K / 2 separate pairs."""
  pairs = pairs_key(pairs_from_groups, num_views, "tasks.mpcl_mixture")
  if not xnli_mt_directory:
    return nway_mixture(corpora, vocabulary, num_views, alpha, data_dir, validation_percent,
                        holdout, pairs_from_groups)
  langs, premises, _ = xnli_mt_groups(xnli_mt_directory, xnli_languages, "premises")
  if num_views > len(langs):
    raise ConfigError(f"NUM_VIEWS={num_views} views of distinct languages, but the XNLI-MT "
                      f"groups have {len(langs)} languages ({', '.join(langs)})")
  if (pairs_from_groups or 0) > len(langs):
    raise ConfigError(f"tasks.mpcl_mixture.pairs_from_groups={pairs_from_groups}, but the "
                      f"XNLI-MT groups have {len(langs)} languages ({', '.join(langs)})")
  h, suffix = held_out(holdout, data_dir, "tasks.mpcl_mixture")
  return registration.register_nway_task(
      f"xnli_mt.views{num_views}.{languages_key(langs, XNLI_LANGUAGES)}{pairs}{suffix}", langs,
      premises, vocabulary, num_views, validation_percent=validation_percent, holdout=h,
      paths=list(xnli_mt_files(xnli_mt_directory, xnli_languages).values()),
      pairs_from_groups=pairs_from_groups)


@gin.configurable(module="tasks")
def mpcl_mixture_text_files(xnli_mt_directory: Optional[str] = None,
                            xnli_languages: Sequence[str] = MPCL_LANGUAGES,
                            corpora=gin.REQUIRED, data_dir: Optional[str] = None) -> list[str]:
  """Text for a vmx vocabulary of `mpcl_mixture`'s groups: the XNLI-MT text
  `xnli_mt_text_files` writes (its contradiction lines' premises and hypotheses), else the
  N-way corpora's."""
  if xnli_mt_directory:
    return xnli_mt_text_files(xnli_mt_directory, xnli_languages)
  return nway_mixture_text_files(corpora, data_dir)
