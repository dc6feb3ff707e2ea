"""Parallel-corpus tasks and temperature-sampled mixtures over language pairs."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin

from vmx.data import download, tasks as vtasks
from vmx.data.download import DataError


@dataclasses.dataclass(frozen=True)
class ParallelCorpus:
  """Moses layout of a many-to-pivot corpus; `{lang}` is filled per language."""
  directory: str
  source_file: str
  pivot_file: str
  pivot: str


CORPORA = {
    "tatoeba-challenge": ParallelCorpus("train/tatoeba-challenge/{lang}-eng",
                                        "train.{lang}.gz", "train.eng.gz", "eng"),
    "wmt-newstest": ParallelCorpus("train/wmt-newstest/{lang}-en",
                                   "train.{lang}.gz", "train.en.gz", "en"),
}


def _corpus(name: str) -> ParallelCorpus:
  if name not in CORPORA:
    raise DataError(f"unknown corpus {name!r}; known: {', '.join(sorted(CORPORA))}")
  return CORPORA[name]


@gin.configurable(module="tasks")
def corpus_files(corpus: str, languages: Sequence[str], data_dir: Optional[str] = None
                 ) -> list[tuple[str, str, str]]:
  """[(lang, source path, pivot path)] for each language, resolved locally or downloaded."""
  c = _corpus(corpus)
  out = []
  for lang in languages:
    d = c.directory.format(lang=lang)
    rel_src, rel_piv = f"{d}/{c.source_file.format(lang=lang)}", f"{d}/{c.pivot_file}"
    if (download.configured_data_dir(data_dir) is None
        and rel_src not in download.registry()):
      raise DataError(f"corpus {corpus}: no data for language {lang!r} ({rel_src})")
    out.append((lang, str(download.resolve(rel_src, data_dir)),
                str(download.resolve(rel_piv, data_dir))))
  return out


@gin.configurable(module="tasks")
def corpus_text_files(corpus: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
                      data_dir: Optional[str] = None) -> list[str]:
  """Every distinct file of the corpus for these languages (e.g. to build a vocabulary)."""
  files = []
  for _, src, piv in corpus_files(corpus, languages, data_dir):
    files += [f for f in (src, piv) if f not in files]
  return files


@gin.configurable(module="tasks")
def parallel_mixture(corpus: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
                     vocabulary: str = gin.REQUIRED, model_languages: Sequence[str] = gin.REQUIRED,
                     alpha: float = 0.3, data_dir: Optional[str] = None,
                     empty_lines: str = "error",
                     shuffle_buffer_size: int = vtasks.DEFAULT_SHUFFLE_BUFFER) -> str:
  """Registers one pair task per language (xx -> pivot) and their mixture.

  Languages are sampled with p ∝ n^alpha (n = pairs per language). Returns the
  mixture name. `model_languages` fixes the language ids (index in that list).
  """
  c = _corpus(corpus)
  key = vtasks.short_hash(vocabulary)
  prefix = corpus.replace("-", "_")  # SeqIO names: [\w.:#]
  names = []
  for lang, src, piv in corpus_files(corpus, languages, data_dir):
    names.append(vtasks.register_pair_task(
        f"{prefix}.{lang}_{c.pivot}.{key}", vtasks.moses_source(src, piv, empty_lines),
        lang, c.pivot, vocabulary, model_languages, shuffle_buffer_size))
  lang_key = vtasks.short_hash(",".join(languages))
  return vtasks.register_mixture(f"{prefix}.mix_{lang_key}_a{alpha}.{key}", names, alpha)


@gin.configurable(module="tasks")
def moses_task(name: str, source_file: str, target_file: str, source_language: str,
               target_language: str, vocabulary: str, model_languages: Sequence[str],
               empty_lines: str = "error") -> str:
  """A pair task over any two aligned line files."""
  return vtasks.register_pair_task(
      name, vtasks.moses_source(source_file, target_file, empty_lines), source_language,
      target_language, vocabulary, model_languages)


@gin.configurable(module="tasks")
def tsv_task(name: str, path: str, source_language: str, target_language: str,
             vocabulary: str, model_languages: Sequence[str], columns: Sequence[int] = (0, 1),
             empty_lines: str = "error") -> str:
  """A pair task over a `source<TAB>target` file."""
  return vtasks.register_pair_task(
      name, vtasks.tsv_source(path, columns, empty_lines), source_language, target_language,
      vocabulary, model_languages)


@gin.configurable(module="tasks")
def monolingual_mixture(corpus: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
                        vocabulary: str = gin.REQUIRED, alpha: float = 0.7,
                        data_dir: Optional[str] = None, pivot: bool = True,
                        disjoint_pairs: bool = False,
                        shuffle_buffer_size: int = vtasks.DEFAULT_SHUFFLE_BUFFER) -> str:
  """Monolingual text from single sides of a parallel corpus (InfoXLM's MMLM data): one
  task per language (its side of the xx-pivot pairs) and, with `pivot`, one for the
  pivot language (the pivot side of every pair); languages sampled with p ∝ n^alpha
  (n = lines). `disjoint_pairs` (EMMA-X's non-parallel text): the xx side of the even
  pairs and the pivot side of the odd ones, so that no pair gives both of its sides.
  Returns the mixture name."""
  c = _corpus(corpus)
  key = vtasks.short_hash(vocabulary)
  prefix = corpus.replace("-", "_")
  files = corpus_files(corpus, languages, data_dir)
  sides = [(lang, [src]) for lang, src, _ in files]
  if pivot:
    sides.append((c.pivot, [piv for _, _, piv in files]))
  parity = {lang: (None if not disjoint_pairs else int(lang == c.pivot and pivot))
            for lang, _ in sides}
  names = [vtasks.register_text_task(
      f"{prefix}.mono_{lang}_{vtasks.short_hash(','.join(paths))}"
      f"{'' if parity[lang] is None else f'_p{parity[lang]}'}.{key}",
      vtasks.text_source(paths, parity[lang]), vocabulary, shuffle_buffer_size)
      for lang, paths in sides]
  lang_key = vtasks.short_hash(",".join(languages) + f"|pivot={pivot}"
                               + ("|disjoint" if disjoint_pairs else ""))
  return vtasks.register_mixture(f"{prefix}.mono_mix_{lang_key}_a{alpha}.{key}", names, alpha)
