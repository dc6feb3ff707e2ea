"""Transformer encoder, poolers and projection heads (Flax linen).

The encoder is the unit every method reuses: dual encoders (CONTRASTIVE, EMS,
MPCL, InfoXLM), the semantic/language encoders of VMSST and the momentum copies
of MoCo-style methods are instances of `TransformerEncoder`; two instances can
share one token table by passing the same `Embed` module as `shared_embedding`.

`TransformerEncoder.family` picks the architecture (gin_configs/architectures/):
  'vmx'   pre-LayerNorm layers, learned or sinusoidal positions (vmx's own models);
  'bert'  BERT / XLM-RoBERTa / MiniLM: post-LN, learned absolute positions (XLM-R's
          padding-offset position ids with position_offset=2), token-type embedding,
          embedding LayerNorm, biases everywhere, exact GELU, optional tanh pooler;
  't5'    T5 v1.1 / mT5 encoder: RMSNorm pre-norm, bucketed relative position bias
          computed once and shared by all layers, gated-GELU MLP, no biases.
Each family's parameter names are what vmx/modeldir/hf_import.py maps Hugging Face
checkpoints onto; the module interface, logical axes, scan and remat are shared.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen import partitioning as nnp

from vmx import layers
from vmx.errors import ConfigError
from vmx.packing import Packed, Tokens
from vmx.gin_utils import check_range, positive_int

Array = jax.Array
POOLING_METHODS = ("mean", "first", "pooler")
FAMILIES = ("vmx", "bert", "t5")
POSITION_EMBEDDINGS = ("learned", "sinusoidal", "none")
REMAT_POLICIES = ("none", "full", "dots")


class LayerSettings(nn.Module):
  """The settings every encoder and decoder layer takes (built by `layer_kwargs`)."""
  num_heads: int
  head_dim: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  activation: str = "gelu"
  dtype: jnp.dtype = jnp.float32
  scanned: bool = False  # called under nn.scan: return (carry, None)


class EncoderLayer(LayerSettings):
  """Pre-LayerNorm Transformer layer: x + Attn(LN(x)); x + MLP(LN(x))."""

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_Bx1xLxL: Array, deterministic: bool):
    h = layers.LayerNorm(dtype=self.dtype, name="pre_attention_norm")(x_BxLxD)
    h = layers.MultiHeadAttention(self.num_heads, self.head_dim, self.attention_dropout_rate,
                                  dtype=self.dtype, name="attention")(h, h, mask_Bx1xLxL,
                                                                     deterministic)
    x = x_BxLxD + nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = layers.LayerNorm(dtype=self.dtype, name="pre_mlp_norm")(x)
    h = layers.MlpBlock(self.mlp_dim, self.activation, self.dropout_rate, dtype=self.dtype,
                        name="mlp")(h, deterministic)
    x = x + nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    if self.scanned:
      return x, None
    return x


class BertLayer(LayerSettings):
  """Post-LayerNorm layer (BERT, XLM-R): x = LN(x + Attn(x)); x = LN(x + MLP(x))."""
  norm_epsilon: float = 1e-12

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_Bx1xLxL: Array, deterministic: bool):
    h = layers.MultiHeadAttention(self.num_heads, self.head_dim, self.attention_dropout_rate,
                                  dtype=self.dtype, use_bias=True, name="attention")(
                                      x_BxLxD, x_BxLxD, mask_Bx1xLxL, deterministic)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = layers.LayerNorm(self.norm_epsilon, self.dtype, name="attention_norm")(x_BxLxD + h)
    h = layers.MlpBlock(self.mlp_dim, self.activation, 0.0, dtype=self.dtype, name="mlp")(
        x, deterministic)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = layers.LayerNorm(self.norm_epsilon, self.dtype, name="mlp_norm")(x + h)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    return (x, None) if self.scanned else x


class T5Layer(LayerSettings):
  """T5 v1.1 / mT5 encoder layer: x + Attn(RMS(x), +rel. bias); x + GatedMLP(RMS(x))."""
  norm_epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_Bx1xLxL: Array, bias_1xHxLxL: Array,
               deterministic: bool):
    h = layers.RMSNorm(self.norm_epsilon, self.dtype, name="pre_attention_norm")(x_BxLxD)
    h = layers.MultiHeadAttention(self.num_heads, self.head_dim, self.attention_dropout_rate,
                                  dtype=self.dtype, scale_query=False, name="attention")(
                                      h, h, mask_Bx1xLxL, deterministic, bias_1xHxLxL)
    x = x_BxLxD + nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = layers.RMSNorm(self.norm_epsilon, self.dtype, name="pre_mlp_norm")(x)
    h = layers.GatedMlpBlock(self.mlp_dim, self.activation, self.dropout_rate,
                             dtype=self.dtype, name="mlp")(h, deterministic)
    x = x + nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    return (x, None) if self.scanned else x


def relative_position_buckets(query_len: int, key_len: int, num_buckets: int,
                              max_distance: int, bidirectional: bool = True) -> np.ndarray:
  """T5's relative-position bucket of every (query, key) pair: [Q, K] int32.

  Bidirectional (the encoder): half the buckets per direction. Causal
  (`bidirectional=False`, T5's decoder): all buckets for keys at or before the query,
  later keys share bucket 0 (the causal mask hides them). Within a direction, exact for
  distances below half its buckets, log-spaced up to `max_distance`, and the last
  bucket beyond.
  """
  rel = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]   # key - query
  if bidirectional:
    per_direction = num_buckets // 2
    buckets = (rel > 0).astype(np.int32) * per_direction
    n = np.abs(rel)
  else:
    per_direction = num_buckets
    buckets = np.zeros_like(rel, np.int32)
    n = -np.minimum(rel, 0)
  max_exact = per_direction // 2
  with np.errstate(divide="ignore"):
    large = max_exact + (np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact)
                         * (per_direction - max_exact)).astype(np.int32)
  large = np.minimum(large, per_direction - 1)
  return (buckets + np.where(n < max_exact, n, large)).astype(np.int32)


class TransformerEncoder(nn.Module):
  """Token (+ position, + optional language) embeddings -> N layers (-> final norm).

  Returns hidden states [B, L, D] of layer `output_layer` (default None: the
  last, after the final norm of the 'vmx' and 't5' families; 0 means the
  embeddings) and the validity mask [B, L] (token id 0 is padding: an imported
  vocabulary whose padding id is another, XLM-R's 1, has the two ids swapped).
  Layers above `output_layer` are not built. `family`: see the module docstring.
  """
  vocab_size: int
  num_layers: int = 6
  emb_dim: int = 512
  num_heads: int = 8
  head_dim: Optional[int] = None  # default emb_dim // num_heads
  mlp_dim: int = 2048
  max_length: int = 512
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  activation: str = "gelu"
  position_embedding: str = "learned"
  num_languages: int = 0  # > 0 adds a language embedding to every position
  scan_layers: bool = False
  remat_policy: str = "none"
  dtype: jnp.dtype = jnp.float32
  output_layer: Optional[int] = None
  shared_embedding: Optional[nn.Module] = None
  family: str = "vmx"
  norm_epsilon: float = 1e-6             # 'bert': 1e-12 (BERT, MiniLM), 1e-5 (XLM-R)
  type_vocab_size: int = 2               # 'bert': token-type table rows (type 0 is used)
  position_offset: int = 0               # 'bert': XLM-R's 2 (padding_idx + 1)
  pooler: bool = False                   # 'bert': tanh(Dense(first token)), pooling='pooler'
  relative_attention_num_buckets: int = 32   # 't5'
  relative_attention_max_distance: int = 128  # 't5'
  # With scan_layers: layers after which the scan is cut (a model reading an intermediate
  # layer, e.g. InfoXLM's universal layer, then runs only the segments below it). The
  # segments' parameters are `layers_from_<first layer>` instead of one `layers`.
  scan_boundaries: Sequence[int] = ()

  @property
  def depth(self) -> int:
    """How many layers run (all of them unless output_layer is set)."""
    return self.num_layers if self.output_layer is None else self.output_layer

  def setup(self):
    check_sizes(self)
    if not 0 <= self.depth <= self.num_layers:
      raise ConfigError(f"output_layer={self.output_layer} outside [0, {self.num_layers}]")
    if self.family not in FAMILIES:
      raise ConfigError(f"TransformerEncoder.family={self.family!r}; expected one of {FAMILIES}")
    if self.position_embedding not in POSITION_EMBEDDINGS:
      raise ConfigError(f"position_embedding={self.position_embedding!r}; "
                        f"expected one of {POSITION_EMBEDDINGS}")
    self.token_embed = self.shared_embedding or layers.Embed(
        self.vocab_size, self.emb_dim, dtype=self.dtype, name="token_embed")
    if self.family == "bert":
      self.type_embed = layers.Embed(self.type_vocab_size, self.emb_dim, dtype=self.dtype,
                                     axes=("token_types", "embed"),
                                     embedding_init=nn.initializers.normal(0.02),
                                     name="token_type_embed")
      self.embed_norm = layers.LayerNorm(self.norm_epsilon, self.dtype, name="embed_norm")
      if self.pooler:
        self.pooler_dense = layers.Dense(self.emb_dim, ("embed", "mlp"), use_bias=True,
                                         dtype=self.dtype, name="pooler")
    if self.family == "t5":
      self.relative_attention_bias = nnp.param_with_axes(
          "relative_attention_bias", nn.initializers.normal(0.02),
          (self.num_heads, self.relative_attention_num_buckets), jnp.float32,
          axes=("heads", "relpos_buckets"))
    elif self.position_embedding == "learned":
      self.position_embed = layers.Embed(self.max_length + self.position_offset, self.emb_dim,
                                         dtype=self.dtype, axes=("length", "embed"),
                                         embedding_init=nn.initializers.normal(0.02),
                                         name="position_embed")
    if self.num_languages:
      self.language_embed = layers.Embed(self.num_languages, self.emb_dim, dtype=self.dtype,
                                         axes=("languages", "embed"),
                                         embedding_init=nn.initializers.normal(0.02),
                                         name="language_embed")
    if self.family == "vmx":
      self.final_norm = layers.LayerNorm(dtype=self.dtype, name="final_norm")
    elif self.family == "t5":
      self.final_norm = layers.RMSNorm(self.norm_epsilon, self.dtype, name="final_norm")
    self.embed_dropout = nn.Dropout(self.dropout_rate)
    self.layer_stack = self._make_layers()

  @property
  def segments(self) -> list[tuple[int, int]]:
    """(first layer, end) of each scanned segment of the built layers."""
    cuts = sorted({b for b in self.scan_boundaries if 0 < b < self.depth})
    edges = [0, *cuts, self.depth]
    return list(zip(edges[:-1], edges[1:]))

  def _make_layers(self):
    cls = {"vmx": EncoderLayer, "bert": BertLayer, "t5": T5Layer}[self.family]
    kwargs = layer_kwargs(self)
    if self.family != "vmx":
      kwargs["norm_epsilon"] = self.norm_epsilon
    for b in self.scan_boundaries:
      if not (isinstance(b, int) and 0 < b < self.num_layers):
        raise ConfigError(f"TransformerEncoder.scan_boundaries={list(self.scan_boundaries)}: "
                          f"expected layers 1 .. {self.num_layers - 1}")
    make = lambda depth, name: make_layer_stack(  # noqa: E731
        self, cls, kwargs, depth, self.scan_layers, self.remat_policy,
        num_inputs=2 if self.family == "t5" else 1, name=name)
    if not self.scan_layers or len(self.segments) == 1:
      return make(self.depth, "layers")
    return [make(end - start, f"layers_from_{start}") for start, end in self.segments]

  def position_bias(self, length: int) -> Array:
    """'t5': the relative position bias [1, H, L, L] every layer adds to its logits."""
    buckets = relative_position_buckets(length, length, self.relative_attention_num_buckets,
                                        self.relative_attention_max_distance)
    return jnp.take(self.relative_attention_bias, jnp.asarray(buckets), axis=1)[None]

  def embed(self, tokens_BxL: Array, lang_B: Optional[Array],
            positions_BxL: Optional[Array] = None) -> Array:
    """Token (+ position, + language) embeddings. `positions_BxL`: each token's position in
    its sentence (packed rows; default 0, 1, ... along the row); `lang_B`: a language id per
    row [B], or per token [B, L] (packed rows)."""
    x = self.token_embed(tokens_BxL)
    length = tokens_BxL.shape[1]
    if length > self.max_length:
      raise ValueError(f"sequence length {length} > max_length {self.max_length}")
    if self.family == "t5":
      pass  # positions enter as the relative attention bias
    elif self.position_embedding == "learned" and self.position_offset:
      # XLM-R: padding sits at position offset-1, the first token at `position_offset`
      valid = (tokens_BxL > 0).astype(jnp.int32)
      pos = (jnp.cumsum(valid, axis=1) - 1 if positions_BxL is None else positions_BxL)
      x = x + self.position_embed(jnp.where(valid > 0, pos + self.position_offset,
                                            self.position_offset - 1))
    elif self.position_embedding == "learned":
      x = x + (self.position_embed(jnp.arange(length))[None] if positions_BxL is None
               else self.position_embed(positions_BxL))
    elif self.position_embedding == "sinusoidal":
      table = jnp.asarray(layers.sinusoidal_positions(self.max_length, self.emb_dim), self.dtype)
      x = x + (table[None, :length] if positions_BxL is None else table[positions_BxL])
    if self.num_languages:
      if lang_B is None:
        raise ValueError("this encoder has language embeddings: pass language ids")
      lang = self.language_embed(lang_B)
      x = x + (lang[:, None, :] if lang.ndim == 2 else lang)
    if self.family == "bert":
      x = self.embed_norm(x + self.type_embed(jnp.zeros((1, 1), jnp.int32)))
    return x

  def pool(self, hidden_BxLxD: Array, valid_BxL: Array, method: str = "mean") -> Array:
    """Sentence vectors [B, D] (float32): `pool`, or 'pooler' (BERT's tanh(Dense(first)))."""
    if method != "pooler":
      return pool(hidden_BxLxD, valid_BxL, method)
    return self.pooler_vector(hidden_BxLxD[:, 0])

  def pooler_vector(self, first_xD: Array) -> Array:
    """BERT's pooler on first-token states [..., D]: tanh(Dense(first))."""
    if not (self.family == "bert" and self.pooler):
      raise ConfigError("pooling='pooler' needs TransformerEncoder.family='bert' and "
                        "TransformerEncoder.pooler=True")
    return jnp.tanh(self.pooler_dense(first_xD)).astype(jnp.float32)

  def __call__(self, tokens_BxL: Array, lang_B: Optional[Array] = None,
               deterministic: bool = True, depth: Optional[int] = None,
               segment_ids_BxL: Optional[Array] = None, positions_BxL: Optional[Array] = None):
    """`depth`: run only the first `depth` layers of the built ones (a model reading an
    intermediate layer, e.g. InfoXLM's universal layer, on some of its inputs); the
    output of a layer below the top is taken before any final norm. `segment_ids_BxL` and
    `positions_BxL`: packed rows (vmx/packing.py): a token attends to its own sentence
    only and takes its position within it."""
    depth = self.depth if depth is None else depth
    if not 0 <= depth <= self.depth:
      raise ConfigError(f"TransformerEncoder: depth={depth} outside [0, {self.depth}] "
                        "(the layers this encoder builds)")
    if self.scan_layers and 0 < depth < self.depth and depth not in (
        end for _, end in self.segments):
      raise ConfigError(f"TransformerEncoder: reading layer {depth} of {self.depth} of a scanned "
                        f"stack needs TransformerEncoder.scan_boundaries to include {depth} "
                        "(or SCAN_LAYERS = False)")
    valid_BxL = tokens_BxL > 0
    mask = layers.make_attention_mask(valid_BxL, valid_BxL, segment_ids_BxL=segment_ids_BxL)
    x = self.embed(tokens_BxL, lang_B, positions_BxL)
    x = self.embed_dropout(x, deterministic=deterministic)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    if depth == 0:
      return x, valid_BxL
    inputs = (mask, self.position_bias(tokens_BxL.shape[1])) if self.family == "t5" else (mask,)
    if self.scan_layers and len(self.segments) > 1:
      for (_, end), segment in zip(self.segments, self.layer_stack):
        if end <= depth:
          x, _ = segment(x, *inputs, deterministic)
    elif self.scan_layers:
      x, _ = self.layer_stack(x, *inputs, deterministic)
    else:
      for lyr in self.layer_stack[:depth]:
        x = lyr(x, *inputs, deterministic)
    if depth < self.num_layers or self.family == "bert":
      return x, valid_BxL
    return self.final_norm(x), valid_BxL

  def hidden(self, x: Tokens, lang: Optional[Array] = None, deterministic: bool = True,
             depth: Optional[int] = None):
    """(hidden states, validity mask) of token rows [B, L] or of a packed feature (its
    rows; `lang` per sentence, put on each of its tokens)."""
    if not isinstance(x, Packed):
      return self(x, lang, deterministic, depth)
    if lang is not None and self.num_languages:
      lang = x.per_token(lang)
    return self(x.tokens, lang, deterministic, depth, x.segment_ids, x.positions)

  def sentences(self, x: Tokens, lang: Optional[Array] = None, deterministic: bool = True,
                method: str = "mean", depth: Optional[int] = None) -> Array:
    """Pooled sentence vectors (float32) of token rows [B, L] -> [B, D], or of a packed
    feature -> [*S, D] in the examples' order (the same vectors)."""
    hidden, valid = self.hidden(x, lang, deterministic, depth)
    if not isinstance(x, Packed):
      return self.pool(hidden, valid, method)
    if method == "pooler":
      return self.pooler_vector(x.first(hidden))
    return x.pool(hidden, method)


def check_sizes(stack: nn.Module):
  """ConfigError naming the binding for a non-positive size or a dropout rate outside [0, 1)."""
  cls = type(stack).__name__
  for field in ("vocab_size", "emb_dim", "num_heads", "mlp_dim", "max_length"):
    value = getattr(stack, field)
    check_range(positive_int(value), cls, field, value, "a positive integer")
  check_range(isinstance(stack.num_layers, int) and stack.num_layers >= 0, cls, "num_layers",
              stack.num_layers, "an integer >= 0")
  for field in ("dropout_rate", "attention_dropout_rate"):
    value = getattr(stack, field)
    check_range(0.0 <= value < 1.0, cls, field, value, "a rate in [0, 1)")


def layer_kwargs(stack: nn.Module) -> dict:
  """Per-layer settings of an encoder or decoder stack (head_dim defaults to emb_dim / heads)."""
  if not stack.head_dim and stack.emb_dim % stack.num_heads:
    raise ConfigError(f"{type(stack).__name__}: emb_dim {stack.emb_dim} is not divisible by "
                      f"num_heads {stack.num_heads}; set head_dim")
  return dict(num_heads=stack.num_heads, head_dim=stack.head_dim or stack.emb_dim // stack.num_heads,
              mlp_dim=stack.mlp_dim, dropout_rate=stack.dropout_rate,
              attention_dropout_rate=stack.attention_dropout_rate,
              activation=stack.activation, dtype=stack.dtype)


def make_layer_stack(parent: nn.Module, layer_cls, kwargs: dict, depth: int, scan: bool,
                     remat_policy: str, num_inputs: int, name: str):
  """`depth` layers of `layer_cls`, optionally rematerialized and/or scanned.

  A layer is called as layer(x, *inputs, deterministic) with `num_inputs`
  broadcast inputs (mask, conditioning, ...). Scanned: one module named `name`
  whose params have a leading 'layers' axis; else a list `{name}_{i}`.
  """
  if remat_policy not in REMAT_POLICIES:
    raise ConfigError(f"remat_policy={remat_policy!r}; expected one of {REMAT_POLICIES}")
  if depth == 0:
    return None
  cls = layer_cls
  if remat_policy != "none":
    policy = (jax.checkpoint_policies.checkpoint_dots if remat_policy == "dots"
              else jax.checkpoint_policies.nothing_saveable)
    # nn.remat counts `self` as argument 0: x=1, inputs=2.., deterministic=num_inputs+2,
    # which must stay a Python bool (dropout branches on it). (flax.linen.partitioning's
    # remat counts from x instead.)
    cls = nn.remat(layer_cls, policy=policy, prevent_cse=not scan,
                   static_argnums=(num_inputs + 2,))
  if not scan:
    return [cls(**kwargs, parent=parent, name=f"{name}_{i}") for i in range(depth)]
  scanned = nnp.scan_with_axes(
      cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
      in_axes=(nn.broadcast,) * (num_inputs + 1), length=depth, axis_name="layers")
  return scanned(**kwargs, scanned=True, parent=parent, name=name)


def pool(hidden_BxLxD: Array, valid_BxL: Array, method: str = "mean") -> Array:
  """Sentence vector [B, D] from hidden states: masked mean, or the first token (CLS).
  ('pooler' is `TransformerEncoder.pool`: it needs the encoder's parameters.)"""
  if method == "mean":
    w = valid_BxL.astype(jnp.float32)[..., None]
    return (hidden_BxLxD.astype(jnp.float32) * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
  if method == "first":
    return hidden_BxLxD[:, 0].astype(jnp.float32)
  raise ConfigError(f"pooling={method!r}; expected one of {POOLING_METHODS}")


class ProjectionHead(nn.Module):
  """MLP on sentence vectors: Dense(d1) -> act -> ... -> Dense(dn); () = identity."""
  features: Sequence[int] = ()
  activation: str = "relu"
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxD: Array) -> Array:
    for i, f in enumerate(self.features):
      if i:
        x_BxD = layers.activation(self.activation)(x_BxD)
      # alternate the logical axes: ("mlp", "mlp") would name one mesh axis twice
      axes = ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")
      x_BxD = layers.Dense(f, axes, use_bias=self.use_bias, dtype=self.dtype,
                           name=f"dense_{i}")(x_BxD)
    return x_BxD.astype(jnp.float32)
