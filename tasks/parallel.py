"""Parallel-corpus tasks and temperature-sampled mixtures over language pairs."""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

import gin

from etils import epy

from vmx.data import download, task_settings
with epy.lazy_imports():   # SeqIO and TensorFlow: only when a task is registered
  from vmx.data import registration, sources, teacher as teacher_lib
from vmx.errors import DataError
from vmx.evaluation.heldout import EvaluationHeldOut


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


def corpus_languages(corpus: str) -> list[str]:
  """Every language of a corpus (sorted), from the data registry (vmx/data/registry.tsv)."""
  c = _corpus(corpus)
  pattern = re.compile(re.escape(c.directory).replace(re.escape("{lang}"), r"([^/]+)")
                       + "/" + re.escape(c.source_file).replace(re.escape("{lang}"), r"\1")
                       + "$")
  return sorted({m.group(1) for rel in download.registry() for m in [pattern.match(rel)] if m})


def languages_key(languages: Sequence[str], every: Sequence[str]) -> str:
  """A language set inside a task name: `all` (every language of the corpus), the codes
  themselves (up to 4), else their number and a hash of the sorted codes."""
  langs = sorted(languages)
  if langs == sorted(every):
    return "all"
  if len(langs) <= 4:
    return "_".join(langs)
  return f"{len(langs)}langs_{registration.short_hash(','.join(langs))}"


def held_out(holdout: Sequence[str], data_dir: Optional[str], where: str,
             directories: Optional[dict] = None):
  """(a devsets.HeldOut or None, task-name suffix): `holdout` names dev sets, test sets
  and evaluation benchmarks whose sentences the tasks skip, `directories` {benchmark:
  directory or None} the user-supplied benchmarks (ParaCrawl, MLDoc, Amazon: every one
  given is skipped; vmx/evaluation/heldout.py); the names carry `.minus_<sets>` (other
  data, another name; user directories add a hash of their files)."""
  if not holdout and not any((directories or {}).values()):
    return None, ""
  h = EvaluationHeldOut(holdout, data_dir, directories, where=f"{where}.holdout")
  stamp = h.key.partition("@")[2]
  return h, ".minus_" + "_".join(h.names) + (f"_{stamp}" if stamp else "")


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


def parallel_mixture(corpus: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
                     vocabulary: str = gin.REQUIRED, model_languages: Sequence[str] = gin.REQUIRED,
                     alpha: float = 0.3, data_dir: Optional[str] = None,
                     empty_lines: str = "error",
                     shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                     validation_percent: int = task_settings.VALIDATION_PERCENT,
                     lazy: bool = False, holdout: Sequence[str] = (),
                     holdout_dirs: Optional[dict] = None, emptied: str = "error") -> str:
  """Registers one pair task per language (xx -> pivot), `<corpus>.<xx>_<pivot>`, and
  their mixture `<corpus>.mix_<languages>_a<alpha>` (`languages_key`); returns its name.

  Languages are sampled with p ∝ n^alpha (n = training pairs per language).
  `model_languages` fixes the language ids (index in that list). Names do not depend
  on the vocabulary: registering again (another run's vocabulary) replaces the tasks.
  `lazy`: files are validated and counted on first use instead of now. `holdout`: dev
  sets (`vmx.data.devsets`), test sets and evaluation benchmarks whose sentences are
  skipped, `holdout_dirs` the user's evaluation data to skip as well ({'paracrawl' |
  'mldoc' | 'amazon_v1' | 'amazon_v2': directory or None}; EMS §4.2, `held_out`); names
  end in `.minus_<sets>`. A language whose every pair the hold-out removes is an error
  when the task is first counted (it would drop out of the mixture unseen); `emptied =
  'warn'` trains without it after one warning line.
  """
  h, suffix = held_out(holdout, data_dir, "tasks.parallel_mixture", holdout_dirs)
  names = _pair_tasks(corpus, languages, vocabulary, model_languages, data_dir, empty_lines,
                      shuffle_buffer_size, validation_percent, h, suffix,
                      emptied=emptied, switch="tasks.parallel_mixture.emptied")
  key = languages_key(languages, corpus_languages(corpus))
  prefix = corpus.replace("-", "_")  # SeqIO names: [\w.:#]
  return registration.register_mixture(f"{prefix}.mix_{key}_a{alpha}{suffix}", names, alpha, lazy)


def _pair_tasks(corpus, languages, vocabulary, model_languages, data_dir, empty_lines,
                shuffle_buffer_size, validation_percent, h, suffix, teacher=None,
                emptied="error", switch="emptied") -> list[str]:
  """Registers `<corpus>.<xx>_<pivot><suffix>` for each language; returns the names."""
  c = _corpus(corpus)
  prefix = corpus.replace("-", "_")
  names = []
  # a teacher cache that embeds a sample of the pivots: the pairs with an embedded pivot
  pivots_in = teacher if teacher and teacher_lib.partial(teacher) else None
  for lang, src, piv in corpus_files(corpus, languages, data_dir):
    source = sources.moses_source(src, piv, empty_lines, validation_percent, h, pivots_in,
                                  emptied, switch)
    names.append(registration.register_pair_task(
        f"{prefix}.{lang}_{c.pivot}{suffix}", source, lang, c.pivot, vocabulary,
        model_languages, shuffle_buffer_size, teacher))
  return names


def parallel_corpora_mixture(corpora=gin.REQUIRED, vocabulary: str = gin.REQUIRED,
                             model_languages: Sequence[str] = gin.REQUIRED,
                             alpha: float = 0.3, data_dir: Optional[str] = None,
                             empty_lines: str = "error",
                             shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                             validation_percent: int = task_settings.VALIDATION_PERCENT,
                             lazy: bool = False, holdout: Sequence[str] = (),
                             teacher: Optional[str] = None, emptied: str = "error") -> str:
  """The pair tasks of several corpora ({corpus: languages}, e.g. tatoeba-challenge and
  wmt-newstest) in one mixture, every (corpus, language) task sampled with p ∝ n^alpha:
  `pairs.mix_<hash of the task names>_a<alpha>[.minus_<sets>][.teacher_<hash>]`. Other
  arguments as in `parallel_mixture`; `model_languages` must hold every corpus's codes
  and pivot. `teacher`: a teacher-embedding cache (`teacher_embeddings`): every pair also
  yields `teacher` [D], the teacher's embedding of its pivot sentence (distillation); a
  partial cache (`max_sentences_per_file`) keeps the pairs whose pivot it embeds, and the
  mixing rates count those. `emptied`: as in `parallel_mixture` (the teacher's filter
  too)."""
  if not isinstance(corpora, dict) or not corpora:
    raise DataError(f"tasks.parallel_corpora_mixture.corpora={corpora!r}: expected a "
                    f"non-empty {{corpus: [languages]}} dict (corpora: {', '.join(CORPORA)})")
  h, suffix = held_out(holdout, data_dir, "tasks.parallel_corpora_mixture")
  if teacher:   # another feature, another name
    suffix += ".teacher_" + registration.short_hash(str(teacher))
  names = []
  for corpus, languages in corpora.items():
    names += _pair_tasks(corpus, languages, vocabulary, model_languages, data_dir,
                         empty_lines, shuffle_buffer_size, validation_percent, h, suffix,
                         teacher, emptied, "tasks.parallel_corpora_mixture.emptied")
  key = registration.short_hash("|".join(names))
  return registration.register_mixture(f"pairs.mix_{key}_a{alpha}{suffix}", names, alpha, lazy)


@gin.configurable(module="tasks")
def corpora_text_files(corpora=gin.REQUIRED, data_dir: Optional[str] = None) -> list[str]:
  """`corpus_text_files` of every corpus of a `parallel_corpora_mixture`."""
  return [f for c, langs in corpora.items() for f in corpus_text_files(c, langs, data_dir)]


def _checked(source):
  """A source validated now (explicitly registered files fail at registration)."""
  source.counts()
  return source


def moses_task(name: str, source_file: str, target_file: str, source_language: str,
               target_language: str, vocabulary: str, model_languages: Sequence[str],
               empty_lines: str = "error",
               validation_percent: int = task_settings.VALIDATION_PERCENT,
               holdout: Sequence[str] = (), data_dir: Optional[str] = None) -> str:
  """A pair task over any two aligned line files (`holdout`: dev sets to skip, read
  from `data_dir`)."""
  h, _ = held_out(holdout, data_dir, "tasks.moses_task")
  return registration.register_pair_task(
      name, _checked(sources.moses_source(source_file, target_file, empty_lines,
                                         validation_percent, h)),
      source_language, target_language, vocabulary, model_languages)


def tsv_task(name: str, path: str, source_language: str, target_language: str,
             vocabulary: str, model_languages: Sequence[str], columns: Sequence[int] = (0, 1),
             empty_lines: str = "error",
             validation_percent: int = task_settings.VALIDATION_PERCENT,
             holdout: Sequence[str] = (), data_dir: Optional[str] = None) -> str:
  """A pair task over a `source<TAB>target` file (`holdout` as in `moses_task`)."""
  h, _ = held_out(holdout, data_dir, "tasks.tsv_task")
  return registration.register_pair_task(
      name, _checked(sources.tsv_source(path, columns, empty_lines, validation_percent, h)),
      source_language, target_language, vocabulary, model_languages)


def monolingual_mixture(corpus: str = gin.REQUIRED, languages: Sequence[str] = gin.REQUIRED,
                        vocabulary: str = gin.REQUIRED, alpha: float = 0.7,
                        data_dir: Optional[str] = None, pivot: bool = True,
                        disjoint_pairs: bool = False,
                        shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                        validation_percent: int = task_settings.VALIDATION_PERCENT,
                        lazy: bool = False, holdout: Sequence[str] = (),
                        emptied: str = "error") -> str:
  """Monolingual text from single sides of a parallel corpus (InfoXLM's MMLM data): one
  task per language (its side of the xx-pivot pairs), `<corpus>.mono_<xx>`, and, with
  `pivot`, one for the pivot language (the pivot side of every pair),
  `<corpus>.mono_<pivot>.<languages>`; languages sampled with p ∝ n^alpha (n = lines).
  `disjoint_pairs` (EMMA-X's non-parallel text): the xx side of the even pairs and the
  pivot side of the odd ones, so that no pair gives both of its sides (names end in
  `_even` / `_odd`). `holdout`, `emptied`: as in `parallel_mixture`. Returns the mixture name,
  `<corpus>.mono_mix_<languages>_a<alpha>`."""
  c = _corpus(corpus)
  h, hsuffix = held_out(holdout, data_dir, "tasks.monolingual_mixture")
  prefix = corpus.replace("-", "_")
  key = languages_key(languages, corpus_languages(corpus))
  files = corpus_files(corpus, languages, data_dir)
  sides = [(lang, [src], f"{prefix}.mono_{lang}") for lang, src, _ in files]
  if pivot:
    sides.append((c.pivot, [piv for _, _, piv in files], f"{prefix}.mono_{c.pivot}.{key}"))
  names = []
  for lang, paths, name in sides:
    parity = None if not disjoint_pairs else int(lang == c.pivot and pivot)
    suffix = "" if parity is None else ("_even", "_odd")[parity]
    names.append(registration.register_text_task(
        name + suffix + hsuffix,
        sources.text_source(paths, parity, validation_percent, h, emptied,
                            "tasks.monolingual_mixture.emptied"),
        vocabulary, shuffle_buffer_size))
  variant = ("" if pivot else "_nopivot") + ("_disjoint" if disjoint_pairs else "")
  return registration.register_mixture(f"{prefix}.mono_mix_{key}{variant}_a{alpha}{hsuffix}", names,
                                 alpha, lazy)
