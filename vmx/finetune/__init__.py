"""Cross-lingual transfer fine-tuning: `launch/finetune.py`'s gin-configured run.

  python launch/finetune.py --gin_file=finetune/xnli_infoxlm_base.gin \
      --gin.INITIAL_CHECKPOINT_PATH="'gs://BUCKET/infoxlm_base'" --gin.XNLI_DIR="'DIR'" \
      --gin.MODEL_DIR="'gs://BUCKET/infoxlm_base_xnli'" [--protocol=infoxlm]

What InfoXLM's Tables 1, 7 and 10 report (XNLI after fine-tuning on English, scored on
every language zero-shot, §4.2 and App. D) and EMMA-X's fine-tuned XRETE classification
tasks (XNLI, AmericasNLI, PAWS-X; Table 1 "translate-train-all": `train_languages` all of
them). Sentence-pair classification benchmarks share one code path (`BENCHMARKS`): the
pairs are read from the user's files, joined in the tokenizer's own pair format
(the tokenizer's `encode_pairs`) and classified by `vmx.models.classifier.ClassifierModel`,
whose encoder starts from any vmx model directory, a finished run of any method or one written by
launch/import_checkpoint.py (its encoder, wherever the method keeps it: `source_encoder`).

The run is a training run (vmx/training/trainer.py `run_phases`, the loop that `train()`
runs): the same mesh and sharding (`Partitioner`), checkpoints and resume
(vmx/modeldir/checkpoints.py: a killed run resumes at its step, bit for bit; the data
position is the step), run lock and restart contract, preemption, non-finite checks,
metrics and best checkpoint. Only the input differs: the pairs are few and labelled, so
they are tokenized once into memory and the batch of step s is a pure function of (seed,
s) (vmx/finetune/data.py `ArrayInput`, an `Input` of vmx/training/inputs.py: epoch e is a
seeded permutation of the training pairs), instead of the token-cache pipeline. Model
selection as InfoXLM's App. D: every `eval_period` steps the accuracy on the joint dev set
of the evaluated languages, the best step kept in MODEL_DIR/best/ (#M=1: one model for all
languages). At the end every language's test set is scored with it (without dev files:
the last step) and MODEL_DIR/finetune_<benchmark>.json written.

Modules: data.py (benchmarks, files, `ArrayInput`), run.py (`finetune()`, `DevAccuracy`,
`predict`, `source_encoder`).
"""
from vmx.finetune.data import (BENCHMARKS, XNLI_LANGUAGES, ArrayInput, PairBatches,
                               PairBenchmark, read_pairs)
from vmx.finetune.run import DevAccuracy, finetune, predict, source_encoder

__all__ = ["BENCHMARKS", "XNLI_LANGUAGES", "ArrayInput", "PairBatches", "PairBenchmark",
           "read_pairs", "DevAccuracy", "finetune", "predict", "source_encoder"]
