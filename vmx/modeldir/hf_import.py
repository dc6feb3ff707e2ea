"""Hugging Face checkpoints -> vmx model directories (no torch needed for safetensors).

  python launch/import_checkpoint.py --hf_dir=DIR --output_dir=DIR

A Hugging Face directory (`config.json` + `model.safetensors`, sharded safetensors with
their index, or `pytorch_model.bin`, which needs torch) of `BertModel`,
`XLMRobertaModel`, `T5EncoderModel` / `MT5EncoderModel` (or a model built on one of them:
its extra heads and a T5 decoder are listed as ignored) becomes a vmx model directory:
`vmx_model.json` (a CONTRASTIVE dual encoder on the checkpoint's encoder), the
checkpoint's own tokenizer (vmx/data/hf_tokenizer.py: HfTokenizer) and `checkpoint_0/params`
with its checksum manifest. With `decoder=True` (`--decoder`), a T5 / mT5
encoder-decoder checkpoint's decoder is kept too, in `decoder/checkpoint_0/params`
(layout.PRETRAINED_DECODER_DIR), as a vmx `ConditionedDecoder(family='t5')` without its
cross-attention: VMSST's and BITRANSLATION's decoders start from it (VMSST §6.5). A
masked-LM checkpoint's head (XLM-R's `lm_head`, BERT's `cls.predictions`) is kept in
`mlm_head/` (hf_mlm_head.py), where InfoXLM's head starts from it.
`Encoder.from_checkpoint` opens the directory, and a training run starts from it with
`INITIAL_CHECKPOINT_PATH` (vmx/training/initial_checkpoint.py).
Part of vmx/modeldir/ (the MODEL_DIR layout: layout.py); the deprecated path
`vmx.checkpoint_import` forwards here.

Every tensor is accounted for before anything is written (the tensors' map:
hf_weights.py): unknown, missing or mis-shaped tensors give one `CheckpointError` that
lists them.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from flax import traverse_util

from vmx import encoders
from vmx.data.vocab import TOKENIZER_SPEC, HfTokenizer
from vmx.errors import CheckpointError, ConfigError
from vmx.models.dual_encoder import DualEncoder, DualEncoderModel
from vmx.modeldir.checkpoints import flatten, save_params
from vmx.modeldir.hf_mlm_head import convert_mlm_head
from vmx.modeldir.hf_weights import (MODEL_TYPES, normalize_names, convert, convert_decoder,
                                     decoder_settings, decoder_shapes, decoder_weight_map,
                                     encoder_settings, read_hf_config, read_hf_tensors)
from vmx.modeldir.layout import PRETRAINED_DECODER_DIR, PRETRAINED_MLM_HEAD_DIR, write_model_info


# ----------------------------------------------------------------------------
# Tokenizer.

def tokenizer_spec(hf_dir, cfg: dict) -> dict:
  """Which of the checkpoint's tokenizer files vmx uses, and its padding id."""
  hf_dir = Path(hf_dir)
  tok_cfg = {}
  if (hf_dir / "tokenizer_config.json").is_file():
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
  family = MODEL_TYPES[cfg["model_type"]]
  pad = int(cfg.get("pad_token_id", 1 if cfg["model_type"] in ("xlm-roberta", "roberta") else 0)
            or 0)
  if (hf_dir / "tokenizer.json").is_file():
    spec = {"kind": "tokenizers", "file": "tokenizer.json"}
  elif family == "bert" and (hf_dir / "vocab.txt").is_file():
    spec = {"kind": "wordpiece", "file": "vocab.txt",
            "lowercase": bool(tok_cfg.get("do_lower_case", False))}
  elif family == "t5" and (hf_dir / "spiece.model").is_file():
    spec = {"kind": "t5_spm", "file": "spiece.model"}
  elif (hf_dir / "sentencepiece.bpe.model").is_file():
    spec = {"kind": "fairseq_spm", "file": "sentencepiece.bpe.model"}
  else:
    raise CheckpointError(f"{hf_dir}: no tokenizer (tokenizer.json, vocab.txt, spiece.model or "
                          f"sentencepiece.bpe.model)")
  spec.update(pad_id=pad, vocab_size=int(cfg["vocab_size"]), closing_special=True)
  return spec


def _pooling_from_sentence_transformers(hf_dir) -> Optional[str]:
  path = Path(hf_dir) / "1_Pooling" / "config.json"
  if not path.is_file():
    return None
  p = json.loads(path.read_text())
  if p.get("pooling_mode_mean_tokens"):
    return "mean"
  if p.get("pooling_mode_cls_token"):
    return "first"
  raise ConfigError(f"{path}: only mean or CLS pooling can be imported")


def _max_length_from_sentence_transformers(hf_dir) -> Optional[int]:
  path = Path(hf_dir) / "sentence_bert_config.json"
  if path.is_file():
    return json.loads(path.read_text()).get("max_seq_length")
  return None


# ----------------------------------------------------------------------------
# The whole import.

@contextlib.contextmanager
def atomic_output_dir(output_dir: Path, suffix: str):
  """Yields a temporary sibling of `output_dir` to write into, renamed to `output_dir` at
  the end; on any error it is removed (nothing half-written is left behind). An existing,
  non-empty `output_dir` is a ConfigError."""
  output_dir = Path(output_dir)
  if output_dir.exists() and any(output_dir.iterdir()):
    raise ConfigError(f"--output_dir={output_dir} exists and is not empty")
  tmp = output_dir.with_name(output_dir.name + suffix)
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if output_dir.exists():
    output_dir.rmdir()
  tmp.rename(output_dir)


def import_checkpoint(hf_dir, output_dir, pooling: Optional[str] = None,
                      max_length: Optional[int] = None, temperature: float = 0.05,
                      decoder: bool = False) -> dict:
  """Writes a vmx model directory for the Hugging Face checkpoint in `hf_dir` (a
  directory, or a .zip of one).

  decoder: also keep a T5 / mT5 encoder-decoder checkpoint's decoder (without its
  cross-attention) in `decoder/` of the output, where VMSST's and BITRANSLATION's
  initial-checkpoint rules find it (VMSST §6.5).
  pooling: 'mean', 'first' (CLS) or 'pooler' (BERT's tanh pooler); default: the
  sentence-transformers config's, else 'first' for BERT/XLM-R and 'mean' for mT5.
  max_length: tokens per sentence at inference and training (default: the
  sentence-transformers max_seq_length, else 128 or the checkpoint's positions if fewer).
  Returns a summary dict.
  """
  hf_dir, output_dir = Path(hf_dir), Path(output_dir)
  if hf_dir.is_file() and hf_dir.suffix == ".zip":
    with tempfile.TemporaryDirectory() as tmp:
      try:
        with zipfile.ZipFile(hf_dir) as z:
          z.extractall(tmp)
      except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{hf_dir}: not a readable zip file ({e})") from None
      found = sorted(Path(tmp).rglob("config.json"), key=lambda p: len(p.parts))
      if not found:
        raise CheckpointError(f"{hf_dir}: no config.json inside")
      return import_checkpoint(found[0].parent, output_dir, pooling, max_length, temperature,
                               decoder)
  cfg = read_hf_config(hf_dir)
  settings = encoder_settings(cfg)
  family = settings["family"]
  pooling = pooling or _pooling_from_sentence_transformers(hf_dir) or (
      "first" if family == "bert" else "mean")
  if pooling not in encoders.POOLING_METHODS:
    raise ConfigError(f"pooling={pooling!r}; expected one of {encoders.POOLING_METHODS}")
  if pooling == "pooler" and family != "bert":
    raise ConfigError("pooling='pooler' exists for BERT / XLM-R checkpoints only")
  spec = tokenizer_spec(hf_dir, cfg)
  tensors = read_hf_tensors(hf_dir)
  max_length = int(max_length or _max_length_from_sentence_transformers(hf_dir)
                   or min(128, settings["max_length"]))
  if max_length > settings["max_length"]:
    raise ConfigError(f"max_length={max_length} > the checkpoint's {settings['max_length']} "
                      f"positions")
  encoder = encoders.TransformerEncoder(**settings, pooler=pooling == "pooler")
  model = DualEncoderModel(DualEncoder(encoder=encoder, pooling=pooling),
                           temperature=temperature)
  expected = {k: v.shape for k, v in flatten(model.abstract_params(8)["encoder"]).items()}
  flat, ignored = convert(cfg, tensors, expected, pooling == "pooler", spec["pad_id"])
  leftover = sorted(set(expected) - set(flat))
  if leftover:  # a vmx parameter no HF tensor fills: a bug in the weight map
    raise CheckpointError(f"no Hugging Face tensor for vmx parameters {leftover}")
  head, head_used = {}, []
  if family == "bert":       # a masked-LM checkpoint's head (hf_mlm_head.py): mlm_head/
    named = normalize_names(tensors)
    head, head_used = convert_mlm_head(named, named["embeddings.word_embeddings.weight"],
                                       spec["pad_id"], str(hf_dir))
    ignored = sorted(set(ignored) - set(head_used))
  dec_flat, dec_settings = {}, None
  if decoder:
    dec_settings = decoder_settings(cfg)
    dec_expected = decoder_shapes(dec_settings)
    dec_flat, cross = convert_decoder(cfg, tensors, dec_expected)
    leftover = sorted(set(dec_expected) - set(dec_flat))
    if leftover:  # a bug in the decoder weight map
      raise CheckpointError(f"no Hugging Face tensor for vmx decoder parameters {leftover}")
    used = {hf for hf, _, _ in decoder_weight_map(dec_settings, "lm_head.weight" in tensors)}
    ignored = sorted((set(ignored) - used) | set(cross))

  # Write: tokenizer, model info, params (into a temporary directory, renamed at the end).
  with atomic_output_dir(output_dir, ".importing") as tmp:
    shutil.copyfile(hf_dir / spec["file"], tmp / spec["file"])
    (tmp / TOKENIZER_SPEC).write_text(json.dumps(spec, indent=1))
    tok = HfTokenizer(str(tmp / TOKENIZER_SPEC))
    if tok.vocab_size > settings["vocab_size"]:
      raise CheckpointError(f"the tokenizer has {tok.vocab_size} ids but the embedding table "
                            f"{settings['vocab_size']} rows")
    write_model_info(tmp, model, [], max_length, TOKENIZER_SPEC)
    save_params(tmp.absolute(), 0, {"encoder": traverse_util.unflatten_dict(flat, sep="/")})
    if decoder:
      save_params((tmp / PRETRAINED_DECODER_DIR).absolute(), 0,
                  traverse_util.unflatten_dict(dec_flat, sep="/"))
    if head:
      save_params((tmp / PRETRAINED_MLM_HEAD_DIR).absolute(), 0,
                  traverse_util.unflatten_dict(head, sep="/"))
    (tmp / "IMPORTED_FROM.json").write_text(json.dumps(
        {"hf_dir": str(hf_dir.absolute()), "architectures": cfg.get("architectures"),
         "model_type": cfg["model_type"], "ignored_tensors": ignored,
         "decoder": dec_settings, "mlm_head": bool(head)}, indent=1))
  n = sum(a.size for a in flat.values())
  return {"family": family, "pooling": pooling, "max_length": max_length,
          "tokenizer": spec["kind"], "parameters": int(n), "tensors": len(flat),
          "decoder_parameters": int(sum(a.size for a in dec_flat.values())),
          "decoder_tensors": len(dec_flat), "decoder": dec_settings,
          "mlm_head_tensors": len(head_used),
          "ignored": ignored, "output_dir": str(output_dir)}
