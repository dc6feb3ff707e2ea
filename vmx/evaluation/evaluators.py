"""The harness's tasks as evaluators: one dataclass per task, its fields its settings.

  from vmx.evaluation import evaluators, harness
  harness.run(encoder, evaluators={"tatoeba": evaluators.Tatoeba(languages=["deu"]),
                                   "bucc": evaluators.Bucc(pairs=["de-en"])})

Each evaluator's `run(ctx)` scores one task and returns its record's task-specific part
(`scores`, `main_score`, aggregates; the harness adds the MTEB-like fields). `ctx` is
what every task of one run shares (`Context`: the encoder, the data directory, the files
read, the model's languages). A result is kept by a resumed run when the evaluator's
settings (`settings()`) and the data directory are the same.

`launch/eval.py` sets any field as `--<task>.<field>=VALUE` (`parse_setting`), and gin
or Python build them directly. A new task is a new class here, registered in
`EVALUATORS` under its name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

from vmx.data import devsets
from vmx.data.languages import XNLI
from vmx.data.languages import resolve as resolve_language
from vmx.errors import ConfigError, DataError
from vmx.evaluation import (bucc, common, dev, flores, geometry, knn, layerwise, paracrawl,
                            retrieval, sts, tatoeba, transfer, vectors)
from vmx.inference import Encoder


@dataclasses.dataclass
class Context:
  """What every task of one harness run shares."""
  encoder: Any                          # what harness.run was given
  encode: Callable                      # common.as_encode_fn(encoder)
  files: common.DataFiles               # the task's input files (dataset_revision)
  data_dir: Optional[str] = None        # default: $VMX_DATA_DIR, else the download cache
  progress: bool = True
  languages: Optional[Sequence[str]] = None      # the model's languages (a vmx Encoder's)
  id_languages: Optional[Sequence[str]] = None   # ... where the model reads language ids

  def encode_with(self, encoder):
    """The encode function of another encoder (a layer of this one), same progress."""
    return common.as_encode_fn(encoder, progress=None if self.progress else False)


class Evaluator:
  """One harness task (subclasses are dataclasses; their fields are the settings)."""
  NAME: ClassVar[str] = ""
  LOWER_IS_BETTER: ClassVar[bool] = False     # main_score's direction (MTEB: higher)

  def run(self, ctx: Context) -> dict:
    raise NotImplementedError

  def settings(self) -> dict:
    """What the task's result depends on besides the model and the data directory."""
    return {"task": self.NAME, **dataclasses.asdict(self)}


def required(value, task: str, field: str, module: Optional[str] = None):
  """`value`, or a DataError naming the setting and where the file layout is written."""
  if not value:
    raise DataError(f"task {task}: needs --{task}.{field} (see vmx/evaluation/"
                    f"{module or task.rstrip('0123456789')}.py for the file layout)")
  return value


# -- how a command line's value becomes a setting (parse_setting) ----------------------

def _text(text: str) -> str:
  return text


def _bool(text: str) -> bool:
  return {"true": True, "1": True, "false": False, "0": False}[text.strip().lower()]


def comma_list(text: Optional[str]) -> list:
  """'a, b,,c' -> ['a', 'b', 'c']; None or '' -> [] (every comma-separated flag and setting)."""
  return [p.strip() for p in (text or "").split(",") if p.strip()]


def _ints(text: str) -> list:
  return [int(p) for p in comma_list(text)]


def _pairs(text: str) -> dict:
  return dict(p.split("=", 1) for p in comma_list(text))


def _vector(text: str) -> tuple:
  layer, pooling = comma_list(text)
  if int(layer) < 1 or pooling not in ("mean", "first"):
    raise ValueError(text)
  return int(layer), pooling


def _layers(text: str):
  return "all" if text.strip() == "all" else _ints(text)


_PARSERS = {bool: _bool, int: int, str: _text}


def _probe(text: str) -> str:
  if text not in transfer.PROBES:
    raise ValueError(text)
  return text


def setting(default, parse: Optional[Callable] = None, expected: str = "",
            optional: bool = False):
  """A settings field whose command-line value is read by `parse` (`expected` says what
  it should look like; `optional`: `none` gives None)."""
  return dataclasses.field(default=default, metadata={"parse": parse, "expected": expected,
                                                      "optional": optional})


RESCORE_EXPECTED = "a multiplier >= 1 (0: off), with --precision=int8 or binary"


def check_rescoring(evaluators: Sequence[Evaluator], quantized: Optional[str]):
  """Before any task runs: a `rescore` setting needs a quantized encoder and a multiplier
  of at least 1 (ConfigError naming the flag)."""
  for ev in evaluators:
    if isinstance(ev, (Tatoeba, Bucc)) and ev.rescore:
      flag = f"--{ev.NAME}.rescore={ev.rescore}"
      if ev.rescore < 1:
        raise ConfigError(f"{flag}: expected {RESCORE_EXPECTED}")
      if isinstance(ev, TatoebaVector):
        raise ConfigError(f"{flag}: task {ev.NAME} scores a layer's vector, which has no "
                          "quantized geometry to rescore")
      if quantized is None:
        raise ConfigError(f"{flag}: rescoring needs quantized vectors (a vmx encoder's own, "
                          "quantized with --precision=int8 or binary)")


def rescoring_of(ctx: Context, evaluator: Evaluator):
  """(the float encode function, knn.Rescoring) of the run's quantized encoder for an
  evaluator's `rescore` multiplier: its searches run on the quantized vectors and their
  candidates are rescored with the float ones (knn.rescored_topk); the settings checked
  by `check_rescoring` against the run's encoder (ConfigError naming the setting)."""
  encoder = ctx.encoder if isinstance(ctx.encoder, Encoder) else None
  check_rescoring([evaluator], encoder.quantized if encoder else None)
  return (ctx.encode_with(encoder.float_encoder()),
          knn.Rescoring(encoder.to_geometry, evaluator.rescore))


def _record_tatoeba(files: common.DataFiles, langs):
  """Resolves (and records) the Tatoeba files of `langs`: a missing one fails here, named."""
  for l in langs:
    files.path(f"eval/tatoeba/v1/tatoeba.{l}-eng.{l}")
    files.path(f"eval/tatoeba/v1/tatoeba.{l}-eng.eng")


@dataclasses.dataclass
class Tatoeba(Evaluator):
  """Tatoeba retrieval, both directions (vmx/evaluation/tatoeba.py). `languages`: ISO
  639-3 codes (default: those the model knows, under their code or another one, else all);
  `english`: the code the model knows English by."""
  NAME: ClassVar[str] = "tatoeba"
  languages: Optional[Sequence[str]] = setting(None, comma_list, "ISO 639-3 codes, e.g. deu,fra",
                                                optional=True)
  english: str = "eng"
  # with a quantized encoder (--precision=int8|binary): search the quantized vectors for
  # rescore x k candidates and rescore them with the float vectors (knn.rescored_topk);
  # 0: score the quantized vectors alone
  rescore: int = setting(0, int, RESCORE_EXPECTED)

  def run(self, ctx: Context, encode: Optional[Callable] = None) -> dict:
    langs = list(self.languages or ctx.languages or [])
    available = tatoeba.available_languages(ctx.data_dir)
    if not langs:
      langs = available
    elif ctx.languages and not self.languages:
      # Tatoeba's languages that the model knows (pes for fas: vmx.data.languages.resolve)
      langs = [l for l in available if resolve_language(l, langs) is not None]
    _record_tatoeba(ctx.files, langs)
    own = ctx.languages
    rescoring = None
    if self.rescore:
      encode, rescoring = rescoring_of(ctx, self)
    res = tatoeba.evaluate(encode or ctx.encode, langs, ctx.data_dir, english=self.english,
                           progress=ctx.progress, own_languages=own, rescoring=rescoring)
    # `seen`: whether the model trained on the language (VMSST A.3's Table 8), where the
    # model says which languages it trained on
    subsets = [{"hf_subset": f"{l}-eng", "languages": [l, "eng"], "main_score": r["mean"],
                "accuracy_xx2en": r["xx2en"], "accuracy_en2xx": r["en2xx"],
                "xsim_error": r["xsim"], "n": r["n"],
                "group": "head" if l in tatoeba.EMMAX_HEAD else "long_tail",
                **({"seen": resolve_language(l, own) is not None} if own else {})}
               for l, r in res["languages"].items()]
    return {"scores": {"test": subsets}, "main_score": res["mean"]["mean"],
            "mean": res["mean"], "groups": res["groups"]}


@dataclasses.dataclass
class TatoebaVector(Tatoeba):
  """Tatoeba with `vector` = (layer, pooling) of the encoder, whatever vector the model
  embeds (InfoXLM §4.2: the mean of layer 7, Tables 2-3). An encoder that cannot give it
  (not a vmx model, or fewer layers) is scored with its own vector, and the result says
  so (`vector_requested`, `vector_unavailable`)."""
  NAME: ClassVar[str] = "tatoeba_vector"
  vector: tuple = setting((7, "mean"), _vector, "LAYER,POOLING, e.g. 7,mean (pooling mean "
                          "or first)")

  def run(self, ctx: Context, encode: Optional[Callable] = None) -> dict:
    layer, pooling = self.vector
    wanted = f"layer {int(layer)}, {vectors.POOLING_NAMES.get(pooling, pooling)}"
    try:
      chosen, why = layerwise.layer_encoder(ctx.encoder, int(layer), pooling), None
    except ConfigError as e:
      chosen, why = ctx.encoder, str(e)
    out = super().run(ctx, ctx.encode if why else ctx.encode_with(chosen))
    out["vector"] = vectors.describe(chosen)
    out["vector_requested"] = wanted
    if why:
      out["vector_unavailable"] = why
    return out


@dataclasses.dataclass
class TatoebaLayers(Evaluator):
  """InfoXLM Fig. 1: Tatoeba accuracy of each layer's mean-pooled hidden states
  (vmx/evaluation/layerwise.py), one Tatoeba pass per layer; main score = the best layer's
  xx->en accuracy. `layers`: 'all' or layer numbers (None: all, when asked for by name;
  off in a protocol)."""
  NAME: ClassVar[str] = "tatoeba_layers"
  layers: Union[None, str, Sequence[int]] = setting(None, _layers, "'all' or layer numbers "
                                                    "1,2,..", optional=True)
  languages: Sequence[str] = setting(tatoeba.INFOXLM_PARALLEL14, comma_list, "ISO 639-3 codes")
  english: str = "eng"

  def run(self, ctx: Context) -> dict:
    layers = self.layers
    if layers in (None, "all"):
      layers = list(range(1, layerwise.num_layers(ctx.encoder) + 1))
    langs = list(self.languages)
    _record_tatoeba(ctx.files, langs)
    rows = []
    for k in layers:
      layer_enc = layerwise.layer_encoder(ctx.encoder, int(k))
      res = tatoeba.evaluate(ctx.encode_with(layer_enc), langs, ctx.data_dir,
                             english=self.english)
      m = res["mean"]
      rows.append({"hf_subset": f"layer_{k}", "layer": int(k), "languages": langs,
                   "vector": vectors.describe(layer_enc),
                   "main_score": m["xx2en"], "accuracy_xx2en": m["xx2en"],
                   "accuracy_en2xx": m["en2xx"], "accuracy_mean": m["mean"],
                   "n_languages": m["n_languages"]})
    best = max(rows, key=lambda r: r["main_score"])
    return {"scores": {"test": rows}, "main_score": best["main_score"],
            "best_layer": best["layer"], "pooling": "mean", "direction": "xx2en",
            "vector": "each layer's mean (per row)"}


@dataclasses.dataclass
class Bucc(Evaluator):
  """BUCC 2018 bitext mining F1 (vmx/evaluation/bucc.py); `pairs`: default every pair of
  bucc.PAIRS supplied."""
  NAME: ClassVar[str] = "bucc"
  pairs: Optional[Sequence[str]] = setting(None, comma_list, "pairs, e.g. de-en,fr-en",
                                           optional=True)
  rescore: int = setting(0, int, RESCORE_EXPECTED)   # as Tatoeba's

  def run(self, ctx: Context) -> dict:
    encode, rescoring = ctx.encode, None
    if self.rescore:
      encode, rescoring = rescoring_of(ctx, self)
    return bucc.evaluate(encode, self.pairs, ctx.data_dir, progress=ctx.progress,
                         files=ctx.files, rescoring=rescoring)


@dataclasses.dataclass
class Sts12To16(Evaluator):
  """SemEval STS 2012-2016 (vmx/evaluation/sts.py)."""
  NAME: ClassVar[str] = "sts12-16"

  def run(self, ctx: Context) -> dict:
    return sts.evaluate_sts12_16(ctx.encode, data_dir=ctx.data_dir, progress=ctx.progress,
                                 files=ctx.files)


@dataclasses.dataclass
class Stsb(Evaluator):
  """STS Benchmark, test and dev (vmx/evaluation/sts.py)."""
  NAME: ClassVar[str] = "stsb"

  def run(self, ctx: Context) -> dict:
    return sts.evaluate_stsb(ctx.encode, data_dir=ctx.data_dir, files=ctx.files)


@dataclasses.dataclass
class Sts17(Evaluator):
  """SemEval-2017's cross-lingual STS (`dir`: STS.input.trackN.xx-yy.txt; `gs_dir`: the
  gold files, if not next to the inputs; `extended`: STS2017-extended's zip or directory,
  for the four pairs the release does not have, or every pair without `dir`)."""
  NAME: ClassVar[str] = "sts17"
  dir: Optional[str] = None
  gs_dir: Optional[str] = None
  extended: Optional[str] = None

  @property
  def sources(self) -> Optional[str]:
    """What the task reads (the release or STS2017-extended): None when neither is given."""
    return self.dir or self.extended

  def run(self, ctx: Context) -> dict:
    required(self.sources, self.NAME, "dir")
    return sts.evaluate_sts17(ctx.encode, self.dir, self.gs_dir, ctx.progress,
                              files=ctx.files, extended=self.extended)


@dataclasses.dataclass
class Retrieval(Evaluator):
  """Query -> corpus retrieval over directories of queries.tsv / corpus.tsv / qrels.tsv
  (vmx/evaluation/retrieval.py); main score: the mean over the directories."""
  NAME: ClassVar[str] = "retrieval"
  dirs: Sequence[str] = setting((), comma_list, "directories, comma-separated")

  def run(self, ctx: Context) -> dict:
    scores, mains = {"test": []}, []
    for d in required(list(self.dirs), self.NAME, "dirs"):
      r = retrieval.evaluate(ctx.encode, d, progress=ctx.progress, files=ctx.files)
      for s in r["scores"]["test"]:
        s["hf_subset"] = f"{r['name']}/{s['hf_subset']}"
        scores["test"].append(s)
      mains.append(r["main_score"])
    return {"scores": scores, "main_score": common.mean(mains)}


@dataclasses.dataclass
class Geometry(Evaluator):
  """Language invariance, canonical form and isotropy of the embedding space
  (vmx/evaluation/geometry.py) over `n` N-way parallel sentences (`files` {lang: path};
  default newstest2013); `cov`: the Gaussians' covariance. Lower KL is better."""
  NAME: ClassVar[str] = "geometry"
  LOWER_IS_BETTER: ClassVar[bool] = True
  files: Optional[dict] = setting(None, _pairs, "lang=path,lang=path,...", optional=True)
  n: int = 1000
  cov: str = "diag"

  def run(self, ctx: Context) -> dict:
    return geometry.evaluate(ctx.encode, self.files, self.n, self.cov, ctx.data_dir,
                             ctx.progress, files=ctx.files)


@dataclasses.dataclass
class Dev(Evaluator):
  """Retrieval on the dev sets carved from the training data (vmx/data/devsets.py): model
  selection. `languages`: file codes or ISO 639-3 (default all; the model's where it reads
  language ids)."""
  NAME: ClassVar[str] = "dev"
  sets: Sequence[str] = setting(devsets.DEFAULT_DEV_SETS, comma_list, "dev set names")
  max_sentences: Optional[int] = setting(1000, int, "a number of sentences, or none",
                                         optional=True)
  languages: Optional[Sequence[str]] = setting(None, comma_list, "file codes or ISO 639-3 codes",
                                               optional=True)

  def run(self, ctx: Context) -> dict:
    return dev.evaluate(ctx.encode, self.sets, ctx.data_dir, self.max_sentences,
                        self.languages, ctx.id_languages, ctx.progress)


@dataclasses.dataclass
class XnliTransfer(Evaluator):
  """Zero-shot cross-lingual transfer of a probe trained on `source`'s XNLI dev sentences
  (vmx/evaluation/transfer.py); `probe` one of transfer.PROBES, `seeds` its seeds."""
  NAME: ClassVar[str] = "xnli_transfer"
  languages: Sequence[str] = setting(XNLI, comma_list, "XNLI languages, e.g. en,de,fr")
  source: str = "en"
  probe: str = setting("logistic", _probe, f"one of {', '.join(transfer.PROBES)}")
  seeds: Sequence[int] = setting((0,), _ints, "integers 0,1,..")

  def run(self, ctx: Context) -> dict:
    return transfer.evaluate(ctx.encode, languages=self.languages, source=self.source,
                             data_dir=ctx.data_dir, progress=ctx.progress, files=ctx.files,
                             probe=self.probe, seeds=self.seeds)


@dataclasses.dataclass
class TransferBenchmark(Evaluator):
  """A document-classification transfer benchmark of EMS (transfer.BENCHMARKS: MLDoc,
  Amazon reviews v1 / v2) read from the user's `dir`, with EMS's MLP probe and seeds."""
  dir: Optional[str] = None
  probe: str = setting("mlp", _probe, f"one of {', '.join(transfer.PROBES)}")
  seeds: Sequence[int] = setting(transfer.EMS_SEEDS, _ints, "integers 0,1,..")

  def run(self, ctx: Context) -> dict:
    return transfer.evaluate_benchmark(
        ctx.encode, transfer.BENCHMARKS[self.NAME],
        required(self.dir, self.NAME, "dir", "transfer"), self.probe, self.seeds,
        ctx.progress, files=ctx.files)


@dataclasses.dataclass
class Mldoc(TransferBenchmark):
  NAME: ClassVar[str] = "mldoc"


@dataclasses.dataclass
class AmazonV1(TransferBenchmark):
  NAME: ClassVar[str] = "amazon_v1"


@dataclasses.dataclass
class AmazonV2(TransferBenchmark):
  NAME: ClassVar[str] = "amazon_v2"


@dataclasses.dataclass
class Paracrawl(Evaluator):
  """EMS Table 9's ParaCrawl retrieval (vmx/evaluation/paracrawl.py) from OPUS ParaCrawl
  v5 files in `dir`; `languages` default every pair supplied."""
  NAME: ClassVar[str] = "paracrawl"
  dir: Optional[str] = None
  languages: Optional[Sequence[str]] = setting(None, comma_list, "languages, e.g. de,fr",
                                               optional=True)
  queries: int = paracrawl.N_QUERIES
  candidates: int = paracrawl.N_CANDIDATES
  seed: int = 0

  def run(self, ctx: Context) -> dict:
    return paracrawl.evaluate(ctx.encode, required(self.dir, self.NAME, "dir"),
                              self.languages, self.queries, self.candidates, self.seed,
                              progress=ctx.progress, files=ctx.files)


@dataclasses.dataclass
class Flores(Evaluator):
  """FLORES-200 retrieval xx->en (vmx/evaluation/flores.py) from `dir`
  (flores200_dataset/); `languages`: FLORES codes, default all."""
  NAME: ClassVar[str] = "flores"
  dir: Optional[str] = None
  splits: Sequence[str] = setting(flores.DEFAULT_SPLITS, comma_list, "splits, e.g. devtest")
  languages: Optional[Sequence[str]] = setting(None, comma_list, "FLORES codes, e.g. deu_Latn",
                                               optional=True)

  def run(self, ctx: Context) -> dict:
    return flores.evaluate(ctx.encode, required(self.dir, self.NAME, "dir"), self.splits,
                           self.languages, progress=ctx.progress, files=ctx.files,
                           model_languages=ctx.id_languages)


EVALUATORS: dict[str, type] = {cls.NAME: cls for cls in (
    Tatoeba, Bucc, Sts12To16, Stsb, Sts17, Retrieval, Geometry, Dev, XnliTransfer, Mldoc,
    AmazonV1, AmazonV2, Paracrawl, TatoebaLayers, TatoebaVector, Flores)}


def parse_setting(evaluator: Evaluator, field: str, text: str, flag: str = ""):
  """`text` (a command-line value) as `evaluator`'s `field`: the field's own parser where
  it has one (comma-separated lists, `lang=path` pairs, `layer,pooling`), else the type
  of its default; `none` for a setting that may be None. ConfigError naming
  `--task.field` (or `flag`, the one the user typed) for anything else."""
  flag = flag or f"--{evaluator.NAME}.{field}"
  fields = {f.name: f for f in dataclasses.fields(evaluator)}
  if field not in fields:
    raise ConfigError(f"{flag}: task {evaluator.NAME} has no setting {field!r}; its "
                      f"settings: {', '.join(fields) or 'none'}")
  f = fields[field]
  parse = f.metadata.get("parse") or _PARSERS.get(type(f.default), _text)
  if text.strip().lower() == "none" and f.metadata.get("optional", f.default is None):
    return None
  try:
    return parse(text)
  except (ValueError, KeyError, IndexError):
    expected = f.metadata.get("expected") or type(f.default).__name__
    raise ConfigError(f"{flag}={text!r}: expected {expected}") from None


