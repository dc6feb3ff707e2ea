r"""Cross-lingual transfer fine-tuning: `launch/finetune.py`'s gin-configured run.

  python launch/finetune.py --gin_file=finetune/xnli_infoxlm_base.gin \
      --gin.INITIAL_CHECKPOINT_PATH="'gs://BUCKET/infoxlm_base'" --gin.XNLI_DIR="'DIR'" \
      --gin.MODEL_DIR="'gs://BUCKET/infoxlm_base_xnli'" [--protocol=infoxlm]

What InfoXLM's Tables 1, 4, 5, 7 and 10 report (XNLI and MLQA after fine-tuning on English,
scored on every language zero-shot, §4.2 and App. D) and EMMA-X's fine-tuned XRETE
classification tasks (XNLI, AmericasNLI, PAWS-X; Table 1 "translate-train-all":
`train_languages` all of them). Two kinds of benchmark share the run, each handing it a
`Task` (task.py):
- sentence-pair classification (`BENCHMARKS`, data.py; run.py `pairs_task`): the pairs
  joined in the tokenizer's own pair format (`encode_pairs`) and classified by
  `vmx.models.classifier.ClassifierModel`;
- extractive QA (`QA_BENCHMARKS`, qa.py; SQuAD-format files and MLQA's metric, squad.py):
  question-passage windows and a span head (`vmx.models.span.SpanModel`).
Either model's encoder starts from any vmx model directory, a finished run of any method or
one written by launch/import_checkpoint.py (its encoder, wherever the method keeps it:
`source_encoder`).

The run is a training run (vmx/training/trainer.py `run_phases`, the loop that `train()`
runs): the same mesh and sharding (`Partitioner`), checkpoints and resume
(vmx/modeldir/checkpoints.py: a killed run resumes at its step, bit for bit; the data
position is the step), run lock and restart contract, preemption, non-finite checks,
metrics and best checkpoint. Only the input differs: the examples are few and labelled, so
they are tokenized once into memory and the batch of step s is a pure function of (seed,
s) (data.py `ArrayInput`, an `Input` of vmx/training/inputs.py: epoch e is a seeded
permutation of the training rows), instead of the token-cache pipeline. Model selection as
InfoXLM's App. D: for XNLI every `eval_period` steps the accuracy on the joint dev set of
the evaluated languages, the best step kept in MODEL_DIR/best/ (#M=1: one model for all
languages); for MLQA the last step. At the end every language's test set is scored with
it and MODEL_DIR/finetune_<benchmark>.json written.

Modules: task.py (`Start`, `Task`), data.py (pair benchmarks, files, `ArrayInput`), qa.py
and squad.py (extractive QA), run.py (`finetune()`, `pairs_task`, `DevAccuracy`,
`predict`).
"""
from vmx.finetune.data import (BENCHMARKS, XNLI_LANGUAGES, ArrayInput, PairBenchmark,
                               RowBatches, read_pairs)
from vmx.finetune.qa import QA_BENCHMARKS, DevF1, QaBenchmark, QaSettings
from vmx.finetune.run import DevAccuracy, finetune, pairs_task, predict
from vmx.finetune.squad import QaExample, evaluate, normalize_answer, read_squad
from vmx.finetune.task import Start, Task, open_start, source_encoder

__all__ = ["BENCHMARKS", "XNLI_LANGUAGES", "ArrayInput", "PairBenchmark", "RowBatches",
           "read_pairs", "QA_BENCHMARKS", "DevF1", "QaBenchmark", "QaSettings", "DevAccuracy",
           "finetune", "pairs_task", "predict", "QaExample", "evaluate", "normalize_answer",
           "read_squad", "Start", "Task", "open_start", "source_encoder"]
