"""SeqIO registrations for vmx's corpora.

With VMX_VOCABULARY and VMX_DATA_DIR set, `import tasks` registers every corpus's tasks
and mixtures under stable names (tasks/defaults.py), for seqio's tools, caching and t5x.
Otherwise tasks are registered when a gin run asks for them (their vocabulary and data
location are run settings), by the functions here, which return the task or mixture name
for `DatasetConfig.mixture_or_task_name`. In gin they are deferred (vmx/data/deferred.py):
the binding holds the call, and a run whose token cache is built finds it by that call
without registering anything (no SeqIO, no TensorFlow):

  DatasetConfig.mixture_or_task_name = @tasks.parallel_mixture()
  tasks.parallel_mixture.corpus = 'tatoeba-challenge'
  tasks.parallel_mixture.languages = %TRAIN_LANGUAGES
  tasks.parallel_mixture.alpha = 0.3

Corpora (layouts of ../shared/data/train, see its README):
  tatoeba-challenge  train/tatoeba-challenge/<xxx>-eng/train.{<xxx>,eng}.gz  (ISO 639-3)
  wmt-newstest       train/wmt-newstest/<xx>-en/train.{<xx>,en}.gz           (ISO 639-1)
Monolingual text (single sides of those corpora): `tasks.monolingual_mixture`.
Any other Moses or TSV corpus: `tasks.moses_task` / `tasks.tsv_task`.
N-way corpora for MPCL (`tasks.nway_task`): tico19-multiway, wmt-newstest-multiway,
bible-verses (see tasks/nway.py); MPCL's own (`tasks.mpcl_mixture`: XNLI-MT 1.0's premises
in six languages when the user sets its directory, else those corpora) and with hard
negatives (`tasks.xnli_mt_task`): XNLI-MT 1.0's translated MultiNLI files (see
tasks/xnli_mt.py), or pairs with negatives the model mined itself
(`tasks.mined_negatives_task`, `tasks.mined_negatives_mixture`: tasks/mined.py,
launch/mine_negatives.py).
"""
from tasks.parallel import (CORPORA, ParallelCorpus, corpora_text_files, corpus_files,
                            corpus_languages, corpus_text_files, languages_key,
                            monolingual_mixture, moses_task, parallel_corpora_mixture,
                            parallel_mixture, tsv_task)
from tasks.teacher import pivot_sentences, teacher_embeddings
from tasks.nway import (NWAY_CORPORA, nway_groups, nway_mixture, nway_mixture_text_files,
                        nway_task, nway_text_files)
from tasks.mined import mined_negatives_mixture, mined_negatives_task
from tasks.xnli_mt import (MPCL_LANGUAGES, XNLI_LANGUAGES, mpcl_mixture, mpcl_mixture_text_files,
                           read_xnli_mt, xnli_mt_files, xnli_mt_groups, xnli_mt_task,
                           xnli_mt_text_files)
from tasks.defaults import default_languages, register_defaults, register_from_environment
from vmx.data import deferred

for _fn in (parallel_mixture, parallel_corpora_mixture, moses_task, tsv_task,
            monolingual_mixture, nway_task, nway_mixture, xnli_mt_task, mpcl_mixture,
            mined_negatives_task, mined_negatives_mixture):
  deferred.configurable(_fn)

DEFAULT_MIXTURES = register_from_environment()
