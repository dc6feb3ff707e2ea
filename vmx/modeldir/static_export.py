"""A static encoder's model directory -> a sentence-transformers folder whose first module
is `StaticEmbedding` (its table and a `tokenizers` tokenizer), then `Normalize`; or
(`export_model2vec`) the plain Hugging Face layout static models are published in, Model2Vec's
(`config.json`, `model.safetensors` with one `embeddings` tensor, `tokenizer.json`), which
`model2vec.StaticModel.from_pretrained` and sentence-transformers'
`StaticEmbedding.from_model2vec` read.

`StaticEmbedding` takes the plain mean of its rows; vmx's learned weights are folded into
the rows (row t times exp(s_t)): the mean of the folded rows is the weighted mean times a
positive number per sentence, so after `Normalize` the vectors are vmx's (cosine 1 up to
float error). vmx's own SentencePiece vocabulary becomes a `tokenizers` Unigram tokenizer
(`SentencePieceUnigramTokenizer.from_spm`, the same ids); an imported `tokenizer.json`
is copied. A vocabulary with a language pre-tokenizer (Moses, jieba) cannot be expressed
in `tokenizers` and is refused, as are imported SentencePiece files (their ids are offset).
`StaticEmbedding` does not truncate, vmx stops at the run's max_length: the two agree on
sentences of up to that many tokens. Model2Vec truncates at the `max_length` written to its
config (vmx's), but drops unknown pieces (its word-level convention) where vmx keeps their
row: the two agree on sentences without one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
from safetensors.numpy import save_file

from vmx.errors import ConfigError
from vmx.modeldir import model_card
from vmx.modeldir.checkpoints import restore_params
from vmx.modeldir.hf_import import atomic_output_dir


def _tokenizer_json(model_dir: Path, vocabulary: str) -> str:
  """The `tokenizers` JSON of the model's vocabulary (module docstring)."""
  path = model_dir / vocabulary
  if path.suffix == ".json":
    spec = json.loads(path.read_text())
    if spec.get("kind") == "tokenizers" and spec.get("pad_id", 0) == 0:
      return (model_dir / spec["file"]).read_text()
    if spec.get("kind") == "sentencepiece" and spec.get("pretokenize"):
      raise ConfigError(f"{path}: the vocabulary pre-tokenizes by language "
                        f"({spec['pretokenize']}), which a `tokenizers` tokenizer cannot do: "
                        f"a static export needs a plain SentencePiece vocabulary")
    if spec.get("kind") != "sentencepiece":
      raise ConfigError(f"{path}: a {spec.get('kind')!r} tokenizer cannot be exported with a "
                        f"static encoder (a vmx SentencePiece model or a tokenizer.json "
                        f"whose padding id is 0)")
    path = model_dir / spec["file"]
  import sys
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import SentencePieceUnigramTokenizer
  # from_spm reads the model proto with the module sentencepiece ships, by its bare name
  sys.modules.setdefault("sentencepiece_model_pb2", sentencepiece_model_pb2)
  return SentencePieceUnigramTokenizer.from_spm(str(path)).to_str()


def _table(model_dir: Path, model, info: dict, step: Optional[int]):
  """(the [V, D] table whose rows a sentence sums, the tokenizer's JSON, the step)."""
  tokenizer = _tokenizer_json(model_dir, info["vocabulary"])
  params, step = restore_params(model_dir, model, step, info["max_length"])
  return np.ascontiguousarray(model.token_sum_table(params)), tokenizer, step


def _provenance(model_dir: Path, model, info: dict, step: int) -> dict:
  return {"exported_from": str(model_dir.absolute()), "checkpoint_step": step,
          "languages": info["languages"], "vmx_max_length": info["max_length"],
          **({"matryoshka_dims": list(model.matryoshka_dims)} if model.matryoshka_dims
             else {})}


def _summary(model, table, step, info, output_dir: Path, architecture: str) -> dict:
  enc, _ = model.pooled_encoder()
  return {"architecture": architecture, "pooling": f"{enc.weighting}-weighted mean"
          if enc.weighting != "none" else "mean", "max_length": info["max_length"],
          "step": step, "tensors": 1, "dim": int(table.shape[1]),
          "output_dir": str(output_dir)}


def export(model_dir, output_dir, model, info: dict, step: Optional[int] = None) -> dict:
  """Writes `output_dir` (must not exist or be empty) as a sentence-transformers folder;
  returns a summary dict."""
  model_dir, output_dir = Path(model_dir), Path(output_dir)
  table, tokenizer, step = _table(model_dir, model, info, step)
  with atomic_output_dir(output_dir, ".exporting") as tmp:
    (tmp / "0_StaticEmbedding").mkdir()
    (tmp / "1_Normalize").mkdir()
    save_file({"embedding.weight": table},
              str(tmp / "0_StaticEmbedding" / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "0_StaticEmbedding" / "tokenizer.json").write_text(tokenizer, encoding="utf-8")
    (tmp / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_StaticEmbedding",
         "type": "sentence_transformers.models.StaticEmbedding"},
        {"idx": 1, "name": "1", "path": "1_Normalize",
         "type": "sentence_transformers.models.Normalize"}], indent=1))
    (tmp / "config_sentence_transformers.json").write_text(json.dumps(
        {"similarity_fn_name": "cosine", **_provenance(model_dir, model, info, step)},
        indent=1))
    model_card.write_with_card(model_dir, tmp, step, info, output_dir.name)
  return _summary(model, table, step, info, output_dir, "StaticEmbedding")


def export_model2vec(model_dir, output_dir, model, info: dict,
                     step: Optional[int] = None) -> dict:
  """Writes `output_dir` (must not exist or be empty) in Model2Vec's layout (module
  docstring); returns a summary dict."""
  model_dir, output_dir = Path(model_dir), Path(output_dir)
  table, tokenizer, step = _table(model_dir, model, info, step)
  with atomic_output_dir(output_dir, ".exporting") as tmp:
    save_file({"embeddings": table}, str(tmp / "model.safetensors"))
    (tmp / "tokenizer.json").write_text(tokenizer, encoding="utf-8")
    (tmp / "config.json").write_text(json.dumps(
        {"model_type": "model2vec", "architectures": ["StaticModel"], "tokenizer_name": "",
         "apply_pca": None, "hidden_dim": int(table.shape[1]), "seq_length": 1000000,
         "normalize": True, "pooling": "mean", "max_length": info["max_length"],
         "embedding_dtype": "float32", **_provenance(model_dir, model, info, step)},
        indent=1))
    model_card.write_with_card(model_dir, tmp, step, info, output_dir.name, "model2vec")
  return _summary(model, table, step, info, output_dir, "Model2Vec StaticModel")
