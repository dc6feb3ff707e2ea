"""Sentence embeddings from a trained vmx model, without TensorFlow.

  enc = Encoder.from_checkpoint("/path/to/model_dir")
  vecs = enc.encode(["Hello world", "Hallo Welt"], lang=["eng", "deu"])  # [2, D], rows L2-normalized

A model_dir holds `vmx_model.json` (model config, languages, max length),
`vocab.model` (SentencePiece) and orbax checkpoints `checkpoint_<step>/`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

import jax
import numpy as np

from vmx.data.vocab import Tokenizer
from vmx.models.base import model_from_config

MODEL_INFO_FILE = "vmx_model.json"
CHECKPOINT_PREFIX = "checkpoint"


def write_model_info(model_dir, model, languages: Sequence[str], max_length: int,
                     vocabulary: str = "vocab.model"):
  """Everything `Encoder.from_checkpoint` needs besides the parameters."""
  info = {"model": model.get_config(), "languages": list(languages),
          "max_length": int(max_length), "vocabulary": vocabulary}
  path = Path(model_dir) / MODEL_INFO_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(info, indent=1))
  tmp.replace(path)


def read_model_info(model_dir) -> dict:
  path = Path(model_dir) / MODEL_INFO_FILE
  if not path.exists():
    raise FileNotFoundError(f"{path}: not found; is {model_dir} a vmx model_dir?")
  return json.loads(path.read_text())


def restore_params(model_dir, model, step: Optional[int] = None, input_shapes=None):
  """Parameters of checkpoint `step` (default: latest) on the default device."""
  import orbax.checkpoint as ocp
  mngr = ocp.CheckpointManager(Path(model_dir).absolute(),
                               options=ocp.CheckpointManagerOptions(
                                   step_prefix=CHECKPOINT_PREFIX, read_only=True),
                               item_names=("params",))
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"{model_dir}: no {CHECKPOINT_PREFIX}_<step> directory")
  shapes = jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0),
                                                              input_shapes))["params"]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                        shapes)
  restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
  return restored["params"], step


class Encoder:
  """encode(list of str) -> L2-normalized float32 rows, in fixed-shape jitted batches."""

  def __init__(self, model, params, tokenizer: Tokenizer, languages: Sequence[str],
               max_length: int, batch_size: int = 128):
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.languages = list(languages)
    self.max_length = int(max_length)
    self.batch_size = batch_size
    self.name, self.revision = type(model).__name__, None   # set by from_checkpoint
    self._predict = jax.jit(lambda p, b: model.predict_batch(p, b))

  @classmethod
  def from_checkpoint(cls, model_dir, step: Optional[int] = None, batch_size: int = 128):
    info = read_model_info(model_dir)
    model = model_from_config(info["model"])
    L = info["max_length"]
    shapes = {"left_tokens": (1, L), "right_tokens": (1, L), "left_lang": (1,),
              "right_lang": (1,)}
    params, step = restore_params(model_dir, model, step, shapes)
    enc = cls(model, params, Tokenizer(str(Path(model_dir) / info["vocabulary"])),
              info["languages"], L, batch_size)
    enc.name, enc.revision = Path(model_dir).absolute().name, f"{CHECKPOINT_PREFIX}_{step}"
    return enc

  def _lang_ids(self, lang, n: int) -> np.ndarray:
    """Language ids for models that read them; others ignore `lang`."""
    if not self.model.uses_languages:
      return np.zeros((n,), np.int32)
    if lang is None:
      raise ValueError("this model reads language ids: pass lang= (one code, or one per "
                       f"sentence, of {', '.join(self.languages[:12])}…)")
    langs = [lang] * n if isinstance(lang, str) else list(lang)
    if len(langs) != n:
      raise ValueError(f"lang has {len(langs)} entries for {n} sentences")
    unknown = sorted(set(langs) - set(self.languages))
    if unknown:
      raise ValueError(f"languages {unknown} are not among the model's {len(self.languages)} "
                       f"languages ({', '.join(self.languages[:12])}…)")
    index = {l: i for i, l in enumerate(self.languages)}
    return np.array([index[l] for l in langs], np.int32)

  def encode(self, sentences: Sequence[str], lang: Union[None, str, Sequence[str]] = None,
             batch_size: Optional[int] = None, progress: Optional[bool] = None) -> np.ndarray:
    if isinstance(sentences, str):
      raise TypeError("encode() takes a list of sentences, not one string")
    sentences = list(sentences)
    bs = batch_size or self.batch_size
    lang_ids = self._lang_ids(lang, len(sentences))
    starts = range(0, len(sentences), bs)
    if progress is None:
      progress = len(sentences) > 20 * bs
    if progress:
      from tqdm.auto import tqdm
      starts = tqdm(starts, desc="encode", unit="batch")
    out = []
    for s in starts:
      chunk = sentences[s:s + bs]
      tokens = np.zeros((bs, self.max_length), np.int32)  # fixed shape: one compilation
      tokens[:len(chunk)] = self.tokenizer.encode(chunk, self.max_length)
      ids = np.zeros((bs,), np.int32)
      ids[:len(chunk)] = lang_ids[s:s + bs]
      emb = self._predict(self.params, {"left_tokens": tokens, "left_lang": ids})
      out.append(np.asarray(emb[:len(chunk)], np.float32))
    if not out:
      return np.zeros((0, 0), np.float32)
    return np.concatenate(out)
