"""Dev sets carved from the training corpora, and the sentences training must then skip.

A dev set is N-way parallel text with English: every language's sentence i translates
English sentence i. Model selection (recipe sweeps, `train.best_metric`) reads these,
never a test set:

  newstest2013  train/wmt-newstest-multiway/2013/newstest2013.<xx>.gz, all 3,000 lines,
                cs de es fr ru <-> en (news). The merged train/wmt-newstest pairs hold
                this year too: training with `holdout=['newstest2013']` drops them.
  tico19        train/tico19-multiway/tico19.<xx>.gz, lines 1-1,000 of 2,100 (a block,
                so that documents stay on one side), 38 language variants <-> en
                (COVID-19 texts; many long-tail languages).

The Bible verses have no English side and are not a dev set here.

Test sets are never read for model selection, but training can skip them the same way:
`holdout=['tatoeba']` drops every training example that shares a sentence with the
Tatoeba v1 test set (eval/tatoeba/v1, all 112 languages and their English sides), as the
VMSST paper's §6.1 removes Tatoeba from its training data. (`../shared/data/train` is
built without them already; the filter keeps any other corpus clean too.)

`holdout=[names]` on the training tasks (`tasks.parallel_mixture`,
`tasks.monolingual_mixture`, `tasks.nway_mixture`, ...) drops every training example
that contains a sentence of those dev sets, in any of their languages (compared after
stripping whitespace), so a dev sentence never reaches training through any corpus.
No TensorFlow here.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional, Sequence

from vmx.data import download, readers
from vmx.errors import DataError


@dataclasses.dataclass(frozen=True)
class DevSet:
  """N-way line files `pattern.format(lang=...)`; lines [start, stop) are the dev set."""
  pattern: str
  languages: tuple[str, ...]
  english: str = "en"
  start: int = 0
  stop: Optional[int] = None
  description: str = ""


TICO19_LANGUAGES = (
    "am", "ar", "bn", "ckb", "din", "es_LA", "fa", "fr", "fuv", "ha", "hi", "id", "km", "kr",
    "ku", "lg", "ln", "mr", "ms", "my", "ne", "nus", "om", "prs", "ps", "pt_BR", "ru", "rw",
    "so", "sw", "ta", "ti", "ti_ER", "ti_ET", "tl", "ur", "zh", "zu")

DEV_SETS = {
    "newstest2013": DevSet("train/wmt-newstest-multiway/2013/newstest2013.{lang}.gz",
                           ("cs", "de", "es", "fr", "ru"),
                           description="WMT newstest 2013, 3,000 news sentences"),
    "tico19": DevSet("train/tico19-multiway/tico19.{lang}.gz", TICO19_LANGUAGES, stop=1000,
                     description="TICO-19, its first 1,000 of 2,100 sentences"),
}
DEFAULT_DEV_SETS = ("newstest2013", "tico19")
# Test sets training may skip (by `holdout`); never dev sets.
TEST_SETS = {"tatoeba": "eval/tatoeba/v1"}

def dev_set(name: str) -> DevSet:
  if name not in DEV_SETS:
    raise DataError(f"unknown dev set {name!r}; known: {', '.join(DEV_SETS)}")
  return DEV_SETS[name]


def check_names(names: Sequence[str], where: str, test_sets: bool = False) -> list[str]:
  """The names as a list; an unknown one is an error naming `where` (a gin binding).
  `test_sets`: TEST_SETS are valid too (what training may skip, never a dev set)."""
  if isinstance(names, str):
    names = [names]
  known = [*DEV_SETS, *(TEST_SETS if test_sets else ())]
  unknown = [n for n in names if n not in known]
  if unknown:
    test = [n for n in unknown if n in TEST_SETS]
    raise DataError(f"{where}: unknown dev set(s) {unknown}; known: {', '.join(known)}"
                    + (f" ({', '.join(test)}: a test set, which training can hold out but "
                       f"models are never selected on)" if test else ""))
  return list(names)


def read(name: str, data_dir: Optional[str] = None, languages: Optional[Sequence[str]] = None,
         max_sentences: Optional[int] = None) -> tuple[dict[str, list[str]], list[str]]:
  """({lang: sentences}, english sentences), line i of each translating English line i.

  `languages`: a subset of the set's file codes (default all); `max_sentences`: the first
  that many lines of the dev block. A language missing from the data is an error.
  """
  d = dev_set(name)
  langs = list(d.languages if languages is None else languages)
  bad = [l for l in langs if l not in d.languages]
  if bad:
    raise DataError(f"dev set {name}: no language(s) {bad}; it has {', '.join(d.languages)}")
  paths = {}
  for lang in langs + [d.english]:
    rel = d.pattern.format(lang=lang)
    if not download.available(rel, data_dir):
      raise DataError(f"dev set {name}: missing file {rel} (set VMX_DATA_DIR to the data)")
    paths[lang] = download.resolve(rel, data_dir)
  order, rows = readers.read_nway_lines(paths)
  stop = d.stop if max_sentences is None else min(d.start + max_sentences, d.stop or 1 << 62)
  rows = rows[d.start:stop]
  cols = {l: [r[i] for r in rows] for i, l in enumerate(order)}
  return {l: cols[l] for l in langs}, cols[d.english]


def test_set_files(name: str, data_dir: Optional[str] = None) -> list[str]:
  """Registry-relative paths of every file of test set `name` (the data dir's, else the
  download registry's)."""
  root = TEST_SETS[name]
  rels = [f"{root}/{n}" for n in download.file_names(root, data_dir)]
  if not rels:
    raise DataError(f"test set {name}: no files under {root} "
                    f"(data dir: {download.configured_data_dir(data_dir) or 'registry'})")
  return rels


def held_out_sentences(names: Sequence[str], data_dir: Optional[str] = None) -> set[str]:
  """Every sentence (stripped, non-empty) of the dev and test sets `names`, in every
  language."""
  out = set()
  for name in names:
    if name in TEST_SETS:
      for rel in test_set_files(name, data_dir):
        out.update(l.strip() for _, l in readers.iter_lines(download.resolve(rel, data_dir))
                   if l.strip())
      continue
    langs, english = read(name, data_dir)
    for sentences in list(langs.values()) + [english]:
      out.update(s.strip() for s in sentences if s.strip())
  return out


class HeldOut:
  """The dev sets a training source skips; their sentences are read on first use."""

  def __init__(self, names: Sequence[str], data_dir: Optional[str] = None,
               where: str = "holdout"):
    self.names = check_names(names, where, test_sets=True)
    self.data_dir = data_dir
    self._sentences = None

  def __bool__(self):
    return bool(self.names)

  @property
  def key(self) -> str:
    """Names the exclusion in cached split counts."""
    return "+".join(self.names)

  def sentences(self) -> set[str]:
    if self._sentences is None:
      self._sentences = held_out_sentences(self.names, self.data_dir)
    return self._sentences

  def keeps(self, texts: Sequence[str]) -> bool:
    """Whether an example with these texts may be trained on."""
    s = self.sentences()
    return not any(t.strip() in s for t in texts if t)

  def fingerprint(self) -> str:
    return hashlib.sha256("\n".join(sorted(self.sentences())).encode()).hexdigest()[:8]
