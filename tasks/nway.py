"""N-way parallel corpora (one sentence in many languages) as SeqIO tasks, for MPCL.

Corpora (shared/data layout):
  tico19-multiway          train/tico19-multiway/tico19.<lang>.gz, 2100 lines x 39 variants
  wmt-newstest-multiway    train/wmt-newstest-multiway/<year>/newstest<year>.<lang>.gz,
                           2008-2013 (cs de en es fr + hu / it / ru depending on the year)
  bible-verses             train/bible-verses.tsv.gz (file, iso639, verse_id, text):
                           verses with the same id are translations
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import gin

from vmx import storage
from etils import epy

from vmx.data import download, readers, task_settings
with epy.lazy_imports():   # SeqIO and TensorFlow: only when a task is registered
  from vmx.data import registration
from vmx.errors import ConfigError, DataError
from tasks.parallel import held_out, languages_key

WMT_YEARS = (2008, 2009, 2010, 2011, 2012, 2013)
NWAY_CORPORA = ("tico19-multiway", "wmt-newstest-multiway", "bible-verses")


def _line_files(corpus: str, languages: Sequence[str], data_dir: Optional[str]):
  """[{lang: path}] per line-aligned block (one for TICO-19, one per newstest year)."""
  if corpus == "tico19-multiway":
    return [{l: str(download.resolve(f"train/tico19-multiway/tico19.{l}.gz", data_dir))
             for l in languages}]
  blocks = []
  for year in WMT_YEARS:
    rels = {l: f"train/wmt-newstest-multiway/{year}/newstest{year}.{l}.gz" for l in languages}
    have = {l: r for l, r in rels.items() if download.available(r, data_dir)}
    if len(have) >= 2:
      blocks.append({l: str(download.resolve(r, data_dir)) for l, r in have.items()})
  unused = [l for l in languages if not any(l in b for b in blocks)]
  if not blocks or unused:
    raise DataError(f"corpus {corpus}: languages {unused or list(languages)} are in no year "
                    f"{WMT_YEARS[0]}-{WMT_YEARS[-1]} together with another requested language")
  return blocks


def nway_files(corpus: str, languages: Optional[Sequence[str]],
               data_dir: Optional[str] = None) -> list[str]:
  """The files `nway_groups` reads."""
  if corpus == "bible-verses":
    return [str(download.resolve("train/bible-verses.tsv.gz", data_dir))]
  return [p for block in _line_files(corpus, languages, data_dir) for p in block.values()]


def nway_groups(corpus: str, languages: Sequence[str], data_dir: Optional[str] = None):
  """(languages, rows) of an N-way corpus; rows[i][j] = "" where language j is missing."""
  if corpus not in NWAY_CORPORA:
    raise DataError(f"unknown N-way corpus {corpus!r}; known: {', '.join(NWAY_CORPORA)}")
  if corpus == "bible-verses":   # languages None: every language of the file
    return readers.read_nway_tsv(download.resolve("train/bible-verses.tsv.gz", data_dir),
                                 None if languages is None else list(languages), header=True)
  if languages is None:
    raise DataError(f"corpus {corpus}: list its languages (file suffixes)")
  languages = list(languages)
  rows = []
  for block in _line_files(corpus, languages, data_dir):
    langs, block_rows = readers.read_nway_lines(block)
    col = {l: i for i, l in enumerate(langs)}
    rows += [[r[col[l]] if l in col else "" for l in languages] for r in block_rows]
  return languages, rows


@gin.configurable(module="tasks")
def nway_text_files(corpus: str = gin.REQUIRED, languages: Optional[Sequence[str]] = gin.REQUIRED,
                    data_dir: Optional[str] = None) -> list[str]:
  """Text files of the corpus's languages (for a vocabulary); Bible verses are written
  out once as plain text under the cache."""
  if corpus != "bible-verses":
    return [p for block in _line_files(corpus, languages, data_dir) for p in block.values()]

  langs, rows = nway_groups(corpus, languages, data_dir)
  key = hashlib.sha256(",".join(langs).encode()).hexdigest()[:12]
  out = storage.cache_dir().parent / "nway_text" / f"bible-verses.{key}.txt"
  if not out.exists():
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(t + "\n" for r in rows for t in r if t), encoding="utf-8")
    tmp.replace(out)
  return [str(out)]


@gin.configurable(module="tasks")
def nway_mixture_text_files(corpora=gin.REQUIRED, data_dir: Optional[str] = None) -> list[str]:
  """`nway_text_files` of every corpus of an `nway_mixture` ({corpus: languages})."""
  return [f for c, langs in corpora.items() for f in nway_text_files(c, langs, data_dir)]


def pairs_key(pairs_from_groups: Optional[int], num_views: int, binding: str) -> str:
  """The task-name suffix of MPCL's +Single pairs (`.pairs<K>`; "" without them);
  ConfigError naming `binding` unless K is even and >= 2 and the examples have 2 views."""
  if pairs_from_groups is None:
    return ""
  if (isinstance(pairs_from_groups, bool) or not isinstance(pairs_from_groups, int)
      or pairs_from_groups < 2 or pairs_from_groups % 2):
    raise ConfigError(f"{binding}.pairs_from_groups={pairs_from_groups!r}: expected an even "
                      "number of languages >= 2 (or None)")
  if num_views != 2:
    raise ConfigError(f"{binding}.pairs_from_groups={pairs_from_groups} makes examples of two "
                      f"views, but num_views (NUM_VIEWS) is {num_views}: set it to 2")
  return f".pairs{pairs_from_groups}"


def nway_task(corpus: str = gin.REQUIRED, languages: Optional[Sequence[str]] = gin.REQUIRED,
              vocabulary: str = gin.REQUIRED, num_views: int = gin.REQUIRED,
              data_dir: Optional[str] = None,
              shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
              validation_percent: int = task_settings.VALIDATION_PERCENT,
              holdout: Sequence[str] = (), pairs_from_groups: Optional[int] = None) -> str:
  """Registers the MPCL task of an N-way corpus, `<corpus>.views<V>.<languages>`:
  `num_views` translations per example (languages None: every language of the file).
  `holdout`: dev sets whose sentences' groups are dropped (name + `.minus_<sets>`).
  `pairs_from_groups` K (MPCL's +Single data, §3.5; `num_views` 2): each group with K
  languages or more becomes K / 2 separate pairs (vmx/data/nway.py `single_pairs`)."""
  pairs = pairs_key(pairs_from_groups, num_views, "tasks.nway_task")
  langs, rows = nway_groups(corpus, languages, data_dir)
  key = "all" if languages is None else languages_key(langs, every=())
  h, suffix = held_out(holdout, data_dir, "tasks.nway_task")
  return registration.register_nway_task(
      f"{corpus.replace('-', '_')}.views{num_views}.{key}{pairs}{suffix}", langs, rows,
      vocabulary, num_views, shuffle_buffer_size, validation_percent, h,
      nway_files(corpus, languages, data_dir), pairs_from_groups)


def nway_mixture(corpora=gin.REQUIRED, vocabulary: str = gin.REQUIRED,
                 num_views: int = gin.REQUIRED, alpha: float = 1.0,
                 data_dir: Optional[str] = None,
                 validation_percent: int = task_settings.VALIDATION_PERCENT,
                 holdout: Sequence[str] = (), pairs_from_groups: Optional[int] = None) -> str:
  """Several N-way corpora {corpus: languages} mixed with p ∝ groups^alpha
  (`pairs_from_groups`: as `nway_task`'s)."""
  pairs_key(pairs_from_groups, num_views, "tasks.nway_mixture")
  names = [nway_task(c, langs, vocabulary, num_views, data_dir,
                     validation_percent=validation_percent, holdout=holdout,
                     pairs_from_groups=pairs_from_groups)
           for c, langs in corpora.items()]
  if len(names) == 1:
    return names[0]
  key = registration.short_hash("|".join(names))
  return registration.register_mixture(f"nway.mix_{key}_a{alpha}", names, alpha)
