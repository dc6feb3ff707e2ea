"""A static encoder distilled from any vmx model directory, Model2Vec's way (Tulkens & van
Dongen 2024): each vocabulary entry's vector is the teacher's sentence vector of that token
alone, the table is reduced by PCA, and each row is weighted by how rare its token is.

- **Token vectors.** Every id of the teacher's vocabulary except padding is encoded alone
  (`model.embed` of a one-token row; an imported tokenizer's special tokens around it, as
  the teacher reads any sentence), in batches: one forward pass per token.
- **PCA** to `dim` dimensions (centred, by SVD), or none when `dim` is the teacher's.
- **Frequency weights**, SIF's a / (a + p(t)) (Arora et al. 2017) with a = `sif` and p(t)
  the token's probability: a vmx SentencePiece vocabulary stores each piece's unigram
  log-probability, which is used; an imported tokenizer has none, so p follows Zipf's law
  from the id's rank (Model2Vec's assumption: ids in frequency order).
- The result is a vmx model directory (`StaticEncoder`, weights folded into the rows, the
  teacher's vocabulary): `Encoder.from_checkpoint`, `launch/eval.py`, `static_1h.gin` as
  INITIAL_CHECKPOINT_PATH (fine-tuning it with the recipe) and the sentence-transformers
  export all take it.
"""
from __future__ import annotations

import json
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vmx import storage
from vmx.errors import CheckpointError, ConfigError
from vmx.inference import Encoder
from vmx.models import DualEncoder, DualEncoderModel
from vmx.modeldir import checkpoints, layout
from vmx.static_encoder import StaticEncoder, probabilities


def token_rows(tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(the ids distilled [V'], one row per id [V', W]: the id alone, inside the tokenizer's
  special tokens)."""
  ids = np.arange(1, tokenizer.vocab_size, dtype=np.int32)     # 0 is padding in vmx ids
  if hasattr(tokenizer, "hf_ids"):       # an imported tokenizer: its specials around the id
    around = [int(i) for i in tokenizer.to_vmx_ids(tokenizer.hf_ids([""])[0])]
    specials = set(around)
    ids = np.asarray([i for i in ids if i not in specials], np.int32)
    open_, close = around[:1], around[1:]
    if tokenizer.kind == "t5_spm":      # mT5: no opening token, </s> closes
      open_, close = [], around
    return ids, np.asarray([open_ + [int(i)] + close for i in ids], np.int32)
  return ids, ids[:, None]


def distill(teacher_dir, output_dir, dim: Optional[int] = 256, sif: float = 1e-4,
            batch_size: int = 1024, step=None) -> dict:
  """Writes the static model directory `output_dir` (must not hold a run); returns a
  summary (module docstring)."""
  out = storage.path(output_dir)
  if out.exists() and any(out.iterdir()):
    raise ConfigError(f"--output_dir={output_dir} exists and is not empty")
  teacher = Encoder.from_checkpoint(teacher_dir, step)
  model, tok = teacher.model, teacher.tokenizer
  if model.uses_languages:
    raise ConfigError(f"{teacher_dir}: the teacher reads language ids, and a static table "
                      f"has one vector per token whatever the language")
  ids, rows = token_rows(tok)
  fn = jax.jit(lambda p, t: model.embed(p, t))
  vecs = []
  for i in range(0, len(rows), batch_size):
    chunk = rows[i:i + batch_size]
    pad = batch_size - len(chunk)
    if pad:
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)])
    vecs.append(np.asarray(fn(teacher.params, jnp.asarray(chunk)), np.float32)[
        :batch_size - pad])
  table = np.concatenate(vecs)                                   # [V', D]
  if not np.isfinite(table).all():
    raise CheckpointError(f"{teacher_dir}: the teacher gives non-finite token vectors")
  width = table.shape[1]
  dim = width if dim is None else int(dim)
  if not 0 < dim <= width:
    raise ConfigError(f"--dim={dim}: between 1 and the teacher's {width} dimensions")
  centred = table - table.mean(0)          # PCA (at the full width: a rotation, centred)
  _, s, vt = np.linalg.svd(centred, full_matrices=False)
  table = centred @ vt[:dim].T
  explained = float((s[:dim] ** 2).sum() / (s ** 2).sum())
  p, source = probabilities(tok, ids)
  table = table * (sif / (sif + p))[:, None]
  full = np.zeros((tok.vocab_size, dim), np.float32)
  full[ids] = table
  student = DualEncoderModel(DualEncoder(StaticEncoder(tok.vocab_size, dim,
                                                       teacher.max_length, "none")))
  checkpoints.save_params(str(out), 0, {"encoder": {"token_embed": {"embedding": full}}})
  layout.write_inference_files(str(out), student, teacher.languages, teacher.max_length,
                               tok.model_path)
  summary = {"teacher": str(teacher_dir), "teacher_revision": teacher.revision,
             "tokens": int(len(ids)), "teacher_dim": width, "dim": dim,
             "pca_explained_variance": round(explained, 4), "sif": sif,
             "probabilities": source, "output_dir": str(output_dir)}
  storage.write_atomic(out / "distilled_from.json", json.dumps(summary, indent=1))
  return summary
