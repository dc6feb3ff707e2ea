"""Teacher embeddings for multilingual distillation, computed once and cached: the read
side (the pipeline's lookup). The cache is built by `tasks.teacher_embeddings`
(tasks/teacher.py), which runs the teacher.

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
import io
import json

import numpy as np
from etils import epy

with epy.lazy_imports():   # TensorFlow: only where texts are fingerprinted
  import tensorflow as tf

from vmx import storage
from vmx.errors import DataError


def text_fingerprint(text: tf.Tensor) -> tf.Tensor:
  """int64 FarmHash fingerprint (2^62 buckets) of stripped text: how held-out dev sentences
  and cached teacher embeddings are found (a TensorFlow op: the pipeline's lookup key)."""
  return tf.strings.to_hash_bucket_fast(tf.strings.strip(text), 1 << 62)


def text_fingerprints(texts) -> np.ndarray:
  """int64 fingerprints of texts (`text_fingerprint`, the pipeline's lookup key)."""
  if not len(texts):
    return np.zeros([0], np.int64)
  return text_fingerprint(tf.constant(list(texts))).numpy()


def save_npy(path, array):
  buf = io.BytesIO()
  np.save(buf, array)
  storage.write_atomic(path, buf.getvalue())


def load_npy(path):
  return np.load(io.BytesIO(storage.path(path).read_bytes()))


@functools.lru_cache(maxsize=4)
def load(cache: str) -> tuple[np.ndarray, np.ndarray]:
  """(keys [N] sorted, embeddings [N, D]) of a finished cache (read once per process)."""
  d = storage.path(cache)
  if not (d / "teacher.json").exists():
    raise DataError(f"{cache}: not a finished teacher cache (no teacher.json); "
                    f"build it with tasks.teacher_embeddings (tasks/teacher.py)")
  return load_npy(d / "keys.npy"), load_npy(d / "embeddings.npy")


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
