"""What every evaluation task shares: the encoder interface, data files, languages.

An encoder is anything with `encode(list_of_str) -> [n, d] array` (optionally
taking `lang=` a language code, as vmx's `Encoder` does), or a plain callable
`f(sentences, lang) -> array`. Tasks see it as `EncodeFn(sentences, lang)` with
ISO 639-3 language codes (the codes vmx models are trained with).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from vmx.data import download, readers
from vmx.errors import DataError
from vmx.inference import Encoder

EncodeFn = Callable[[list, str], np.ndarray]


def as_encode_fn(encoder, progress: Optional[bool] = None) -> EncodeFn:
  """Adapt an encoder object or callable to `EncodeFn(sentences, lang)`.

  vmx's `Encoder` is one already (`encode(sentences, lang)` gives [n, D] float32): its
  bound method is handed to the tasks as it is, with `progress` when given. Any other
  object is wrapped: `lang` passed as its encode() takes it, `progress` where it takes
  that, the output checked to be [n, d].
  """
  if isinstance(encoder, Encoder):
    return (encoder.encode if progress is None
            else functools.partial(encoder.encode, progress=progress))
  enc = getattr(encoder, "encode", None)
  if enc is None:
    if not callable(encoder):
      raise TypeError(f"{type(encoder).__name__}: need an object with encode(list_of_str) "
                      f"or a callable f(sentences, lang)")
    fn, takes_lang = encoder, _takes(encoder, 2)
  else:
    fn, takes_lang = enc, _accepts_lang(enc)

  extra = {}
  if progress is not None and enc is not None:
    try:
      if "progress" in inspect.signature(enc).parameters:
        extra["progress"] = progress
    except (TypeError, ValueError):
      pass

  def encode(sentences, lang):
    out = fn(list(sentences), lang=lang, **extra) if takes_lang == "kw" else (
        fn(list(sentences), lang, **extra) if takes_lang == "pos" else fn(list(sentences), **extra))
    out = np.asarray(out, np.float32)
    if out.ndim != 2 or out.shape[0] != len(sentences):
      raise ValueError(f"encoder returned shape {out.shape} for {len(sentences)} sentences; "
                       f"expected [n, d]")
    return out
  return encode


def _accepts_lang(fn):
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return None
  if "lang" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return "kw"
  return None


def _takes(fn, n):
  if _accepts_lang(fn):
    return "kw"
  try:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    return None
  return "pos" if len(params) >= n else None


def model_name(encoder) -> str:
  for attr in ("name", "model_name", "name_or_path"):
    v = getattr(encoder, attr, None)
    if isinstance(v, str) and v:
      return v
  return type(encoder).__name__


class DataFiles:
  """Resolves a task's input files and remembers them (for the data revision).

  Registry-relative paths (`eval/...`) come from the data dir or the download
  cache; absolute paths are used as they are. Missing files raise DataError
  naming the file and the task.
  """

  def __init__(self, task: str, data_dir: Optional[str] = None):
    self.task, self.data_dir = task, data_dir
    self.used: dict[str, Path] = {}

  def exists(self, rel: str) -> bool:
    if Path(rel).is_absolute():
      return Path(rel).exists()
    return download.available(rel, self.data_dir)

  def path(self, rel: str) -> Path:
    try:
      if Path(rel).is_absolute():
        p = Path(rel)
        if not p.exists():
          raise DataError(f"{p}: no such file")
      else:
        p = download.resolve(rel, self.data_dir)
    except DataError as e:
      raise DataError(f"task {self.task}: {e}") from None
    self.used[str(rel)] = p
    return p

  def revision(self) -> str:
    """sha256 over the used files' names and contents."""
    h = hashlib.sha256()
    for rel in sorted(self.used):
      h.update(f"{Path(rel).name}\t{download.sha256sum(self.used[rel])}\n".encode())
    return h.hexdigest()[:16]


def read_lines(path, task: str = "") -> list[str]:
  """Lines of a (possibly .gz) UTF-8 text file, without newlines; errors name file:line."""
  try:
    return [line for _, line in readers.iter_lines(path)]
  except DataError as e:
    raise DataError(f"task {task}: {e}" if task else str(e)) from None


def progress_iter(it: Iterable, desc: str, enabled: bool, total: Optional[int] = None):
  if not enabled:
    return it
  return tqdm(it, desc=desc, total=total, leave=False)


def mean(values: Sequence[float]) -> float:
  return float(np.mean(values)) if len(values) else float("nan")
