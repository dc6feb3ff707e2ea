"""Hugging Face checkpoint tensors -> vmx parameters: reading (safetensors without torch,
or pytorch_model.bin), the encoder's settings from `config.json`, the weight-name map of
the BERT / XLM-R and T5 / mT5 families, and a T5 / mT5 decoder's (VMSST §6.5).

hf_import.py writes a model directory from these; hf_export.py is their inverse. Every
tensor is accounted for: unknown, missing or mis-shaped tensors give one
`CheckpointError` that lists them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from vmx import decoders
from vmx.errors import CheckpointError
from vmx.modeldir.checkpoints import flatten

# model_type in config.json -> (encoder family, HF weight-name prefixes to strip)
MODEL_TYPES = {"bert": "bert", "xlm-roberta": "bert", "roberta": "bert", "t5": "t5", "mt5": "t5"}
_PREFIXES = ("bert.", "roberta.", "model.")
# Tensors of other heads or buffers, not part of the encoder: reported as ignored.
_IGNORABLE = re.compile(r"^(cls\.|lm_head\.|qa_outputs\.|classifier\.|decoder\.|pooler\.|"
                        r"embeddings\.position_ids$|encoder\.embed_tokens\.weight$)")


def read_hf_config(hf_dir) -> dict:
  path = Path(hf_dir) / "config.json"
  if not path.is_file():
    raise CheckpointError(f"{path}: not found; is {hf_dir} a Hugging Face model directory?")
  try:
    cfg = json.loads(path.read_text())
  except ValueError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(cfg, dict):
    raise CheckpointError(f"{path}: expected a JSON object (a Hugging Face model config), "
                          f"got a {type(cfg).__name__}")
  if cfg.get("model_type") not in MODEL_TYPES:
    raise CheckpointError(
        f"{path}: model_type {cfg.get('model_type')!r} ({', '.join(cfg.get('architectures') or [])}) "
        f"is not an architecture vmx imports; supported: {', '.join(sorted(MODEL_TYPES))} "
        f"(BertModel, XLMRobertaModel, T5EncoderModel, MT5EncoderModel and models built on them)")
  return cfg


def read_hf_tensors(hf_dir) -> dict[str, np.ndarray]:
  """All tensors as float32/int numpy arrays: safetensors (single or sharded) without
  torch, else pytorch_model.bin (needs torch)."""
  hf_dir = Path(hf_dir)
  index = hf_dir / "model.safetensors.index.json"
  files = []
  if (hf_dir / "model.safetensors").is_file():
    files = [hf_dir / "model.safetensors"]
  elif index.is_file():
    try:
      files = sorted({hf_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    except (ValueError, KeyError) as e:
      raise CheckpointError(f"{index}: unreadable safetensors index ({e})") from None
  if files:
    out = {}
    for f in files:
      if not f.is_file():
        raise CheckpointError(f"{f}: missing (named by {index})")
      try:
        out.update(load_file(str(f)))
      except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{f}: not a readable safetensors file ({e}); truncated or "
                              f"damaged download?") from None
    return {k: _float32(v) for k, v in out.items()}
  binary = hf_dir / "pytorch_model.bin"
  if binary.is_file():
    try:
      import torch  # lazy: torch (optional: pytorch_model.bin only)
    except ImportError:
      raise CheckpointError(f"{binary}: reading pytorch_model.bin needs torch (pip install "
                            f"torch), or convert it to model.safetensors") from None
    try:
      sd = torch.load(str(binary), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (torch raises many kinds for a bad file)
      raise CheckpointError(f"{binary}: not a readable PyTorch checkpoint ({e})") from None
    return {k: _float32(v.float().numpy() if v.is_floating_point() else v.numpy())
            for k, v in sd.items()}
  raise CheckpointError(f"{hf_dir}: no model.safetensors, model.safetensors.index.json or "
                        f"pytorch_model.bin")


def _float32(a: np.ndarray) -> np.ndarray:
  return a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a


# ----------------------------------------------------------------------------
# Architecture: HF config -> vmx TransformerEncoder settings.

def encoder_settings(cfg: dict) -> dict:
  """TransformerEncoder keyword arguments reproducing the checkpoint's encoder; a config
  that lacks a size is a CheckpointError naming it."""
  try:
    return _encoder_settings(cfg)
  except (KeyError, TypeError) as e:
    raise CheckpointError(f"config.json lacks or mistypes {e} (needed to rebuild the "
                          f"{cfg.get('model_type')} encoder)") from None


def _encoder_settings(cfg: dict) -> dict:
  family = MODEL_TYPES[cfg["model_type"]]
  if family == "bert":
    if cfg.get("position_embedding_type", "absolute") != "absolute":
      raise CheckpointError(f"position_embedding_type={cfg['position_embedding_type']!r}: "
                            f"vmx imports absolute position embeddings only")
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "relu"):
      raise CheckpointError(f"hidden_act={act!r} is not supported (gelu, gelu_new, relu)")
    roberta = cfg["model_type"] in ("xlm-roberta", "roberta")
    offset = int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0
    return dict(family="bert", vocab_size=cfg["vocab_size"], num_layers=cfg["num_hidden_layers"],
                emb_dim=cfg["hidden_size"], num_heads=cfg["num_attention_heads"],
                mlp_dim=cfg["intermediate_size"],
                max_length=cfg["max_position_embeddings"] - offset,
                activation={"gelu": "gelu_exact", "gelu_new": "gelu", "relu": "relu"}[act],
                norm_epsilon=float(cfg.get("layer_norm_eps", 1e-12)),
                type_vocab_size=int(cfg.get("type_vocab_size", 2)), position_offset=offset,
                position_embedding="learned")
  proj = cfg.get("feed_forward_proj", "relu")
  if proj not in ("gated-gelu", "gated-gelu_new"):
    raise CheckpointError(f"feed_forward_proj={proj!r}: vmx's t5 family is T5 v1.1 / mT5 "
                          f"(gated-gelu); the original T5 (relu) is not supported")
  return dict(family="t5", vocab_size=cfg["vocab_size"], num_layers=cfg["num_layers"],
              emb_dim=cfg["d_model"], num_heads=cfg["num_heads"], head_dim=cfg["d_kv"],
              mlp_dim=cfg["d_ff"], max_length=512, activation="gelu",
              norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-6)),
              relative_attention_num_buckets=cfg.get("relative_attention_num_buckets", 32),
              relative_attention_max_distance=cfg.get("relative_attention_max_distance", 128),
              position_embedding="none")


# ----------------------------------------------------------------------------
# Weight names: (HF name, vmx path under the encoder, transform).

def _invertible(forward, inverse):
  """A weight transform that carries its inverse (vmx/modeldir/hf_export.py uses it)."""
  forward.inverse = inverse
  return forward


def _same(a):
  return a


_same.inverse = _same


def _t(a):  # torch Linear [out, in] -> kernel [in, out]
  return a.T


_t.inverse = _t


def _heads(h: int):                                          # [H*K, D] -> [D, H, K]
  return _invertible(lambda a: a.T.reshape(a.shape[1], h, -1),
                     lambda a: a.reshape(a.shape[0], -1).T)


def _heads_bias(h: int):                                     # [H*K] -> [H, K]
  return _invertible(lambda a: a.reshape(h, -1), lambda a: a.reshape(-1))


def _out(h: int):                                            # [D, H*K] -> [H, K, D]
  return _invertible(lambda a: a.T.reshape(h, -1, a.shape[0]),
                     lambda a: a.reshape(-1, a.shape[-1]).T)


def weight_map(settings: dict, pooler: bool
               ) -> list[tuple[str, str, Callable[[np.ndarray], np.ndarray]]]:
  h = settings["num_heads"]
  same = _same
  out = []
  if settings["family"] == "bert":
    e = "embeddings."
    out += [(e + "word_embeddings.weight", "token_embed/embedding", same),
            (e + "position_embeddings.weight", "position_embed/embedding", same),
            (e + "token_type_embeddings.weight", "token_type_embed/embedding", same),
            (e + "LayerNorm.weight", "embed_norm/scale", same),
            (e + "LayerNorm.bias", "embed_norm/bias", same)]
    for i in range(settings["num_layers"]):
      p, v = f"encoder.layer.{i}.", f"layers_{i}/"
      for name in ("query", "key", "value"):
        out += [(p + f"attention.self.{name}.weight", v + f"attention/{name}", _heads(h)),
                (p + f"attention.self.{name}.bias", v + f"attention/{name}_bias", _heads_bias(h))]
      out += [(p + "attention.output.dense.weight", v + "attention/out", _out(h)),
              (p + "attention.output.dense.bias", v + "attention/out_bias", same),
              (p + "attention.output.LayerNorm.weight", v + "attention_norm/scale", same),
              (p + "attention.output.LayerNorm.bias", v + "attention_norm/bias", same),
              (p + "intermediate.dense.weight", v + "mlp/wi/kernel", _t),
              (p + "intermediate.dense.bias", v + "mlp/wi/bias", same),
              (p + "output.dense.weight", v + "mlp/wo/kernel", _t),
              (p + "output.dense.bias", v + "mlp/wo/bias", same),
              (p + "output.LayerNorm.weight", v + "mlp_norm/scale", same),
              (p + "output.LayerNorm.bias", v + "mlp_norm/bias", same)]
    if pooler:
      out += [("pooler.dense.weight", "pooler/kernel", _t), ("pooler.dense.bias", "pooler/bias", same)]
    return out
  out += [("shared.weight", "token_embed/embedding", same),
          ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
           "relative_attention_bias", _t),
          ("encoder.final_layer_norm.weight", "final_norm/scale", same)]
  for i in range(settings["num_layers"]):
    out += _t5_block(f"encoder.block.{i}.layer.", f"layers_{i}/", h, "attention", 1)
  return out


def _t5_block(p: str, v: str, h: int, attention: str, mlp_sublayer: int) -> list:
  """A T5 block's self-attention (vmx module `attention`, its norm `pre_<attention>_norm`)
  and gated MLP (HF sublayer `mlp_sublayer`: 1 in the encoder, 2 in the decoder, after
  the cross-attention)."""
  m = f"{mlp_sublayer}."
  out = [(p + f"0.SelfAttention.{a}.weight", v + f"{attention}/{b}", _heads(h))
         for a, b in (("q", "query"), ("k", "key"), ("v", "value"))]
  return out + [(p + "0.SelfAttention.o.weight", v + f"{attention}/out", _out(h)),
                (p + "0.layer_norm.weight", v + f"pre_{attention}_norm/scale", _same),
                (p + m + "DenseReluDense.wi_0.weight", v + "mlp/wi_0/kernel", _t),
                (p + m + "DenseReluDense.wi_1.weight", v + "mlp/wi_1/kernel", _t),
                (p + m + "DenseReluDense.wo.weight", v + "mlp/wo/kernel", _t),
                (p + m + "layer_norm.weight", v + "pre_mlp_norm/scale", _same)]


def normalize_names(tensors: dict) -> dict:
  """Strips a model-class prefix ('bert.', 'roberta.'), maps old gamma/beta names."""
  out = {}
  for k, v in tensors.items():
    for p in _PREFIXES:
      if k.startswith(p):
        k = k[len(p):]
        break
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$",
                                                                "LayerNorm.bias", k))
    if k == "encoder.embed_tokens.weight" and "shared.weight" not in tensors:
      out.setdefault("shared.weight", v)
    out[k] = v
  return out


def convert(cfg: dict, tensors: dict, expected_shapes: dict, pooler: bool = False,
            pad_id: int = 0) -> tuple[dict, list[str]]:
  """(vmx encoder params as a flat {path: array}, names of ignored tensors).

  `expected_shapes`: flat {path: shape} of the vmx encoder. Raises one CheckpointError
  listing every unknown, missing and mis-shaped tensor.
  """
  settings = encoder_settings(cfg)
  tensors = normalize_names(tensors)
  flat, ignored = _convert(weight_map(settings, pooler), tensors, expected_shapes,
                           lambda k: bool(_IGNORABLE.match(k)),
                           f"{settings['family']} checkpoint",
                           f"{settings['num_layers']} layers, d={settings['emb_dim']}")
  if pad_id:
    emb = flat["token_embed/embedding"].copy()
    emb[[0, pad_id]] = emb[[pad_id, 0]]
    flat["token_embed/embedding"] = emb
  return flat, ignored


def _convert(wmap, tensors: dict, expected_shapes: dict, ignorable: Callable[[str], bool],
             what: str, sizes: str) -> tuple[dict, list[str]]:
  """The tensors of `wmap` as {vmx path: float32 array}, and the unused tensors that
  `ignorable` accepts; one CheckpointError listing every unknown, missing and mis-shaped
  tensor."""
  flat, used, missing, misshaped = {}, set(), [], []
  for hf, path, fn in wmap:
    if hf not in tensors:
      missing.append(hf)
      continue
    used.add(hf)
    try:
      a = fn(tensors[hf])
    except ValueError:
      a = None
    want = tuple(expected_shapes[path])
    if a is None or tuple(a.shape) != want:
      misshaped.append(f"{hf} {tuple(tensors[hf].shape)} (vmx {path} needs {want})")
      continue
    flat[path] = np.ascontiguousarray(a, np.float32)
  ignored = sorted(k for k in tensors if k not in used and ignorable(k))
  unknown = sorted(k for k in tensors if k not in used and not ignorable(k))
  if unknown or missing or misshaped:
    parts = [f"{label} ({len(xs)}): {', '.join(xs[:8])}{' …' if len(xs) > 8 else ''}"
             for label, xs in (("unknown", unknown), ("missing", missing),
                               ("mis-shaped", misshaped)) if xs]
    raise CheckpointError(f"{what} does not match its config.json ({sizes}): "
                          + "; ".join(parts) + "; nothing written")
  return flat, ignored


# ----------------------------------------------------------------------------
# The decoder of a T5 / mT5 encoder-decoder checkpoint (VMSST §6.5).

# What VMSST's decoder has and mT5's has not: these start fresh.
DECODER_FRESH = re.compile(r"(^|.*/)(conditioning|pre_conditioning_norm)/.*|output/cond_kernel"
                           r"|output_factor/.*|output_vocab/.*|start_embed/.*|token_embed/.*")
# mT5's cross-attention sublayer (attention and its norm): VMSST's decoder has none.
_CROSS_ATTENTION = re.compile(r"^decoder\.block\.\d+\.layer\.1\.")


def decoder_settings(cfg: dict) -> dict:
  """vmx ConditionedDecoder keyword arguments for a T5 / mT5 checkpoint's decoder."""
  enc = encoder_settings(cfg)
  if enc["family"] != "t5":
    raise CheckpointError(f"--decoder: model_type {cfg['model_type']!r} has no decoder; "
                          f"only T5 / mT5 encoder-decoder checkpoints do")
  keep = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "activation",
          "norm_epsilon", "relative_attention_num_buckets", "relative_attention_max_distance")
  return dict(family="t5", num_layers=int(cfg.get("num_decoder_layers") or cfg["num_layers"]),
              max_length=512, **{k: enc[k] for k in keep})


def decoder_weight_map(settings: dict, lm_head: bool, scaled: bool = False
                       ) -> list[tuple[str, str, Callable[[np.ndarray], np.ndarray]]]:
  """(HF name, vmx ConditionedDecoder path, transform) of everything imported: causal
  self-attention, its position bias, gated MLP, norms and the output projection on the
  hidden state: mT5's own `lm_head` when the checkpoint has one (mT5 and T5 v1.1 train
  it untied, unscaled), else the shared embedding (a checkpoint saved with tied
  weights, as transformers 5 saves mT5), times d^-0.5 where the model scales the hidden
  state before it (`scaled`: `output_scaled(cfg)`)."""
  h, d = settings["num_heads"], settings["emb_dim"]
  tied = (lambda a: a.T * np.float32(d) ** -0.5) if scaled else _t
  out = [("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
          "relative_attention_bias", _t),
         ("decoder.final_layer_norm.weight", "final_norm/scale", _same),
         ("lm_head.weight", "output/kernel", _t) if lm_head else
         ("shared.weight", "output/kernel", tied)]
  for i in range(settings["num_layers"]):
    out += _t5_block(f"decoder.block.{i}.layer.", f"layers_{i}/", h, "self_attention", 2)
  return out


def output_scaled(cfg: dict) -> bool:
  """Whether a tied T5 multiplies the decoder's output by d^-0.5 before the shared
  embedding: transformers 5's `scale_decoder_outputs` (T5Config sets it unless
  `tie_word_embeddings` is false), T5 v1.0's convention; mT5 never scales."""
  if cfg["model_type"] != "t5":
    return False
  return bool(cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True)
                      is not False))


def convert_decoder(cfg: dict, tensors: dict, expected_shapes: dict
                    ) -> tuple[dict, list[str]]:
  """(vmx decoder params as a flat {path: array}, the cross-attention tensors left out).

  `expected_shapes`: flat {path: shape} of the vmx decoder (its fresh parts,
  DECODER_FRESH, may be absent). Tensors of the encoder are not looked at; one
  CheckpointError lists every unknown, missing and mis-shaped decoder tensor."""
  settings = decoder_settings(cfg)
  tensors = normalize_names(tensors)
  if not any(k.startswith("decoder.") for k in tensors):
    raise CheckpointError(f"--decoder: the checkpoint has no decoder tensors ({cfg.get('architectures')}); "
                          f"use an encoder-decoder checkpoint (MT5ForConditionalGeneration)")
  lm_head = "lm_head.weight" in tensors
  mine = {k: v for k, v in tensors.items() if k.startswith("decoder.")
          or k == ("lm_head.weight" if lm_head else "shared.weight")}
  wmap = decoder_weight_map(settings, lm_head, scaled=not lm_head and output_scaled(cfg))
  return _convert(wmap, mine, expected_shapes,
                  lambda k: bool(_CROSS_ATTENTION.match(k)) or k == "decoder.embed_tokens.weight",
                  "the decoder", f"{settings['num_layers']} layers, d={settings['emb_dim']}")


def decoder_shapes(settings: dict) -> dict:
  """Flat {path: shape} of a vmx ConditionedDecoder with `settings`, fresh parts left out."""
  dec = decoders.ConditionedDecoder(**settings)
  d = settings["emb_dim"]
  tree = jax.eval_shape(lambda: dec.init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32), None,
                                         np.zeros((1, d), np.float32)))["params"]
  return {k: v.shape for k, v in flatten(tree).items() if not DECODER_FRESH.fullmatch(k)}
