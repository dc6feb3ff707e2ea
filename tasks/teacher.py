"""The teacher pass of multilingual distillation: `tasks.teacher_embeddings` embeds the
pivot sentences of the training corpora with a teacher model once and writes the cache
that the training tasks read (vmx/data/teacher.py: its layout and the lookup).

Reimers & Gurevych (2020), §3: the student learns to map both sides of a translation pair
to the teacher's vector of the English side. A teacher pass over every English sentence
of a large corpus can take much of the budget of the training it serves
(all-MiniLM-L6-v2 on 2 CPU cores: ~350 short Tatoeba or ~100 news sentences a second);
`max_sentences_per_file` embeds a uniform sample of each file instead.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from typing import Optional, Sequence

import gin
import numpy as np
from tqdm.auto import tqdm

from vmx import storage
from vmx.data import devsets, readers
from vmx.data.teacher import load_npy, save_npy, text_fingerprints
from vmx.errors import ConfigError, DataError
from vmx.inference import Encoder
from vmx.storage import cache_dir
from tasks.parallel import corpus_files

CHUNK = 4096


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
    bar = tqdm(total=len(sentences), desc="teacher", unit="sent")
  parts, truncated = [], 0
  for i in range(n_parts):
    part = out / "parts" / f"part_{i:05d}_of_{n_parts:05d}.npy"
    chunk = sentences[i * CHUNK:(i + 1) * CHUNK]
    if part.exists():
      emb = load_npy(part)
    else:
      # (a non-finite embedding raises NonFiniteError in the encoder, naming the sentence)
      emb, cut = enc.encode_counting(chunk, lang=language, progress=False)
      truncated += cut
      save_npy(part, emb)
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
  save_npy(out / "keys.npy", keys)
  save_npy(out / "embeddings.npy", emb)
  storage.write_atomic(out / "teacher.json", json.dumps(
      {"teacher": str(teacher), "revision": enc.revision, "dim": int(emb.shape[1]),
       "sentences": len(sentences), "files": paths, "stamp": stamp,
       "max_sentences_per_file": max_sentences_per_file, "complete": not capped}, indent=1))
  return str(out)
