"""vmx encoders in MTEB (v2: `mteb.evaluate(model, tasks)`), with their model metadata.

  import mteb
  from vmx.inference import Encoder
  from vmx.mteb_compat import MTEBEncoder
  model = MTEBEncoder(Encoder.from_checkpoint("/tmp/vmx/contrastive_tiny"))
  mteb.evaluate(model, mteb.get_tasks(tasks=["Tatoeba"], languages=["deu"]))

MTEB 2 hands an encoder a DataLoader of text batches plus the task's metadata, where
sentence-transformers and MTEB 1 passed a list of strings; `MTEBEncoder` is that adapter.
The metadata (`mteb_model_meta`) names the model `vmx/<model_dir name>` at its checkpoint
(revision `checkpoint_<step>`), so MTEB's result files of two checkpoints do not mix.
`mteb` is an optional dependency (in the test extra), imported only here.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

from vmx.errors import InputError

try:
  from mteb.models.abs_encoder import AbsEncoder
except ImportError as e:   # pragma: no cover  (mteb is optional)
  raise ImportError("vmx.mteb_compat needs mteb >= 2: pip install mteb") from e


def model_meta(encoder, name: Optional[str] = None, revision: Optional[str] = None):
  """MTEB's ModelMeta of a vmx Encoder (name, revision, size, dimension, max tokens,
  cosine similarity, JAX)."""
  from mteb.models.model_meta import ModelMeta, ScoringFunction  # lazy: mteb (optional)
  n_params = int(sum(np.size(x) for x in jax.tree.leaves(encoder.params)))
  return ModelMeta(
      loader=None, name=name or f"vmx/{encoder.name}",
      revision=revision or encoder.revision, release_date=None, languages=None,
      n_parameters=n_params, memory_usage_mb=None, max_tokens=encoder.max_length,
      embed_dim=encoder.get_sentence_embedding_dimension(), license=None,
      open_weights=True, public_training_code=None, public_training_data=None,
      framework=["JAX"], similarity_fn_name=ScoringFunction.COSINE, use_instructions=False,
      training_datasets=None)


class MTEBEncoder(AbsEncoder):
  """A vmx `Encoder` as an MTEB 2 model: `encode` reads MTEB's DataLoader of batches
  (their "text" column), gives float32 unit rows; prompts are taken from
  `encoder.prompts` by task name and prompt type, as sentence-transformers does (vmx
  models are trained without prompts: none by default)."""

  def __init__(self, encoder, name: Optional[str] = None, revision: Optional[str] = None,
               batch_size: Optional[int] = None):
    self.model = encoder
    self.batch_size = batch_size
    self.model_prompts = dict(encoder.prompts) or None
    self.mteb_model_meta = model_meta(encoder, name, revision)

  def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str,
             prompt_type=None, **kwargs: Any) -> np.ndarray:
    del hf_split, hf_subset
    if self.model.model.uses_languages:
      raise InputError(f"{self.mteb_model_meta.name} reads language ids, which MTEB does not "
                       "pass; evaluate it with vmx.evaluation (lang= per sentence)")
    texts = []
    for batch in inputs:
      if "text" not in batch:
        raise InputError(f"MTEB task {task_metadata.name}: batches without a 'text' column "
                         f"({sorted(batch)}); vmx encoders embed text only")
      texts.extend(batch["text"])
    if not texts:
      return np.zeros((0, self.model.get_sentence_embedding_dimension()), np.float32)
    prompt = self.get_prompt(task_metadata, prompt_type)
    return self.model.encode(texts, batch_size=self.batch_size or kwargs.get("batch_size"),
                             prompt=self.model.prompts.get(prompt) if prompt else None,
                             show_progress_bar=False)
