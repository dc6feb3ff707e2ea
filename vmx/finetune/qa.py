"""Extractive question answering (MLQA, InfoXLM Table 4): the files, the windows over long
passages, and the answers read back from the span head's logits.

- `QaBenchmark` / `QA_BENCHMARKS`: where the files are. MLQA's dev and test files in
  MLQA_DIR as MLQA_V1.zip unpacks; the English training set (SQuAD v1.1's
  `train-v1.1.json`) and XTREME's translate-train files in SQUAD_DIR.
- `windows`: each question joined with windows of its passage in the tokenizer's pair
  format (`<s> question </s></s> passage window </s>` for XLM-R), as BERT's SQuAD code
  does: the question keeps its first `max_query_length` tokens (counted in the results),
  the passage is cut into windows of what room is left, each starting `doc_stride` tokens
  after the last, so no part of a passage is ever dropped. A training window holds the
  answer's first and last token, or points at position 0 when the answer is not wholly in
  it.
- `best_answers`: for each question, the best span over all its windows (the `n_best`
  start and end logits of each window, end >= start, at most `max_answer_length` tokens,
  score the sum of the two logits), read from the passage by the tokens' character spans
  (the tokenizers' `encode_spans`, vmx/data/).
- `prepare`: the `Task` (vmx/finetune/run.py) a run of `finetune()` trains and scores.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional, Sequence

import gin
import jax
import numpy as np

from vmx.data.languages import iso3
from vmx.errors import ConfigError, DataError
from vmx.finetune import squad
from vmx.finetune.data import ArrayInput, digest, stamp
from vmx.finetune.task import Start, Task, in_batches
from vmx.gin_utils import check_range, positive_int
from vmx.models.span import SpanExtractor, SpanModel


@gin.configurable
@dataclasses.dataclass(frozen=True)
class QaSettings:
  """Windows and answer extraction (BERT's and XTREME's SQuAD settings by default)."""
  doc_stride: int = 128           # tokens between the starts of a passage's windows
  max_query_length: int = 64      # the question's tokens kept
  max_answer_length: int = 30     # tokens of an extracted answer, at most
  n_best: int = 20                # start and end candidates per window

  def check(self) -> None:
    for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best"):
      check_range(positive_int(getattr(self, name)), "QaSettings", name, getattr(self, name),
                  "a positive integer")


@dataclasses.dataclass(frozen=True)
class QaBenchmark:
  """An extractive QA benchmark: evaluation files in `flag`'s directory, the English
  training file (and translated ones, `translated_train`) in `train_flag`'s."""
  name: str
  flag: str
  train_flag: str
  languages: tuple
  files: Mapping[str, str]
  translated_train: str = ""

  def path(self, data_dir, train_dir, split: str, lang: str) -> Path:
    if split == "train":
      pattern = self.files["train"] if lang == "en" else self.translated_train
      return Path(str(train_dir)) / pattern.format(lang=lang)
    return Path(str(data_dir)) / self.files[split].format(lang=lang)

  def check_train_dir(self, train_dir) -> None:
    """The training files' directory is set and is one (else one line with the layout)."""
    if not train_dir:
      raise ConfigError(f"{self.train_flag} is not set: {self.layout()}")
    if not Path(str(train_dir)).is_dir():
      raise DataError(f"{self.train_flag}={train_dir}: no such directory ({self.layout()})")

  def layout(self) -> str:
    return (f"--gin.{self.flag}=DIR: DIR/{self.files['dev'].format(lang='<lang>')} and "
            f"DIR/{self.files['test'].format(lang='<lang>')} for lang in "
            f"{' '.join(self.languages)} (MLQA_V1.zip unpacked); --gin.{self.train_flag}=DIR: "
            f"DIR/{self.files['train']} (SQuAD v1.1), "
            f"DIR/{self.translated_train.format(lang='<lang>')} for translate-train (XTREME)")


QA_BENCHMARKS = {b.name: b for b in (
    QaBenchmark("mlqa", "MLQA_DIR", "SQUAD_DIR", squad.MLQA_LANGUAGES,
                {"train": "train-v1.1.json",
                 "dev": "dev/dev-context-{lang}-question-{lang}.json",
                 "test": "test/test-context-{lang}-question-{lang}.json"},
                translated_train="translate-train/squad.translate.train.en-{lang}.json"),
)}


@dataclasses.dataclass
class Windows:
  """Token rows of (question, passage window) pairs: `tokens` [F, L], the training targets
  `start`, `end` [F], the question each row belongs to (`example` [F]), and each context
  token's [start, end) characters in its passage (`spans` [F, L, 2], -1 elsewhere)."""
  tokens: np.ndarray
  start: np.ndarray
  end: np.ndarray
  example: np.ndarray
  spans: np.ndarray
  questions_cut: int


def windows(tokenizer, examples: Sequence[squad.QaExample], max_length: int,
            settings: QaSettings, lang: Optional[str] = None,
            with_spans: bool = True) -> Windows:
  """The rows of every question (module docstring). `with_spans=False` (training rows,
  where answers are not read back): `spans` is empty [F, 0, 2], which saves 8 bytes a
  token (270 MB for SQuAD's ~88,000 windows of 384)."""
  opening, middle, closing = tokenizer.pair_template()
  tokens, starts, ends, owner, spans, cut = [], [], [], [], [], 0
  for e, ex in enumerate(examples):
    question = tokenizer.encode_spans(ex.question, lang)[0]
    cut += len(question) > settings.max_query_length
    question = question[:settings.max_query_length]
    ids, where = tokenizer.encode_spans(ex.context, lang)
    offset = len(opening) + len(question) + len(middle)
    room = max_length - offset - len(closing)
    if room < 1:
      raise ConfigError(f"finetune.max_length={max_length}: no room for a passage after a "
                        f"question of {len(question)} tokens (QaSettings.max_query_length="
                        f"{settings.max_query_length})")
    first = last = -1
    if ex.start >= 0:     # the answer's first and last token with characters of their own
      a, b = ex.start, ex.start + len(ex.answers[0])
      inside = [i for i, (s, t) in enumerate(where) if t > s and t > a and s < b]
      if inside:
        first, last = inside[0], inside[-1]
    at = 0
    while True:
      chunk = slice(at, min(at + room, len(ids)))
      row = np.zeros(max_length, np.int32)
      joined = opening + question + middle + ids[chunk] + closing
      row[:len(joined)] = joined
      span = np.full((max_length if with_spans else 0, 2), -1, np.int32)
      if chunk.stop > at and with_spans:
        span[offset:offset + chunk.stop - at] = np.asarray(where[chunk], np.int32)
      hold = first >= at and last < chunk.stop and first >= 0
      tokens.append(row)
      spans.append(span)
      starts.append(offset + first - at if hold else 0)
      ends.append(offset + last - at if hold else 0)
      owner.append(e)
      if chunk.stop >= len(ids):
        break
      at += min(settings.doc_stride, room)
  return Windows(np.stack(tokens), np.asarray(starts, np.int32), np.asarray(ends, np.int32),
                 np.asarray(owner, np.int32), np.stack(spans), cut)


_LOGITS = {}


def span_logits(model, params, tokens_NxL, batch_size: int = 128):
  """(start, end) logits [N, L] float32 on the host, in batches (the last one padded: one
  compilation)."""
  key = id(model)
  if key not in _LOGITS:
    _LOGITS[key] = jax.jit(lambda p, t: model.logits(p, t))
  return in_batches(_LOGITS[key], params, tokens_NxL, batch_size)


def best_answers(start_FxL, end_FxL, win: Windows, examples: Sequence[squad.QaExample],
                 settings: QaSettings) -> dict:
  """{question id: answer text} (module docstring); a question without any valid span
  gets ""."""
  context = win.spans[..., 0] >= 0
  neg = np.float32(-np.inf)
  s = np.where(context, start_FxL, neg)
  t = np.where(context, end_FxL, neg)
  n = min(settings.n_best, s.shape[1])
  top_s = np.argsort(-s, axis=1, kind="stable")[:, :n]          # [F, n]
  top_t = np.argsort(-t, axis=1, kind="stable")[:, :n]
  rows = np.arange(len(s))[:, None, None]
  i, j = top_s[:, :, None], top_t[:, None, :]                     # [F, n, 1], [F, 1, n]
  score = s[rows, i] + t[rows, j]                                 # [F, n, n]
  ok = (j >= i) & (j - i < settings.max_answer_length) & np.isfinite(score)
  score = np.where(ok, score, neg)
  flat = score.reshape(len(s), -1).argmax(axis=1)
  best = score.reshape(len(s), -1)[np.arange(len(s)), flat]
  bi, bj = top_s[np.arange(len(s)), flat // n], top_t[np.arange(len(s)), flat % n]
  out, kept = {}, {}
  for f in range(len(s)):
    ex = examples[win.example[f]]
    if not np.isfinite(best[f]) or best[f] <= kept.get(ex.qid, neg):
      continue
    kept[ex.qid] = best[f]
    out[ex.qid] = ex.context[win.spans[f, bi[f], 0]:win.spans[f, bj[f], 1]].strip()
  return {ex.qid: out.get(ex.qid, "") for ex in examples}


class DevF1:
  """The periodic evaluation (vmx/evaluation/periodic.py's interface): MLQA F1 on the
  joint dev set of the evaluated languages (`dev/f1`, #M=1) and on each (`dev/<lang>`)."""

  def __init__(self, sets: Mapping[str, tuple], settings: QaSettings, batch_size: int = 128):
    self.sets, self.settings, self.batch_size = dict(sets), settings, batch_size

  def metric_names(self) -> list[str]:
    return ["dev/f1"] + [f"dev/{l}" for l in self.sets]

  def metric_prefixes(self) -> list[str]:
    return ["dev/"]

  def scores(self, model, params) -> dict:
    """{lang: {"f1", "exact_match", "n"}}."""
    out = {}
    for lang, (examples, win) in self.sets.items():
      start, end = span_logits(model, params, win.tokens, self.batch_size)
      out[lang] = squad.evaluate(examples, best_answers(start, end, win, examples,
                                                        self.settings), lang)
    return out

  def run(self, encoder) -> tuple[dict, str]:
    scores = self.scores(encoder.model, encoder.params)
    total = sum(r["n"] for r in scores.values())
    scalars = {f"dev/{l}": r["f1"] for l, r in scores.items()}
    scalars["dev/f1"] = sum(r["f1"] * r["n"] for r in scores.values()) / total
    return scalars, (f"dev F1 {scalars['dev/f1']:.2f} (" + ", ".join(
        f"{l} {r['f1']:.1f}" for l, r in scores.items()) + ")")


def prepare(bench: QaBenchmark, start: Start, *, data_dir, train_dir, train_languages, langs,
            max_length: int, batch_size: int, max_train_examples, seed: int,
            qa: Optional[QaSettings], dropout_rate: float, pooling: Optional[str]):
  """The fine-tuning `Task` of an extractive QA benchmark (vmx/finetune/run.py)."""
  qa = qa or QaSettings()
  qa.check()

  def read(split, lang, **kw):
    path = bench.path(data_dir, train_dir, split, lang)
    if not path.is_file():
      flag = bench.train_flag if split == "train" else bench.flag
      raise DataError(f"{flag}: no {path} ({bench.layout()})")
    return squad.read_squad(path, split == "train", **kw)

  tokenizer = start.tokenizer
  train_files, parts, cut = [], [], 0
  for lang in train_languages:
    win = windows(tokenizer, read("train", lang, limit=max_train_examples), max_length, qa,
                  iso3(lang), with_spans=False)
    parts.append(win)
    cut += win.questions_cut
    train_files.append(bench.path(data_dir, train_dir, "train", lang))
  arrays = {"tokens": np.concatenate([w.tokens for w in parts]),
            "start": np.concatenate([w.start for w in parts]),
            "end": np.concatenate([w.end for w in parts])}
  dev, tests = {}, {}
  for lang in langs:
    if bench.path(data_dir, train_dir, "dev", lang).is_file():
      ex = read("dev", lang)
      dev[lang] = (ex, windows(tokenizer, ex, max_length, qa, iso3(lang)))
    ex = read("test", lang)
    tests[lang] = (ex, windows(tokenizer, ex, max_length, qa, iso3(lang)))
  data = ArrayInput(f"finetune.{bench.name}", arrays, batch_size, digest({
      "benchmark": bench.name, "files": stamp(train_files), "languages": list(train_languages),
      "max_length": max_length, "limit": max_train_examples, "batch_size": batch_size,
      "seed": seed, "qa": dataclasses.asdict(qa), "vocabulary": Path(start.vocabulary).name}))
  model = SpanModel(SpanExtractor(start.module_encoder(dropout_rate), pooling or start.pooling))
  scorer, dev_scorer = DevF1(tests, qa), (DevF1(dev, qa) if dev else None)

  def score(params):
    test = scorer.scores(model, params)
    rows = [{"hf_subset": lang, "languages": [iso3(lang)], "main_score": r["f1"],
             "f1": r["f1"], "exact_match": r["exact_match"], "n": r["n"],
             "windows": int(len(tests[lang][1].tokens)),
             "zero_shot": lang not in train_languages} for lang, r in test.items()]
    dev_rows = [{"hf_subset": lang, **r} for lang, r in
                dev_scorer.scores(model, params).items()] if dev else []
    return rows, dev_rows

  return Task(model, data, len(arrays["tokens"]), dev_scorer, "dev/f1",
              ("f1", "exact_match"), score, {
                  "questions_truncated": cut, "n_train_questions": sum(
                      len(np.unique(w.example)) for w in parts),
                  "qa": dataclasses.asdict(qa)},
              "extractive QA with a span head (start / end logits over the tokens)")
