"""One harness for every evaluation task: suites, results files, summary, plots.

  from vmx.evaluation import harness
  results = harness.run(encoder, suite="standard", output_dir="/tmp/vmx/eval")

`encoder` is a vmx `Encoder` or anything with `encode(list_of_str) -> [n, d]`
(see `common.as_encode_fn`). For each task the harness writes
`OUTPUT_DIR/<task>.json` in an MTEB-like schema:

  {"task_name", "main_score", "dataset_revision" (sha256 of the input files),
   "evaluation_time" (s), "model": {"name", "revision"}, "vmx_version",
   "mteb_version": null, "kg_co2_emissions": null,
   "scores": {split: [{"hf_subset", "languages", "main_score", ...metrics}]},
   "vector" (the sentence vector scored, vmx/evaluation/vectors.py), ...task-level
   aggregates}

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
from typing import Callable, Optional, Sequence, Union

import numpy as np

import vmx
from vmx import signals, storage
from vmx.data import devsets
from vmx.data.languages import resolve as resolve_language
from vmx.errors import ConfigError, DataError
from vmx.evaluation import bucc, common, dev, geometry, retrieval, sts, tatoeba, transfer
from vmx.evaluation import flores, layerwise, paracrawl, plots, vectors

VMX_VERSION = vmx.__version__   # what a resumed evaluation compares (run(resume=...))


@dataclasses.dataclass
class EvalConfig:
  """Where the data are and what to run on; every field is a flag of launch/eval.py."""
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


def _record_tatoeba(files: common.DataFiles, langs):
  """Resolves (and records) the Tatoeba files of `langs`: a missing one fails here, named."""
  for l in langs:
    files.path(f"eval/tatoeba/v1/tatoeba.{l}-eng.{l}")
    files.path(f"eval/tatoeba/v1/tatoeba.{l}-eng.eng")


def _tatoeba(encode, cfg: EvalConfig, ctx) -> dict:
  langs = list(cfg.tatoeba_languages or ctx.get("languages") or [])
  available = tatoeba.available_languages(cfg.data_dir)
  if not langs:
    langs = available
  elif ctx.get("languages") and not cfg.tatoeba_languages:
    # Tatoeba's languages that the model knows, under their code or another one
    # (pes for fas: vmx.data.languages.resolve)
    langs = [l for l in available if resolve_language(l, langs) is not None]
  _record_tatoeba(ctx["files"], langs)
  own = ctx.get("languages")
  res = tatoeba.evaluate(encode, langs, cfg.data_dir, english=cfg.tatoeba_english,
                         progress=cfg.progress, own_languages=own)
  # `seen`: whether the model trained on the language (VMSST A.3's Table 8), where the
  # model says which languages it trained on
  subsets = [{"hf_subset": f"{l}-eng", "languages": [l, "eng"], "main_score": r["mean"],
              "accuracy_xx2en": r["xx2en"], "accuracy_en2xx": r["en2xx"], "xsim_error": r["xsim"],
              "n": r["n"], "group": "head" if l in tatoeba.EMMAX_HEAD else "long_tail",
              **({"seen": resolve_language(l, own) is not None} if own else {})}
             for l, r in res["languages"].items()]
  return {"scores": {"test": subsets}, "main_score": res["mean"]["mean"],
          "mean": res["mean"], "groups": res["groups"]}


def _tatoeba_vector(encode, cfg: EvalConfig, ctx) -> dict:
  """Tatoeba (as the `tatoeba` task) with the mean (or CLS) of one layer of the encoder,
  `cfg.tatoeba_vector` = (layer, pooling), whatever vector the model embeds (InfoXLM §4.2:
  the mean of layer 7, Tables 2-3). An encoder that cannot give it (not a vmx model, or
  fewer layers) is scored with its own vector, and the result says so
  (`vector_requested`, `vector_unavailable`)."""
  layer, pooling = cfg.tatoeba_vector
  wanted = f"layer {int(layer)}, {vectors.POOLING_NAMES.get(pooling, pooling)}"
  encoder = ctx["encoder"]
  try:
    chosen = layerwise.layer_encoder(encoder, int(layer), pooling)
    why = None
  except ConfigError as e:
    chosen, why = encoder, str(e)
  out = _tatoeba(encode if why else common.as_encode_fn(
      chosen, progress=None if cfg.progress else False), cfg, ctx)
  out["vector"] = vectors.describe(chosen)
  out["vector_requested"] = wanted
  if why:
    out["vector_unavailable"] = why
  return out


def _tatoeba_layers(encode, cfg: EvalConfig, ctx) -> dict:
  """InfoXLM Fig. 1: Tatoeba accuracy of each layer's mean-pooled hidden states
  (vmx/evaluation/layerwise.py), one Tatoeba pass per layer; main score = the best layer's
  xx->en accuracy."""
  del encode
  encoder = ctx["encoder"]
  layers = cfg.tatoeba_layers
  if layers in (None, "all"):
    layers = list(range(1, layerwise.num_layers(encoder) + 1))
  langs = list(cfg.tatoeba_layer_languages)
  _record_tatoeba(ctx["files"], langs)
  rows = []
  for k in layers:
    layer_enc = layerwise.layer_encoder(encoder, int(k))
    enc_k = common.as_encode_fn(layer_enc, progress=None if cfg.progress else False)
    res = tatoeba.evaluate(enc_k, langs, cfg.data_dir, english=cfg.tatoeba_english)
    m = res["mean"]
    rows.append({"hf_subset": f"layer_{k}", "layer": int(k), "languages": langs,
                 "vector": vectors.describe(layer_enc),
                 "main_score": m["xx2en"], "accuracy_xx2en": m["xx2en"],
                 "accuracy_en2xx": m["en2xx"], "accuracy_mean": m["mean"],
                 "n_languages": m["n_languages"]})
  best = max(rows, key=lambda r: r["main_score"])
  return {"scores": {"test": rows}, "main_score": best["main_score"], "best_layer": best["layer"],
          "pooling": "mean", "direction": "xx2en", "vector": "each layer's mean (per row)"}


def _transfer_benchmark(name: str):
  """The harness task of transfer benchmark `name`, reading `EvalConfig.<name>_dir`."""
  bench, flag = transfer.BENCHMARKS[name], f"{name}_dir"
  return lambda e, c, x: transfer.evaluate_benchmark(
      e, bench, _required(getattr(c, flag), name, flag, "transfer"),
      c.transfer_probe or "mlp", c.transfer_seeds or transfer.EMS_SEEDS, c.progress,
      files=x["files"])


TASKS: dict[str, Callable] = {
    "tatoeba": _tatoeba,
    "bucc": lambda e, c, x: bucc.evaluate(e, c.bucc_pairs, c.data_dir, progress=c.progress,
                                          files=x["files"]),
    "sts12-16": lambda e, c, x: sts.evaluate_sts12_16(e, data_dir=c.data_dir,
                                                      progress=c.progress, files=x["files"]),
    "stsb": lambda e, c, x: sts.evaluate_stsb(e, data_dir=c.data_dir, files=x["files"]),
    "sts17": lambda e, c, x: sts.evaluate_sts17(e, _required(c.sts17_dir, "sts17", "sts17_dir"),
                                                c.sts17_gs_dir, c.progress, files=x["files"]),
    "retrieval": lambda e, c, x: _retrieval(e, c, x),
    "geometry": lambda e, c, x: geometry.evaluate(e, c.geometry_files, c.geometry_n,
                                                  c.geometry_cov, c.data_dir, c.progress,
                                                  files=x["files"]),
    # the model's languages bound the dev languages only if the model reads language ids
    "dev": lambda e, c, x: dev.evaluate(e, c.dev_sets, c.data_dir, c.dev_max_sentences,
                                        c.dev_languages, x.get("id_languages"), c.progress),
    "xnli_transfer": lambda e, c, x: transfer.evaluate(
        e, languages=c.transfer_languages, source=c.transfer_source, data_dir=c.data_dir,
        progress=c.progress, files=x["files"], probe=c.transfer_probe or "logistic",
        seeds=c.transfer_seeds or (0,)),
    **{name: _transfer_benchmark(name) for name in transfer.BENCHMARKS},
    "paracrawl": lambda e, c, x: paracrawl.evaluate(
        e, _required(c.paracrawl_dir, "paracrawl", "paracrawl_dir"), c.paracrawl_languages,
        c.paracrawl_queries, c.paracrawl_candidates, c.paracrawl_seed, progress=c.progress,
        files=x["files"]),
    "tatoeba_layers": _tatoeba_layers,
    "tatoeba_vector": _tatoeba_vector,
    "flores": lambda e, c, x: flores.evaluate(
        e, _required(c.flores_dir, "flores", "flores_dir"), c.flores_splits, c.flores_languages,
        progress=c.progress, files=x["files"], model_languages=x.get("id_languages")),
}
# main_score direction, for readers of the results (MTEB assumes higher is better)
LOWER_IS_BETTER = {"geometry"}

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


def _required(value, task, flag, module=None):
  if not value:
    raise DataError(f"task {task}: needs --{flag} (see vmx/evaluation/"
                    f"{module or task.rstrip('0123456789')}.py for the file layout)")
  return value


def _retrieval(encode, cfg, ctx):
  dirs = list(cfg.retrieval_dirs)
  if not dirs:
    _required(None, "retrieval", "retrieval_dir")
  scores, mains = {"test": []}, []
  for d in dirs:
    r = retrieval.evaluate(encode, d, progress=cfg.progress, files=ctx["files"])
    for s in r["scores"]["test"]:
      s["hf_subset"] = f"{r['name']}/{s['hf_subset']}"
      scores["test"].append(s)
    mains.append(r["main_score"])
  return {"scores": scores, "main_score": common.mean(mains)}


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


def config_digest(cfg: EvalConfig) -> str:
  """What a task's result depends on besides the model: every setting but the display's."""
  settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("plots", "progress")}
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
        model_info: Optional[dict] = None, resume: bool = False) -> dict:
  """Runs the tasks; returns {task: result dict}; writes files when output_dir is set.

  `resume`: a task whose result file in output_dir was written for this model (name and
  revision), vmx version and settings (`config_digest`) is kept, not run again: an
  interrupted evaluation (SIGTERM: exit 75, vmx/signals.py) continues where it stopped."""
  cfg = config or EvalConfig()
  digest = config_digest(cfg)
  names = resolve_tasks(None if tasks else suite, tasks)
  encode = common.as_encode_fn(encoder, progress=None if cfg.progress else False)
  model = model_info or {"name": common.model_name(encoder), "revision": None}
  ctx_langs = getattr(encoder, "languages", None)
  reads_ids = getattr(getattr(encoder, "model", None), "uses_languages", False)
  out = storage.path(output_dir) if output_dir else None
  if out:
    out.mkdir(parents=True, exist_ok=True)
  results, errors, artifacts = {}, {}, {}
  for name in names:
    files = common.DataFiles(name, cfg.data_dir)
    t0 = time.time()
    kept = _kept(out / f"{name}.json", model, digest) if out and resume else None
    if kept is not None:
      results[name] = kept
      print(f"[vmx eval] {name}: main score {kept['main_score']:.2f} (kept: "
            f"{out / f'{name}.json'} is this model's, with these settings)", flush=True)
      continue
    print(f"[vmx eval] {name} ...", flush=True)
    try:
      with signals.activity(f"evaluating {name}"):
        res = TASKS[name](encode, cfg, {"files": files, "languages": ctx_langs,
                                           "id_languages": ctx_langs if reads_ids else None,
                                           "encoder": encoder})
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
              "higher_is_better": name not in LOWER_IS_BETTER,
              "dataset_revision": files.revision(),
              "evaluation_time": round(time.time() - t0, 3), "model": model,
              "vmx_version": VMX_VERSION, "mteb_version": None, "kg_co2_emissions": None,
              "eval_config_digest": digest,
              "scores": res.pop("scores"), **res}
    results[name] = record
    print(f"[vmx eval] {name}: main score {record['main_score']:.2f} "
          f"({record['evaluation_time']:.1f} s)", flush=True)
    if out:
      _write_json(out / f"{name}.json", record)
  if out:
    storage.write_atomic(out / "summary.md", summary_markdown(results, errors, model))
    if cfg.plots:
      if "tatoeba" in results:
        plots.tatoeba_bars(results["tatoeba"], out / "tatoeba_languages.png")
      if "geometry" in artifacts:
        plots.projection(artifacts["geometry"], out / "geometry_projection.png")
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
