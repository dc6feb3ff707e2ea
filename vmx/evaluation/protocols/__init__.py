"""Each paper's own evaluation protocol, by name: what its tables report, on the data vmx has.

  python launch/eval.py --checkpoint_dir=DIR --protocol=vmsst      # or ems, infoxlm, emmax, mpcl

A protocol runs the harness tasks its tables need and writes `protocol_<name>.json`:
{"protocol", "paper", "figures": [{"table", "column", "value", "metric", "vector", "task",
"languages", ...}], "missing": [{"table", "benchmark", "layout"}], "tasks_failed": {...}}.
Each figure follows the paper's conventions (direction, language group, correlation,
scoring) and names the sentence vector it was scored with (`vector`: "layer 7, mean", "CLS
of the last layer", ...; vmx/evaluation/vectors.py) and the harness task it comes from. A
benchmark that the paper uses but vmx cannot read yet, or whose data were not given, is
listed under `missing`, with the file layout it would read; it is never silently skipped.
The fine-tuned evaluations (InfoXLM's XNLI, EMMA-X's XNLI, ANLI and PAWS-X) are run by
launch/finetune.py --protocol=..., which writes `protocol_<name>_finetuned.json` in the same
form (vmx/finetune/). Figures over fewer languages than the paper used say how many
(`n_languages`). Compare a figure with the paper only at the paper's
language set (`--languages=all`, the default for protocols).

Language groups (Tatoeba v1 ISO 639-3 codes):
- XTREME's 36 (`tatoeba.XTREME36`); InfoXLM Tables 2 and 3 split them into the 14 languages
  covered by its parallel data (§4.1, Table 9: ar bg de el es fr hi ru sw th tr ur vi zh)
  and the 22 others. MPCL's "Tatoeba(14avg.)" is taken as the same 14: the paper does not
  list them (docs/departures.md).
- EMMA-X A.1's head list: 42 codes, XTREME's 36 plus en, az, lt, pl, uk and ro (en is the
  pivot, so 41 Tatoeba languages); the long tail is every other evaluated language.
- EMS's groups (Tables 4, 5, 6, 13): see ems.py's `EMS_TABLE6`, each derived from the
  paper's own tables and checked against its printed averages.

Modules, one per paper, each readable next to its paper: vmsst.py, ems.py, infoxlm.py,
emmax.py, mpcl.py (the paper's figures, language groups, optional tasks and what is missing,
and its `PROTOCOL`); figures.py (the figure helpers they share: Tatoeba means, BUCC, STS17,
geometry); base.py (`Protocol`, `Missing` and the layouts several papers name). This module
collects the protocols (`PROTOCOLS`, in the order above), the fine-tuned tables (`FINETUNED`)
and writes the JSON (`report`, `finetuned_report`).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

from vmx.evaluation.protocols import emmax, ems, infoxlm, mpcl, vmsst
from vmx.evaluation.protocols.base import FINETUNE, STS17_LAYOUT, Missing, Protocol
from vmx.evaluation.protocols.emmax import (EMMAX_HEAD, EMMAX_MULTISTS, EMMAX_OPTIONAL,
                                            EMMAX_XRETE_MISSING)
from vmx.evaluation.protocols.ems import (EMS_OPTIONAL, EMS_SEEN58, EMS_TABLE6, EMS_TABLE13,
                                          EMS_TRANSFER, EMS_UNSEEN54)
from vmx.evaluation.protocols.figures import INFOXLM_PARALLEL14, tatoeba_mean
from vmx.evaluation.protocols.infoxlm import INFOXLM_OPTIONAL, INFOXLM_OTHER22
from vmx.evaluation.protocols.vmsst import VMSST_STS17

__all__ = ["EMMAX_HEAD", "EMMAX_MULTISTS", "EMMAX_OPTIONAL", "EMMAX_XRETE_MISSING",
           "EMS_OPTIONAL", "EMS_SEEN58", "EMS_TABLE6", "EMS_TABLE13", "EMS_TRANSFER",
           "EMS_UNSEEN54", "FINETUNE", "FINETUNED", "FINETUNED_MISSING", "INFOXLM_OPTIONAL",
           "TRANSFER_GAP",
           "INFOXLM_OTHER22", "INFOXLM_PARALLEL14", "PROTOCOLS", "STS17_LAYOUT", "VMSST_STS17",
           "Missing", "PER_TASK", "Protocol", "finetuned_report", "per_task_steps", "report",
           "resolve", "selected_by", "tasks_of",
           "tatoeba_mean", "with_vector"]

PROTOCOLS = {p.name: p for p in (vmsst.PROTOCOL, ems.PROTOCOL, infoxlm.PROTOCOL,
                                 emmax.PROTOCOL, mpcl.PROTOCOL)}
PER_TASK = "per_task"   # launch/eval.py --step=per_task: each task at its paper's step


def per_task_steps(protocols: Sequence[Protocol], tasks: Sequence[str]) -> dict:
  """{checkpoint step: [tasks]} of a per-task selection: a task the protocols select on a
  metric at 'best:<metric>' (the step train.best_metric kept by it), the others at the
  latest step (None). ValueError: two protocols select one task on different metrics."""
  on = {}
  for p in protocols:
    for task, metric in p.select_on.items():
      if on.setdefault(task, metric) != metric:
        raise ValueError(f"--step={PER_TASK}: protocols select {task} on {on[task]!r} and "
                         f"{metric!r}; run them one at a time")
  out = {}
  for t in tasks:
    out.setdefault(f"best:{on[t]}" if t in on else None, []).append(t)
  return out


def selected_by(step: Optional[str], revision: str) -> str:
  """How a per-task selection chose a task's checkpoint (the figures' `checkpoint`)."""
  if step is None:
    return f"{revision} (the latest: the paper's selection for this task is not available)"
  return f"{revision} (the step best by {step.split(':', 1)[1]})"


# Fine-tuned figures (launch/finetune.py --protocol=...; vmx/finetune/): for each paper,
# each benchmark's (table of the average, table of the languages, the paper's setting).
FINETUNED = {
    "infoxlm": {"xnli": ("Tables 1, 7, 10", "Table 1",
                         "cross-lingual transfer (English training data)"),
                "mlqa": ("Tables 4, 7, 10", "Table 4",
                         "cross-lingual transfer (English training data)")},
    "emmax": {"xnli": ("Table 1", "Table 10", "translate-train-all"),
              "anli": ("Table 1", "Table 11", "translate-train-all"),
              "pawsx": ("Table 1", "Table 19", "translate-train-all")},
}
# The tables of the cross-lingual transfer gap (InfoXLM Table 5, after Hu et al. 2020): the
# English test score minus the mean of the other languages' (zero-shot transfer).
TRANSFER_GAP = {"infoxlm": {"xnli": "Table 5", "mlqa": "Table 5"}}
# what each benchmark's flags are (the `missing` line of a run of another benchmark)
FINETUNE_FLAGS = {"mlqa": "gin.MLQA_DIR=DIR --gin.SQUAD_DIR"}
FINETUNED_MISSING = {
    "infoxlm": (),
    "emmax": tuple(m for m in EMMAX_XRETE_MISSING if "fine-tuned" not in m.benchmark
                   or m.benchmark.startswith("MultiSTS")),
}


def finetuned_report(protocol: str, results: dict) -> dict:
  """The protocol JSON of one fine-tuning run (vmx/finetune/'s results): every language's
  test score in the paper's per-language table and their mean in its main table (each of
  the run's `metrics`: accuracy; extractive QA's F1 and exact match, F1 first), each with
  the vector and the setting; the transfer gap of the main metric where the paper prints
  one; the paper's other fine-tuned benchmarks under `missing`."""
  tables = FINETUNED[protocol]
  bench = results["benchmark"]
  missing = [dataclasses.asdict(m) for m in FINETUNED_MISSING[protocol]]
  missing += [dataclasses.asdict(Missing(t[0], f"{b} (fine-tuned)", FINETUNE.format(
      protocol=protocol, flag=FINETUNE_FLAGS.get(b, f"gin.{b.upper()}_DIR"))))
      for b, t in tables.items() if b != bench]
  if bench not in tables:
    return {"protocol": protocol, "paper": PROTOCOLS[protocol].paper, "figures": [],
            "missing": missing, "tasks_failed": {}}
  avg_table, lang_table, setting = tables[bench]
  metrics = results.get("metrics", ["accuracy"])
  note = ({} if results["setting"].startswith(setting.split(" (")[0]) else
          {"paper_setting": setting})
  rows = results["scores"]["test"]
  figures = []
  for i, m in enumerate(metrics):
    common_fields = {"metric": f"{m} x100, test, fine-tuned: {results['setting']}, model "
                               f"{results['selected']}", "vector": results["vector"],
                     "task": results["task_name"], **note}
    label = f" {m}" if len(metrics) > 1 else ""
    figures += [{"table": lang_table, "column": f"{bench} {r['hf_subset']}{label}",
                 "value": r[m], "n": r["n"], **common_fields} for r in rows]
    figures.append({"table": avg_table, "column": f"{bench} Avg.{label}",
                    "value": results["main_score"] if i == 0 else results[f"{m}_mean"],
                    "n_languages": len(rows), **common_fields})
    gap_table = TRANSFER_GAP.get(protocol, {}).get(bench)
    scores = {r["hf_subset"]: r[m] for r in rows}
    others = [v for lang, v in scores.items() if lang != "en"]
    if i == 0 and gap_table and "en" in scores and others:
      figures.append({"table": gap_table, "column": f"{bench} transfer gap{label} (en minus "
                      f"the mean of the other languages; lower is better)",
                      "value": scores["en"] - sum(others) / len(others),
                      "n_languages": len(others), **common_fields})
  return {"protocol": protocol, "paper": PROTOCOLS[protocol].paper, "figures": figures,
          "missing": missing, "tasks_failed": {}}


def with_vector(figure: dict, results: dict) -> dict:
  """The figure with the sentence vector it was scored with (`vector`, from its task's
  result unless the figure names its own) and NaN (undefined) as null for the JSON."""
  out = {k: (None if isinstance(v, float) and v != v else v) for k, v in figure.items()}
  if "vector" not in out:
    out["vector"] = results[figure["task"]]["vector"]
  return out


def resolve(names: Sequence[str]) -> list[Protocol]:
  unknown = [n for n in names if n not in PROTOCOLS]
  if unknown:
    raise ValueError(f"--protocol: unknown {unknown}; known: {sorted(PROTOCOLS)}")
  return [PROTOCOLS[n] for n in names]


def tasks_of(protocols: Sequence[Protocol], settings: Mapping) -> list[str]:
  """The harness tasks to run (optional ones only where `settings` {task: Evaluator} give
  their data: the setting the protocol names)."""
  out = []
  for p in protocols:
    out += [t for t in p.tasks if t not in out]
    out += [t for t, (_, needs) in p.optional_tasks.items()
            if _given(settings, t, needs) and t not in out]
  return out


def _given(settings: Optional[Mapping], task: str, field: str) -> bool:
  return bool(settings) and task in settings and bool(getattr(settings[task], field))


def report(protocol: Protocol, results: dict, errors: dict,
           settings: Optional[Mapping] = None, selected: Optional[Mapping] = None) -> dict:
  """The protocol's JSON: its figures, what is missing, and tasks that failed. `selected`
  ({task: how its checkpoint was chosen}, a per-task selection): each figure's
  `checkpoint`."""
  missing = [dataclasses.asdict(m) for m in protocol.missing]
  for task, (m, needs) in protocol.optional_tasks.items():
    if not _given(settings, task, needs):
      missing.append(dataclasses.asdict(m))
  if protocol.missing_from is not None:
    missing += [dataclasses.asdict(m) for m in protocol.missing_from(results)]
  failed = {t: str(e) for t, e in errors.items() if t in protocol.tasks
            or t in protocol.optional_tasks}
  figures = [with_vector(f, results) for f in protocol.figures(results)]
  if selected:
    figures = [{**f, "checkpoint": selected[f["task"]]} for f in figures]
  return {"protocol": protocol.name, "paper": protocol.paper,
          "figures": figures, "missing": missing, "tasks_failed": failed}
