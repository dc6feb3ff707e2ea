"""EMS (Mao, Chu, Kurohashi: "EMS: Efficient and Effective Massively Multilingual
Sentence Representation Learning"): a dual encoder trained with cross-lingual token
reconstruction (XTR) plus a contrastive head. Details not in the paper's text follow
the authors' code (github.com/Mao-KU/EMS, modeling/model_v2.py).

For a translation pair (x, y) with languages (l_x, l_y), one shared Transformer
encoder (no language token on its input) gives mean-pooled sentence vectors
u = enc(x), v = enc(y).

XTR: from u and the embedding of the TARGET language token <2 l_y> (d_la = 128),
    h = swish(W_fc [e(l_y) ; u]),  q = softmax(W_emb h)          (Eq. 4, `xtr_norms=False`)
  The authors' code adds LayerNorm + dropout on e(l_y) and a LayerNorm after the swish,
  h = LayerNorm(swish(W_fc [LN(e(l_y)) ; u])): `xtr_norms=True`, the module's default (the
  CPU-scale configs and their results); gin_configs/ems.gin, named after the paper, runs
  Eq. 4 as written.
  (W_fc: (d + d_la) -> (d + d_la); W_emb: its own projection to the vocabulary, no
  bias; with `xtr_shared_embedding` W_fc maps to d and W_emb is the input token
  table). Target: the bag of tokens of the translation, p(t) = count(t in y) / |y|
  (padding excluded; sums to 1. The authors' code gives each DISTINCT token 1/|y|).
  XTR(x -> y) = KL(p_y || q(u, l_y)); both directions are used.
Contrastive: z = W1 ReLU(W2 u) (d -> d -> d_cntrs = 128; `contrastive_dims`), cosine
  similarity / T (T = 0.1), cross-entropy over in-batch negatives in both directions.
Loss per batch = (1/B) sum_i [XTR(x_i -> y_i) + XTR(y_i -> x_i)
                              + CE(x_i -> y_i) + CE(y_i -> x_i)]
(the code's xtr + 2 * mean-of-both-directions CE), with the two terms switchable
(`xtr_weight`, `contrastive_weight`) for Table 13's ablations. Negatives are the
GLOBAL batch (the authors' DDP code used per-GPU batches).
The sentence embedding for retrieval is u (the pooled encoder output).

Batch features: PairFeatureConverter (left_tokens, right_tokens, left_lang, right_lang).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, layers, losses, packing
from vmx.errors import ConfigError
from vmx.models.base import SentenceEncoderModel, SentenceVector


class EMS(nn.Module):
  """Shared encoder + XTR head + contrastive head."""
  encoder: encoders.TransformerEncoder
  num_languages: int                       # target-language tokens of the XTR head
  language_dim: int = 128                  # d_la
  use_language_token: bool = True          # False: XTR sees only the sentence vector
  xtr_shared_embedding: bool = False       # True: W_emb = the input token table
  xtr_norms: bool = True                   # the authors' code's LayerNorms; False: Eq. 4
  contrastive_dims: Sequence[int] = (1024, 128)   # () = no MLP: cosine on u itself
  pooling: str = "mean"

  def setup(self):
    enc = self.encoder
    self.token_embed = layers.Embed(enc.vocab_size, enc.emb_dim, dtype=enc.dtype,
                                    name="token_embed")
    self.sentence_encoder = enc.clone(parent=self, name="sentence_encoder",
                                      shared_embedding=self.token_embed)
    width = enc.emb_dim
    if self.use_language_token:
      self.target_language_embed = layers.Embed(
          self.num_languages, self.language_dim, dtype=enc.dtype, axes=("languages", "embed"),
          embedding_init=nn.initializers.normal(0.02), name="target_language_embed")
      if self.xtr_norms:
        self.language_norm = layers.LayerNorm(dtype=enc.dtype, name="language_norm")
        self.language_dropout = nn.Dropout(enc.dropout_rate)
      width += self.language_dim
    # W_fc keeps the width (d + d_la), or maps to d when W_emb is the input table.
    self.xtr_fc = layers.Dense(enc.emb_dim if self.xtr_shared_embedding else width,
                               ("embed", "mlp"), use_bias=True, dtype=enc.dtype, name="xtr_fc")
    if self.xtr_norms:
      self.xtr_norm = layers.LayerNorm(dtype=enc.dtype, name="xtr_norm")
    if not self.xtr_shared_embedding:
      self.xtr_out = layers.Dense(enc.vocab_size, ("mlp", "vocab"), use_bias=False,
                                  dtype=enc.dtype, name="xtr_out")
    self.contrastive_head = encoders.ProjectionHead(tuple(self.contrastive_dims),
                                                    activation="relu", name="contrastive_head")

  def encode(self, tokens_BxL, deterministic: bool = True):
    """u: mean-pooled encoder output [B, D] (the sentence embedding; token rows or a packed
    feature, vmx/packing.py)."""
    return self.sentence_encoder.sentences(tokens_BxL, None, deterministic, self.pooling)

  def xtr_logits(self, u_BxD, target_lang_B, deterministic: bool = True):
    """Logits [B, V] of the bag-of-tokens distribution of the translation."""
    x = u_BxD
    if self.use_language_token:
      lang = self.target_language_embed(target_lang_B)
      if self.xtr_norms:
        lang = self.language_dropout(self.language_norm(lang), deterministic=deterministic)
      x = jnp.concatenate([lang.astype(x.dtype), x], axis=-1)    # u_la ⊕ u (Eq. 4)
    h = jax.nn.swish(self.xtr_fc(x))
    if self.xtr_norms:
      h = self.xtr_norm(h)
    logits = self.token_embed.attend(h) if self.xtr_shared_embedding else self.xtr_out(h)
    return logits.astype(jnp.float32)

  def __call__(self, left_tokens, right_tokens, left_lang, right_lang,
               deterministic: bool = True):
    """Both sides' vectors and heads; `right_tokens` None: `left_tokens` is a packed pair
    (vmx/packing.py `pair`: the left sentences, then the right ones), read in one pass."""
    if right_tokens is None:
      uv = self.encode(left_tokens, deterministic)
      u, v = uv[:left_lang.shape[0]], uv[left_lang.shape[0]:]
    else:
      u = self.encode(left_tokens, deterministic)
      v = self.encode(right_tokens, deterministic)
    return {"u": u, "v": v,
            "logits_u": self.xtr_logits(u, right_lang, deterministic),   # predicts y's tokens
            "logits_v": self.xtr_logits(v, left_lang, deterministic),    # predicts x's tokens
            "z_u": self.contrastive_head(u), "z_v": self.contrastive_head(v)}


class EMSModel(SentenceEncoderModel):
  """EMS: XTR + contrastive, summed per pair, averaged over the batch."""
  # An imported (or CONTRASTIVE) dual encoder's `encoder/...` fills the sentence encoder
  # and the token table; the XTR and contrastive heads start fresh.
  INITIAL_CHECKPOINT_ASSIGNMENT = ((r"token_embed/(.*)", r"encoder/token_embed/\1"),
                                   (r"sentence_encoder/(.*)", r"encoder/\1"))
  FEATURE_CONVERTER = "PairFeatureConverter"
  CONFIG_FIELDS = ("module", "temperature", "xtr_weight", "contrastive_weight")

  def sentence_vector(self) -> SentenceVector:
    # the sentence encoder's, its token table shared with the XTR head (kept outside it)
    enc = self.module.encoder
    return SentenceVector(enc, self.module.pooling, enc.depth, params="sentence_encoder",
                          token_table="token_embed")

  def __init__(self, module: EMS, temperature: float = 0.1, xtr_weight: float = 1.0,
               contrastive_weight: float = 1.0, mask_duplicates: bool = True):
    super().__init__(module)
    self.mask_duplicates = mask_duplicates   # (§3.3 is silent on repeated sentences)
    if xtr_weight <= 0 and contrastive_weight <= 0:
      raise ConfigError("EMSModel: xtr_weight and contrastive_weight are both 0: nothing to train")
    self.temperature = temperature
    self.xtr_weight = xtr_weight
    self.contrastive_weight = contrastive_weight

  def _apply(self, params, batch, dropout_rng):
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    pair = packing.pair(batch)
    left, right = ((pair, None) if pair is not None else
                   (batch["left_tokens"], batch["right_tokens"]))
    return self.module.apply({"params": params}, left, right,
                             batch["left_lang"], batch["right_lang"],
                             deterministic=dropout_rng is None, rngs=rngs)

  def packed_features(self):
    return {"left_tokens": 0, "right_tokens": 0}

  def packed_groups(self):
    return {packing.PAIR: packing.PAIR_FEATURES}   # one encoder reads both sides

  def per_pair(self, out, batch):
    """What the objective reads of the module outputs, per pair: the XTR terms of both
    directions [B] and the contrastive head's vectors [B, D]."""
    pair = packing.pair(batch)
    if pair is not None:   # both targets at once: the left sentences, then the right ones
      b = out["logits_u"].shape[0]
      kl = losses.bag_of_tokens_kl_packed(
          jnp.concatenate([out["logits_v"], out["logits_u"]]), pair.tokens, pair.segment_ids,
          pair.owner())
      xtr_yx, xtr_xy = kl[:b], kl[b:]
    else:
      xtr_xy = losses.bag_of_tokens_kl(out["logits_u"], batch["right_tokens"])
      xtr_yx = losses.bag_of_tokens_kl(out["logits_v"], batch["left_tokens"])
    return {"xtr_xy": xtr_xy, "xtr_yx": xtr_yx, "z_u": out["z_u"], "z_v": out["z_v"]}

  def objective(self, pairs, batch):
    """(loss, metrics) from `per_pair`'s terms: the EMS objective."""
    xtr = jnp.mean(pairs["xtr_xy"] + pairs["xtr_yx"])
    # in_batch_softmax_loss averages the two directions: x2 = their sum per pair.
    ce, m = losses.in_batch_softmax_loss(pairs["z_u"], pairs["z_v"], self.temperature, True,
                                         **self.duplicate_keys(batch))
    contrastive = 2.0 * ce
    loss = self.xtr_weight * xtr + self.contrastive_weight * contrastive
    return loss, {"loss": loss, "xtr": xtr, "contrastive": contrastive,
                  "in_batch_accuracy": m["in_batch_accuracy"]}

  def compute_loss(self, params, batch, dropout_rng, flax_mutables=None):
    return self.grad_cache_loss(self.grad_cache_embed(params, batch, dropout_rng), batch,
                                flax_mutables)

  # GradCache split (train.grad_cache_chunks): the loss reads the batch only through the
  # per-pair XTR terms and contrastive vectors, so the [B, vocab] XTR logits exist for one
  # chunk at a time.
  def grad_cache_embed(self, params, batch, dropout_rng):
    return self.per_pair(self._apply(params, batch, dropout_rng), batch)

  def grad_cache_loss(self, pairs, batch, flax_mutables=None):
    return (*self.objective(pairs, batch), flax_mutables)

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    """u: the pooled encoder output (the encoder reads no language id)."""
    return self.module.apply({"params": params}, tokens_BxL, True, method=EMS.encode)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    input_types = input_types or {}
    dummy = {k: jnp.ones(s, input_types.get(k, jnp.int32)) for k, s in input_shapes.items()}
    zeros = jnp.zeros(input_shapes["left_tokens"][:1], jnp.int32)
    return self.module.init({"params": rng}, dummy["left_tokens"], dummy["right_tokens"],
                            dummy.get("left_lang", zeros), dummy.get("right_lang", zeros),
                            deterministic=True)
