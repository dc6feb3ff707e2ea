"""What a fine-tuning run starts from (`Start`: the source model's sentence encoder and
tokenizer) and what each kind of benchmark hands the shared run (`Task`): sentence-pair
classification (vmx/finetune/run.py `pairs_task`), extractive QA (vmx/finetune/qa.py)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vmx import storage
from vmx.data.vocab import load_tokenizer
from vmx.errors import ConfigError
from vmx.finetune.data import ArrayInput
from vmx.models.base import model_from_config
from vmx.modeldir.layout import read_model_info


def source_encoder(model):
  """(TransformerEncoder, where its parameters are, where its token table is (None: in
  the encoder), its pooling) of a vmx model's sentence encoder: `encoder/` (dual
  encoders, MPCL, InfoXLM, EMMA-X, imported checkpoints), EMS's `sentence_encoder/` and
  VMSST's `semantic_encoder/` (both with the shared `token_embed/`)."""
  try:
    v = model.sentence_vector()
  except ConfigError:
    raise ConfigError(f"fine-tuning starts from a model with a sentence encoder; "
                      f"{type(model).__name__} has none") from None
  return v.encoder, v.params, v.token_table, v.pooling


@dataclasses.dataclass(frozen=True)
class Start:
  """The starting point: the source model's sentence encoder (`source_encoder`), where its
  parameters are, its pooling, the vocabulary file and its tokenizer."""
  encoder: object
  prefix: str
  table: Optional[str]
  pooling: str
  vocabulary: str
  tokenizer: object

  def module_encoder(self, dropout_rate: float):
    """The encoder as a fine-tuned module's own (its dropout, no shared tables)."""
    return self.encoder.clone(parent=None, dropout_rate=dropout_rate,
                              attention_dropout_rate=dropout_rate, shared_embedding=None,
                              output_layer=None)

  def rules(self) -> list:
    """The initial-checkpoint assignment: the module's `encoder/` from the source's."""
    return ([(r"encoder/token_embed/(.*)", rf"{self.table}/\1")] if self.table else []) + [
        (r"encoder/(.*)", rf"{self.prefix}/\1")]


def open_start(initial_checkpoint_path: str, max_length: int) -> Start:
  info = read_model_info(initial_checkpoint_path)
  enc, prefix, table, pooling = source_encoder(model_from_config(info["model"]))
  if enc.num_languages:
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH={initial_checkpoint_path}: its encoder reads "
                      f"language ids, which fine-tuning does not give")
  if max_length > enc.max_length:
    raise ConfigError(f"finetune.max_length={max_length}: the encoder's positions end at "
                      f"{enc.max_length}")
  vocabulary = str(storage.path(initial_checkpoint_path) / info["vocabulary"])
  return Start(enc, prefix, table, pooling, vocabulary, load_tokenizer(vocabulary))


@dataclasses.dataclass
class Task:
  """What one kind of benchmark hands the shared run: the `model`, its training rows
  (`data`, `rows` of them), the dev evaluator (None: no dev files) and the metric it
  selects by, the test metrics (`metrics`, the first the main one), `score(params) ->
  (test rows, dev rows)`, facts for the results (`extra`) and what was trained (`head`)."""
  model: object
  data: ArrayInput
  rows: int
  evaluator: Optional[object]
  select_by: str
  metrics: tuple
  score: Callable
  extra: dict
  head: str


def in_batches(fn, params, tokens_NxL: np.ndarray, batch_size: int):
  """`fn(params, tokens)` (jitted, any tree of [B, ...] outputs) over rows in batches of
  `batch_size`, the last one padded (one compilation), concatenated on the host."""
  out = []
  for i in range(0, len(tokens_NxL), batch_size):
    chunk = tokens_NxL[i:i + batch_size]
    pad = batch_size - len(chunk)
    if pad:
      chunk = np.concatenate([chunk, np.ones((pad, chunk.shape[1]), chunk.dtype)])
    out.append(jax.tree.map(lambda x: np.asarray(x)[:batch_size - pad],
                            fn(params, jnp.asarray(chunk))))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *out)
