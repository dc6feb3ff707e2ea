#!/usr/bin/env python
r"""Evaluate a trained vmx model on a suite of tasks (no TensorFlow needed).

  python launch/eval.py --checkpoint_dir=/tmp/vmx/contrastive_tiny --suite=standard \
      [--tasks=tatoeba,bucc] [--output_dir=DIR] [--data_dir=...] [--step=N|best|best:METRIC]

Suites: tatoeba, mining (tatoeba, bucc), sts (sts12-16, stsb), quick (tatoeba, stsb,
geometry), standard (tatoeba, bucc, sts12-16, stsb, xnli_transfer, geometry), full
(standard + sts17 + retrieval, which need --sts17.dir / --retrieval.dirs). Tasks outside
the suites: paracrawl, mldoc, amazon_v1, amazon_v2, flores (their --TASK.dir) and
tatoeba_layers (per-layer Tatoeba, --tatoeba_layers.layers), tatoeba_vector (Tatoeba with
one layer's mean or CLS, --tatoeba_vector.vector).
Every task's settings are the fields of its evaluator (vmx/evaluation/evaluators.py), set
as --TASK.FIELD=VALUE, e.g. --tatoeba.languages=deu,fra --bucc.pairs=de-en
--dev.max_sentences=none; lists are comma-separated. The flags of earlier releases
(--bucc_pairs, --sts17_dir, ...) still work, with a warning.
`--protocol=vmsst|ems|infoxlm|emmax|mpcl` (comma-separated for several) runs what that
paper's tables report, with its conventions, and writes OUTPUT_DIR/protocol_<name>.json
naming each figure's table and the benchmarks vmx cannot read yet
(vmx/evaluation/protocols/; docs/evaluation.md).
`--step=per_task` with a protocol that selects its checkpoints per task (MPCL §3.3:
Tatoeba at the step best on BUCC, BUCC at the step best on Tatoeba) scores each task at
its own step, one folder per checkpoint under OUTPUT_DIR (default
CHECKPOINT_DIR/eval/per_task), the protocol file beside them.
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


# Flags of earlier releases -> the task settings they set (`--task.field`); they still
# work, with one warning, until vmx/_deprecated.py's REMOVED_IN.
ALIASES = {
    "bucc_pairs": ("bucc.pairs",), "sts17_dir": ("sts17.dir",),
    "sts17_gs_dir": ("sts17.gs_dir",), "retrieval_dir": ("retrieval.dirs",),
    "geometry_files": ("geometry.files",), "geometry_n": ("geometry.n",),
    "transfer_languages": ("xnli_transfer.languages",),
    "transfer_source": ("xnli_transfer.source",),
    "transfer_probe": ("xnli_transfer.probe", "mldoc.probe", "amazon_v1.probe",
                       "amazon_v2.probe"),
    "transfer_seeds": ("xnli_transfer.seeds", "mldoc.seeds", "amazon_v1.seeds",
                       "amazon_v2.seeds"),
    "mldoc_dir": ("mldoc.dir",), "amazon_v1_dir": ("amazon_v1.dir",),
    "amazon_v2_dir": ("amazon_v2.dir",), "paracrawl_dir": ("paracrawl.dir",),
    "paracrawl_languages": ("paracrawl.languages",),
    "paracrawl_queries": ("paracrawl.queries",),
    "paracrawl_candidates": ("paracrawl.candidates",), "paracrawl_seed": ("paracrawl.seed",),
    "flores_dir": ("flores.dir",), "flores_splits": ("flores.splits",),
    "flores_languages": ("flores.languages",), "tatoeba_layers": ("tatoeba_layers.layers",),
    "tatoeba_vector": ("tatoeba_vector.vector",),
    "tatoeba_layer_languages": ("tatoeba_layers.languages",), "dev_sets": ("dev.sets",),
    "dev_max_sentences": ("dev.max_sentences",), "dev_languages": ("dev.languages",),
}
PATH_FIELDS = ("dir", "gs_dir", "dirs", "files")   # settings naming files or directories


def parse_args(argv):
  from vmx.evaluation import evaluators, harness, protocols  # lazy: jax, after cli.run_main
  from vmx.modeldir.layout import BEST_DIR, BEST_STEP  # lazy: after cli.run_main

  from vmx import _deprecated, cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True, help="a vmx model_dir")
  p.add_argument("--suite", default="standard", help=f"one of {sorted(harness.SUITES)}")
  p.add_argument("--protocol", default="",
                 help=f"a paper's evaluation protocol, comma-separated of "
                      f"{sorted(protocols.PROTOCOLS)} (replaces --suite / --tasks)")
  p.add_argument("--tasks", default="", help=f"comma-separated, overrides --suite; of "
                                             f"{sorted(evaluators.EVALUATORS)}")
  p.add_argument("--step", type=_step_flag, default=None,
                 help=f"checkpoint step, or {BEST_STEP!r} (MODEL_DIR/{BEST_DIR}/, kept by runs "
                      f"with BEST_METRIC), '{BEST_STEP}:METRIC' (the best step by that one of "
                      f"BEST_METRIC's list), or {protocols.PER_TASK!r} with --protocol: each "
                      "task at the step its paper selects it on (MPCL §3.3: Tatoeba at the "
                      "step best on BUCC, BUCC at the step best on Tatoeba); default: the "
                      "latest")
  p.add_argument("--output_dir", default=None)
  cli.add_vector_flags(p, "score")
  p.add_argument("--fresh", action="store_true",
                 help="run every task again (default: a task whose result file in the output "
                      "directory was written for this checkpoint, vmx version and settings "
                      "is kept, so an interrupted evaluation continues where it stopped)")
  p.add_argument("--data_dir", default=None, help="default: $VMX_DATA_DIR, else the cache")
  p.add_argument("--languages", default="", help="Tatoeba languages (ISO 639-3), or 'all'; "
                                                 "default: the model's trained languages")
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--no_plots", action="store_true")
  p.add_argument("--no_progress", action="store_true")
  for old in ALIASES:
    p.add_argument(f"--{old}", action="append", default=None, help=argparse.SUPPRESS)
  args, rest = p.parse_known_args(argv)
  if args.step == protocols.PER_TASK and not any(
      protocols.PROTOCOLS[n].select_on for n in evaluators.comma_list(args.protocol)
      if n in protocols.PROTOCOLS):
    p.error(f"--step={protocols.PER_TASK}: needs a --protocol that selects a checkpoint per "
            f"task ({', '.join(n for n, q in protocols.PROTOCOLS.items() if q.select_on)})")
  settings = {name: cls() for name, cls in evaluators.EVALUATORS.items()}
  given = []   # (flag, task, field, text), in command-line order
  for old, targets in ALIASES.items():
    values = getattr(args, old)
    if values is None:
      continue
    _deprecated.flag(f"--{old}", " / ".join(f"--{t}" for t in targets))
    text = ",".join(values)
    if old == "dev_max_sentences" and text.strip() == "0":
      text = "none"    # 0 meant every sentence
    given += [(f"--{old}", *t.split("."), text) for t in targets]
  try:
    given += _task_settings(rest, settings)
  except ValueError as e:
    p.error(str(e))
  for flag, task, field, text in given:
    setattr(settings[task], field, evaluators.parse_setting(settings[task], field, text, flag))
  _check_paths(args, given)
  langs = evaluators.comma_list(args.languages)
  if langs == ["all"]:
    from vmx.evaluation import tatoeba  # lazy: jax
    langs = tatoeba.available_languages(args.data_dir)
  try:
    args.protocols = protocols.resolve(evaluators.comma_list(args.protocol))
    tasks = (protocols.tasks_of(args.protocols, settings) if args.protocols else
             harness.resolve_tasks(args.suite, evaluators.comma_list(args.tasks)))
    args.steps = (protocols.per_task_steps(args.protocols, tasks)
                  if args.step == protocols.PER_TASK else {args.step: tasks})
  except ValueError as e:
    p.error(str(e))
  _check_selected(args)   # (after _check_paths: the directory exists)
  evaluators.check_rescoring([settings[t] for t in tasks],
                             cli.vector_options(args)["quantized"])
  if not langs and args.protocols:   # a protocol's own languages (else every language)
    wanted = [p_.tatoeba_languages for p_ in args.protocols]
    if all(w is not None for w in wanted):
      langs = sorted({l for w in wanted for l in w})
    else:
      from vmx.evaluation import tatoeba  # lazy: jax
      langs = tatoeba.available_languages(args.data_dir)
  for task in ("tatoeba", "tatoeba_vector"):
    if langs and not any(g[1:3] == (task, "languages") for g in given):
      settings[task].languages = langs
  return args, settings, tasks


def _check_selected(args):
  """--step=per_task: every checkpoint it needs is there, before any task runs."""
  from vmx.errors import CheckpointError
  from vmx.evaluation import protocols  # lazy: after cli.run_main
  from vmx.modeldir.layout import find_best_dir
  if args.step != protocols.PER_TASK:
    return
  for step, tasks in args.steps.items():
    if step is not None and find_best_dir(args.checkpoint_dir, step.split(":", 1)[1]) is None:
      raise CheckpointError(
          f"--step={protocols.PER_TASK}: {args.checkpoint_dir} keeps no best step by "
          f"{step.split(':', 1)[1]!r}, on which {', '.join(tasks)} is selected: train with "
          f"--gin_file=runs/mpcl_paper_selection.gin (BEST_METRIC naming it)")


def _step_flag(s: str):
  from vmx import cli  # (light)
  from vmx.evaluation.protocols import PER_TASK  # lazy: after cli.run_main
  return s if s == PER_TASK else cli.step_flag(s)


def _task_settings(rest, settings) -> list:
  """[(flag, task, field, text)] of `--task.field=VALUE` (or `--task.field VALUE`)."""
  out, i = [], 0
  while i < len(rest):
    arg = rest[i]
    name, eq, text = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
    task, dot, field = name.partition(".")
    if not dot or task not in settings:
      raise ValueError(f"unrecognized argument {arg!r}" + (
          f" (a task setting is --TASK.FIELD=VALUE with TASK one of {sorted(settings)})"
          if dot else ""))
    if not eq:
      if i + 1 >= len(rest):
        raise ValueError(f"{arg}: expected a value")
      i, text = i + 1, rest[i + 1]
    out.append((f"--{name}", task, field, text))
    i += 1
  return out


def _check_paths(args, given):
  """Every path setting names something that exists, checked before any long work."""
  from vmx import storage  # lazy: after cli.run_main
  from vmx.errors import ConfigError
  from vmx.evaluation import evaluators  # lazy: jax, after cli.run_main
  paths = [("--checkpoint_dir", args.checkpoint_dir)]
  paths += [("--data_dir", args.data_dir)] if args.data_dir else []
  for flag, task, field, text in given:
    if field in PATH_FIELDS and text.strip().lower() != "none":
      paths += [(flag, v.split("=", 1)[-1]) for v in evaluators.comma_list(text)]
  for flag, value in paths:
    if not storage.path(value).exists():
      raise ConfigError(f"{flag}={value}: no such file or directory")
  if not (storage.path(args.checkpoint_dir) / "vmx_model.json").exists():
    raise ConfigError(f"--checkpoint_dir={args.checkpoint_dir}: not a vmx model_dir (no "
                      f"vmx_model.json)")


def _evaluate(args, settings, tasks, step, output_dir=None, per_checkpoint=False):
  """The harness's `tasks` on checkpoint `step`: (results, errors, the checkpoint's name,
  the output directory: `output_dir`, or a folder per checkpoint in it, or the default)."""
  from vmx import cli, signals, storage  # lazy: after cli.run_main
  from vmx.evaluation import harness  # lazy: jax, after cli.run_main's host set-up
  from vmx.inference import Encoder  # lazy: jax
  with signals.activity("loading the checkpoint"):
    enc = Encoder.from_checkpoint(args.checkpoint_dir, step=step,
                                  batch_size=args.batch_size, **cli.vector_options(args))
  suffix = ((f"_dim{args.embedding_dim}" if args.embedding_dim else "")
            + (f"_{args.precision}" if enc.quantized else ""))
  if output_dir is None:
    out = storage.path(args.checkpoint_dir) / "eval" / (enc.revision + suffix)
  else:
    out = storage.path(output_dir)
    out = out / (enc.revision.replace("/", "_") + suffix) if per_checkpoint else out
  signals.saved(f"the finished tasks' results are in {out}; rerun the same command to "
                "continue (they are kept)")
  errors = {}
  try:
    results = harness.run(enc, output_dir=out, evaluators={t: settings[t] for t in tasks},
                          data_dir=args.data_dir, plots=not args.no_plots,
                          progress=not args.no_progress,
                          model_info={"name": enc.name, "revision": enc.revision,
                                      **({"dim": enc.dim} if enc.dim else {}),
                                      **({"precision": enc.quantized} if enc.quantized
                                         else {})},
                          resume=not args.fresh)
  except harness.EvaluationFailed as e:
    errors, results = e.errors, e.results
  print((out / "summary.md").read_text())
  return results, errors, enc.revision, out


def main(argv):
  from vmx import signals, storage  # lazy: after cli.run_main
  from vmx.evaluation import protocols  # lazy: jax, after cli.run_main's host set-up
  args, settings, tasks = parse_args(argv)
  signals.install()   # SIGTERM / SIGINT: exit 75, the finished tasks' results kept
  if args.step == protocols.PER_TASK:   # each task at the step its partner task chose
    base = storage.path(args.output_dir or storage.path(args.checkpoint_dir) / "eval" /
                        protocols.PER_TASK)
    results, errors, selected = {}, {}, {}
    for step, group in args.steps.items():
      r, e, revision, _ = _evaluate(args, settings, group, step, base, per_checkpoint=True)
      results.update(r), errors.update(e)
      selected.update({t: protocols.selected_by(step, revision) for t in group})
    out = base
  else:
    results, errors, _, out = _evaluate(args, settings, tasks, args.step, args.output_dir)
    selected = None
  for proto in args.protocols:
    report = protocols.report(proto, results, errors, settings, selected)
    storage.write_atomic(out / f"protocol_{proto.name}.json", json.dumps(report, indent=1))
    print(f"[vmx eval] protocol {proto.name} ({proto.paper}):")
    for f in report["figures"]:
      value = "undefined" if f["value"] is None else f"{f['value']:.2f}"
      at = f"; checkpoint: {f['checkpoint']}" if "checkpoint" in f else ""
      print(f"  {f['table']}, {f['column']}: {value} ({f['metric']}; vector: {f['vector']}"
            f"{at})")
    for m in report["missing"]:
      print(f"  missing: {m['table']}, {m['benchmark']} ({m['layout']})")
  if errors:
    print(f"[vmx eval] some tasks failed: {'; '.join(f'{t}: {e}' for t, e in errors.items())}"
          f" (other results are in {out})", file=sys.stderr)
    return 1
  print(f"[vmx eval] wrote {out}")
  return results


if __name__ == "__main__":
  from vmx.cli import run_main
  sys.exit(1 if run_main(main) == 1 else 0)
