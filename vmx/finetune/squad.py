"""SQuAD v1.1-format question answering files and MLQA's official F1 / exact match.

`read_squad` reads one SQuAD-format JSON file (SQuAD v1.1's train / dev files, MLQA's
`dev-context-<l>-question-<l>.json` and `test-...` files, XTREME's translate-train files):
{"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}]}]}]}]}. In a training file each question's first answer must lie at its
`answer_start` (`context[start:start + len(text)] == text`): one that does not is an error
naming the file, the question id and both strings (the training target would be wrong;
the official scripts skip such questions silently, vmx does not guess). Evaluation files
are scored on the answers' texts only, as the official scripts do.

`evaluate(examples, predictions, lang)` is MLQA's `mlqa_evaluation_v1.py` (Lewis et al.
2020), which XTREME and InfoXLM Table 4 use: each prediction's best F1 and exact match over
the question's answers after `normalize_answer(s, lang)`: lowercase, drop every Unicode
punctuation character, drop the language's articles (en, es, de, vi; Arabic's "ال"), then
split on whitespace (Chinese: every CJK character and punctuation mark its own token).
An unanswered question scores 0. SQuAD v1.1's English script is the same with ASCII
punctuation only.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import re
import string
import sys
import unicodedata
from pathlib import Path
from typing import Mapping, Optional, Sequence

from vmx.errors import DataError

MLQA_LANGUAGES = ("en", "es", "de", "ar", "hi", "vi", "zh")


@dataclasses.dataclass(frozen=True)
class QaExample:
  """One question on its passage; `answers` the gold texts, `start` the first answer's
  character offset in `context` (-1 in evaluation files, where offsets are not used)."""
  qid: str
  question: str
  context: str
  answers: tuple
  start: int = -1


def read_squad(path, train: bool, limit: Optional[int] = None) -> list[QaExample]:
  """The questions of one SQuAD-format file (module docstring); `limit`: the first that
  many. A missing file, bad JSON or a misplaced training answer is a DataError naming it."""
  path = Path(str(path))
  try:
    data = json.loads(path.read_bytes().decode("utf-8").lstrip("\ufeff"))["data"]
  except FileNotFoundError:
    raise DataError(f"{path}: no such file") from None
  except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{path}: not a SQuAD-format JSON file ({type(e).__name__}: "
                    f"{str(e)[:120]}); expected {{\"data\": [{{\"paragraphs\": [...]}}]}}"
                    ) from None
  out = []
  try:
    for article in data:
      for para in article["paragraphs"]:
        context = para["context"]
        for qa in para["qas"]:
          answers = tuple(a["text"] for a in qa["answers"])
          start = -1
          if train:
            if not answers:
              raise DataError(f"{path}: question {qa['id']} has no answer (a training "
                              f"question needs one)")
            first = qa["answers"][0]
            start = int(first["answer_start"])
            found = context[start:start + len(first["text"])]
            if found != first["text"]:
              raise DataError(f"{path}: question {qa['id']}: answer_start {start} gives "
                              f"{found!r}, not its answer {first['text']!r}")
          out.append(QaExample(str(qa["id"]), qa["question"], context, answers, start))
          if limit and len(out) == limit:
            return out
  except DataError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f"{path}: not a SQuAD-format JSON file (question {len(out) + 1}: "
                    f"{type(e).__name__}: {str(e)[:120]})") from None
  if not out:
    raise DataError(f"{path}: no question")
  return out


# -- MLQA's official metric ---------------------------------------------------------------

PUNCT = frozenset(chr(i) for i in range(sys.maxunicode)
                  if unicodedata.category(chr(i)).startswith("P")) | set(string.punctuation)
_ARTICLES = {
    "en": r"\b(a|an|the)\b",
    "es": r"\b(un|una|unos|unas|el|la|los|las)\b",
    "vi": r"\b(của|là|cái|chiếc|những)\b",
    "de": r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b",
    "ar": "\\sال^|ال",       # as the official script writes it: every "ال" goes
}
_CJK = re.compile("[\u4e00-\u9fa5]")


def _mixed_segmentation(text: str) -> list[str]:
  """Chinese: each CJK character and punctuation mark is a token, the rest split on
  whitespace."""
  out, run = [], ""
  for ch in text:
    if _CJK.match(ch) or ch in PUNCT:
      out += run.split()
      run = ""
      out.append(ch)
    else:
      run += ch
  return out + run.split()


def normalize_answer(s: str, lang: str) -> str:
  """MLQA's normalization of an answer in `lang` (one of MLQA_LANGUAGES)."""
  if lang not in MLQA_LANGUAGES:
    raise ValueError(f"MLQA's answer normalization knows {list(MLQA_LANGUAGES)}, not {lang!r}")
  s = "".join(ch for ch in s.lower() if ch not in PUNCT)
  if lang in _ARTICLES:
    s = re.sub(_ARTICLES[lang], " ", s)
  tokens = _mixed_segmentation(s) if lang == "zh" else s.split()
  return " ".join(t for t in tokens if t.strip())


def f1_score(prediction: str, truth: str, lang: str) -> float:
  pred, gold = normalize_answer(prediction, lang).split(), normalize_answer(truth, lang).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, truth: str, lang: str) -> float:
  return float(normalize_answer(prediction, lang) == normalize_answer(truth, lang))


def evaluate(examples: Sequence[QaExample], predictions: Mapping[str, str],
             lang: str) -> dict:
  """{"exact_match", "f1"} x100 over `examples` (an unanswered one scores 0), and "n"."""
  em = f1 = 0.0
  for ex in examples:
    if ex.qid not in predictions or not ex.answers:
      continue
    p = predictions[ex.qid]
    em += max(exact_match_score(p, a, lang) for a in ex.answers)
    f1 += max(f1_score(p, a, lang) for a in ex.answers)
  n = len(examples)
  return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n, "n": n}
