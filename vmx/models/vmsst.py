"""VMSST: Variational Multilingual Source-Separation Transformer, and BITRANSLATION.

Wieting, Clark, Cohen, Neubig, Berg-Kirkpatrick. "Beyond Contrastive Learning: A
Variational Generative Model for Multilingual Retrieval". ACL 2023.

Generative story (§3). A translation pair (x_i, x_j) in languages (l_i, l_j) shares
a semantic latent z_sem; each sentence also has a language-specific latent:
  z_sem, z_li, z_lj ~ N(0, I)
  x_i ~ p(x_i | z_sem, z_li),   x_j ~ p(x_j | z_sem, z_lj)       (one shared decoder)

Inference networks (§4), diagonal Gaussians from mean-pooled encoder states
through linear maps to (mean, log-variance):
  q(z_sem | x)        semantic encoder (no language input)
  q(z_l | x, l)       language encoder (a language embedding at its input)
The two encoders share only the token embedding table (so does the decoder).
q(z_sem | x_i, x_j) is approximated with ONE side of the pair: within a batch,
even rows use x_i, odd rows x_j.

Decoder (vmx.decoders.ConditionedDecoder): causal, no cross-attention; the
conditioning vector [z_l ; z_sem] enters every layer and the output projection
([h ; z_l ; z_sem] -> V, 3d x V); its first input is the target language's
embedding.

Objective (§4, Eq. for the full model), per pair, averaged over the global batch
(loss = its negative):
  log p(x_i | mu_sem(x_j)) + log p(x_j | mu_sem(x_i))                    translation
  + lambda * ( E_q[log p(x_i | z_sem, z_li)] + E_q[log p(x_j | z_sem, z_lj)]
               - beta_t * [KL(q(z_sem)) + KL(q(z_li)) + KL(q(z_lj))] )   ELBO
  beta_t = kl_weight * min(1, t / kl_anneal_steps)                        KL annealing
with one reparameterized sample of every latent, KLs in closed form.
log p(x) is the sum of token log-probabilities (EOS included): nats per sentence,
as in the authors' fairseq code (`--sentence-avg`).

The loss, with what each term is reduced over:
  loss = vmsst_weight * L_VMSST + contrastive_weight * L_C
  L_VMSST = mean over pairs of [translation NLLs + elbo_weight * (reconstruction NLLs
            + beta_t * KLs)]; each NLL summed over the sentence's tokens, each KL over
            the latent's dimensions
  L_C     = symmetric in-batch InfoNCE of (mu_sem(x_i), mu_sem(x_j)) (cosine / tau):
            mean over pairs (`contrastive_reduction='mean'`) or its sum ('sum')
VMSST and BITRANSLATION: vmsst_weight 1, contrastive_weight 0. VMSST-CONTRASTIVE as
§6.4 states it: the contrastive loss is the base and lambda weights the VMSST loss,
  loss = L_C (mean) + lambda * L_VMSST,  lambda = .0005 (6L, pretrained), .001 (24L random)
i.e. contrastive_weight 1, vmsst_weight lambda, the ELBO keeping its own elbo_weight
inside L_VMSST (models/vmsst_contrastive.gin). The reading this repository used before,
  loss = L_VMSST + lambda * L_C (sum over pairs),
is contrastive_weight lambda, vmsst_weight 1, reduction 'sum'
(ablations/vmsst_contrastive_tiny_summed.gin; docs/vmsst.md compares the two).
With MATRYOSHKA_DIMS, L_C is summed over prefixes of mu_sem and the whole
(`losses.matryoshka`), so each prefix is a vector of its own; VMSST has no L_C to do so.

Choices where the paper leaves room (documented; switches where both readings
are plausible):
* Translation terms condition on [0 ; mu_sem(x_src)]: the language slot holds the
  prior mean, so it carries nothing of the target sentence; which language to
  produce is said by the decoder's start embedding.
* The conditioning sublayer is linear, [LN(x) ; c] -> d plus residual, as in the
  authors' BGT code (its ReLU result is discarded there).
* Latent size = d_model (`latent_dim=None`), latent maps without bias.
* VMSST-CONTRASTIVE's InfoNCE is averaged over the pairs, like the contrastive
  baseline's (vmx.losses.in_batch_softmax_loss); the generative terms keep their
  per-sentence sums, so with lambda = .0005 they weigh ~0.05 nats against ~ln(B) for
  the contrastive term: the VMSST loss acts as a regularizer of the contrastive model.
* Several language encoders (Table 4 "4 enc.", Table 6 "per language"): every
  encoder runs on the whole batch and each row keeps the output of the encoder
  its language is assigned to (languages round-robin over encoders unless
  `language_encoder_assignment` lists an encoder per language id). Same for
  per-language decoders. Cost grows with the number of encoders: meant for the
  small language sets of those tables.
* "One encoder for both variables": one encoder (no language embedding, since
  the semantic vector must not depend on it) with two pairs of latent maps.

BITRANSLATION (§6.3) is `language_latents=False` with `elbo_weight=0`: translation
terms only, decoder conditioned on mu_sem alone, no KL.

Inference embedding: mu_sem of the semantic encoder (`embed`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from vmx import decoders, encoders, layers, losses, packing
from vmx.errors import ConfigError
from vmx.models.base import GRAD_CACHE_ROW, SentenceEncoderModel, SentenceVector

Array = jax.Array
CONTRASTIVE_REDUCTIONS = ("sum", "mean")


class GaussianHead(nn.Module):
  """Sentence vector [B, D] -> (mean, logvar) [B, Z] of a diagonal Gaussian."""
  latent_dim: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxD: Array):
    mean = layers.Dense(self.latent_dim, ("embed", "mlp"), dtype=self.dtype, name="mean")(x_BxD)
    logvar = layers.Dense(self.latent_dim, ("embed", "mlp"), dtype=self.dtype,
                          name="logvar")(x_BxD)
    return mean.astype(jnp.float32), logvar.astype(jnp.float32)


def _select(outputs: Sequence[Array], group_B: Optional[Array]) -> Array:
  """Row b of outputs[group_B[b]] (one-hot mix, sharding-friendly); `group` may index the
  outputs' first several dimensions (a packed row's slots: [R, L])."""
  if len(outputs) == 1:
    return outputs[0]
  stacked = jnp.stack(outputs)  # [N, B, ...]
  g = group_B.ndim
  onehot = jax.nn.one_hot(group_B, len(outputs), dtype=stacked.dtype)  # [B, N]
  onehot = jnp.moveaxis(onehot, -1, 0).reshape(onehot.shape[-1:] + group_B.shape
                                              + (1,) * (stacked.ndim - 1 - g))
  return (onehot * stacked).sum(0)


class VMSST(nn.Module):
  """Semantic encoder, language encoder(s) and decoder(s) sharing one token table."""
  encoder: encoders.TransformerEncoder       # template: semantic and language encoders
  decoder: decoders.ConditionedDecoder       # template: the decoder(s)
  num_languages: int                         # language ids (the run's LANGUAGES)
  latent_dim: Optional[int] = None           # default: encoder emb_dim
  pooling: str = "mean"
  language_latents: bool = True              # False: BITRANSLATION (no z_l, no ELBO)
  num_language_encoders: int = 1
  language_encoder_assignment: Optional[Sequence[int]] = None  # encoder index per language id
  per_language_decoders: bool = False        # Table 6: one decoder per language
  single_encoder: bool = False               # Table 4: one encoder for z_sem and z_l
  language_embedding_in_encoder: bool = True
  language_embedding_in_decoder: bool = True

  def setup(self):
    enc = self.encoder
    if self.decoder.emb_dim != enc.emb_dim or self.decoder.vocab_size != enc.vocab_size:
      raise ConfigError(f"decoder (emb_dim {self.decoder.emb_dim}, vocab "
                        f"{self.decoder.vocab_size}) and encoder (emb_dim {enc.emb_dim}, vocab "
                        f"{enc.vocab_size}) share the token table: sizes must match")
    self._check_options()
    z = self.latent_dim or enc.emb_dim
    self.token_embed = layers.Embed(enc.vocab_size, enc.emb_dim, dtype=enc.dtype,
                                    name="token_embed")
    self.semantic_encoder = enc.clone(parent=self, name="semantic_encoder", num_languages=0,
                                      shared_embedding=self.token_embed)
    self.semantic_head = GaussianHead(z, name="semantic_latent")
    if self.language_latents:
      if self.single_encoder:
        self.language_encoders = [self.semantic_encoder]
      else:
        n_lang = self.num_languages if self.language_embedding_in_encoder else 0
        self.language_encoders = [
            enc.clone(parent=self, name=f"language_encoder_{k}", num_languages=n_lang,
                      shared_embedding=self.token_embed)
            for k in range(self.num_language_encoders)]
      self.language_heads = [GaussianHead(z, name=f"language_latent_{k}")
                             for k in range(len(self.language_encoders))]
    n_dec = self.num_languages if self.per_language_decoders else 1
    dec_langs = self.num_languages if self.language_embedding_in_decoder else 0
    self.decoders = [self.decoder.clone(parent=self, name=f"decoder_{k}",
                                        num_languages=dec_langs,
                                        shared_embedding=self.token_embed)
                     for k in range(n_dec)]

  def _check_options(self):
    if self.single_encoder and self.num_language_encoders != 1:
      raise ConfigError("single_encoder=True uses one encoder: num_language_encoders must be 1")
    if self.single_encoder and self.language_embedding_in_encoder:
      raise ConfigError("single_encoder=True: the shared encoder also gives the semantic "
                        "vector, which must not read the language; set "
                        "language_embedding_in_encoder=False")
    if not self.language_latents and (self.num_language_encoders != 1 or self.single_encoder
                                      or not self.language_embedding_in_encoder):
      raise ConfigError("language_latents=False (BITRANSLATION) has no language encoder: "
                        "leave the language-encoder options at their defaults")
    if self.language_encoder_assignment is not None:
      a = list(self.language_encoder_assignment)
      if len(a) != self.num_languages or not all(0 <= k < self.num_language_encoders
                                                 for k in a):
        raise ConfigError(f"language_encoder_assignment needs {self.num_languages} entries in "
                          f"[0, {self.num_language_encoders}), got {a}")

  # -- inference networks ---------------------------------------------------
  def semantic(self, tokens_BxL, deterministic: bool = True):
    """(mean, logvar) of q(z_sem | x) (token rows [B, L], or a packed feature)."""
    return self.semantic_head(self.semantic_encoder.sentences(tokens_BxL, None, deterministic,
                                                              self.pooling))

  def language(self, tokens_BxL, lang_B: Array, deterministic: bool = True):
    """(mean, logvar) of q(z_l | x, l), from the encoder assigned to language l."""
    outs = []
    for enc, head in zip(self.language_encoders, self.language_heads):
      outs.append(head(enc.sentences(tokens_BxL, lang_B if enc.num_languages else None,
                                     deterministic, self.pooling)))
    group = None
    if len(outs) > 1:
      assignment = (jnp.asarray(self.language_encoder_assignment, jnp.int32)
                    if self.language_encoder_assignment is not None
                    else jnp.arange(self.num_languages) % len(outs))
      group = assignment[lang_B]
    return _select([m for m, _ in outs], group), _select([v for _, v in outs], group)

  def decode(self, targets_BxL: Array, lang_B: Array, cond_BxC: Array,
             deterministic: bool = True) -> Array:
    """Logits [B, L, V] of targets given the conditioning vector (target language's decoder)."""
    outs = [dec(targets_BxL, lang_B, cond_BxC, deterministic) for dec in self.decoders]
    return _select(outs, lang_B if len(outs) > 1 else None)

  def decode_packed(self, rows: packing.Packed, langs: Sequence[Array],
                    conds: Sequence[Array], deterministic: bool = True):
    """Decoder passes over packed rows, one call over the passes' rows stacked: pass k
    decodes every sentence of `rows` given its own row of `conds[k]` [N, C], from the start
    embedding of its language `langs[k]` [N]. Returns (logits [P, R, L, V], targets, mask
    [P, R, L])."""
    p, n = len(conds), langs[0].shape[0]
    owner = jnp.concatenate([jnp.minimum(rows.owner(), n - 1) + k * n for k in range(p)])
    tile = lambda x: jnp.concatenate([x] * p)  # noqa: E731
    targets, mask = decoders.packed_targets(tile(rows.tokens), tile(rows.segment_ids))
    lang_RxL = jnp.take(jnp.concatenate(langs), owner)
    outs = [dec.packed(targets, tile(rows.segment_ids), tile(rows.positions), lang_RxL,
                       jnp.concatenate(conds), owner, deterministic) for dec in self.decoders]
    logits = _select(outs, lang_RxL if len(outs) > 1 else None)
    return (logits.reshape(p, -1, *logits.shape[1:]), targets.reshape(p, -1, targets.shape[1]),
            mask.reshape(p, -1, mask.shape[1]))

  def encode(self, tokens_BxL: Array, lang_B: Optional[Array] = None,
             deterministic: bool = True, side: str = "left") -> Array:
    """Sentence embedding: mu_sem (language ids are not read)."""
    del lang_B, side
    return self.semantic(tokens_BxL, deterministic)[0]

  # -- training forward -----------------------------------------------------
  def __call__(self, left_tokens, right_tokens, left_lang, right_lang,
               deterministic: bool = True, sample: bool = False, row_B=None):
    """Everything the objective needs, for pairs (x_i, x_j) = (left, right).

    Returns a dict with semantic (and language) posteriors of both sides and
    `logits` [B, P, L, V], `targets`/`mask` [B, P, L] for the P decoder passes (a packed
    pair, vmx/packing.py, `right_tokens` None: [P / 2, R, L, V] and [P / 2, R, L], passes 0
    and 1, then 2 and 3, each over the pair's shared rows):
    0: x_i | [0 ; mu_sem(x_j)],  1: x_j | [0 ; mu_sem(x_i)]       (translation)
    2: x_i | [z_li ; z_sem],     3: x_j | [z_lj ; z_sem]          (reconstruction)
    BITRANSLATION has passes 0 and 1 only, conditioned on mu_sem alone.
    `sample=True` draws the latents from q (rng 'latent'); otherwise z = mean.
    """
    b = left_lang.shape[0]
    joint = right_tokens is None     # a packed pair: both sides in `left_tokens`' rows
    halves = lambda x: tuple((v[:b], v[b:]) for v in x)  # noqa: E731  (left, right)
    out = {}
    if joint:
      (out["sem_left"], out["sem_right"]) = zip(*halves(self.semantic(left_tokens,
                                                                     deterministic)))
    else:
      out["sem_left"] = self.semantic(left_tokens, deterministic)
      out["sem_right"] = self.semantic(right_tokens, deterministic)
    mu_l, mu_r = out["sem_left"][0], out["sem_right"][0]
    if self.language_latents:
      zero = jnp.zeros_like(mu_l)
      conds = [jnp.concatenate([zero, mu_r], -1), jnp.concatenate([zero, mu_l], -1)]
    else:
      conds = [mu_r, mu_l]
    targets = [left_tokens, right_tokens]
    langs = [left_lang, right_lang]
    if self.language_latents:
      if joint:
        out["lang_left"], out["lang_right"] = zip(*halves(self.language(
            left_tokens, jnp.concatenate([left_lang, right_lang]), deterministic)))
      else:
        out["lang_left"] = self.language(left_tokens, left_lang, deterministic)
        out["lang_right"] = self.language(right_tokens, right_lang, deterministic)
      # Alternate the side feeding z_sem by the pair's row in the batch (`row_B`: its
      # row in the global batch when a GradCache chunk holds only some rows).
      take_left = ((jnp.arange(b) if row_B is None else row_B) % 2 == 0)[:, None]
      out["sem"] = tuple(jnp.where(take_left, a, c)
                         for a, c in zip(out["sem_left"], out["sem_right"]))
      draw = ((lambda m, lv: losses.reparameterize(self.make_rng("latent"), m, lv)) if sample
              else (lambda m, lv: m))
      z_sem = draw(*out["sem"])
      z_li, z_lj = draw(*out["lang_left"]), draw(*out["lang_right"])
      conds += [jnp.concatenate([z_li, z_sem], -1), jnp.concatenate([z_lj, z_sem], -1)]
      targets += [left_tokens, right_tokens]
      langs += [left_lang, right_lang]
    if joint:   # [P / 2, R, L(, V)]: passes (0, 1) and (2, 3) each over the pair's rows
      cat = lambda i: [jnp.concatenate(x[i:i + 2]) for x in (langs, conds)]  # noqa: E731
      passes = [cat(i) for i in range(0, len(conds), 2)]
      out["logits"], out["targets"], out["mask"] = self.decode_packed(
          left_tokens, [lg for lg, _ in passes], [c for _, c in passes], deterministic)
      return out
    # One decoder call over [B * P] rows, pair-major so each device keeps its own rows.
    p = len(conds)
    dec_targets, mask = decoders.decoder_targets(jnp.stack(targets, 1).reshape(b * p, -1))
    logits = self.decode(dec_targets, jnp.stack(langs, 1).reshape(b * p),
                         jnp.stack(conds, 1).reshape(b * p, -1), deterministic)
    out["logits"] = logits.reshape(b, p, *logits.shape[1:])
    out["targets"] = dec_targets.reshape(b, p, -1)
    out["mask"] = mask.reshape(b, p, -1)
    return out


class VMSSTModel(SentenceEncoderModel):
  """VMSST, VMSST-CONTRASTIVE, BITRANSLATION and the ablations.

  The KL annealing step is model state: `flax_mutables['annealing']['updates']`
  (checkpointed with the train state, +1 per training `compute_loss` call).
  Evaluation (`flax_mutables` None) uses the fully annealed weight.
  """
  # An imported (or CONTRASTIVE) dual encoder's `encoder/...` fills the semantic and the
  # language encoders and the shared token table. The decoder(s) start fresh, or from an
  # imported mT5 decoder (`decoder/...`, launch/import_checkpoint.py --decoder; §6.5) when
  # the model directory has one: then only what conditions on the sentence vector (the
  # conditioning sublayers, the output's `cond_kernel`) and the language start embeddings
  # are new.
  INITIAL_CHECKPOINT_ASSIGNMENT = (
      (r"token_embed/(.*)", r"encoder/token_embed/\1"),
      (r"(?:semantic_encoder|language_encoder_\d+)/(.*)", r"encoder/\1"),
      (r"decoder_\d+/(.*)", r"decoder/\1"))
  FEATURE_CONVERTER = "PairFeatureConverter"
  CONFIG_FIELDS = ("module", "elbo_weight", "kl_weight", "kl_anneal_steps",
                   "contrastive_weight", "contrastive_temperature", "contrastive_reduction",
                   "vmsst_weight", "matryoshka_dims")

  def __init__(self, module: VMSST, elbo_weight: float = 0.1, kl_weight: float = 1.0,
               kl_anneal_steps: int = 1_000_000, contrastive_weight: float = 0.0,
               contrastive_temperature: float = 0.05, contrastive_reduction: str = "mean",
               vmsst_weight: float = 1.0, mask_duplicates: bool = True,
               matryoshka_dims: Sequence[int] = ()):
    super().__init__(module)
    self.mask_duplicates = mask_duplicates   # VMSST-CONTRASTIVE's InfoNCE (§6.4 is silent)
    if vmsst_weight <= 0:
      raise ConfigError(f"vmsst_weight={vmsst_weight}: must be > 0 (the decoder and the "
                        f"language encoders learn only from the VMSST loss); for a "
                        f"contrastive model alone use models/contrastive.gin")
    if module.language_latents and elbo_weight <= 0:
      raise ConfigError("elbo_weight must be > 0 when the model has language latents (the "
                        "language encoders learn only from the ELBO); for BITRANSLATION set "
                        "VMSST.language_latents=False")
    if not module.language_latents and (elbo_weight or kl_weight != 1.0):
      raise ConfigError("language_latents=False (BITRANSLATION) has no ELBO: set "
                        "elbo_weight=0 and leave kl_weight at 1")
    if contrastive_reduction not in CONTRASTIVE_REDUCTIONS:
      raise ConfigError(f"contrastive_reduction={contrastive_reduction!r}; expected one of "
                        f"{CONTRASTIVE_REDUCTIONS}")
    self.elbo_weight, self.kl_weight = elbo_weight, kl_weight
    self.kl_anneal_steps = kl_anneal_steps
    self.contrastive_weight = contrastive_weight
    self.contrastive_temperature = contrastive_temperature
    self.contrastive_reduction = contrastive_reduction
    self.vmsst_weight = vmsst_weight
    # MATRYOSHKA_DIMS: the contrastive term summed over prefixes of mu_sem, the vector
    # inference returns; the generative terms read the whole vector
    self.set_matryoshka_dims(matryoshka_dims)
    if self.matryoshka_dims and not contrastive_weight:
      raise ConfigError(f"VMSSTModel.matryoshka_dims={list(self.matryoshka_dims)}: nested "
                        "dimensions are trained by the contrastive term, which this model "
                        "does not have (VMSST-CONTRASTIVE: models/vmsst_contrastive.gin)")

  def _apply(self, params, batch, dropout_rng, sample: bool):
    rngs = None
    if dropout_rng is not None:
      d, z = jax.random.split(dropout_rng)
      rngs = {"dropout": d, "latent": z}
    pair = packing.pair(batch)
    left, right = ((pair, None) if pair is not None else
                   (batch["left_tokens"], batch["right_tokens"]))
    return self.module.apply({"params": params}, left, right,
                             batch["left_lang"], batch["right_lang"],
                             deterministic=dropout_rng is None,
                             sample=sample and dropout_rng is not None,
                             row_B=batch.get(GRAD_CACHE_ROW), rngs=rngs)

  def packed_features(self):
    # one free slot after each sentence: the decoder's EOS target (decoders.packed_targets)
    return {"left_tokens": 1, "right_tokens": 1}

  def packed_groups(self):   # the encoders and decoders read both sides: shared rows
    return {packing.PAIR: packing.PAIR_FEATURES}

  def per_pair(self, params, batch, dropout_rng):
    """What the objective reads of the module outputs, per pair: sequence NLLs and token
    counts of the P decoder passes [B, P], the KL terms [B] (with language latents) and
    the semantic means of both sides [B, D]."""
    out = self._apply(params, batch, dropout_rng, sample=True)
    pair = packing.pair(batch)
    if pair is None:
      nll = losses.sequence_nll(out["logits"], out["targets"], out["mask"])
      tokens = out["mask"].sum(-1).astype(jnp.float32)
    else:   # each pass's slots summed per sentence, [P / 2, 2B] -> [B, P]: pass (0, 1) is
      # (the left sentences, the right ones) of the pair's first decoder pass
      slot_nll = losses.token_nll(out["logits"], out["targets"], out["mask"])
      mask = out["mask"].astype(jnp.float32)
      nll = jnp.stack([pair.sentence_sum(x) for x in slot_nll])
      tokens = jnp.stack([pair.sentence_sum(x) for x in mask])
      nll, tokens = (x.reshape(2 * len(mask), -1).T for x in (nll, tokens))
    pairs = {"nll": nll, "tokens": tokens,
             "sem_left": out["sem_left"][0], "sem_right": out["sem_right"][0]}
    if self.module.language_latents:
      pairs["kl"] = (losses.gaussian_kl(*out["sem"]) + losses.gaussian_kl(*out["lang_left"])
                     + losses.gaussian_kl(*out["lang_right"]))
    return pairs

  def objective(self, params, batch, dropout_rng, kl_anneal: Array):
    """(loss, metrics dict of scalars): the negated objective of the module docstring."""
    return self.objective_of(self.per_pair(params, batch, dropout_rng), batch, kl_anneal)

  def objective_of(self, pairs, batch, kl_anneal: Array):
    """The objective from `per_pair`'s terms."""
    nll_BxP, tokens_BxP = pairs["nll"], pairs["tokens"]
    translation = (nll_BxP[:, 0] + nll_BxP[:, 1]).mean()
    loss = translation
    m = {"translation_nll": translation,
         "translation_nll_per_token": nll_BxP[:, :2].sum() / tokens_BxP[:, :2].sum()}
    if self.module.language_latents:
      reconstruction = (nll_BxP[:, 2] + nll_BxP[:, 3]).mean()
      kl = pairs["kl"].mean()
      beta = self.kl_weight * kl_anneal
      loss = loss + self.elbo_weight * (reconstruction + beta * kl)
      m.update(reconstruction_nll=reconstruction, kl=kl, kl_weight=beta,
               elbo=-(reconstruction + kl))
    if self.contrastive_weight:
      m["vmsst_loss"] = loss
    loss = self.vmsst_weight * loss
    # In-batch retrieval accuracy of the semantic means: logged for every variant (it
    # tracks what Tatoeba measures); a loss term only for VMSST-CONTRASTIVE.
    keys = self.duplicate_keys(batch)
    c, cm = self.matryoshka_loss(   # (MATRYOSHKA_DIMS: summed over mu_sem's prefixes)
        lambda left, right: losses.in_batch_softmax_loss(
            left, right, self.contrastive_temperature, **keys),
        pairs["sem_left"], pairs["sem_right"])
    m["in_batch_accuracy"] = cm["in_batch_accuracy"]
    m.update({k: v for k, v in cm.items() if k.startswith("loss_dim")})
    if self.contrastive_weight:
      if self.contrastive_reduction == "sum":
        c = c * pairs["sem_left"].shape[0]
      loss = loss + self.contrastive_weight * c
      m["contrastive"] = cm["loss"]
    m["loss"] = loss
    return loss, m

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    if flax_mutables is None:   # evaluation: the fully annealed weight
      loss, m = self.objective(params, batch, dropout_rng, jnp.ones((), jnp.float32))
      return loss, m, None
    return self.grad_cache_loss(self.grad_cache_embed(params, batch, dropout_rng), batch,
                                flax_mutables)

  # GradCache split (train.grad_cache_chunks): the objective reads the batch only through
  # the per-pair terms, so the decoder's [B, P, L, vocab] logits exist for one chunk at a
  # time; the KL-annealing counter advances in the loss, once a step.
  def grad_cache_embed(self, params, batch, dropout_rng):
    return self.per_pair(params, batch, dropout_rng)

  def grad_cache_loss(self, pairs, batch, flax_mutables):
    updates = flax_mutables["annealing"]["updates"]
    loss, m = self.objective_of(pairs, batch,
                                losses.linear_anneal(updates, self.kl_anneal_steps))
    return loss, m, {**flax_mutables, "annealing": {"updates": updates + 1}}

  def sentence_vector(self) -> SentenceVector:
    # the semantic encoder's Gaussian mean; its parameters and the shared token table are
    # where a run that starts from this model's encoder finds them (vmx/finetune/)
    enc = self.module.encoder
    return SentenceVector(enc, self.module.pooling, enc.depth,
                          "then the semantic Gaussian head's mean (mu_sem)",
                          "semantic_encoder", "token_embed")

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    """mu_sem: the semantic encoder's mean (no language id)."""
    return self.module.apply({"params": params}, tokens_BxL, method=VMSST.encode)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    input_types = input_types or {}
    dummy = {k: jnp.ones(s, input_types.get(k, jnp.int32)) for k, s in input_shapes.items()}
    b = dummy["left_tokens"].shape[0]
    zeros = jnp.zeros((b,), jnp.int32)
    variables = self.module.init({"params": rng}, dummy["left_tokens"], dummy["right_tokens"],
                                 dummy.get("left_lang", zeros), dummy.get("right_lang", zeros),
                                 deterministic=True)
    return {**variables, "annealing": {"updates": jnp.zeros((), jnp.int32)}}
