#!/usr/bin/env python
r"""Fine-tune any vmx encoder for cross-lingual transfer and score it zero-shot (gin-configured).

  python launch/finetune.py --gin_file=finetune/xnli_infoxlm_base.gin \
      --gin.INITIAL_CHECKPOINT_PATH="'DIR'" --gin.XNLI_DIR="'XNLI'" --gin.MODEL_DIR="'OUT'" \
      [--protocol=infoxlm|emmax] [--fresh]

INITIAL_CHECKPOINT_PATH is a vmx model directory: any finished run, or one written by
launch/import_checkpoint.py. The benchmark's data are the user's files (XNLI_DIR,
PAWSX_DIR, ANLI_DIR; MLQA_DIR with SQUAD_DIR; the layouts: vmx/finetune/data.py and qa.py,
docs/evaluation.md). The run trains like launch/train.py (mesh, checkpoints, resume after a
kill or preemption: rerun the same command), keeps the step with the best joint dev score
(MLQA as InfoXLM: the last step), and writes MODEL_DIR/finetune_<benchmark>.json (every
language's test accuracy; MLQA's F1 and exact match). `--protocol` writes
MODEL_DIR/protocol_<name>_finetuned.json: the figures in the paper's tables they mirror
(InfoXLM Tables 1, 4 and 5; EMMA-X Table 1 and its per-language tables), each with its
vector, and what else the paper fine-tunes that this run did not (vmx/evaluation/protocols/).
"""
import importlib.util  # noqa: F401  (gin-config 0.5 gotcha: import before gin parses)
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

from vmx import cli, gin_utils, signals  # noqa: E402


def main(argv):
  signals.install()   # SIGTERM / SIGINT: the run saves at the next step, exit 75
  bindings, rest = gin_utils.split_gin_bindings(argv)
  parser = cli.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(parser)
  parser.add_argument("--protocol", default="",
                      help="infoxlm or emmax: write the figures of that paper's tables")
  parser.add_argument("--stop_at_step", type=int, default=None,
                      help="end this invocation after that step (saved; rerun to continue), "
                           "as a preempted run would")
  parser.add_argument("--fresh", action="store_true",
                      help="start anew in a MODEL_DIR that holds an earlier run (moved aside)")
  args = parser.parse_args(rest)
  from vmx.evaluation import protocols  # lazy: jax, after cli.run_main's host set-up
  from vmx.errors import ConfigError
  if args.protocol and args.protocol not in protocols.FINETUNED:
    raise ConfigError(f"--protocol={args.protocol!r}: fine-tuned figures exist for "
                      f"{sorted(protocols.FINETUNED)}")
  if args.fresh:
    bindings.append("finetune.fresh = True")
  from vmx import experiment, finetune  # lazy: jax/TF after cli.run_main (registers finetune)
  experiment.parse_gin(args.gin_file, bindings, args.gin_search_paths)
  with signals.activity("fine-tuning"):
    results = finetune.finetune(stop_at_step=args.stop_at_step)
  if results is None:
    print("[vmx finetune] stopped at --stop_at_step; rerun without it to continue")
    return None
  from vmx import storage  # lazy: after cli.run_main
  out = storage.path(results["model_dir"])
  print(f"[vmx finetune] {results['benchmark']}, {results['setting']}: mean "
        f"{results['metrics'][0]} {results['main_score']:.2f} over "
        f"{len(results['scores']['test'])} languages "
        f"({results['selected']}) -> {out}/finetune_{results['benchmark']}.json")
  if args.protocol:
    report = protocols.finetuned_report(args.protocol, results)
    storage.write_atomic(out / f"protocol_{args.protocol}_finetuned.json",
                         json.dumps(report, indent=1))
    for f in report["figures"]:
      print(f"  {f['table']}, {f['column']}: {f['value']:.2f} ({f['metric']}; vector: "
            f"{f['vector']})")
    for m in report["missing"]:
      print(f"  missing: {m['table']}, {m['benchmark']} ({m['layout']})")
  return results


if __name__ == "__main__":
  cli.run_main(main)
