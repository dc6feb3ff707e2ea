"""A Hugging Face masked-LM checkpoint's output head, as vmx's `masked_lm.MlmHead`.

XLM-R's and RoBERTa's `lm_head` (dense, LayerNorm, output bias; the output projection
tied to the word embeddings) and BERT's `cls.predictions` (transform.dense,
transform.LayerNorm, bias; tied likewise) become the parameters `dense/kernel`,
`dense/bias`, `layer_norm/scale`, `layer_norm/bias` and `bias` of `MlmHead`.
hf_import.import_checkpoint saves them as their own checkpoint in `mlm_head/`
(layout.PRETRAINED_MLM_HEAD_DIR), and a run started from the directory
(INITIAL_CHECKPOINT_PATH, vmx/training/initial_checkpoint.py) reads them under
`mlm_head/...`, the names InfoXLM's head has: InfoXLM §4.1 initializes its model, head
included, with XLM-R. Models without such a head list them as ignored.
"""
from __future__ import annotations

import numpy as np

from vmx.errors import CheckpointError

# class prefix -> (dense, layer norm, output bias, tied output projection)
HEADS = {
    "lm_head.": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias",
                 "lm_head.decoder.weight"),
    "cls.predictions.": ("cls.predictions.transform.dense",
                         "cls.predictions.transform.LayerNorm", "cls.predictions.bias",
                         "cls.predictions.decoder.weight"),
}


def convert_mlm_head(tensors: dict, word_embeddings_VxD: np.ndarray, pad_id: int,
                     where: str) -> tuple[dict, list[str]]:
  """({MlmHead path: float32 array}, the tensors used), or ({}, []) for a checkpoint
  without a masked-LM head. `tensors` as hf_weights.normalize_names leaves them (old
  LayerNorm gamma/beta names mapped). `word_embeddings_VxD` is the checkpoint's own table (in its
  ids); `pad_id` the padding id vmx swaps with id 0 (hf_weights.convert), which the output
  bias follows. A head whose width or vocabulary is not the encoder's, or an output
  projection not tied to the word embeddings, is one CheckpointError naming the shapes."""
  for dense, norm, bias_name, tied in HEADS.values():
    kernel = tensors.get(f"{dense}.weight")
    if kernel is None:
      continue
    dense_bias = tensors.get(f"{dense}.bias")
    scale, shift = tensors.get(f"{norm}.weight"), tensors.get(f"{norm}.bias")
    bias = tensors.get(bias_name, tensors.get(tied.replace(".weight", ".bias")))
    missing = [n for n, a in ((f"{dense}.bias", dense_bias), (f"{norm}.weight", scale),
                              (f"{norm}.bias", shift), (bias_name, bias)) if a is None]
    if missing:
      raise CheckpointError(f"{where}: the masked-LM head lacks {', '.join(missing)}")
    v, d = word_embeddings_VxD.shape
    if kernel.shape != (d, d) or bias.shape != (v,) or scale.shape != (d,):
      raise CheckpointError(
          f"{where}: the masked-LM head does not match the encoder: {dense}.weight "
          f"{tuple(kernel.shape)} and {bias_name} {tuple(bias.shape)} against the word "
          f"embeddings' {tuple(word_embeddings_VxD.shape)} (vocabulary x width)")
    out_proj = tensors.get(tied)
    if out_proj is not None and (out_proj.shape != word_embeddings_VxD.shape or not
                                 np.array_equal(out_proj, word_embeddings_VxD)):
      raise CheckpointError(
          f"{where}: {tied} {tuple(out_proj.shape)} is not the word embeddings "
          f"{tuple(word_embeddings_VxD.shape)}: vmx's MLM head reads its logits from the "
          f"token table (tied), and an untied output projection has no place in it")
    bias = np.asarray(bias, np.float32).copy()
    if pad_id:
      bias[[0, pad_id]] = bias[[pad_id, 0]]
    used = [n for n in tensors if n.startswith((dense, norm, bias_name, tied[:-len("weight")]))]
    return ({"dense/kernel": np.asarray(kernel, np.float32).T,
             "dense/bias": np.asarray(dense_bias, np.float32),
             "layer_norm/scale": np.asarray(scale, np.float32),
             "layer_norm/bias": np.asarray(shift, np.float32),
             "bias": bias}, sorted(used))
  return {}, []
