"""Evaluation during training: what `train(eval_cfg=...)` runs every `eval_period` steps.

An evaluator is any object with
  batch_size: int                   the Encoder's batch size for its evaluations
  metric_names() -> list[str]       the scalars known before the run (what
                                    `train.best_metric` may name; subsets may add more)
  metric_prefixes() -> list[str]    prefixes under which later scalars appear
  run(encoder) -> (scalars, line)   {name: value} and a one-line summary
The trainer hands it an `Encoder` of the current parameters and writes the scalars;
it knows nothing else about evaluation. Both evaluators here run the evaluation
harness's evaluators (vmx/evaluation/evaluators.py, through harness.py), so a periodic
score is the number `launch/eval.py` gives for the same checkpoint.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import warnings
from typing import Optional, Protocol, Sequence

import gin

from vmx.data import devsets
from vmx.errors import ConfigError, DataError
from vmx.evaluation import evaluators, harness
from vmx.gin_utils import check_range, positive_int


class PeriodicEvaluation(Protocol):
  """What the loop calls every EVAL_PERIOD steps (TatoebaEvalConfig, HarnessEvalConfig,
  fine-tuning's dev scorer); a harness task is `evaluators.Evaluator`, a different thing."""
  batch_size: int

  def metric_names(self) -> list[str]:
    ...

  def metric_prefixes(self) -> list[str]:
    ...

  def run(self, encoder) -> tuple[dict, str]:
    ...


def _run_harness(encoder, evaluators: dict, data_dir: Optional[str]) -> dict:
  # Quiet: the harness's per-task lines, and truncation at the run's MAX_LENGTH (the same
  # at every evaluation, so it does not bias the comparison between steps).
  with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*longer than the model's max_length")
    try:
      return harness.run(encoder, evaluators=evaluators, data_dir=data_dir, plots=False,
                         progress=False)
    except harness.EvaluationFailed as e:
      raise DataError(f"periodic evaluation failed: {e}") from None


@gin.configurable
class HarnessEvalConfig:
  """Periodic evaluation during training with any tasks of the evaluation harness
  (`vmx.evaluation.harness`, e.g. ['dev'] for the dev sets carved from the training data,
  or ['dev', 'tatoeba', 'stsb']). Scalars written (and nameable by `train.best_metric`):
  `<task>/main_score` for each task, `<task>/<subset>` for each of its subsets (e.g.
  `dev/tico19/pt_BR`, `tatoeba/deu-eng`), `dev/<set>` for each dev set, and
  `tatoeba/<group>` for each of Tatoeba's language groups the run has languages in
  (`outside_use`, `head`, `long_tail`, `xtreme36`, `own`: vmx/evaluation/tatoeba.py), e.g.
  BEST_METRIC = 'tatoeba/outside_use' with EVAL_TASKS = ['dev', 'tatoeba']. Tatoeba and
  dev default to the model's languages; the other fields are harness.EvalConfig's."""

  def __init__(self, tasks: Sequence[str] = ("dev",), data_dir: Optional[str] = None,
               tatoeba_languages: Optional[Sequence[str]] = None,
               dev_sets: Optional[Sequence[str]] = None, dev_max_sentences: Optional[int] = 1000,
               dev_languages: Optional[Sequence[str]] = None, batch_size: int = 256):
    check_range(positive_int(batch_size), "HarnessEvalConfig", "batch_size", batch_size,
                "a positive integer")
    try:
      self.tasks = harness.resolve_tasks(None, list(tasks))
    except ValueError as e:
      raise ConfigError(f"HarnessEvalConfig.tasks: {e}") from None
    extra = {} if dev_sets is None else {"dev_sets": devsets.check_names(
        dev_sets, "HarnessEvalConfig.dev_sets")}
    self.data_dir, self.batch_size = data_dir, batch_size
    self.evaluators = harness.evaluators_of(harness.EvalConfig(
        tatoeba_languages=tatoeba_languages, dev_max_sentences=dev_max_sentences,
        dev_languages=dev_languages, **extra), self.tasks)

  def metric_names(self) -> list[str]:
    names = [f"{t}/main_score" for t in self.tasks]
    if "dev" in self.tasks:
      names += [f"dev/{s}" for s in self.evaluators["dev"].sets]
    return names

  def metric_prefixes(self) -> list[str]:
    return [f"{t}/" for t in self.tasks]

  def run(self, encoder) -> tuple[dict, str]:
    results = _run_harness(encoder, self.evaluators, self.data_dir)
    scalars, parts = {}, []
    for task, r in results.items():
      scalars[f"{task}/main_score"] = r["main_score"]
      for subs in r["scores"].values():
        for sub in subs:
          scalars[f"{task}/{sub['hf_subset']}"] = sub["main_score"]
      for name, v in r.get("sets", {}).items():
        scalars[f"dev/{name}"] = v
      for group, g in r.get("groups", {}).items():   # Tatoeba's language groups
        if g["n_languages"]:
          scalars[f"{task}/{group}"] = g["mean"]
      parts.append(f"{task} {r['main_score']:.2f}" + (
          " (" + ", ".join(f"{k} {v:.2f}" for k, v in r["sets"].items()) + ")"
          if r.get("sets") else ""))
    return scalars, "; ".join(parts)


@gin.configurable
class TatoebaEvalConfig:
  """Periodic Tatoeba evaluation (the harness's `tatoeba` task on `languages`; `english`:
  the code the model knows English by). Scalars: `tatoeba/mean` and `tatoeba/<lang>`
  (the mean of both directions' accuracy, as `launch/eval.py --suite=tatoeba`)."""

  def __init__(self, languages: Sequence[str] = gin.REQUIRED, data_dir: Optional[str] = None,
               english: str = "eng", batch_size: int = 256):
    check_range(positive_int(batch_size), "TatoebaEvalConfig", "batch_size", batch_size,
                "a positive integer")
    self.languages, self.batch_size, self.data_dir = list(languages), batch_size, data_dir
    self.tatoeba = evaluators.Tatoeba(self.languages, english)

  def metric_names(self) -> list[str]:
    return ["tatoeba/mean"] + [f"tatoeba/{l}" for l in self.languages]

  def metric_prefixes(self) -> list[str]:
    return []

  def run(self, encoder) -> tuple[dict, str]:
    r = _run_harness(encoder, {"tatoeba": self.tatoeba}, self.data_dir)["tatoeba"]
    per = {sub["languages"][0]: sub["main_score"] for sub in r["scores"]["test"]}
    scalars = {f"tatoeba/{l}": v for l, v in per.items()}
    scalars["tatoeba/mean"] = r["main_score"]
    line = (f"tatoeba mean {r['main_score']:.2f} ("
            + ", ".join(f"{l} {v:.1f}" for l, v in per.items()) + ")")
    return scalars, line


def best_metrics(best_metric) -> tuple[str, ...]:
  """train.best_metric as names: None -> (), one name -> (name,), a list -> its names (the
  first kept in MODEL_DIR/best/, each other one in best-<metric>/; vmx/modeldir/layout.py)."""
  if best_metric is None:
    return ()
  names = (best_metric,) if isinstance(best_metric, str) else tuple(best_metric)
  if (not names or not all(isinstance(n, str) and n for n in names)
      or len(set(names)) < len(names)):
    raise ConfigError(f"train.best_metric={best_metric!r}: expected a metric name or a list "
                      "of distinct metric names")
  return names


def check_best_metric(best_metric, evaluator, eval_period):
  """ConfigError unless `best_metric` names scalars the periodic evaluation writes (one
  name, or a list of them: a best checkpoint kept for each)."""
  metrics = best_metrics(best_metric)
  if not metrics:
    return
  names = evaluator.metric_names() if evaluator is not None else []
  if not names or not eval_period:
    raise ConfigError(f"train.best_metric={best_metric!r} needs periodic evaluation: set "
                      "train.eval_cfg (TatoebaEvalConfig or HarnessEvalConfig) and "
                      "EVAL_PERIOD > 0")
  for metric in metrics:
    if metric not in names and not any(
        metric.startswith(p) for p in evaluator.metric_prefixes()):
      raise _not_a_metric(metric, names)


def _not_a_metric(best_metric, names) -> ConfigError:
  close = difflib.get_close_matches(str(best_metric), list(names), n=1)
  return ConfigError(f"train.best_metric={best_metric!r} is not a metric of this run's "
                     f"evaluation ({', '.join(list(names)[:8])}"
                     f"{', ...' if len(names) > 8 else ''})"
                     + (f"; did you mean {close[0]!r}?" if close else ""))


def metric_value(best_metric: str, scalars: dict) -> float:
  """The value of `best_metric` in an evaluation's scalars (ConfigError: not one of them;
  a name checked by prefix before the run, `check_best_metric`, is checked here)."""
  if best_metric not in scalars:
    raise _not_a_metric(best_metric, [k for k in scalars if k != "eval/seconds"])
  return scalars[best_metric]
