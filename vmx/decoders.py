"""Transformer decoder conditioned on a sentence vector, with NO cross-attention.

VMSST's decoder (Wieting et al. 2023, §4; the same block as their earlier BGT
code): a causal Transformer whose only view of the source is a conditioning
vector c = [z_lang ; z_sem]. Each layer is

  x = x + SelfAttn_causal(LN(x))
  x = x + W_c [LN(x) ; c]          (in place of cross-attention; W_c: (d + |c|) x d)
  x = x + MLP(LN(x))

and the output logits read the conditioning vector too:
  logits = W_out [h ; c]           (W_out: (d + |c|) x V; for VMSST |c| = 2d, so 3d x V)
or, factorized (Table 4 ablation), logits = W_v (W_f [h ; c]) with W_f: (d + |c|) x d, W_v: d x V.

Both concatenations are computed without materializing [h ; c] per token:
[h ; c] W = h W[:d] + c W[d:], and c W[d:] is one row per sentence. Same
parameters, same function, ~1/3 of the FLOPs of the naive form.

The first decoder input is a start embedding chosen by the target language
(`num_languages` > 0) or one learned start vector (`num_languages` = 0).
Sequences are the encoder's tokens (no EOS) plus EOS: see `decoder_targets`.

`family` picks the layers, like `TransformerEncoder.family`:
  'vmx'  pre-LayerNorm layers and learned absolute positions (vmx's own models);
  't5'   mT5's decoder without its cross-attention (VMSST §6.5, the pretrained setting:
         the decoder is "re-purposed" from mT5): RMSNorm pre-norm, T5's causal bucketed
         relative position bias computed once and shared by the layers, gated-GELU MLP,
         no biases, unscaled q.k. The conditioning sublayer takes the place of mT5's
         cross-attention, and the conditioned kernels keep the part acting on the hidden
         state (`kernel`) apart from the part acting on the conditioning vector
         (`cond_kernel`): launch/import_checkpoint.py --decoder fills the self-attention,
         MLP, norms, position bias and `output/kernel` (mT5's lm_head) from an mT5
         checkpoint, and only the conditioning parts and the language start embeddings
         start fresh (vmx/modeldir/hf_import.py).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nnp

from vmx import layers
from vmx.data.vocab import EOS_ID
from vmx.encoders import (LayerSettings, check_sizes, layer_kwargs, make_layer_stack,
                          relative_position_buckets)
from vmx.errors import ConfigError

Array = jax.Array
FAMILIES = ("vmx", "t5")


def decoder_targets(tokens_BxL: Array) -> tuple[Array, Array]:
  """(targets, mask): `tokens` (0-padded, no EOS) with EOS after the last token.

  A sentence that fills all L positions (truncated) gets no EOS: its end is unknown.
  """
  valid = tokens_BxL > 0
  length_B = valid.sum(-1)
  pos = jnp.arange(tokens_BxL.shape[1])[None]
  targets = jnp.where(pos == length_B[:, None], EOS_ID, tokens_BxL)
  return targets.astype(jnp.int32), pos <= length_B[:, None]


def _part_init(rows: int, total_rows: int):
  """layers.default_kernel_init's distribution for `rows` of a `total_rows` x F kernel
  (fan-in `total_rows`): a split kernel starts as the merged one does, part by part."""
  return nn.initializers.variance_scaling(rows / total_rows, "fan_in", "truncated_normal")


class ConditionedLinear(nn.Module):
  """y = [x ; c] W (+ b) with x [B, L, D], c [B, C] (or, packed rows, `(c [N, C], owner
  [B, L])`: each slot takes its own sentence's conditioning, vmx/packing.py).

  W is one (D + C) x F `kernel`, or with `split_kernel` a D x F `kernel` and a C x F
  `cond_kernel`: the same function, each part initialized with the merged kernel's
  distribution, so that a pretrained D x F matrix can fill `kernel` alone."""
  features: int
  kernel_axes: tuple[str, str]
  use_bias: bool = True
  split_kernel: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxD: Array, cond_BxC) -> Array:
    cond_BxC, owner_BxL = cond_BxC if isinstance(cond_BxC, tuple) else (cond_BxC, None)
    d, c = x_BxLxD.shape[-1], cond_BxC.shape[-1]
    if self.split_kernel:
      w_x = nnp.param_with_axes("kernel", _part_init(d, d + c), (d, self.features),
                                jnp.float32, axes=self.kernel_axes)
      w_c = nnp.param_with_axes("cond_kernel", _part_init(c, d + c), (c, self.features),
                                jnp.float32, axes=self.kernel_axes)
    else:
      kernel = nnp.param_with_axes("kernel", layers.default_kernel_init,
                                   (d + c, self.features), jnp.float32, axes=self.kernel_axes)
      w_x, w_c = kernel[:d], kernel[d:]
    y = layers.matmul_2d(x_BxLxD.astype(self.dtype), w_x.astype(self.dtype))
    y_c = jnp.dot(cond_BxC.astype(self.dtype), w_c.astype(self.dtype))  # once per sentence
    if self.use_bias:
      bias = nnp.param_with_axes("bias", nn.initializers.zeros, (self.features,), jnp.float32,
                                 axes=(self.kernel_axes[-1],))
      y_c = y_c + bias.astype(self.dtype)
    if owner_BxL is not None:   # packed: each slot's sentence's row (free slots: any)
      return y + jnp.take(y_c, jnp.minimum(owner_BxL, y_c.shape[0] - 1), axis=0)
    return y + y_c[:, None, :]


class DecoderLayer(LayerSettings):
  """Pre-LN decoder layer: causal self-attention, conditioning, MLP (see module doc)."""

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_Bx1xLxL: Array, cond_BxC: Array,
               deterministic: bool):
    drop = lambda h: nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = layers.LayerNorm(dtype=self.dtype, name="pre_self_attention_norm")(x_BxLxD)
    h = layers.MultiHeadAttention(self.num_heads, self.head_dim, self.attention_dropout_rate,
                                  dtype=self.dtype, name="self_attention")(
                                      h, h, mask_Bx1xLxL, deterministic)
    x = x_BxLxD + drop(h)
    h = layers.LayerNorm(dtype=self.dtype, name="pre_conditioning_norm")(x)
    h = ConditionedLinear(x.shape[-1], ("mlp", "embed"), dtype=self.dtype,
                          name="conditioning")(h, cond_BxC)
    x = x + drop(h)
    h = layers.LayerNorm(dtype=self.dtype, name="pre_mlp_norm")(x)
    h = layers.MlpBlock(self.mlp_dim, self.activation, self.dropout_rate, dtype=self.dtype,
                        name="mlp")(h, deterministic)
    x = x + drop(h)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    if self.scanned:
      return x, None
    return x


class T5DecoderLayer(LayerSettings):
  """mT5's decoder layer with the conditioning sublayer in place of its cross-attention:
  x + SelfAttn_causal(RMS(x), +rel. bias); x + W_c [RMS(x) ; c]; x + GatedMLP(RMS(x))."""
  norm_epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_Bx1xLxL: Array, bias_1xHxLxL: Array,
               cond_BxC: Array, deterministic: bool):
    drop = lambda h: nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = layers.RMSNorm(self.norm_epsilon, self.dtype, name="pre_self_attention_norm")(x_BxLxD)
    h = layers.MultiHeadAttention(self.num_heads, self.head_dim, self.attention_dropout_rate,
                                  dtype=self.dtype, scale_query=False, name="self_attention")(
                                      h, h, mask_Bx1xLxL, deterministic, bias_1xHxLxL)
    x = x_BxLxD + drop(h)
    h = layers.RMSNorm(self.norm_epsilon, self.dtype, name="pre_conditioning_norm")(x)
    h = ConditionedLinear(x.shape[-1], ("mlp", "embed"), use_bias=False, split_kernel=True,
                          dtype=self.dtype, name="conditioning")(h, cond_BxC)
    x = x + drop(h)
    h = layers.RMSNorm(self.norm_epsilon, self.dtype, name="pre_mlp_norm")(x)
    h = layers.GatedMlpBlock(self.mlp_dim, self.activation, self.dropout_rate,
                             dtype=self.dtype, name="mlp")(h, deterministic)
    x = x + drop(h)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    return (x, None) if self.scanned else x


class ConditionedDecoder(nn.Module):
  """Causal Transformer decoder reading a conditioning vector instead of encoder states.

  __call__(targets [B, L], lang [B], cond [B, C]) -> logits [B, L, V] (float32),
  where position t predicts targets[t] from the start embedding, targets[:t] and cond.
  """
  vocab_size: int
  num_layers: int = 6
  emb_dim: int = 512
  num_heads: int = 8
  head_dim: Optional[int] = None
  mlp_dim: int = 2048
  max_length: int = 512
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  activation: str = "gelu"
  num_languages: int = 0          # > 0: start embedding per target language; 0: one start vector
  factorized_output: bool = False  # Table 4: (d + C) x d then d x V instead of (d + C) x V
  scan_layers: bool = False
  remat_policy: str = "none"
  dtype: jnp.dtype = jnp.float32
  shared_embedding: Optional[nn.Module] = None
  family: str = "vmx"                         # 'vmx' or 't5' (module docstring)
  norm_epsilon: float = 1e-6                  # 't5'
  relative_attention_num_buckets: int = 32    # 't5'
  relative_attention_max_distance: int = 128  # 't5'

  def setup(self):
    check_sizes(self)
    if self.num_layers < 1:
      raise ConfigError(f"decoder num_layers={self.num_layers}; need at least 1")
    if self.family not in FAMILIES:
      raise ConfigError(f"ConditionedDecoder.family={self.family!r}; expected one of {FAMILIES}")
    t5 = self.family == "t5"
    self.token_embed = self.shared_embedding or layers.Embed(
        self.vocab_size, self.emb_dim, dtype=self.dtype, name="token_embed")
    if t5:
      self.relative_attention_bias = nnp.param_with_axes(
          "relative_attention_bias", nn.initializers.normal(0.02),
          (self.num_heads, self.relative_attention_num_buckets), jnp.float32,
          axes=("heads", "relpos_buckets"))
    else:
      self.position_embed = layers.Embed(self.max_length, self.emb_dim, dtype=self.dtype,
                                         axes=("length", "embed"),
                                         embedding_init=nn.initializers.normal(0.02),
                                         name="position_embed")
    self.start_embed = layers.Embed(max(self.num_languages, 1), self.emb_dim, dtype=self.dtype,
                                    axes=("languages", "embed"),
                                    embedding_init=nn.initializers.normal(0.02),
                                    name="start_embed")
    kwargs = layer_kwargs(self)
    if t5:
      kwargs["norm_epsilon"] = self.norm_epsilon
    self.layer_stack = make_layer_stack(self, T5DecoderLayer if t5 else DecoderLayer, kwargs,
                                        self.num_layers, self.scan_layers, self.remat_policy,
                                        num_inputs=3 if t5 else 2, name="layers")
    self.final_norm = (layers.RMSNorm(self.norm_epsilon, self.dtype, name="final_norm") if t5
                       else layers.LayerNorm(dtype=self.dtype, name="final_norm"))
    self.embed_dropout = nn.Dropout(self.dropout_rate)
    if self.factorized_output:
      self.output_factor = ConditionedLinear(self.emb_dim, ("mlp", "embed"), use_bias=False,
                                             split_kernel=t5, dtype=self.dtype,
                                             name="output_factor")
      self.output_vocab = layers.Dense(self.vocab_size, ("embed", "vocab"), dtype=self.dtype,
                                       name="output_vocab")
    else:
      self.output = ConditionedLinear(self.vocab_size, ("embed", "vocab"), use_bias=False,
                                      split_kernel=t5, dtype=self.dtype, name="output")

  def position_bias(self, length: int) -> Array:
    """'t5': the causal relative position bias [1, H, L, L] every layer adds to its logits."""
    buckets = relative_position_buckets(length, length, self.relative_attention_num_buckets,
                                        self.relative_attention_max_distance,
                                        bidirectional=False)
    return jnp.take(self.relative_attention_bias, jnp.asarray(buckets), axis=1)[None]

  def __call__(self, targets_BxL: Array, lang_B: Optional[Array], cond_BxC: Array,
               deterministic: bool = True) -> Array:
    b, length = targets_BxL.shape
    self._check(length, lang_B)
    start = self.start_embed(lang_B if self.num_languages else jnp.zeros((b,), jnp.int32))
    x = jnp.concatenate([start[:, None, :], self.token_embed(targets_BxL[:, :-1])], axis=1)
    if self.family != "t5":   # 't5': positions enter as the relative attention bias
      x = x + self.position_embed(jnp.arange(length))[None]
    # Input position t holds targets[t-1]: a valid key while t <= length of targets.
    # Every query (padding too) sees keys <= t only, so no row is fully masked and
    # nothing after t leaks into position t.
    input_valid = jnp.concatenate([jnp.ones((b, 1), bool), targets_BxL[:, :-1] > 0], axis=1)
    mask = layers.make_attention_mask(jnp.ones_like(input_valid), input_valid, causal=True)
    return self._layers_and_output(x, mask, cond_BxC.astype(self.dtype), deterministic)

  def packed(self, targets_RxL: Array, segment_ids_RxL: Array, positions_RxL: Array,
             lang_RxL: Optional[Array], cond_NxC: Array, owner_RxL: Array,
             deterministic: bool = True) -> Array:
    """Logits [R, L, V] of packed rows (vmx/packing.py): each sentence decoded as `__call__`
    decodes its row, from its language's start embedding (`lang_RxL`: the language of each
    slot's sentence), with its own conditioning (`cond_NxC` row `owner_RxL`), seeing its
    own earlier slots only. `targets_RxL` hold each sentence's tokens and its EOS."""
    length = targets_RxL.shape[1]
    self._check(length, lang_RxL)
    start = self.start_embed(lang_RxL if self.num_languages
                             else jnp.zeros_like(targets_RxL))
    shifted = jnp.concatenate([jnp.zeros_like(targets_RxL[:, :1]), targets_RxL[:, :-1]], 1)
    x = jnp.where((positions_RxL == 0)[..., None], start, self.token_embed(shifted))
    if self.family != "t5":
      x = x + self.position_embed(positions_RxL)
    # a slot sees its own sentence's slots up to itself (tokens, EOS)
    in_sentence = segment_ids_RxL > 0
    mask = layers.make_attention_mask(jnp.ones_like(in_sentence), in_sentence, causal=True,
                                      segment_ids_BxL=segment_ids_RxL)
    return self._layers_and_output(x, mask, (cond_NxC.astype(self.dtype), owner_RxL),
                                   deterministic)

  def _check(self, length: int, lang):
    if length > self.max_length:
      raise ValueError(f"sequence length {length} > decoder max_length {self.max_length}")
    if self.num_languages and lang is None:
      raise ValueError("this decoder starts from a language embedding: pass language ids")

  def _layers_and_output(self, x, mask, cond, deterministic: bool) -> Array:
    """The layers and the conditioned output on embedded inputs [B, L, D]; `cond`: [B, C],
    or (packed) ([N, C], owner [B, L])."""
    x = self.embed_dropout(x, deterministic=deterministic)
    x = nnp.with_sharding_constraint(x, ("batch", "length", "embed"))
    length = x.shape[1]
    inputs = (mask, self.position_bias(length), cond) if self.family == "t5" else (mask, cond)
    if self.scan_layers:
      x, _ = self.layer_stack(x, *inputs, deterministic)
    else:
      for lyr in self.layer_stack:
        x = lyr(x, *inputs, deterministic)
    h = self.final_norm(x)
    if self.factorized_output:
      logits = self.output_vocab(self.output_factor(h, cond))
    else:
      logits = self.output(h, cond)
    logits = nnp.with_sharding_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32)


def packed_targets(tokens_RxL: Array, segment_ids_RxL: Array) -> tuple[Array, Array]:
  """`decoder_targets` of packed rows: (targets, mask), EOS in each sentence's reserved slot
  (the one slot of a sentence without a token; a sentence that fills its row has none)."""
  in_sentence = segment_ids_RxL > 0
  targets = jnp.where(in_sentence & (tokens_RxL == 0), EOS_ID, tokens_RxL)
  return targets.astype(jnp.int32), in_sentence
