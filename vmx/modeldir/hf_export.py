"""vmx model directories -> sentence-transformers folders (the inverse of
vmx/modeldir/hf_import.py, for the BERT / XLM-R family).

  python launch/export_checkpoint.py --checkpoint_dir=DIR --output_dir=DIR [--step=N]

A model whose retrieval vector is a BERT-family encoder's mean or CLS pooling, L2
normalized (CONTRASTIVE `DualEncoderModel` with one shared encoder and no projection, and
`EmmaXModel`), with the Hugging Face tokenizer it was imported with, becomes a folder that
`sentence_transformers.SentenceTransformer(output_dir)` opens (and through it MTEB and
other tools): `config.json` + `model.safetensors` (a `BertModel` / `XLMRobertaModel`),
the tokenizer file, `modules.json` (Transformer -> Pooling -> Normalize),
`sentence_bert_config.json` (max_seq_length) and `1_Pooling/config.json`. The embeddings
equal vmx's `Encoder.encode` (tests/test_hf_import_export.py). Anything else (vmx's own
SentencePiece vocabulary, language embeddings, projections, mT5, the tanh pooler) is a
ConfigError naming what cannot be expressed; nothing is written then. A static encoder
(vmx/static_encoder.py) becomes a `StaticEmbedding` folder instead, or a Model2Vec folder
(`export_model2vec`; static_export.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
from safetensors.numpy import save_file

from vmx.errors import ConfigError
from vmx.models.base import model_from_config
from vmx.static_encoder import StaticEncoder
from vmx.modeldir.checkpoints import flatten, restore_params
from vmx.modeldir.hf_import import atomic_output_dir
from vmx.modeldir.hf_weights import weight_map
from vmx.modeldir import model_card, static_export
from vmx.modeldir.layout import read_model_info

# vmx activation -> Hugging Face hidden_act (inverse of hf_weights.encoder_settings)
_ACTIVATIONS = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu"}
_POOLING = {"mean": "pooling_mode_mean_tokens", "first": "pooling_mode_cls_token"}


def exportable(model, tokenizer_spec: Optional[dict]) -> tuple[object, str]:
  """(the model's TransformerEncoder, its pooling), or ConfigError saying why not. The
  model says which encoder and pooling make its vector (`pooled_encoder`)."""
  enc, pooling = model.pooled_encoder()
  if enc.family != "bert":
    raise ConfigError(f"encoder family {enc.family!r} cannot be exported: only BERT / XLM-R "
                      f"encoders (imported with launch/import_checkpoint.py) have a "
                      f"sentence-transformers equivalent here")
  if enc.num_languages:
    raise ConfigError("an encoder with language embeddings (num_languages > 0) has no "
                      "sentence-transformers equivalent")
  if pooling not in _POOLING or enc.pooler:
    raise ConfigError(f"pooling={pooling!r} cannot be exported (mean or first/CLS)")
  if enc.activation not in _ACTIVATIONS:
    raise ConfigError(f"activation={enc.activation!r} has no Hugging Face hidden_act")
  if tokenizer_spec is None or tokenizer_spec.get("kind") not in ("tokenizers", "wordpiece",
                                                                    "fairseq_spm"):
    raise ConfigError("the model's vocabulary is vmx's own SentencePiece model; only models "
                      "with an imported Hugging Face tokenizer (tokenizer.json, vocab.txt, "
                      "sentencepiece.bpe.model) can be exported")
  return enc, pooling


def hf_config(enc, pad_id: int) -> dict:
  roberta = enc.position_offset > 0
  return {"architectures": ["XLMRobertaModel" if roberta else "BertModel"],
          "model_type": "xlm-roberta" if roberta else "bert",
          "vocab_size": enc.vocab_size, "hidden_size": enc.emb_dim,
          "num_hidden_layers": enc.num_layers, "num_attention_heads": enc.num_heads,
          "intermediate_size": enc.mlp_dim, "hidden_act": _ACTIVATIONS[enc.activation],
          "max_position_embeddings": enc.max_length + enc.position_offset,
          "type_vocab_size": enc.type_vocab_size, "layer_norm_eps": enc.norm_epsilon,
          "pad_token_id": pad_id, "position_embedding_type": "absolute",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
          "initializer_range": 0.02}


def hf_tensors(enc, encoder_params: dict, pad_id: int) -> dict[str, np.ndarray]:
  """{Hugging Face name: array} of the encoder (inverse of hf_weights.convert)."""
  flat = {k: np.asarray(v, np.float32) for k, v in flatten(encoder_params).items()}
  if pad_id:   # vmx keeps padding at id 0: swap the rows back
    emb = flat["token_embed/embedding"].copy()
    emb[[0, pad_id]] = emb[[pad_id, 0]]
    flat["token_embed/embedding"] = emb
  settings = {"family": "bert", "num_heads": enc.num_heads, "num_layers": enc.num_layers}
  out = {}
  for hf, path, fn in weight_map(settings, pooler=False):
    out[hf] = np.ascontiguousarray(fn.inverse(flat.pop(path)))
  if flat:
    raise ConfigError(f"vmx parameters without a Hugging Face name: {sorted(flat)}")
  out["embeddings.position_ids"] = np.arange(enc.max_length + enc.position_offset,
                                             dtype=np.int64)[None]
  return out


def export_model2vec(model_dir, output_dir, step: Optional[int] = None) -> dict:
  """A static encoder's directory in Model2Vec's layout (static_export.py); ConfigError for
  any other model (a Transformer is not a table). Returns a summary dict."""
  info = read_model_info(model_dir)
  model = model_from_config(info["model"])
  enc, _ = model.pooled_encoder()
  if not isinstance(enc, StaticEncoder):
    raise ConfigError(f"{model_dir}: --format=model2vec writes static encoders "
                      f"(static_*.gin) only; this model's vector is a {enc.family} "
                      f"encoder's (export it as sentence-transformers)")
  return static_export.export_model2vec(model_dir, output_dir, model, info, step)


def export_sentence_transformers(model_dir, output_dir, step: Optional[int] = None) -> dict:
  """Writes `output_dir` (must not exist or be empty); returns a summary dict."""
  model_dir, output_dir = Path(model_dir), Path(output_dir)
  info = read_model_info(model_dir)
  model = model_from_config(info["model"])
  if isinstance(model.pooled_encoder()[0], StaticEncoder):   # a table and a tokenizer
    return static_export.export(model_dir, output_dir, model, info, step)
  spec_path = model_dir / info["vocabulary"]
  spec = json.loads(spec_path.read_text()) if spec_path.suffix == ".json" else None
  enc, pooling = exportable(model, spec)
  L = info["max_length"]
  params, step = restore_params(model_dir, model, step, L)
  tensors = hf_tensors(enc, params["encoder"], spec["pad_id"])
  config = hf_config(enc, spec["pad_id"])
  with atomic_output_dir(output_dir, ".exporting") as tmp:
    (tmp / "1_Pooling").mkdir()
    (tmp / "2_Normalize").mkdir()
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(model_dir / spec["file"], tmp / spec["file"])
    if spec["kind"] == "wordpiece":
      (tmp / "tokenizer_config.json").write_text(json.dumps(
          {"tokenizer_class": "BertTokenizer", "do_lower_case": spec.get("lowercase", False)}))
    elif spec["kind"] == "fairseq_spm":
      (tmp / "tokenizer_config.json").write_text(json.dumps(
          {"tokenizer_class": "XLMRobertaTokenizer"}))
    (tmp / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}], indent=1))
    (tmp / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": L, "do_lower_case": False}))
    pool = {"word_embedding_dimension": enc.emb_dim, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}
    pool[_POOLING[pooling]] = True
    (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=1))
    (tmp / "config_sentence_transformers.json").write_text(json.dumps(
        {"similarity_fn_name": "cosine", "exported_from": str(model_dir.absolute()),
         "checkpoint_step": step, "languages": info["languages"],
         **({"matryoshka_dims": list(model.matryoshka_dims)} if model.matryoshka_dims
            else {})}, indent=1))
    model_card.write_with_card(model_dir, tmp, step, info, output_dir.name)
  return {"architecture": config["architectures"][0],
          "pooling": pooling, "max_length": L, "step": step, "tensors": len(tensors),
          "output_dir": str(output_dir)}
