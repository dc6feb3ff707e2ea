"""What a protocol is (`Protocol`) and what it lists as missing (`Missing`), with the
layouts several papers' missing entries name: a module of its own so that each paper's
module (vmsst.py, ems.py, ...) can build its `Protocol` without importing the package
that collects them."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

STS17_LAYOUT = ("--sts17.dir=DIR: SemEval-2017 Task 1 test release, STS.input.trackN.xx-yy.txt "
                "with STS.gs.trackN.xx-yy.txt; --sts17.extended=STS2017-extended.zip for "
                "en-de, fr-en, it-en, nl-en (vmx/evaluation/sts.py)")


@dataclasses.dataclass(frozen=True)
class Missing:
  table: str
  benchmark: str
  layout: str = "not readable by vmx yet"


@dataclasses.dataclass(frozen=True)
class Protocol:
  name: str
  paper: str
  tasks: tuple                                     # harness tasks
  figures: Callable[[dict], list]                  # {task: result} -> figure rows
  missing: tuple = ()
  tatoeba_languages: Optional[Sequence[str]] = None   # None: every available language
  # task -> (Missing, the setting of its evaluator that gives its data)
  optional_tasks: dict = dataclasses.field(default_factory=dict)
  # what the results themselves show to be missing (results -> [Missing])
  missing_from: Optional[Callable[[dict], list]] = None
  # the paper's own model selection, per task: task -> the periodic-evaluation metric whose
  # best step it is reported at (train.best_metric keeps each; launch/eval.py
  # --step=per_task). Empty: one checkpoint for every task.
  select_on: dict = dataclasses.field(default_factory=dict)


def sts17_optional(tables: str, benchmark: str = "STS17") -> dict:
  return {"sts17": (Missing(tables, benchmark, STS17_LAYOUT), "sources")}


FINETUNE = ("launch/finetune.py --gin_file=finetune/<file>.gin --protocol={protocol} "
            "--{flag}=DIR (vmx/finetune/; the figures in "
            "MODEL_DIR/protocol_{protocol}_finetuned.json)")
