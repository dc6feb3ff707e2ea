"""EMMA-X's pure losses (Guo et al., NeurIPS 2023, §3): the semantic-rank classifier (a
Gaussian mixture over relation vectors), mixup ranks and the ranking InfoNCE. Shapes are in
the argument names, as in vmx/losses.py (the contrastive losses); tested against NumPy
references in tests/test_emmax.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from vmx.losses import _NEG   # a logit that is no candidate (the contrastive losses' own)

Array = jax.Array


# EMMA-X (Guo et al., NeurIPS 2023, §3): semantic-rank classifier G (a Gaussian mixture)
# and the cross-lingual encoder M supervising each other. Ranks are 0-based here:
# index r-1 for the paper's rank r (index 0 = translation, index N-1 = unrelated).

def gmm_log_posterior(relation_MxD: Array, log_prior_R: Array, mean_RxD: Array,
                      log_var_RxD: Array) -> Array:
  """Eq. 5: log p_G(c = r | x, y) for relation vectors gamma(x) - gamma(y) [M, D] under a
  mixture of R diagonal Gaussians (log prior [R], mean [R, D], log variance [R, D]):
    log pi_r + log N(rel | mu_r, sigma_r^2) - logsumexp_j(log pi_j + log N(rel | mu_j, sigma_j^2)).
  Computed in log space: finite for relations arbitrarily far from every mean. [M, R]."""
  rel = relation_MxD.astype(jnp.float32)
  inv_var = jnp.exp(-log_var_RxD.astype(jnp.float32))
  sq = jnp.sum((rel[:, None, :] - mean_RxD[None]) ** 2 * inv_var[None], axis=-1)   # [M, R]
  return jax.nn.log_softmax(_gmm_log_joint(sq, log_prior_R, log_var_RxD), axis=-1)


def _gmm_log_joint(sq_MxR, log_prior_R, log_var_RxD):
  """log pi_r + log N(.|mu_r, sigma_r^2) from the Mahalanobis terms sq [.., R]."""
  d = log_var_RxD.shape[-1]
  log_norm_R = -0.5 * (d * jnp.log(2 * jnp.pi) + jnp.sum(log_var_RxD.astype(jnp.float32), -1))
  return jax.nn.log_softmax(log_prior_R.astype(jnp.float32)) + log_norm_R - 0.5 * sq_MxR


def gmm_pairwise_log_posterior(anchor_BxD: Array, other_KxD: Array, log_prior_R: Array,
                               mean_RxD: Array, log_var_RxD: Array) -> Array:
  """`gmm_log_posterior` of every relation anchor_b - other_k: [B, K, R], without the
  [B, K, D] relations (the Mahalanobis term expanded into matmuls), for the E-step over
  a batch against a queue."""
  a = anchor_BxD.astype(jnp.float32)
  o = other_KxD.astype(jnp.float32)
  inv_var = jnp.exp(-log_var_RxD.astype(jnp.float32))          # [R, D]
  mu = mean_RxD.astype(jnp.float32)
  # sum_d (a - o - mu)^2 / var = (a - mu)^2/var + o^2/var - 2 (a - mu) o / var
  am = a[:, None, :] - mu[None]                                 # [B, R, D]
  t_a = jnp.sum(am * am * inv_var[None], axis=-1)              # [B, R]
  t_o = jnp.einsum("kd,rd->kr", o * o, inv_var)                 # [K, R]
  cross = jnp.einsum("brd,kd->bkr", am * inv_var[None], o)      # [B, K, R]
  sq = jnp.maximum(t_a[:, None, :] + t_o[None] - 2.0 * cross, 0.0)
  return jax.nn.log_softmax(_gmm_log_joint(sq, log_prior_R, log_var_RxD), axis=-1)


def mixup_rank(lam_M: Array, num_ranks: int) -> Array:
  """EMMA-X Eq. 3's rank of a virtual example lam * y + (1 - lam) * y' (y the translation,
  rank 1; y' a random sentence, rank N): the paper's weight of y' is λ = 1 - lam and its
  rank r = ⌈(1 - λ)·1 + λ·N⌉ = ⌈1 + (N - 1)(1 - lam)⌉, so any mix (lam < 1) is rank 2 or
  more and the ranks 2..N get equal shares of lam ~ U(0, 1). Returned 0-based, [M] int32
  in [0, N-1] (lam = 1: 0, the translation; lam = 0: N - 1, unrelated)."""
  r = jnp.ceil(1.0 + (num_ranks - 1) * (1.0 - lam_M.astype(jnp.float32))).astype(jnp.int32)
  return jnp.clip(r, 1, num_ranks) - 1


def nearest_rank(sim_BxK: Array, rank_sims_R: Array) -> Array:
  """Eq. 10: c*_M = the rank whose similarity anchor s_r is nearest to s(x, y): [B, K]."""
  return jnp.argmin(jnp.abs(sim_BxK[..., None] - rank_sims_R), axis=-1).astype(jnp.int32)


def rank_similarity_ema(rank_sims_R: Array, sim_M: Array, ranks_M: Array, valid_M: Array,
                        rate: float) -> Array:
  """Eq. 11: s_r <- (1 - eta) s_r + eta * mean{s(x, y) : rank(x, y) = r}, for the ranks
  that occur among the valid pairs (the others keep their s_r)."""
  one_hot = jax.nn.one_hot(ranks_M, rank_sims_R.shape[0]) * valid_M[:, None]   # [M, R]
  count = one_hot.sum(0)
  mean = (one_hot * sim_M[:, None]).sum(0) / jnp.maximum(count, 1.0)
  return jnp.where(count > 0, (1.0 - rate) * rank_sims_R + rate * mean, rank_sims_R)


def ranking_infonce_loss(sim_BxK: Array, ranks_BxK: Array, valid_BxK: Array,
                         temperatures_T: Array):
  """Eq. 7, ranking InfoNCE: for every rank r < N (T = N - 1 temperatures, increasing:
  tau_1 < ... < tau_{N-1}), the pairs of rank r are the positives and the pairs of rank
  >= r (as or less similar) the denominator:
    L = mean_b sum_{r<N} -log sum_{k: rank r} exp(s_bk / tau_r)
                              / sum_{k: rank >= r} exp(s_bk / tau_r),
  an anchor without a pair of rank r adding nothing to that rank's term. The mean is over
  every anchor, as Eq. 7's expectation over x_i and the authors' criterion.py (which adds a
  constant for such anchors) take it: a rank that G gives to a few pairs weighs by how few
  they are (a mean over only the anchors that have one would give a handful of spurious
  rank-1 pairs the weight of a batch of translations, the EM collapse of docs/emmax.md).
  `ranks_BxK` are 0-based targets (not differentiated); `valid_BxK` drops pairs (empty
  queue slots, an anchor's own key). Returns (loss, metrics)."""
  sim = sim_BxK.astype(jnp.float32)
  total = jnp.zeros((), jnp.float32)
  for r in range(temperatures_T.shape[0]):
    logits = sim / temperatures_T[r]
    pos = valid_BxK & (ranks_BxK == r)
    den = valid_BxK & (ranks_BxK >= r)
    log_num = jax.nn.logsumexp(jnp.where(pos, logits, _NEG), axis=1)
    log_den = jax.nn.logsumexp(jnp.where(den, logits, _NEG), axis=1)
    term = jnp.where(jnp.any(pos, axis=1), log_den - log_num, 0.0)
    total = total + jnp.mean(term)
  return total, {"loss": total}
