"""Teacher embeddings for multilingual distillation, computed once and cached.

Reimers & Gurevych (2020) train a student to map both sides of a translation pair to the
teacher's embedding of the English side. The teacher (any vmx model directory: a vmx
run or an imported checkpoint such as all-MiniLM-L6-v2) embeds every distinct pivot
sentence of the training corpora once; the training pipeline then looks each pair's
pivot sentence up (`teacher` feature) instead of running the teacher every step.

Cache layout (a directory; `gs://` works):
  keys.npy         int64 [N], sorted: FarmHash fingerprints of the stripped sentences
                   (the same op as the pipeline's lookup, `text_fingerprints`)
  embeddings.npy   float32 [N, D], row i for keys[i]
  teacher.json     teacher directory and revision, D, N, the source files: written last,
                   so a cache without it is unfinished
  parts/           chunks written while embedding (a killed build resumes from them)

A teacher pass over every English sentence of a large corpus can take much of the budget
of the training it serves (all-MiniLM-L6-v2 on 2 CPU cores: ~350 short Tatoeba or ~100
news sentences a second). `max_sentences_per_file` embeds a uniform sample of each file
instead, and the training tasks then keep the pairs whose English side was embedded.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import warnings
from typing import Optional, Sequence

import gin
import numpy as np

from vmx import storage
from vmx.data import devsets, readers
from vmx.data.download import cache_dir
from vmx.errors import ConfigError, DataError

CHUNK = 4096


def text_fingerprints(texts) -> np.ndarray:
  """int64 fingerprints of texts (`vmx.data.tasks.text_fingerprint`, the pipeline's
  lookup key)."""
  import tensorflow as tf
  from vmx.data.tasks import text_fingerprint
  if not len(texts):
    return np.zeros([0], np.int64)
  return text_fingerprint(tf.constant(list(texts))).numpy()


def pivot_sentences(paths: Sequence[str], holdout: Optional[devsets.HeldOut] = None,
                    max_per_file: Optional[int] = None) -> tuple[list[str], int]:
  """(the distinct non-empty stripped lines of the pivot files minus held-out dev
  sentences, in first-seen order; how many files were capped). `max_per_file`: of a file
  with more distinct sentences, those with the smallest fingerprints (a uniform sample
  that does not depend on the file's order or on other files)."""
  seen, capped = {}, 0
  for p in paths:
    distinct = {}
    for _, line in readers.iter_lines(p):
      s = line.strip()
      if s and (holdout is None or holdout.keeps([s])):
        distinct.setdefault(s, None)
    chosen = list(distinct)
    if max_per_file is not None and len(chosen) > max_per_file:
      capped += 1
      keep = np.sort(np.argsort(text_fingerprints(chosen), kind="stable")[:max_per_file])
      chosen = [chosen[i] for i in keep]
    for s in chosen:
      seen.setdefault(s, None)
  return list(seen), capped


def _save_npy(path, array):
  buf = io.BytesIO()
  np.save(buf, array)
  storage.write_atomic(path, buf.getvalue())


def _load_npy(path):
  return np.load(io.BytesIO(storage.path(path).read_bytes()))


@gin.configurable(module="tasks")
def teacher_embeddings(teacher: str = gin.REQUIRED, corpora=gin.REQUIRED,
                       data_dir: Optional[str] = None, holdout: Sequence[str] = (),
                       output_dir: Optional[str] = None, batch_size: int = 256,
                       language: Optional[str] = None, progress: bool = True,
                       max_sentences_per_file: Optional[int] = None) -> str:
  """The cache directory of `teacher`'s embeddings of the pivot side of `corpora`
  ({corpus: languages}, as `tasks.parallel_corpora_mixture`); built if absent (with a
  progress bar; resumed from its parts if a build was killed). Default location: the
  data cache, keyed by the teacher's revision, the pivot files and the cap. `language`:
  the code a teacher that reads language ids knows the pivot language by.

  `max_sentences_per_file`: embed at most this many distinct sentences of each pivot
  file (`pivot_sentences`), for a teacher pass that fits a time budget. The cache is then
  partial (`partial`), and the training tasks keep only the pairs whose pivot sentence
  it holds (their mixing rates count those pairs)."""
  if max_sentences_per_file is not None and (
      isinstance(max_sentences_per_file, bool) or not isinstance(max_sentences_per_file, int)
      or max_sentences_per_file <= 0):
    raise ConfigError(f"tasks.teacher_embeddings.max_sentences_per_file="
                      f"{max_sentences_per_file!r}: expected a positive integer or None")
  from tasks.parallel import corpus_files     # tasks imports seqio: the training path only
  from vmx.inference import Encoder
  paths = sorted({piv for c, langs in corpora.items()
                  for _, _, piv in corpus_files(c, langs, data_dir)})
  h = devsets.HeldOut(holdout, data_dir, where="tasks.teacher_embeddings.holdout") \
      if holdout else None
  try:
    enc = Encoder.from_checkpoint(teacher, batch_size=batch_size)
  except (OSError, ValueError) as e:
    raise ConfigError(f"tasks.teacher_embeddings.teacher={teacher!r}: {e}") from None
  stamp = hashlib.sha256("|".join([str(teacher), str(enc.revision), *paths,
                                   *(h.names if h else []),
                                   *([f"max{max_sentences_per_file}"]
                                     if max_sentences_per_file else [])]
                                  ).encode()).hexdigest()[:16]
  out = storage.path(output_dir) if output_dir else (
      storage.path(cache_dir().parent) / "teacher" / stamp)
  if (out / "teacher.json").exists():
    info = json.loads((out / "teacher.json").read_text())
    if info.get("stamp") != stamp:
      raise DataError(f"{out}: a teacher cache of {info.get('teacher')} "
                      f"({info.get('revision')}) for other files; remove it or set another "
                      f"output_dir")
    return str(out)
  sentences, capped = pivot_sentences(paths, h, max_sentences_per_file)
  if not sentences:
    raise DataError(f"no pivot sentences to embed in {paths[:3]}")
  (out / "parts").mkdir(parents=True, exist_ok=True)
  n_parts = (len(sentences) + CHUNK - 1) // CHUNK
  print(f"[vmx] teacher {teacher}: embedding {len(sentences)} sentences -> {out}"
        + (f" (at most {max_sentences_per_file} per file: {capped} of {len(paths)} files "
           f"capped; their other pairs are left out of training)" if capped else ""),
        flush=True)
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(sentences), desc="teacher", unit="sent")
  parts, truncated = [], 0
  for i in range(n_parts):
    part = out / "parts" / f"part_{i:05d}_of_{n_parts:05d}.npy"
    chunk = sentences[i * CHUNK:(i + 1) * CHUNK]
    if part.exists():
      emb = _load_npy(part)
    else:
      # (a non-finite embedding raises NonFiniteError in the encoder, naming the sentence)
      emb, cut = enc.encode_counting(chunk, lang=language, progress=False)
      truncated += cut
      _save_npy(part, emb)
    parts.append(emb)
    if bar is not None:
      bar.update(len(chunk))
  if bar is not None:
    bar.close()
  if truncated:
    warnings.warn(f"teacher {teacher}: {truncated} of {len(sentences)} sentences are longer "
                  f"than its max_length={enc.max_length} tokens and were truncated",
                  stacklevel=2)
  emb = np.concatenate(parts)
  keys = text_fingerprints(sentences)
  order = np.argsort(keys, kind="stable")
  keys, emb = keys[order], emb[order]
  if np.any(keys[1:] == keys[:-1]):
    raise DataError("two distinct pivot sentences share a 62-bit fingerprint")
  _save_npy(out / "keys.npy", keys)
  _save_npy(out / "embeddings.npy", emb)
  storage.write_atomic(out / "teacher.json", json.dumps(
      {"teacher": str(teacher), "revision": enc.revision, "dim": int(emb.shape[1]),
       "sentences": len(sentences), "files": paths, "stamp": stamp,
       "max_sentences_per_file": max_sentences_per_file, "complete": not capped}, indent=1))
  return str(out)


@functools.lru_cache(maxsize=4)
def load(cache: str) -> tuple[np.ndarray, np.ndarray]:
  """(keys [N] sorted, embeddings [N, D]) of a finished cache (read once per process)."""
  d = storage.path(cache)
  if not (d / "teacher.json").exists():
    raise DataError(f"{cache}: not a finished teacher cache (no teacher.json); "
                    f"build it with tasks.teacher_embeddings")
  return _load_npy(d / "keys.npy"), _load_npy(d / "embeddings.npy")


def info(cache: str) -> dict:
  """teacher.json of a finished cache."""
  return json.loads((storage.path(cache) / "teacher.json").read_text())


def dim(cache: str) -> int:
  return int(info(cache)["dim"])


def partial(cache: str) -> bool:
  """Whether the cache left some pivot sentences out (`max_sentences_per_file`)."""
  return not info(cache).get("complete", True)


def lookup(cache: str, keys_B: np.ndarray, where: str = "") -> np.ndarray:
  """Teacher embeddings [B, D] of the sentences with fingerprints `keys_B`; a sentence
  missing from the cache is an error (the cache was built for other files)."""
  keys, emb = load(cache)
  idx = np.minimum(np.searchsorted(keys, keys_B), len(keys) - 1)
  bad = keys[idx] != keys_B
  if np.any(bad):
    raise DataError(f"{where}teacher cache {cache} has no embedding for "
                    f"{int(bad.sum())} pivot sentence(s): it was built for other files; "
                    f"rebuild it (tasks.teacher_embeddings)")
  return emb[idx]
