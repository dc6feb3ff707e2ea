"""EMMA-X (Guo et al., "EMMA-X: An EM-like Multilingual Pre-training Algorithm for
Cross-lingual Representation Learning", NeurIPS 2023), §3 and Appendix G. Details the
paper leaves open follow the authors' code (github.com/guopingiie/EMMA-X, model.py,
criterion.py).

Two models supervise each other:
  M  the cross-lingual encoder: gamma(x) = the CLS (`pooling`) of the last layer, L2
     normalized; s(x, y) = gamma(x) . gamma(y) (a cosine).
  G  the semantic-rank classifier over the relation gamma(x) - gamma(y): a Gaussian
     mixture with N ranks, each a prior pi_r, a mean mu_r and a standard deviation sigma_r
     of the model dimension (Eq. 5, vmx.rank_losses.gmm_log_posterior; `classifier='fcn'` is
     Table 6's fully connected ablation). Rank 1 = translation ... rank N = unrelated
     (0-based indices in the code).
The training has two phases (vmx.training.trainer.Phase), this model's `stage`:
  'warmup'  (phase 1, parallel data, pairs (x, y))
      M: InfoNCE (Eq. 2), s / tau, over both sides of the batch as the authors' code
         does (vmx.losses.paired_batch_infonce): every sentence of [x; y] is an anchor,
         its translation the positive, the other 2B - 2 sentences the negatives.
         `warmup_contrast='eq2'`: Eq. 2 as printed, x -> y with the batch's other y' as
         negatives (vmx.losses.in_batch_softmax_loss, one direction).
      G: cross-entropy (Eq. 4) on relations gamma(a) - y~ of `classifier_batch_size`
         examples a step, anchors a drawn from both sides of the batch: a third
         translations (rank 1), a third random pairs (rank N), a third mixup virtual
         examples y~ = lam y + (1 - lam) y' (Eq. 3, lam ~ U(0, 1), y the translation, y'
         any other sentence of the batch, either side), rank ⌈1 + (N - 1)(1 - lam)⌉ as
         Eq. 3 gives it with λ = 1 - lam (vmx.rank_losses.mixup_rank: a mix is never rank 1);
         gamma is not differentiated here (G learns, M does not).
      Both sides matter: with x -> y alone, M never separates sentences of one language
      and G never sees a same-language pair, which phase 2's text is full of (at CPU
      scale the both-sides warm-up reaches Tatoeba 21.9 after 600 steps, x -> y 19.2).
      s_r follows the similarities of those examples by their rank (Eq. 11; the authors'
         warm-up does the same), so that phase 2 starts with anchors that mean something.
  'em'      (phase 2, non-parallel text only)
      anchors x of the batch against Y = the momentum keys of the batch and a MoCo queue of
      K past keys (momentum encoder, m = 0.999; the anchor's own key is left out, as in the
      authors' code); `e_step_candidates='queue'`: Y = the queue alone, as §3.3 writes it
      ("a queue of random sentences"), emmax_large.gin's setting;
      E-step: c*_G(x, y) = argmax_r p_G(r | x, y) (Eq. 9) and c*_M(x, y) = argmin_r
         |s(x, y) - s_r| (Eq. 10), both targets (stop-gradient);
      M-step, dual supervision: M learns from c*_G with ranking InfoNCE (Eq. 7,
         temperatures tau_1 < ... < tau_{N-1}), G learns from c*_M (Eq. 6, cross-entropy
         on `classifier_batch_size` pairs drawn from the B x (B + K) matrix; the anchor's
         own key counts as rank 1, as the authors' gmm mask);
      s_r <- (1 - eta) s_r + eta mean{s(x, y) : c*_G(x, y) = r} (Eq. 11), an anchor's
      own key and its translation counted as rank 1 (the authors' update_mean).
      `em_parallel=True` (the authors' code, is_pair, which always has it; emmax_tiny.gin:
      on text alone Eq. 7 collapses, docs/emmax.md; the paper's phase 2 reads non-parallel
      text only) adds a batch of translation pairs to the anchors
      (MultiTaskConfig tasks 'text' and 'pairs'): both sides are anchors, and each pair's
      translation is rank 1 for both targets, c*_G and c*_M, as their golden mask.
Loss = encoder term + classifier term; each updates its own parameters only (G sees
stop-gradient embeddings, M's ranks are targets), so the two optimizers of the paper
(G: Adam 3e-5; M: Adam, cosine decay from 5e-4) are `multi_optimizer` subsets
('^classifier/' and the rest).

Choices (stated where the paper is silent or unreadable here):
  * s_r starts evenly spaced, (N - r + 1) / N for rank r (1 for translations, 1/N for
    unrelated pairs): "r / N" counted from the unrelated end, so that the translation rank
    has the largest similarity; EMA rate `rank_ema` (the authors' update_mean, 0.001).
  * tau_r for r = 1..N-1 linearly from `temperature` (0.04, also Eq. 2's) to
    `max_temperature` (the authors' code: 0.05 .. 0.1, the same ratio).
  * The GMM starts with mu = 0 and sigma_r^2 = (r / N) * 2 / D per dimension (the spread
    of random unit vectors' differences, ordered by rank: the authors draw both at
    random); the prior is softmax(pi logits).
  * Non-gradient state (flax_mutables): momentum/params (the key encoder), queue {keys
    [K, D], next, filled} and rank_sims [N]; both stages keep all of it (phase 1 fills the
    queue and moves s_r), so the phases share one train state.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from vmx import encoders, layers, losses, packing, rank_losses
from vmx.errors import ConfigError
from vmx.models import momentum as moco
from vmx.models.base import SentenceEncoderModel

STAGES = ("warmup", "em")
E_STEP_CANDIDATES = ("batch_and_queue", "queue")   # Y of the E-step: vmx's, or §3.3's queue
WARMUP_CONTRASTS = ("both_sides", "eq2")   # phase 1's InfoNCE: the authors' code, or Eq. 2
CLASSIFIERS = ("gmm", "fcn")


class GmmClassifier(nn.Module):
  """G of Eq. 5: log p(rank | relation) of a diagonal Gaussian mixture."""
  num_ranks: int
  dim: int

  def setup(self):
    n, d = self.num_ranks, self.dim
    init_var = np.log((np.arange(1, n + 1) / n) * 2.0 / d).astype(np.float32)
    self.prior_logits = layers.param_with_axes("prior_logits", nn.initializers.zeros, (n,),
                                               jnp.float32, axes=("ranks",))
    self.mean = layers.param_with_axes("mean", nn.initializers.zeros, (n, d), jnp.float32,
                                       axes=("ranks", "embed"))
    self.log_var = layers.param_with_axes(
        "log_var", lambda *_: jnp.broadcast_to(jnp.asarray(init_var)[:, None], (n, d)),
        (n, d), jnp.float32, axes=("ranks", "embed"))

  def __call__(self, relation_MxD):
    """[M, R] log posteriors of relations [M, D]."""
    return rank_losses.gmm_log_posterior(relation_MxD, self.prior_logits, self.mean, self.log_var)

  def pairwise(self, anchor_BxD, other_KxD):
    """[B, K, R] log posteriors of every anchor_b - other_k."""
    return rank_losses.gmm_pairwise_log_posterior(anchor_BxD, other_KxD, self.prior_logits,
                                             self.mean, self.log_var)


class FcnClassifier(nn.Module):
  """Table 6's ablation: a fully connected classifier, Dense(D) -> GELU -> Dense(N)."""
  num_ranks: int
  dim: int

  def setup(self):
    self.hidden = layers.Dense(self.dim, ("embed", "mlp"), use_bias=True, name="hidden")
    self.out = layers.Dense(self.num_ranks, ("mlp", "ranks"), use_bias=True, name="out")

  def __call__(self, relation_MxD):
    h = nn.gelu(self.hidden(relation_MxD.astype(jnp.float32)), approximate=False)
    return jax.nn.log_softmax(self.out(h).astype(jnp.float32), axis=-1)

  def pairwise(self, anchor_BxD, other_KxD):
    rel = anchor_BxD[:, None, :] - other_KxD[None]
    b, k, d = rel.shape
    return self(rel.reshape(b * k, d)).reshape(b, k, -1)


class EmmaX(nn.Module):
  """M (the encoder, `encoder/...`: an imported XLM-R loads as is) and G (`classifier/...`)."""
  encoder: encoders.TransformerEncoder
  num_ranks: int = 4
  classifier: str = "gmm"
  pooling: str = "first"          # the CLS; 'mean' for vocabularies without <s>

  def setup(self):
    cls = {"gmm": GmmClassifier, "fcn": FcnClassifier}[self.classifier]
    self.rank_classifier = cls(self.num_ranks, self.encoder.emb_dim, name="classifier")

  def sentence_vector(self, tokens_BxL, deterministic: bool = True):
    """gamma(x) before normalization, [B, D] float32: the retrieval vector (token rows, or
    a packed feature, vmx/packing.py)."""
    return self.encoder.sentences(tokens_BxL, None, deterministic, self.pooling)

  def classify(self, relation_MxD):
    return self.rank_classifier(relation_MxD)

  def classify_pairwise(self, anchor_BxD, other_KxD):
    return self.rank_classifier.pairwise(anchor_BxD, other_KxD)

  def __call__(self, tokens_BxL, deterministic: bool = True):
    """Initialization: every parameter."""
    v = self.sentence_vector(tokens_BxL, deterministic)
    return self.classify(v - v)


def _draw_excluding(rng, first_M, second_M, n: int):
  """[M] indices uniform over range(n) without first_M[m] and second_M[m] (distinct)."""
  lo, hi = jnp.minimum(first_M, second_M), jnp.maximum(first_M, second_M)
  o = jax.random.randint(rng, first_M.shape, 0, max(n - 2, 1))
  o = o + (o >= lo)
  return o + (o >= hi)


class EmmaXModel(SentenceEncoderModel):
  """One EMMA-X phase (`stage`); see the module docstring."""
  INITIAL_CHECKPOINT_ASSIGNMENT = ((r"encoder/(.*)", r"encoder/\1"),)
  CONFIG_FIELDS = ("module", "stage", "temperature", "max_temperature", "queue_size",
                   "momentum", "rank_ema", "classifier_batch_size", "em_parallel")

  def pooled_encoder(self):
    return self.module.encoder, self.module.pooling

  def __init__(self, module: EmmaX, stage: str = "em", temperature: float = 0.04,
               max_temperature: float = 0.08, queue_size: int = 256, momentum: float = 0.999,
               rank_ema: float = 0.001, classifier_batch_size: int = 1024,
               em_parallel: bool = False, warmup_contrast: str = "both_sides",
               e_step_candidates: str = "batch_and_queue", mask_duplicates: bool = True):
    super().__init__(module)
    self.mask_duplicates = mask_duplicates   # the warm-up's in-batch negatives (Eq. 2)
    if not isinstance(module.num_ranks, int) or module.num_ranks < 2:
      raise ConfigError(f"EmmaX.num_ranks={module.num_ranks!r}: EMMA-X needs N >= 2 semantic "
                        "ranks (translation ... unrelated); the paper uses 4 (NUM_RANKS)")
    if module.classifier not in CLASSIFIERS:
      raise ConfigError(f"EmmaX.classifier={module.classifier!r}; expected one of {CLASSIFIERS}")
    if stage not in STAGES:
      raise ConfigError(f"EmmaXModel.stage={stage!r}; expected one of {STAGES}")
    if not 0 < temperature <= max_temperature:
      raise ConfigError(f"EmmaXModel: temperature={temperature} and max_temperature="
                        f"{max_temperature} must satisfy 0 < temperature <= max_temperature")
    if not isinstance(queue_size, int) or queue_size <= 0:
      raise ConfigError(f"EmmaXModel.queue_size={queue_size!r}: expected a positive integer")
    if not 0.0 <= momentum < 1.0 or not 0.0 < rank_ema <= 1.0:
      raise ConfigError(f"EmmaXModel: momentum={momentum} must be in [0, 1) and rank_ema="
                        f"{rank_ema} in (0, 1]")
    if not isinstance(classifier_batch_size, int) or classifier_batch_size <= 0:
      raise ConfigError(f"EmmaXModel.classifier_batch_size={classifier_batch_size!r}: expected "
                        "a positive integer")
    self.stage, self.temperature, self.max_temperature = stage, temperature, max_temperature
    self.queue_size, self.momentum, self.rank_ema = queue_size, momentum, rank_ema
    self.classifier_batch_size = classifier_batch_size
    if not isinstance(em_parallel, bool):
      raise ConfigError(f"EmmaXModel.em_parallel={em_parallel!r}: expected True or False")
    self.em_parallel = em_parallel
    if warmup_contrast not in WARMUP_CONTRASTS:
      raise ConfigError(f"EmmaXModel.warmup_contrast={warmup_contrast!r}; expected one of "
                        f"{WARMUP_CONTRASTS}")
    self.warmup_contrast = warmup_contrast
    if e_step_candidates not in E_STEP_CANDIDATES or (e_step_candidates == "queue"
                                                      and em_parallel):
      raise ConfigError(f"EmmaXModel.e_step_candidates={e_step_candidates!r}; expected one of "
                        f"{E_STEP_CANDIDATES} ('queue' has no in-batch translations: not with "
                        f"em_parallel=True)")
    self.e_step_candidates = e_step_candidates

  @property
  def num_ranks(self) -> int:
    return self.module.num_ranks

  def feature_converter(self):
    if self.stage == "warmup":
      return "PairFeatureConverter"
    if self.em_parallel:
      return {"text": "MonolingualFeatureConverter", "pairs": "PairFeatureConverter"}
    return "MonolingualFeatureConverter"

  def packed_features(self):
    if self.stage == "warmup":
      return {"left_tokens": 0, "right_tokens": 0}
    if self.em_parallel:
      return {"text/tokens": 0, "pairs/left_tokens": 0, "pairs/right_tokens": 0}
    return {"tokens": 0}

  def packed_groups(self):   # a pair's two sides share rows (one encoder reads both)
    if self.stage == "warmup":
      return {packing.PAIR: packing.PAIR_FEATURES}
    return {"pairs/" + packing.PAIR: tuple("pairs/" + f for f in packing.PAIR_FEATURES)}

  def rank_temperatures(self) -> jnp.ndarray:
    """tau_1 < ... < tau_{N-1} of Eq. 7, linear from temperature to max_temperature."""
    return jnp.asarray(np.linspace(self.temperature, self.max_temperature,
                                   self.num_ranks - 1), jnp.float32)

  def initial_rank_sims(self) -> jnp.ndarray:
    """s_r = (N - r + 1) / N for ranks r = 1..N (see the module docstring)."""
    n = self.num_ranks
    return jnp.asarray((n - np.arange(n)) / n, jnp.float32)

  # --- pieces ---

  def _gamma(self, params, tokens_BxL, dropout_rng):
    """Normalized gamma(x) [B, D] of token rows or a packed feature (a list of packed
    features: their sentences one after the other)."""
    if isinstance(tokens_BxL, list):
      rngs = (jax.random.split(dropout_rng, len(tokens_BxL)) if dropout_rng is not None
              else [None] * len(tokens_BxL))
      return jnp.concatenate([self._gamma(params, t, r) for t, r in zip(tokens_BxL, rngs)])
    v = self.module.apply({"params": params}, tokens_BxL, dropout_rng is None,
                          method=EmmaX.sentence_vector,
                          rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    return losses.l2_normalize(v)

  def _classifier_term(self, params, relation_MxD, ranks_M):
    """Eqs. 4/6: cross-entropy of G on relations (not differentiated into M)."""
    logp = self.module.apply({"params": params}, jax.lax.stop_gradient(relation_MxD),
                             method=EmmaX.classify)
    loss = -jnp.mean(jnp.take_along_axis(logp, ranks_M[:, None], axis=1))
    acc = jnp.mean(jnp.argmax(logp, axis=1) == ranks_M)
    return loss, acc

  def _keys(self, params, flax_mutables, tokens_BxL):
    p = params if flax_mutables is None else flax_mutables["momentum"]["params"]
    return jax.lax.stop_gradient(self._gamma(p, tokens_BxL, None))

  def _warmup_loss(self, params, batch, rng, dropout_rng, flax_mutables):
    n, g = self.num_ranks, self.classifier_batch_size
    d_x, d_y = (jax.random.split(dropout_rng) if dropout_rng is not None else (None, None))
    pair = packing.pair(batch)
    if pair is not None:   # both sides in one pass over their shared rows
      xy = self._gamma(params, pair, d_x)
      x, y = jnp.split(xy, 2)
    else:
      x = self._gamma(params, packing.tokens(batch, "left_tokens"), d_x)
      y = self._gamma(params, packing.tokens(batch, "right_tokens"), d_y)
    b = x.shape[0]
    # M: Eq. 2 over both sides of the batch (translation positive, the other 2B - 2
    # sentences negatives, same-language ones included), or as printed: x -> y only.
    if self.warmup_contrast == "eq2":
      l_m, mm = losses.in_batch_softmax_loss(x, y, self.temperature, bidirectional=False,
                                             normalize=False, **self.duplicate_keys(batch))
    else:
      l_m, mm = losses.paired_batch_infonce(x, y, self.temperature,
                                            **self.duplicate_keys(batch))
    # G: Eq. 4 on translations, random pairs and mixup examples (Eq. 3), anchors and
    # random sentences from both sides.
    z = jax.lax.stop_gradient(jnp.concatenate([x, y], axis=0))                   # [2B, D]
    k_i, k_j, k_l = jax.random.split(rng, 3)
    anchor = jax.random.randint(k_i, (g,), 0, 2 * b)
    partner = (anchor + b) % (2 * b)
    other = _draw_excluding(k_j, anchor, partner, 2 * b)
    lam = jax.random.uniform(k_l, (g,))
    kind = jnp.arange(g)
    lam = jnp.where(kind < g // 3, 1.0, jnp.where(kind < 2 * (g // 3), 0.0, lam))
    mixed = lam[:, None] * z[partner] + (1.0 - lam[:, None]) * z[other]
    ranks = rank_losses.mixup_rank(lam, n)
    l_g, acc_g = self._classifier_term(params, z[anchor] - mixed, ranks)
    metrics = {"infonce_loss": l_m, "infonce_accuracy": mm["in_batch_accuracy"],
               "classifier_loss": l_g, "classifier_accuracy": acc_g}
    new = flax_mutables
    if flax_mutables is not None:
      sims = jnp.sum(z[anchor] * mixed, axis=-1)
      rank_sims = rank_losses.rank_similarity_ema(flax_mutables["rank_sims"], sims, ranks,
                                             jnp.ones_like(sims), self.rank_ema)
      keys = (jnp.split(self._keys(params, flax_mutables, pair), 2)[1] if pair is not None
              else self._keys(params, flax_mutables, packing.tokens(batch, "right_tokens")))
      new = {**flax_mutables, "rank_sims": rank_sims,
             "queue": moco.enqueue(flax_mutables["queue"], keys)}
      for r in range(n):     # what phase 2 starts from (benchmarks/emmax_em_phase.py)
        metrics[f"rank{r + 1}_similarity"] = rank_sims[r]
    return l_m, l_g, metrics, new

  def _em_anchors(self, batch):
    """Phase-2 anchors [A, L] and each one's translation among them ([A], -1: none).
    Non-parallel text only (the paper): A = B, no translations. With `em_parallel` (the
    authors' code, is_pair=True): the text, then both sides of the pairs batch. Packed
    features (vmx/packing.py) stay apart: a list of them, embedded one after the other."""
    if not self.em_parallel:
      tokens = packing.tokens(batch, "tokens")
      return tokens, jnp.full((packing.num_sentences(tokens),), -1, jnp.int32)
    text = packing.tokens(batch, "text/tokens")
    packed = packing.is_packed(text)
    n_t = packing.num_sentences(text)
    n_p = batch["pairs/left_tokens" + ("_starts" if packed else "")].shape[0]
    if packed:   # the text's rows, then the pairs' (both sides)
      tokens = [text, packing.pair(batch, "pairs/")]
    else:
      parts = [text, batch["pairs/left_tokens"], batch["pairs/right_tokens"]]
      length = max(t.shape[1] for t in parts)
      tokens = jnp.concatenate([jnp.pad(t, ((0, 0), (0, length - t.shape[1])))
                                for t in parts])
    partner = jnp.concatenate([jnp.full((n_t,), -1, jnp.int32),
                               n_t + n_p + jnp.arange(n_p, dtype=jnp.int32),
                               n_t + jnp.arange(n_p, dtype=jnp.int32)])
    return tokens, partner

  def _em_loss(self, params, batch, rng, dropout_rng, flax_mutables):
    n, g = self.num_ranks, self.classifier_batch_size
    tokens, partner = self._em_anchors(batch)
    x = self._gamma(params, tokens, dropout_rng)
    b = x.shape[0]
    keys = self._keys(params, flax_mutables, tokens)
    if flax_mutables is None:        # evaluation without train state: the batch's keys only
      others, valid_k = keys, jnp.ones((b,), bool)
      rank_sims = self.initial_rank_sims()
    else:
      queue = flax_mutables["queue"]
      in_queue = jnp.arange(queue["keys"].shape[0]) < queue["filled"]
      if self.e_step_candidates == "queue":     # §3.3: Y = the queue of random sentences
        others, valid_k = queue["keys"], in_queue
      else:
        others = jnp.concatenate([keys, queue["keys"]], axis=0)
        valid_k = jnp.concatenate([jnp.ones((b,), bool), in_queue])
      rank_sims = flax_mutables["rank_sims"]
    cols = jnp.arange(others.shape[0])[None, :]
    # the first B columns are the batch's own keys (not with Y = the queue only)
    in_batch = flax_mutables is None or self.e_step_candidates != "queue"
    own = (cols == jnp.arange(b)[:, None]) & in_batch                           # [B, B+K]
    gold = (cols == partner[:, None]) & in_batch   # translations (em_parallel): rank 1
    valid = valid_k[None, :] & ~own
    sim = x @ others.T                                                            # [B, B+K]
    xs, sim_t = jax.lax.stop_gradient(x), jax.lax.stop_gradient(sim)
    # E-step: ranks from G (Eq. 9) and from M (Eq. 10); targets only.
    logp = self.module.apply({"params": jax.lax.stop_gradient(params)}, xs, others,
                             method=EmmaX.classify_pairwise)
    c_g = jnp.where(gold, 0, jnp.argmax(logp, axis=-1).astype(jnp.int32))
    c_m = jnp.where(own | gold, 0, rank_losses.nearest_rank(sim_t, rank_sims))
    # M-step for M: ranking InfoNCE on c*_G (Eq. 7).
    l_m, _ = rank_losses.ranking_infonce_loss(sim, c_g, valid, self.rank_temperatures())
    # M-step for G: cross-entropy on c*_M (Eq. 6), pairs drawn from the valid ones.
    # (The valid candidates are the first B + filled columns: the queue fills in order.)
    k_a, k_o = jax.random.split(rng)
    ai = jax.random.randint(k_a, (g,), 0, b)
    oi = jax.random.randint(k_o, (g,), 0, jnp.sum(valid_k.astype(jnp.int32)))
    l_g, acc_g = self._classifier_term(params, xs[ai] - others[oi], c_m[ai, oi])
    vf = valid.astype(jnp.float32)
    metrics = {"ranking_loss": l_m, "classifier_loss": l_g, "classifier_accuracy": acc_g,
               "rank_agreement": jnp.sum((c_g == c_m) * vf) / jnp.maximum(vf.sum(), 1.0)}
    for r in range(n):
      metrics[f"rank{r + 1}_fraction"] = jnp.sum((c_g == r) * vf) / jnp.maximum(vf.sum(), 1.0)
    new = flax_mutables
    if flax_mutables is not None:
      # Eq. 11 over G's ranks, the pairs of known rank included as rank 1 (the anchor's own
      # key, a translation), as the authors' update_mean counts them: they hold s_1 at
      # what rank 1 means. Without them, text alone gives s_1 only G's stray rank-1
      # pairs, s_1 sinks below s_2 within 200 steps and Eq. 10 stops ranking (the
      # collapse of docs/emmax.md).
      known = (valid | own) & valid_k[None, :]
      new = {**flax_mutables,
             "rank_sims": rank_losses.rank_similarity_ema(
                 rank_sims, sim_t.reshape(-1), jnp.where(own, 0, c_g).reshape(-1),
                 known.astype(jnp.float32).reshape(-1), self.rank_ema),
             "queue": moco.enqueue(flax_mutables["queue"], keys)}
      for r in range(n):
        metrics[f"rank{r + 1}_similarity"] = new["rank_sims"][r]
    return l_m, l_g, metrics, new

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    training = dropout_rng is not None
    rng, drop = jax.random.split(dropout_rng if training else jax.random.PRNGKey(0))
    term = self._warmup_loss if self.stage == "warmup" else self._em_loss
    l_m, l_g, metrics, new = term(params, batch, rng, drop if training else None,
                                  flax_mutables)
    loss = l_m + l_g   # disjoint parameters: each term trains its own subset
    metrics["loss"] = loss
    return loss, metrics, new

  # --- trainer hooks: momentum encoder, queue, rank similarities ---

  def derive_mutables(self, params, flax_mutables):
    return {**flax_mutables, "momentum": {"params": {"encoder": params["encoder"]}}}

  def after_update(self, params, flax_mutables, step):
    key = moco.ema({"encoder": params["encoder"]}, flax_mutables["momentum"]["params"],
                       self.momentum)
    return {**flax_mutables, "momentum": {"params": key}}

  def flax_mutables_axes(self, params_axes, flax_mutables):
    return {"momentum": {"params": {"encoder": params_axes["encoder"]}},
            "queue": {"keys": (None, "embed"), "next": (), "filled": ()},
            "rank_sims": ("ranks",)}

  def validate_data(self, examples: dict, batch_sizes: dict):
    """Start-up checks against the data: whole steps of keys must fit the queue, and the
    phase-2 sentences must fill it (else it would hold repeats of the anchors)."""
    # Sentences a step: warm-up enqueues the right side of its pairs; phase 2 every
    # anchor (em_parallel: the text and both sides of the pairs).
    per_task = {"pairs": 2} if self.stage == "em" and self.em_parallel else {}
    keys = sum(b * per_task.get(k, 1) for k, b in batch_sizes.items())
    if self.queue_size % keys:
      raise ConfigError(f"EmmaXModel.queue_size={self.queue_size} is not a multiple of the "
                        f"{keys} keys a step (the queue takes whole batches of keys)")
    if self.stage == "em" and all(n is not None for n in examples.values()):
      count = sum(n * per_task.get(k, 1) for k, n in examples.items())
      if count < self.queue_size:
        raise ConfigError(f"EmmaXModel.queue_size={self.queue_size} is larger than the "
                          f"{count} sentences of the phase-2 data: the queue would hold "
                          "repeats of the anchors (lower QUEUE_SIZE or add text)")

  # --- t5x interface ---

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, method=EmmaX.sentence_vector)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    length = max(s[1] for s in input_shapes.values() if len(s) == 2)
    variables = dict(self.module.init({"params": rng}, jnp.ones((1, length), jnp.int32),
                                      deterministic=True))
    d = self.module.encoder.emb_dim
    variables["momentum"] = {"params": {"encoder": variables["params"]["encoder"]}}
    variables["queue"] = moco.new_queue(self.queue_size, d)
    variables["rank_sims"] = self.initial_rank_sims()
    return variables
