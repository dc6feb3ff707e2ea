"""Zero-shot cross-lingual transfer probe on frozen embeddings (MLDoc / XNLI style).

A scikit-learn classifier (standardized features, multinomial logistic
regression) is trained on embeddings of ONE language and tested on the others.
Files: UTF-8 TSV per language, `text<TAB>label` (single sentences) or
`text_a<TAB>text_b<TAB>label` (pairs; features [u, v, |u - v|, u * v] as in
SentEval/InferSent), named by a pattern with `{lang}`.

With only a test pattern (XNLI's dev files, line-aligned across languages), the
source language's first `n_train` lines train the probe and lines `n_train:` of
every language are the test set, so no test item (in any language) is a
translation of a training item. With a train pattern, the probe trains on the
source language's train file and tests on each language's whole test file.
Accuracy ×100; main score = mean over the target languages (source excluded).

Probes (`probe`): 'logistic' (standardized features, multinomial logistic regression; the
default of `xnli_transfer`) or 'mlp', EMS's (§5.4-5.5: "a multi-layer perceptron", results
the mean of 5 runs) as LASER's MLDoc script that EMS follows has it (tasks/mldoc/mldoc.sh
and source/sent_classif.py: the raw sentence vectors, dropout 0.2 on the input and after
each hidden layer, hidden layers of 10 and 8 with tanh, Adam at 1e-3 without weight decay,
batches of 12 in a new random order every epoch, 500 epochs, the network of the epoch with
the best dev accuracy kept, a later epoch winning a tie; PyTorch's Linear initialization),
in JAX (`MlpProbe`; all 500 epochs run in one compiled loop). The dev set is the source
language's dev file (`dev_pattern`) or, without one, a seeded 10 % of the training items
held out. One probe is trained per seed (`seeds`); each target's accuracy is the mean over
seeds, `accuracy_per_seed` lists them.

Benchmarks read from a directory (`evaluate_benchmark`): EMS's MLDoc (Table 10) and the
two Amazon review corpora (Tables 11, 12), both directions between English and each other
language (train in one, test in the other), files `text<TAB>label` named as in
`Benchmark.pattern` (each language has its train, dev and test file).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vmx.data.languages import XNLI, iso3
from vmx.errors import DataError
from vmx.evaluation import common

XNLI_LANGS = XNLI
XNLI_PATTERN = "eval/xnli/dev-{lang}.tsv"
XNLI_N_TRAIN = 1494   # 498 premises x 3 hypotheses; the remaining 996 lines are the test set


def read_labeled(path, task="transfer"):
  """(columns: list of text lists, labels). 2 fields = single text, 3 = pair."""
  rows = []
  n_fields = None
  for i, line in enumerate(common.read_lines(path, task), 1):
    parts = line.split("\t")
    if n_fields is None:
      n_fields = len(parts)
      if n_fields not in (2, 3):
        raise DataError(f"task {task}: {path}:{i}: expected text<TAB>label or "
                        f"text_a<TAB>text_b<TAB>label, got {len(parts)} fields")
    if len(parts) != n_fields:
      raise DataError(f"task {task}: {path}:{i}: {len(parts)} fields, line 1 had {n_fields}")
    rows.append(parts)
  if not rows:
    raise DataError(f"task {task}: {path}: empty")
  cols = [[r[j] for r in rows] for j in range(n_fields - 1)]
  return cols, [r[-1] for r in rows]


def features(encode, cols, lang) -> np.ndarray:
  if len(cols) == 1:
    return encode(cols[0], lang)
  u, v = encode(cols[0], lang), encode(cols[1], lang)
  return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


PROBES = ("logistic", "mlp")
# LASER's MLDoc classifier (tasks/mldoc/mldoc.sh, source/sent_classif.py), which EMS follows
# (§5.4); the held-out fraction (without a dev file) is vmx's.
MLP = {"hidden": (10, 8), "dropout": 0.2, "learning_rate": 1e-3, "batch_size": 12,
       "weight_decay": 0.0, "epochs": 500, "validation_fraction": 0.1}
EMS_SEEDS = (0, 1, 2, 3, 4)   # "the mean value of 5 runs" (Tables 10-12)


def make_probe(seed: int = 0, c: float = 1.0):
  from sklearn.linear_model import LogisticRegression  # lazy: scikit-learn (slow import, used by this task only)
  from sklearn.pipeline import make_pipeline  # lazy: scikit-learn
  from sklearn.preprocessing import StandardScaler  # lazy: scikit-learn
  return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000,
                                                            random_state=seed))


def mlp_init(key, sizes):
  """[(W [in, out], b [out])] as PyTorch's Linear draws them: U(-1/sqrt(in), 1/sqrt(in))."""
  layers = []
  for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    kw, kb = jax.random.split(jax.random.fold_in(key, i))
    bound = 1.0 / np.sqrt(n_in)
    layers.append((jax.random.uniform(kw, (n_in, n_out), minval=-bound, maxval=bound),
                   jax.random.uniform(kb, (n_out,), minval=-bound, maxval=bound)))
  return layers


def mlp_logits(layers, x_NxD, dropout: float = 0.0, key=None):
  """LASER's classifier: [dropout] -> (Linear -> tanh -> [dropout]) per hidden layer ->
  Linear. `key` None: no dropout (evaluation)."""

  def drop(h, i):
    if key is None or not dropout:
      return h
    keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - dropout, h.shape)
    return jnp.where(keep, h / (1.0 - dropout), 0.0)
  h = drop(x_NxD, 0)
  for i, (w, b) in enumerate(layers[:-1]):
    h = drop(jnp.tanh(h @ w + b), i + 1)
  w, b = layers[-1]
  return h @ w + b


@functools.partial(jax.jit, static_argnames=("dropout", "learning_rate", "weight_decay",
                                             "batch_size", "epochs"))
def _train_mlp(params, x, y_ids, dev_x, dev_ids, key, *, dropout, learning_rate,
               weight_decay, batch_size, epochs):
  """(the parameters of the best dev epoch, its dev accuracy, the epoch) of `epochs` epochs
  of Adam on batches of `batch_size` in a new order each epoch (one compilation per
  shape and setting, every seed and language pair reusing it)."""
  n, bs = y_ids.shape[0], batch_size
  n_batches = -(-n // bs)
  tx = optax.chain(optax.add_decayed_weights(weight_decay),
                   optax.adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8))

  def batch_loss(p, rows, valid, k):
    logits = mlp_logits(p, x[rows], dropout, k)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, y_ids[rows])
    return jnp.sum(nll * valid) / jnp.sum(valid)    # the batch's mean (a short last one)

  def epoch(carry, e):
    p, opt, best_p, best_acc, best_e = carry
    k = jax.random.fold_in(key, e + 1)
    order = jax.random.permutation(jax.random.fold_in(k, 0), n)
    order = jnp.concatenate([order, jnp.zeros(n_batches * bs - n, order.dtype)])
    valid = (jnp.arange(n_batches * bs) < n).astype(jnp.float32)

    def step(c, i):
      p, opt = c
      rows, v = order.reshape(n_batches, bs)[i], valid.reshape(n_batches, bs)[i]
      g = jax.grad(batch_loss)(p, rows, v, jax.random.fold_in(k, i + 1))
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), None
    (p, opt), _ = jax.lax.scan(step, (p, opt), jnp.arange(n_batches))
    acc = jnp.mean(jnp.argmax(mlp_logits(p, dev_x), axis=1) == dev_ids)
    better = acc >= best_acc                            # LASER: a tie goes to the later epoch
    best_p = jax.tree.map(lambda a, b: jnp.where(better, a, b), p, best_p)
    return (p, opt, best_p, jnp.where(better, acc, best_acc),
            jnp.where(better, e + 1, best_e)), None

  init = (params, tx.init(params), params, jnp.float32(-1.0), jnp.int32(0))
  _, _, best, acc, best_epoch = jax.lax.scan(epoch, init, jnp.arange(epochs))[0]
  return best, acc, best_epoch


class MlpProbe:
  """LASER's MLDoc MLP (module docstring): `fit(x, y, dev_x, dev_y)` trains `MLP["epochs"]`
  epochs and keeps the epoch with the best dev accuracy (`best_epoch`, `dev_accuracy`);
  without a dev set, a seeded `validation_fraction` of (x, y) is held out as one."""

  def __init__(self, seed: int = 0, settings: Optional[dict] = None):
    self.seed = seed
    self.settings = dict(MLP, **(settings or {}))

  def fit(self, x, y, dev_x=None, dev_y=None):
    st = self.settings
    y = np.asarray(y)
    if dev_x is None:
      from sklearn.model_selection import train_test_split  # lazy: scikit-learn
      try:     # stratified where every class can be split, else a plain seeded split
        x, dev_x, y, dev_y = train_test_split(x, y, test_size=st["validation_fraction"],
                                              random_state=self.seed, stratify=y)
      except ValueError:
        x, dev_x, y, dev_y = train_test_split(x, y, test_size=st["validation_fraction"],
                                              random_state=self.seed)
    self.classes = np.unique(y)
    index = {c: i for i, c in enumerate(self.classes)}
    y_ids = jnp.asarray([index[c] for c in y], jnp.int32)
    dev_ids = jnp.asarray([index.get(c, -1) for c in np.asarray(dev_y)], jnp.int32)
    x, dev_x = jnp.asarray(x, jnp.float32), jnp.asarray(dev_x, jnp.float32)
    key = jax.random.PRNGKey(self.seed)
    params = mlp_init(key, (x.shape[1], *st["hidden"], len(self.classes)))
    best, acc, best_epoch = _train_mlp(
        params, x, y_ids, dev_x, dev_ids, key, dropout=st["dropout"],
        learning_rate=st["learning_rate"], weight_decay=st["weight_decay"],
        batch_size=min(st["batch_size"], len(y)), epochs=st["epochs"])
    self.params = best
    self.best_epoch, self.dev_accuracy = int(best_epoch), 100 * float(acc)
    return self

  def predict(self, x):
    logits = mlp_logits(self.params, jnp.asarray(x, jnp.float32))
    return self.classes[np.asarray(jnp.argmax(logits, axis=1))]


def fit_probe(probe: str, seed: int, c: float, x, y, dev=None):
  """A fitted probe of kind `probe` (PROBES); `dev` (x, y): the MLP's dev set."""
  if probe == "logistic":
    return make_probe(seed, c).fit(x, y)
  if probe == "mlp":
    return MlpProbe(seed).fit(x, y, *(dev or (None, None)))
  raise ValueError(f"probe={probe!r}: expected one of {PROBES}")


def evaluate(encode, test_pattern: str = XNLI_PATTERN, languages: Sequence[str] = XNLI_LANGS,
             source: str = "en", train_pattern: Optional[str] = None,
             n_train: Optional[int] = XNLI_N_TRAIN, c: float = 1.0,
             data_dir: Optional[str] = None, progress: bool = False,
             files: Optional[common.DataFiles] = None, name: str = "xnli",
             probe: str = "logistic", seeds: Sequence[int] = (0,),
             dev_pattern: Optional[str] = None, cache: Optional[dict] = None) -> dict:
  """`probe`, `seeds`, `dev_pattern`: see the module docstring. `cache`: a dict shared by
  calls that read the same files (features are computed once per file and language)."""
  if probe not in PROBES:
    raise ValueError(f"probe={probe!r}: expected one of {PROBES}")
  seeds = list(seeds)
  if not seeds:
    raise ValueError("seeds: give at least one")
  files = files or common.DataFiles(f"transfer/{name}", data_dir)
  cache = {} if cache is None else cache
  task = files.task

  def load(pattern, lang):
    """[text columns, labels, features or None] of a file (read once per cache)."""
    path = files.path(pattern.format(lang=lang))
    key = (str(path), lang)
    if key not in cache:
      cache[key] = [*read_labeled(path, task), None]
    return cache[key]

  def feats(pattern, lang, rows=slice(None)):
    entry = load(pattern, lang)
    if entry[2] is None:
      entry[2] = features(encode, entry[0], iso3(lang))
    return entry[2][rows], entry[1][rows]

  if train_pattern:
    tr_x, tr_y = feats(train_pattern, source)
    test_slice = slice(None)
  else:
    n_source = len(load(test_pattern, source)[1])
    if not n_train or n_train >= n_source:
      raise DataError(f"task {task}: n_train={n_train} must be in [1, {n_source}) to split "
                      f"{test_pattern.format(lang=source)}")
    tr_x, tr_y = feats(test_pattern, source, slice(None, n_train))
    test_slice = slice(n_train, None)
  dev = feats(dev_pattern, source) if dev_pattern else None
  known = sorted(set(tr_y))
  if dev and sorted(set(dev[1]) - set(known)):
    raise DataError(f"task {task}: {dev_pattern.format(lang=source)}: labels "
                    f"{sorted(set(dev[1]) - set(known))} not in the training labels {known}")
  probes = [fit_probe(probe, s, c, tr_x, tr_y, dev) for s in seeds]
  subsets = []
  for lang in common.progress_iter(languages, f"transfer {name}", progress):
    n_lang = len(load(test_pattern, lang)[1])
    if not train_pattern and n_lang != n_source:
      raise DataError(f"task {task}: {test_pattern.format(lang=lang)} has {n_lang} lines, "
                      f"{test_pattern.format(lang=source)} has {n_source}: the files must be "
                      f"line-aligned translations to split them at n_train={n_train}")
    x, y = feats(test_pattern, lang, test_slice)
    unknown = sorted(set(y) - set(known))
    if unknown:
      raise DataError(f"task {task}: {test_pattern.format(lang=lang)}: labels {unknown} not "
                      f"in the training labels {known}")
    per_seed = [100 * float(np.mean(p.predict(x) == np.asarray(y))) for p in probes]
    acc = common.mean(per_seed)
    subsets.append({"hf_subset": f"{source}-{lang}", "languages": [iso3(lang)],
                    "main_score": acc, "accuracy": acc, "accuracy_per_seed": per_seed,
                    "n": len(y), "zero_shot": lang != source})
  targets = [s["accuracy"] for s in subsets if s["zero_shot"]]
  out = {"scores": {"test": subsets}, "main_score": common.mean(targets),
         "source": source, "n_train": len(tr_y), "probe": probe, "seeds": seeds}
  if probe == "mlp":
    out["best_epochs"] = [p.best_epoch for p in probes]
    out["dev_accuracy_per_seed"] = [p.dev_accuracy for p in probes]
  return out


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """A zero-shot classification benchmark read from one directory: `pattern` names each
  language's (and domain's) train / dev / test file, `text<TAB>label`."""
  name: str
  table: str                       # EMS's table
  languages: tuple                 # ISO 639-1, as the benchmark names them; English first
  pattern: str                     # relative to the directory; {lang}, {split}[, {domain}]
  domains: tuple = ("",)
  sizes: str = ""                  # EMS's split sizes, for the docs and the layout line

  def layout(self, flag: str) -> str:
    doms = f", domain in {' '.join(self.domains)}" if self.domains != ("",) else ""
    return (f"--{flag}=DIR: DIR/{self.pattern.replace('{split}', '{train,dev,test}')}, "
            f"text<TAB>label, lang in {' '.join(self.languages)}{doms} ({self.sizes}); "
            f"probe: MLP (LASER's MLDoc setting), mean of {len(EMS_SEEDS)} seeds, both "
            f"directions en<->xx (vmx/evaluation/transfer.py)")


MLDOC = Benchmark("mldoc", "Table 10", ("en", "de", "es", "fr", "it", "ja", "ru", "zh"),
                  "{lang}.{split}.tsv",
                  sizes="EMS §5.4: 1,000 train / 1,000 dev in the source language, 4,000 "
                        "test in the target; MLDoc's files with the label column moved last")
AMAZON_V1 = Benchmark("amazon_v1", "Table 11", ("en", "de", "fr", "ja"),
                      "{lang}.{domain}.{split}.tsv", ("books", "dvd", "music"),
                      sizes="EMS §5.5: 2,000 train / 2,000 dev / 2,000 test per language and "
                            "domain (Prettenhofer & Stein 2010)")
AMAZON_V2 = Benchmark("amazon_v2", "Table 12", ("en", "de", "es", "fr", "ja", "zh"),
                      "{lang}.{split}.tsv",
                      sizes="EMS §5.5: 2,000 train / 4,000 dev / 4,000 test per language "
                            "(Keung et al. 2020, domains mixed)")
BENCHMARKS = {b.name: b for b in (MLDOC, AMAZON_V1, AMAZON_V2)}


def evaluate_benchmark(encode, bench: Benchmark, directory, probe: str = "mlp",
                       seeds: Sequence[int] = EMS_SEEDS, progress: bool = False,
                       files: Optional[common.DataFiles] = None) -> dict:
  """Both directions between English and every other language of `bench` (per domain):
  the probe trains on the source's train file (dev file for its epochs) and is tested on
  the target's test file. `scores.test`: one row per direction (`direction` 'en->xx' or
  'xx->en'); main score = the mean over directions, `en2xx` / `xx2en` the means over
  each."""
  directory = Path(directory).resolve()
  files = files or common.DataFiles(bench.name)
  if not directory.is_dir():
    raise DataError(f"task {files.task}: {directory}: no such directory "
                    f"({bench.layout(bench.name + '_dir')})")
  en, others = bench.languages[0], bench.languages[1:]
  cache, rows = {}, []
  for domain in bench.domains:
    pat = {split: str(directory / bench.pattern.format(lang="{lang}", split=split,
                                                       domain=domain))
           for split in ("train", "dev", "test")}
    for source, targets in [(en, others)] + [(xx, (en,)) for xx in others]:
      res = evaluate(encode, pat["test"], targets, source, train_pattern=pat["train"],
                     dev_pattern=pat["dev"], probe=probe, seeds=seeds, progress=progress,
                     files=files, name=bench.name, cache=cache)
      for s in res["scores"]["test"]:
        s["direction"] = "en->xx" if source == en else "xx->en"
        if domain:
          s["hf_subset"] = f"{s['hf_subset']}/{domain}"
        s["n_train"] = res["n_train"]
        rows.append(s)
  by_dir = {d: [s["accuracy"] for s in rows if s["direction"] == d]
            for d in ("en->xx", "xx->en")}
  return {"scores": {"test": rows}, "main_score": common.mean([s["accuracy"] for s in rows]),
          "en2xx": common.mean(by_dir["en->xx"]), "xx2en": common.mean(by_dir["xx->en"]),
          "probe": probe, "seeds": list(seeds), "benchmark": bench.table}
