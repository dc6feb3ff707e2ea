"""One harness for every evaluation task: suites, results files, summary, plots.

  from vmx.evaluation import harness
  results = harness.run(encoder, suite="standard", output_dir="/tmp/vmx/eval")

`encoder` is a vmx `Encoder` or anything with `encode(list_of_str) -> [n, d]`
(see `common.as_encode_fn`). The tasks are evaluators (vmx/evaluation/evaluators.py:
one dataclass per task, its fields its settings), given as `evaluators={name: ...}` or
built from a suite / task list and the flat `EvalConfig`. For each task the harness writes
`OUTPUT_DIR/<task>.json` in an MTEB-like schema:

  {"task_name", "main_score", "dataset_revision" (sha256 of the input files),
   "evaluation_time" (s), "model": {"name", "revision"}, "vmx_version",
   "mteb_version": null, "kg_co2_emissions": null,
   "scores": {split: [{"hf_subset", "languages", "main_score", ...metrics}]},
   "vector" (the sentence vector scored, vmx/evaluation/vectors.py), "settings" (the
   evaluator's), "eval_config_digest", ...task-level aggregates}

plus `summary.md` (one row per task) and plots (`tatoeba_languages.png`,
`geometry_projection.png`). A task whose data are missing or whose inputs are
bad is reported (error naming the task and file) and the others still run;
`run` raises `EvaluationFailed` at the end if any task failed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import traceback
from typing import Mapping, Optional, Sequence, Union

import numpy as np

import vmx
from vmx import signals, storage
from vmx.data import devsets
from vmx.errors import DataError
from vmx.evaluation import common, flores, paracrawl, tatoeba, transfer, vectors
from vmx.evaluation import evaluators as evaluators_lib
from vmx.evaluation import plots as plots_lib

VMX_VERSION = vmx.__version__   # what a resumed evaluation compares (run(resume=...))


@dataclasses.dataclass
class EvalConfig:
  """Every task's settings in one flat object (the Python API of earlier releases, and
  what the periodic evaluators build): `evaluators_of` maps each field to the setting of
  one task's evaluator (vmx/evaluation/evaluators.py), which is what runs."""
  data_dir: Optional[str] = None               # default: $VMX_DATA_DIR, else download cache
  tatoeba_languages: Optional[Sequence[str]] = None   # default: the model's, else all
  tatoeba_english: str = "eng"                 # the code the model knows English by
  bucc_pairs: Optional[Sequence[str]] = None     # default: every pair of bucc.PAIRS supplied
  sts17_dir: Optional[str] = None              # SemEval-2017 STS.input.trackN.xx-yy.txt
  sts17_gs_dir: Optional[str] = None           # gold files, if not next to the inputs
  retrieval_dirs: Sequence[str] = ()           # queries.tsv / corpus.tsv / qrels.tsv dirs
  geometry_files: Optional[dict] = None        # {lang: path} N-way parallel; default newstest2013
  geometry_n: int = 1000
  geometry_cov: str = "diag"
  transfer_languages: Sequence[str] = transfer.XNLI_LANGS
  transfer_source: str = "en"
  # probe of the transfer tasks: None = each task's own (xnli_transfer: 'logistic', seed 0;
  # mldoc / amazon_v1 / amazon_v2: EMS's 'mlp', seeds 0-4); transfer.PROBES
  transfer_probe: Optional[str] = None
  transfer_seeds: Optional[Sequence[int]] = None
  mldoc_dir: Optional[str] = None              # transfer.MLDOC.pattern files
  amazon_v1_dir: Optional[str] = None          # transfer.AMAZON_V1.pattern files
  amazon_v2_dir: Optional[str] = None          # transfer.AMAZON_V2.pattern files
  paracrawl_dir: Optional[str] = None          # OPUS ParaCrawl v5 ParaCrawl.<pair>.<xx> files
  paracrawl_languages: Optional[Sequence[str]] = None   # default: every pair supplied
  paracrawl_queries: int = paracrawl.N_QUERIES
  paracrawl_candidates: int = paracrawl.N_CANDIDATES
  paracrawl_seed: int = 0
  flores_dir: Optional[str] = None             # FLORES-200's flores200_dataset/ (flores.py)
  flores_splits: Sequence[str] = flores.DEFAULT_SPLITS
  flores_languages: Optional[Sequence[str]] = None      # FLORES codes; default all
  # task tatoeba_layers (InfoXLM Fig. 1): 'all' or layer numbers; None = off in protocols,
  # all layers when the task is asked for by name
  tatoeba_layers: Union[None, str, Sequence[int]] = None
  tatoeba_layer_languages: Sequence[str] = tatoeba.INFOXLM_PARALLEL14
  # task tatoeba_vector: Tatoeba with (layer, pooling) of the encoder, whatever vector the
  # model embeds; default InfoXLM §4.2's, the mean of layer 7
  tatoeba_vector: tuple = (7, "mean")
  dev_sets: Sequence[str] = devsets.DEFAULT_DEV_SETS   # vmx.data.devsets
  dev_max_sentences: Optional[int] = 1000
  dev_languages: Optional[Sequence[str]] = None    # file codes or ISO 639-3; default all
  plots: bool = True
  progress: bool = True


def evaluators_of(cfg: EvalConfig, names: Sequence[str]) -> dict:
  """{task: its Evaluator} of the flat `cfg`: each EvalConfig field is one evaluator's
  setting (vmx/evaluation/evaluators.py), and this is where they meet."""
  c = cfg
  transfer_dirs = {name: getattr(c, f"{name}_dir") for name in transfer.BENCHMARKS}
  def make(name):
    if name in transfer.BENCHMARKS:
      return evaluators_lib.EVALUATORS[name](
          dir=transfer_dirs[name], probe=c.transfer_probe or "mlp",
          seeds=c.transfer_seeds or transfer.EMS_SEEDS)
    tatoeba_kw = dict(languages=c.tatoeba_languages, english=c.tatoeba_english)
    return {
        "tatoeba": lambda: evaluators_lib.Tatoeba(**tatoeba_kw),
        "tatoeba_vector": lambda: evaluators_lib.TatoebaVector(**tatoeba_kw,
                                                           vector=tuple(c.tatoeba_vector)),
        "tatoeba_layers": lambda: evaluators_lib.TatoebaLayers(
            c.tatoeba_layers, c.tatoeba_layer_languages, c.tatoeba_english),
        "bucc": lambda: evaluators_lib.Bucc(c.bucc_pairs),
        "sts12-16": evaluators_lib.Sts12To16,
        "stsb": evaluators_lib.Stsb,
        "sts17": lambda: evaluators_lib.Sts17(c.sts17_dir, c.sts17_gs_dir),
        "retrieval": lambda: evaluators_lib.Retrieval(tuple(c.retrieval_dirs)),
        "geometry": lambda: evaluators_lib.Geometry(c.geometry_files, c.geometry_n, c.geometry_cov),
        "dev": lambda: evaluators_lib.Dev(c.dev_sets, c.dev_max_sentences, c.dev_languages),
        "xnli_transfer": lambda: evaluators_lib.XnliTransfer(
            c.transfer_languages, c.transfer_source, c.transfer_probe or "logistic",
            c.transfer_seeds or (0,)),
        "paracrawl": lambda: evaluators_lib.Paracrawl(
            c.paracrawl_dir, c.paracrawl_languages, c.paracrawl_queries,
            c.paracrawl_candidates, c.paracrawl_seed),
        "flores": lambda: evaluators_lib.Flores(c.flores_dir, c.flores_splits, c.flores_languages),
    }[name]()
  return {name: make(name) for name in names}


TASKS = evaluators_lib.EVALUATORS    # {task name: its Evaluator class}


def settings_of(cfg: Optional[EvalConfig] = None) -> dict:
  """{task: Evaluator} of every task, with `cfg`'s settings (default: each task's own)."""
  return evaluators_of(cfg or EvalConfig(), list(TASKS))
SUITES = {
    "tatoeba": ("tatoeba",),
    "dev": ("dev",),              # model selection: retrieval on the dev sets only
    "mining": ("tatoeba", "bucc"),
    "sts": ("sts12-16", "stsb"),
    "quick": ("tatoeba", "stsb", "geometry"),
    "standard": ("tatoeba", "bucc", "sts12-16", "stsb", "xnli_transfer", "geometry"),
    "full": ("tatoeba", "bucc", "sts12-16", "stsb", "sts17", "retrieval", "xnli_transfer",
             "geometry"),
}


class EvaluationFailed(RuntimeError):
  """Some tasks failed; `results` holds those that ran, `errors` {task: message}."""

  def __init__(self, message: str, results: Optional[dict] = None,
               errors: Optional[dict] = None):
    super().__init__(message)
    self.results, self.errors = results or {}, errors or {}


def resolve_tasks(suite: Optional[str] = None, tasks: Optional[Sequence[str]] = None):
  if tasks:
    names = list(tasks)
  elif suite:
    if suite not in SUITES:
      raise ValueError(f"--suite={suite!r}: unknown suite; known: {sorted(SUITES)}")
    names = list(SUITES[suite])
  else:
    raise ValueError("give a suite or a list of tasks")
  unknown = [t for t in names if t not in TASKS]
  if unknown:
    raise ValueError(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
  return names


def _write_json(path, obj):
  storage.write_atomic(path, json.dumps(obj, indent=1, default=_jsonable))


def _jsonable(o):
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  raise TypeError(f"not JSON-serializable: {type(o).__name__}")


def settings_digest(evaluator: evaluators_lib.Evaluator, data_dir: Optional[str]) -> str:
  """What a task's result depends on besides the model: its own settings and the data
  directory (a result kept by a resumed run must have the same)."""
  settings = {**evaluator.settings(), "data_dir": data_dir}
  return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def _kept(path, model: dict, digest: str) -> Optional[dict]:
  """The result in `path` if an earlier run wrote it for this model, vmx version and
  settings (intact JSON), else None."""
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
  except (ValueError, OSError):
    return None
  same = (record.get("model") == model and record.get("vmx_version") == VMX_VERSION
          and record.get("eval_config_digest") == digest)
  return record if same else None


def run(encoder, suite: Optional[str] = "standard", output_dir: Optional[str] = None,
        config: Optional[EvalConfig] = None, tasks: Optional[Sequence[str]] = None,
        model_info: Optional[dict] = None, resume: bool = False,
        evaluators: Optional[Mapping[str, evaluators_lib.Evaluator]] = None,
        data_dir: Optional[str] = None, plots: bool = True, progress: bool = True) -> dict:
  """Runs the tasks; returns {task: result dict}; writes files when output_dir is set.

  The tasks are `evaluators` ({task: Evaluator}, vmx/evaluation/evaluators.py, run with
  `data_dir`, `plots`, `progress`), or those of `tasks` / `suite` with the settings of the
  flat `config` (`EvalConfig`, which also gives data_dir, plots and progress).
  `resume`: a task whose result file in output_dir was written for this model (name and
  revision), vmx version and the task's settings (`settings_digest`) is kept, not run
  again: an interrupted evaluation (SIGTERM: exit 75, vmx/signals.py) continues where it
  stopped."""
  if evaluators is None:
    cfg = config or EvalConfig()
    evaluators = evaluators_of(cfg, resolve_tasks(None if tasks else suite, tasks))
    data_dir, plots, progress = cfg.data_dir, cfg.plots, cfg.progress
  elif config is not None or tasks:
    raise ValueError("harness.run: give evaluators, or config / tasks / suite, not both")
  encode = common.as_encode_fn(encoder, progress=None if progress else False)
  model = model_info or {"name": common.model_name(encoder), "revision": None}
  langs = getattr(encoder, "languages", None)
  reads_ids = getattr(getattr(encoder, "model", None), "uses_languages", False)
  out = storage.path(output_dir) if output_dir else None
  if out:
    out.mkdir(parents=True, exist_ok=True)
  results, errors, artifacts = {}, {}, {}
  for name, evaluator in evaluators.items():
    digest = settings_digest(evaluator, data_dir)
    files = common.DataFiles(name, data_dir)
    t0 = time.time()
    kept = _kept(out / f"{name}.json", model, digest) if out and resume else None
    if kept is not None:
      results[name] = kept
      print(f"[vmx eval] {name}: main score {kept['main_score']:.2f} (kept: "
            f"{out / f'{name}.json'} is this model's, with these settings)", flush=True)
      continue
    print(f"[vmx eval] {name} ...", flush=True)
    ctx = evaluators_lib.Context(encoder, encode, files, data_dir, progress, langs,
                                 langs if reads_ids else None)
    try:
      with signals.activity(f"evaluating {name}"):
        res = evaluator.run(ctx)
    except (DataError, ValueError, OSError) as e:
      errors[name] = f"{type(e).__name__}: {e}"
      print(f"[vmx eval] {name} FAILED: {errors[name]}", flush=True)
      if not isinstance(e, (DataError, FileNotFoundError)):
        traceback.print_exc()
      continue
    if "embeddings" in res:
      artifacts[name] = res.pop("embeddings")
    record = {"task_name": name, "main_score": res.pop("main_score"),
              "vector": res.pop("vector", None) or vectors.describe(encoder),
              "higher_is_better": not evaluator.LOWER_IS_BETTER,
              "dataset_revision": files.revision(),
              "evaluation_time": round(time.time() - t0, 3), "model": model,
              "vmx_version": VMX_VERSION, "mteb_version": None, "kg_co2_emissions": None,
              "eval_config_digest": digest, "settings": evaluator.settings(),
              "scores": res.pop("scores"), **res}
    results[name] = record
    print(f"[vmx eval] {name}: main score {record['main_score']:.2f} "
          f"({record['evaluation_time']:.1f} s)", flush=True)
    if out:
      _write_json(out / f"{name}.json", record)
  if out:
    storage.write_atomic(out / "summary.md", summary_markdown(results, errors, model))
    if plots:
      if "tatoeba" in results:
        plots_lib.tatoeba_bars(results["tatoeba"], out / "tatoeba_languages.png")
      if "geometry" in artifacts:
        plots_lib.projection(artifacts["geometry"], out / "geometry_projection.png")
  if errors:
    raise EvaluationFailed("; ".join(f"{k}: {v}" for k, v in errors.items()) +
                           (f" (other results are in {out})" if out else ""), results, errors)
  return results


def _details(r: dict) -> str:
  name = r["task_name"]
  if name == "tatoeba":
    g = r["groups"]
    parts = [f"xx→en {r['mean']['xx2en']:.2f}, en→xx {r['mean']['en2xx']:.2f}, "
             f"xSIM err {r['mean']['xsim']:.2f}"]
    parts += [f"{k} ({v['n_languages']}) {v['mean']:.2f}" for k, v in g.items()
              if v["n_languages"]]
    return "; ".join(parts)
  if name == "dev":
    return ", ".join(f"{k} {v:.2f}" for k, v in r["sets"].items()) + (
        f" (first {r['max_sentences']} sentences)" if r.get("max_sentences") else "")
  if name == "sts12-16":
    return f"VMSST Pearson {r['vmsst_pearson']:.2f}, SBERT Spearman {r['sbert_spearman']:.2f}"
  subsets = next(iter(r["scores"].values()))
  if name == "geometry":
    s = subsets[0]
    return (f"KL {s['invariance_kl']:.2f} (lower better), CH "
            f"{s['canonical_form_ch']:.2f}, PR {s['isotropy_pr']:.3f}")
  shown = subsets if len(subsets) <= 6 else subsets[:6]
  more = "" if len(subsets) <= 6 else f", … ({len(subsets)} subsets)"
  return ", ".join(f"{s['hf_subset']} {s['main_score']:.2f}" for s in shown) + more


def summary_markdown(results: dict, errors: dict, model: dict) -> str:
  lines = [f"# vmx evaluation: {model.get('name')}"
           + (f" ({model['revision']})" if model.get("revision") else ""), "",
           "| task | main score | details | time (s) |", "|---|---|---|---|"]
  for name, r in results.items():
    lines.append(f"| {name} | {r['main_score']:.2f} | {_details(r)} | {r['evaluation_time']:.1f} |")
  for name, e in errors.items():
    lines.append(f"| {name} | failed | {e.replace('|', '/')} | |")
  return "\n".join(lines) + "\n"
