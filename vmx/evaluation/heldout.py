"""Evaluation sentences training must not see (EMS §4.2 takes every evaluation dataset's
sentences out of its training data).

`devsets.HeldOut` skips the dev sets and the Tatoeba test set, which live in the data
directory. EMS evaluates on more: BUCC (the data directory's `eval/bucc2018`), and on data
the user supplies, ParaCrawl (Table 9), MLDoc (Table 10) and the two Amazon review corpora
(Tables 11, 12). `EvaluationHeldOut` is a `devsets.HeldOut` (the interface the training
sources read: `names`, `key`, `sentences()`, `keeps()`, `fingerprint()`) over both:

  bucc       every split of every pair of `eval/bucc2018` in the data directory (both
             sides' sentences, `bucc.read_corpus`)
  paracrawl  the sentences the evaluation draws from each pair's files (both sides of the
             2,000 queries and 200k candidates, `paracrawl.draw` with the evaluation's
             defaults), not the whole multi-million-line corpus
  mldoc, amazon_v1, amazon_v2
             every text of every language's (and domain's) train, dev and test file
             (`transfer.BENCHMARKS[...]`), the files the evaluation reads, and each
             sentence of those documents (`document_sentences`): §4.2 removes "the
             sentences that appear in any evaluation dataset", and a training sentence
             inside a review or a news story is one of them

A benchmark whose directory is not given is not held out (there is nothing to compare
with); each one given is read with the evaluation's own reader, so the sentences training
skips are the ones the evaluation scores. Texts are compared stripped, as the dev sets'.
No TensorFlow here.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence

from vmx.data import devsets
from vmx.errors import ConfigError, DataError
from vmx.evaluation import bucc, common, paracrawl, transfer

BENCHMARKS = ("bucc", "paracrawl", "mldoc", "amazon_v1", "amazon_v2")
# the benchmarks read from a directory the user gives (bucc: the data directory)
USER_SUPPLIED = ("paracrawl",) + tuple(transfer.BENCHMARKS)


def bucc_sentences(data_dir: Optional[str] = None) -> tuple[set, list]:
  """(sentences, files read) of every BUCC split and pair in the data directory."""
  files = common.DataFiles("bucc", data_dir)
  out, read = set(), []
  for pair in bucc.PAIRS:
    src = pair.split("-")[0]
    for split in bucc.SPLITS:
      base = f"eval/bucc2018/{pair}/{pair}.{split}"
      for side in (src, "en"):
        if files.exists(f"{base}.{side}"):
          path = files.path(f"{base}.{side}")
          out.update(s.strip() for s in bucc.read_corpus(path)[1] if s.strip())
          read.append(path)
  if not read:
    raise DataError("holdout 'bucc': no eval/bucc2018/<pair>/<pair>.<split>.<lang> files in "
                    "the data directory")
  return out, read


def paracrawl_sentences(directory) -> tuple[set, list]:
  """(sentences, files read) of the pools the ParaCrawl evaluation draws (every pair of
  its Table 9 languages present)."""
  out, read = set(), []
  for lang in paracrawl.LANGUAGES:
    found = paracrawl.pair_files(directory, lang)
    if found is None:
      continue
    src, tgt, _, _ = paracrawl.draw(*found, task="holdout paracrawl")
    out.update(s.strip() for s in src + tgt if s.strip())
    read += list(found)
  if not read:
    raise DataError(f"holdout 'paracrawl': no ParaCrawl.<pair>.<xx> files in {directory} "
                    f"({paracrawl.LAYOUT})")
  return out, read


# A sentence ends at . ! ? … followed by white space, after 。！？ (no space in CJK text),
# after ؟ and । (Arabic, Devanagari), and at a line break. A rule, not a segmenter: none
# installable here covers MLDoc's and Amazon's languages (Chinese, Japanese, Russian among
# them) without a download at run time. Abbreviations ("Mr. Smith") split too: a piece
# that short is held out with the rest, which costs a training sentence only where one
# is exactly that piece.
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])|(?<=[؟।])\s*|\s*\n\s*")


def document_sentences(text: str) -> list[str]:
  """The sentences of a document (stripped, non-empty), by `_SENTENCE_END`."""
  return [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]


def transfer_sentences(name: str, directory) -> tuple[set, list]:
  """(sentences, files read) of every file of transfer benchmark `name` (MLDoc, Amazon)."""
  bench = transfer.BENCHMARKS[name]
  out, read = set(), []
  for lang in bench.languages:
    for domain in bench.domains:
      for split in ("train", "dev", "test"):
        path = Path(directory) / bench.pattern.format(lang=lang, split=split, domain=domain)
        if path.is_file():
          cols, _ = transfer.read_labeled(path, f"holdout {name}")
          for text in (t for col in cols for t in col if t.strip()):
            out.add(text.strip())
            out.update(document_sentences(text))
          read.append(path)
  if not read:
    raise DataError(f"holdout {name!r}: no files in {directory} "
                    f"({bench.layout(name + '_dir')})")
  return out, read


class EvaluationHeldOut(devsets.HeldOut):
  """The dev / test sets `names` (devsets) plus the evaluation benchmarks among `names`
  (BENCHMARKS; the user-supplied ones need their directory in `directories`), and every
  user-supplied benchmark whose directory `directories` gives."""

  def __init__(self, names: Sequence[str], data_dir: Optional[str] = None,
               directories: Optional[Mapping[str, Optional[str]]] = None,
               where: str = "holdout"):
    names = [names] if isinstance(names, str) else list(names)
    given = {k: v for k, v in (directories or {}).items() if v}
    unknown = sorted(set(given) - set(USER_SUPPLIED))
    if unknown:
      raise ConfigError(f"{where}_dirs: unknown benchmark(s) {unknown}; known: "
                        f"{', '.join(USER_SUPPLIED)}")
    need = [n for n in names if n in USER_SUPPLIED and n not in given]
    if need:
      raise ConfigError(f"{where}: {need} need their directory ({where}_dirs, e.g. "
                        f"--gin.{need[0].upper()}_DIR=...)")
    for name, d in given.items():
      if not Path(d).is_dir():
        raise ConfigError(f"{where}_dirs[{name!r}]={d!r}: no such directory")
    self.benchmarks = [n for n in BENCHMARKS if n in names or n in given]
    self.directories = given
    super().__init__([n for n in names if n not in BENCHMARKS], data_dir, where)
    self.names = [*self.names, *self.benchmarks]

  def _read_benchmarks(self) -> tuple[set, list]:
    out, files = set(), []
    for name in self.benchmarks:
      if name == "bucc":
        s, f = bucc_sentences(self.data_dir)
      elif name == "paracrawl":
        s, f = paracrawl_sentences(self.directories[name])
      else:
        s, f = transfer_sentences(name, self.directories[name])
      out |= s
      files += f
    return out, files

  @property
  def key(self) -> str:
    """Names the exclusion in cached split counts; the user's directories by the files
    in them (paths, sizes, times), so other files are another exclusion."""
    if not self.directories:
      return "+".join(self.names)
    listing = []
    for name, d in sorted(self.directories.items()):
      for p in sorted(Path(d).rglob("*")):
        if p.is_file():
          st = p.stat()
          listing.append(f"{name}:{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "+".join(self.names) + "@" + hashlib.sha256(
        "\n".join(listing).encode()).hexdigest()[:8]

  def sentences(self) -> set[str]:
    if self._sentences is None:
      dev = devsets.held_out_sentences([n for n in self.names if n not in BENCHMARKS],
                                       self.data_dir)
      self._sentences = dev | self._read_benchmarks()[0]
    return self._sentences
