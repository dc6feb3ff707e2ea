"""Tasks registered on `import tasks`, for SeqIO's tools and t5x (`--module_import=tasks`).

Set `VMX_VOCABULARY` (a SentencePiece `.model`, or an imported checkpoint's
`vmx_tokenizer.json`) and `VMX_DATA_DIR` (a local copy of shared/data); `import tasks`
then registers, for every corpus of `CORPORA` and every language whose files are in
the data dir, without reading any file (files are validated and counted on first use):

  tatoeba_challenge.<xxx>_eng            pair tasks (126 languages), train + validation
  tatoeba_challenge.mix_all_a0.3         their mixture, p ∝ n^0.3
  tatoeba_challenge.mono_<xxx>           monolingual tasks, and mono_eng.all for English
  tatoeba_challenge.mono_mix_all_a0.7    their mixture, p ∝ n^0.7
  wmt_newstest.<xx>_en, wmt_newstest.mix_all_a0.3, wmt_newstest.mono_...  (23 languages)

Language ids (`inputs_lang`, `targets_lang`) index `default_languages(corpus)`: the
corpus's languages, sorted, then its pivot. A gin run registers the same names again
with its own vocabulary and LANGUAGES (tasks.parallel_mixture & co.); the names never
depend on the vocabulary. N-way corpora (MPCL) are not registered here: their number of
views is a model setting (tasks.nway_task).
"""
from __future__ import annotations

import os
from typing import Optional

from tasks.parallel import CORPORA, corpus_languages, monolingual_mixture, parallel_mixture
from vmx import storage
from vmx.data import download
from vmx.errors import DataError

VOCABULARY_VARIABLE = "VMX_VOCABULARY"
PAIR_ALPHA, MONO_ALPHA = 0.3, 0.7


def default_languages(corpus: str) -> list[str]:
  """The language-id order of the default tasks: the corpus's languages, then the pivot."""
  return corpus_languages(corpus) + [CORPORA[corpus].pivot]


def register_defaults(vocabulary: str, data_dir: Optional[str] = None) -> list[str]:
  """Registers the default tasks and mixtures (see the module docstring); returns the
  mixture names."""
  if not storage.path(vocabulary).exists():
    raise DataError(f"{VOCABULARY_VARIABLE}={vocabulary!r}: no such file (a SentencePiece "
                    f".model or an imported checkpoint's vmx_tokenizer.json)")
  if download.configured_data_dir(data_dir) is None:
    raise DataError(f"{VOCABULARY_VARIABLE} is set but VMX_DATA_DIR is not: the default "
                    f"tasks read a local copy of shared/data (train/)")
  mixtures = []
  for corpus, c in CORPORA.items():
    langs = [l for l in corpus_languages(corpus)
             if download.available(f"{c.directory}/{c.source_file}".format(lang=l), data_dir)]
    if not langs:
      continue
    mixtures.append(parallel_mixture(corpus, langs, vocabulary, default_languages(corpus),
                                     alpha=PAIR_ALPHA, data_dir=data_dir, lazy=True))
    mixtures.append(monolingual_mixture(corpus, langs, vocabulary, alpha=MONO_ALPHA,
                                        data_dir=data_dir, lazy=True))
  return mixtures


def register_from_environment() -> list[str]:
  """`register_defaults` with $VMX_VOCABULARY and $VMX_DATA_DIR, when VMX_VOCABULARY is set."""
  vocabulary = os.environ.get(VOCABULARY_VARIABLE)
  return register_defaults(vocabulary) if vocabulary else []
