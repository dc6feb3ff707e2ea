#!/usr/bin/env python
"""Evaluate a trained vmx model on a suite of tasks (no TensorFlow needed).

  python launch/eval.py --checkpoint_dir=/tmp/vmx/contrastive_tiny --suite=standard \
      [--tasks=tatoeba,bucc] [--output_dir=DIR] [--data_dir=...] [--step=N|best]

Suites: tatoeba, mining (tatoeba, bucc), sts (sts12-16, stsb), quick (tatoeba, stsb,
geometry), standard (tatoeba, bucc, sts12-16, stsb, xnli_transfer, geometry), full
(standard + sts17 + retrieval, which need --sts17_dir / --retrieval_dir). Tasks outside
the suites: paracrawl, mldoc, amazon_v1, amazon_v2, flores (their --*_dir) and
tatoeba_layers (per-layer Tatoeba, --tatoeba_layers), tatoeba_vector (Tatoeba with one
layer's mean or CLS, --tatoeba_vector).
`--protocol=vmsst|ems|infoxlm|emmax|mpcl` (comma-separated for several) runs what that
paper's tables report, with its conventions, and writes OUTPUT_DIR/protocol_<name>.json
naming each figure's table and the benchmarks vmx cannot read yet
(vmx/evaluation/protocols.py; docs/evaluation.md).
Writes OUTPUT_DIR/<task>.json (MTEB-like), summary.md and plots; OUTPUT_DIR defaults
to CHECKPOINT_DIR/eval/checkpoint_<step>. Exits 1 if any task failed (the others'
results are still written). Any object with encode(list_of_str) can be evaluated
from Python: `vmx.evaluation.harness.run(encoder, suite=..., output_dir=...)`.
"""
import argparse
import importlib.util  # noqa: F401  (see launch/train.py)
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _list(s):
  return [x for x in s.split(",") if x] if s else []


def parse_args(argv):
  from vmx.evaluation import harness, protocols  # lazy: jax, after cli.run_main's host set-up
  from vmx.modeldir.layout import BEST_DIR, BEST_STEP  # lazy: after cli.run_main

  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True, help="a vmx model_dir")
  p.add_argument("--suite", default="standard", help=f"one of {sorted(harness.SUITES)}")
  p.add_argument("--protocol", default="",
                 help=f"a paper's evaluation protocol, comma-separated of "
                      f"{sorted(protocols.PROTOCOLS)} (replaces --suite / --tasks)")
  p.add_argument("--tasks", default="", help=f"comma-separated, overrides --suite; of "
                                             f"{sorted(harness.TASKS)}")
  p.add_argument("--step", type=cli.step_flag, default=None,
                 help=f"checkpoint step, or {BEST_STEP!r} (MODEL_DIR/{BEST_DIR}/, kept by runs "
                      "with BEST_METRIC); default: the latest")
  p.add_argument("--output_dir", default=None)
  cli.add_vector_flags(p, "score")
  p.add_argument("--fresh", action="store_true",
                 help="run every task again (default: a task whose result file in the output "
                      "directory was written for this checkpoint, vmx version and settings "
                      "is kept, so an interrupted evaluation continues where it stopped)")
  p.add_argument("--data_dir", default=None, help="default: $VMX_DATA_DIR, else the cache")
  p.add_argument("--languages", default="", help="Tatoeba languages (ISO 639-3), or 'all'; "
                                                 "default: the model's trained languages")
  p.add_argument("--bucc_pairs", default="",
                 help=f"comma-separated (default: every one of {','.join(harness.bucc.PAIRS)} "
                      f"whose gold files are supplied)")
  p.add_argument("--sts17_dir", default=None)
  p.add_argument("--sts17_gs_dir", default=None)
  p.add_argument("--retrieval_dir", action="append", default=[],
                 help="a directory with queries.tsv, corpus.tsv, qrels.tsv (repeatable)")
  p.add_argument("--geometry_files", default="",
                 help="lang=path,... line-aligned N-way files (default newstest2013 x6)")
  p.add_argument("--geometry_n", type=int, default=1000)
  p.add_argument("--transfer_languages", default=",".join(harness.transfer.XNLI_LANGS))
  p.add_argument("--transfer_source", default="en")
  p.add_argument("--transfer_probe", default=None, choices=harness.transfer.PROBES,
                 help="probe of the transfer tasks (default: xnli_transfer logistic, "
                      "mldoc / amazon_v1 / amazon_v2 EMS's mlp)")
  p.add_argument("--transfer_seeds", default="",
                 help="comma-separated probe seeds; the mean is reported (default: "
                      "xnli_transfer 0, mldoc / amazon 0,1,2,3,4)")
  for name in harness.transfer.BENCHMARKS:
    b = harness.transfer.BENCHMARKS[name]
    p.add_argument(f"--{name}_dir", default=None,
                   help=f"task {name} (EMS {b.table}): DIR/{b.pattern}, text<TAB>label")
  p.add_argument("--paracrawl_dir", default=None,
                 help="task paracrawl (EMS Table 9): OPUS ParaCrawl v5 ParaCrawl.<pair>.<xx> "
                      "files (vmx/evaluation/paracrawl.py)")
  p.add_argument("--paracrawl_languages", default="",
                 help="comma-separated (default: every Table 9 language whose files are there)")
  p.add_argument("--paracrawl_queries", type=int, default=harness.paracrawl.N_QUERIES)
  p.add_argument("--paracrawl_candidates", type=int, default=harness.paracrawl.N_CANDIDATES)
  p.add_argument("--paracrawl_seed", type=int, default=0)
  p.add_argument("--flores_dir", default=None,
                 help="task flores (EMMA-X Tables 3-4): FLORES-200's flores200_dataset/ "
                      "(<split>/<lang_Script>.<split>)")
  p.add_argument("--flores_splits", default=",".join(harness.flores.DEFAULT_SPLITS),
                 help="task flores: splits read, concatenated (EMMA-X: all 3,001 sentences)")
  p.add_argument("--flores_languages", default="",
                 help="task flores: FLORES codes (default: every language supplied)")
  p.add_argument("--tatoeba_layers", default="",
                 help="task tatoeba_layers (InfoXLM Fig. 1): 'all' or comma-separated layer "
                      "numbers; with --protocol=infoxlm it adds the Fig. 1 rows")
  p.add_argument("--tatoeba_vector", default="7,mean",
                 help="task tatoeba_vector (InfoXLM Tables 2-3 in --protocol=infoxlm): "
                      "LAYER,POOLING (mean or first) of the encoder, whatever vector the "
                      "model embeds; default §4.2's, the mean of layer 7")
  p.add_argument("--tatoeba_layer_languages",
                 default=",".join(harness.tatoeba.INFOXLM_PARALLEL14),
                 help="task tatoeba_layers: its Tatoeba languages (default InfoXLM's 14)")
  p.add_argument("--dev_sets", default=",".join(harness.devsets.DEFAULT_DEV_SETS),
                 help="task dev: dev sets carved from the training data (vmx/data/devsets.py)")
  p.add_argument("--dev_max_sentences", type=int, default=1000,
                 help="task dev: the first N sentences of each set (0: all)")
  p.add_argument("--dev_languages", default="", help="task dev: a subset of the languages")
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--no_plots", action="store_true")
  p.add_argument("--no_progress", action="store_true")
  args = p.parse_args(argv)
  _check_paths(args)
  geo = None
  if args.geometry_files:
    try:
      geo = dict(kv.split("=", 1) for kv in _list(args.geometry_files))
    except ValueError:
      p.error(f"--geometry_files={args.geometry_files!r}: expected lang=path,lang=path")
  langs = _list(args.languages)
  layers = None
  if args.tatoeba_layers:
    try:
      layers = (args.tatoeba_layers if args.tatoeba_layers == "all" else
                [int(x) for x in _list(args.tatoeba_layers)])
    except ValueError:
      p.error(f"--tatoeba_layers={args.tatoeba_layers!r}: expected 'all' or layer numbers 1,2,..")
  try:
    seeds = [int(x) for x in _list(args.transfer_seeds)] or None
  except ValueError:
    p.error(f"--transfer_seeds={args.transfer_seeds!r}: expected integers 0,1,..")
  vector = _list(args.tatoeba_vector)
  if (len(vector) != 2 or not vector[0].isdigit() or int(vector[0]) < 1
      or vector[1] not in ("mean", "first")):
    p.error(f"--tatoeba_vector={args.tatoeba_vector!r}: expected LAYER,POOLING, e.g. 7,mean "
            f"(pooling mean or first)")
  if langs == ["all"]:
    from vmx.evaluation import tatoeba  # lazy: jax
    langs = tatoeba.available_languages(args.data_dir)
  cfg = harness.EvalConfig(
      data_dir=args.data_dir, tatoeba_languages=langs or None,
      bucc_pairs=_list(args.bucc_pairs) or None,
      sts17_dir=args.sts17_dir, sts17_gs_dir=args.sts17_gs_dir, retrieval_dirs=args.retrieval_dir,
      geometry_files=geo, geometry_n=args.geometry_n,
      transfer_languages=_list(args.transfer_languages), transfer_source=args.transfer_source,
      transfer_probe=args.transfer_probe, transfer_seeds=seeds,
      **{f"{name}_dir": getattr(args, f"{name}_dir") for name in harness.transfer.BENCHMARKS},
      paracrawl_dir=args.paracrawl_dir,
      paracrawl_languages=_list(args.paracrawl_languages) or None,
      paracrawl_queries=args.paracrawl_queries, paracrawl_candidates=args.paracrawl_candidates,
      paracrawl_seed=args.paracrawl_seed, tatoeba_layers=layers,
      tatoeba_vector=(int(vector[0]), vector[1]),
      flores_dir=args.flores_dir, flores_splits=_list(args.flores_splits),
      flores_languages=_list(args.flores_languages) or None,
      tatoeba_layer_languages=_list(args.tatoeba_layer_languages),
      dev_sets=_list(args.dev_sets), dev_max_sentences=args.dev_max_sentences or None,
      dev_languages=_list(args.dev_languages) or None, plots=not args.no_plots, progress=not args.no_progress)
  try:
    args.protocols = protocols.resolve(_list(args.protocol))
    tasks = (protocols.tasks_of(args.protocols, cfg) if args.protocols else
             harness.resolve_tasks(args.suite, _list(args.tasks)))
  except ValueError as e:
    p.error(str(e))
  if args.protocols and not langs:   # a protocol's own languages (else every language)
    wanted = [p_.tatoeba_languages for p_ in args.protocols]
    if all(w is not None for w in wanted):
      cfg.tatoeba_languages = sorted({l for w in wanted for l in w})
    else:
      from vmx.evaluation import tatoeba  # lazy: jax
      cfg.tatoeba_languages = tatoeba.available_languages(args.data_dir)
  return args, cfg, tasks


def _check_paths(args):
  """Every path flag names something that exists, checked before any long work."""
  from vmx import storage  # lazy: after cli.run_main
  given = [(f"--{k}", v) for k, v in sorted(vars(args).items())
           if (k.endswith("_dir") or k == "checkpoint_dir") and v and k != "output_dir"]
  given += [("--retrieval_dir", v) for v in args.retrieval_dir]
  if args.geometry_files:
    given += [("--geometry_files", kv.split("=", 1)[-1]) for kv in _list(args.geometry_files)]
  from vmx.errors import ConfigError
  for flag, value in given:
    if not storage.path(value).exists():
      raise ConfigError(f"{flag}={value}: no such file or directory")
  if not (storage.path(args.checkpoint_dir) / "vmx_model.json").exists():
    raise ConfigError(f"--checkpoint_dir={args.checkpoint_dir}: not a vmx model_dir (no "
                      f"vmx_model.json)")


def main(argv):
  from vmx import cli, signals, storage  # lazy: after cli.run_main
  from vmx.evaluation import harness, protocols  # lazy: jax, after cli.run_main's host set-up
  from vmx.inference import Encoder  # lazy: jax
  args, cfg, tasks = parse_args(argv)
  signals.install()   # SIGTERM / SIGINT: exit 75, the finished tasks' results kept
  with signals.activity("loading the checkpoint"):
    enc = Encoder.from_checkpoint(args.checkpoint_dir, step=args.step,
                                  batch_size=args.batch_size, **cli.vector_options(args))
  out = storage.path(args.output_dir or storage.path(args.checkpoint_dir) / "eval" / (
      enc.revision + (f"_dim{args.embedding_dim}" if args.embedding_dim else "")
      + (f"_{args.precision}" if enc.quantized else "")))
  signals.saved(f"the finished tasks' results are in {out}; rerun the same command to "
                "continue (they are kept)")
  failed = None
  try:
    results = harness.run(enc, output_dir=out, config=cfg, tasks=tasks,
                          model_info={"name": enc.name, "revision": enc.revision,
                                      **({"dim": enc.dim} if enc.dim else {}),
                                      **({"precision": enc.quantized} if enc.quantized
                                         else {})},
                          resume=not args.fresh)
  except harness.EvaluationFailed as e:
    failed, results = e, e.results
  print((out / "summary.md").read_text())
  for proto in args.protocols:
    report = protocols.report(proto, results, failed.errors if failed else {}, cfg)
    storage.write_atomic(out / f"protocol_{proto.name}.json", json.dumps(report, indent=1))
    print(f"[vmx eval] protocol {proto.name} ({proto.paper}):")
    for f in report["figures"]:
      value = "undefined" if f["value"] is None else f"{f['value']:.2f}"
      print(f"  {f['table']}, {f['column']}: {value} ({f['metric']}; vector: {f['vector']})")
    for m in report["missing"]:
      print(f"  missing: {m['table']}, {m['benchmark']} ({m['layout']})")
  if failed is not None:
    print(f"[vmx eval] some tasks failed: {failed}", file=sys.stderr)
    return 1
  print(f"[vmx eval] wrote {out}")
  return results


if __name__ == "__main__":
  from vmx.cli import run_main
  sys.exit(1 if run_main(main) == 1 else 0)
