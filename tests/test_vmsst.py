"""VMSST / BITRANSLATION: objective terms, decoder isolation, gradients, device counts."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import initial_variables
from vmx import decoders, encoders, losses
from vmx.models import VMSST, VMSSTModel

B, L, V, D = 8, 10, 40, 16



def _with_aux(out):
  """compute_loss's (loss, metrics, flax_mutables) as (loss, (metrics, flax_mutables))."""
  loss, metrics, mutables = out
  return loss, (metrics, mutables)

def _templates(**dec_kw):
  enc = encoders.TransformerEncoder(vocab_size=V, num_layers=1, emb_dim=D, num_heads=2,
                                    mlp_dim=32, max_length=L)
  dec = decoders.ConditionedDecoder(vocab_size=V, num_layers=2, emb_dim=D, num_heads=2,
                                    mlp_dim=32, max_length=L, **dec_kw)
  return enc, dec


def _model(module_kw=None, model_kw=None, dec_kw=None):
  enc, dec = _templates(**(dec_kw or {}))
  return VMSSTModel(VMSST(enc, dec, num_languages=3, **(module_kw or {})), **(model_kw or {}))


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  lens = rng.integers(3, L - 1, size=(2, B))
  toks = rng.integers(3, V, size=(2, B, L))
  for s in range(2):
    toks[s][np.arange(L)[None] >= lens[s][:, None]] = 0
  return {"left_tokens": jnp.asarray(toks[0], jnp.int32),
          "right_tokens": jnp.asarray(toks[1], jnp.int32),
          "left_lang": jnp.asarray(rng.integers(0, 3, B), jnp.int32),
          "right_lang": jnp.asarray(rng.integers(0, 3, B), jnp.int32)}


def _init(model, batch):
  return initial_variables(model, {k: v.shape for k, v in batch.items()})


def test_decoder_is_causal_and_sees_the_source_only_through_the_conditioning_vector():
  _, dec = _templates()
  targets = _batch()["left_tokens"]
  cond = jax.random.normal(jax.random.PRNGKey(1), (B, 2 * D))
  lang = jnp.zeros((B,), jnp.int32)
  params = dec.init(jax.random.PRNGKey(0), targets, lang, cond)["params"]
  f = jax.jit(lambda t, c: dec.apply({"params": params}, t, lang, c))
  base = f(targets, cond)
  # Changing target token t changes logits at positions > t only (causal).
  t = 4
  changed = f(targets.at[:, t].set((targets[:, t] + 1) % V), cond)
  np.testing.assert_allclose(base[:, :t + 1], changed[:, :t + 1], rtol=1e-6, atol=1e-6)
  assert np.abs(np.asarray(base[:, t + 1:] - changed[:, t + 1:])).max() > 1e-4
  # The conditioning vector changes every position.
  other = f(targets, cond + 1.0)
  assert np.all(np.abs(np.asarray(base - other)).max(-1) > 1e-4)


def test_source_sentence_reaches_translation_logits_only_through_the_semantic_mean():
  model = _model()
  batch = _batch()
  params = _init(model, batch)["params"]

  def run(b):
    return model.module.apply({"params": params}, b["left_tokens"], b["right_tokens"],
                              b["left_lang"], b["right_lang"])

  out = run(batch)
  perturbed = dict(batch, right_tokens=batch["right_tokens"].at[:, 0].set(5))
  out2 = run(perturbed)
  assert np.abs(np.asarray(out2["logits"][:, 0] - out["logits"][:, 0])).max() > 1e-5
  # Feed the decoder the SAME conditioning vector: logits of x_i are identical, so the
  # perturbed source x_j had no other path (no cross-attention) into them.
  dec_in = decoders.decoder_targets(batch["left_tokens"])[0]
  cond2 = jnp.concatenate([jnp.zeros_like(out2["sem_right"][0]), out2["sem_right"][0]], -1)
  relogits = model.module.apply({"params": params}, dec_in, batch["left_lang"], cond2,
                                method=VMSST.decode)
  np.testing.assert_allclose(relogits, out2["logits"][:, 0], rtol=1e-5, atol=1e-5)


# -- objective terms against NumPy --------------------------------------------

def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_gaussian_kl_matches_closed_form_and_monte_carlo():
  rng = np.random.default_rng(0)
  mean, logvar = rng.normal(size=(5, 7)), rng.normal(scale=0.5, size=(5, 7))
  var = np.exp(logvar)
  ref = np.sum(-0.5 * np.log(var) + 0.5 * (var + mean ** 2) - 0.5, axis=-1)
  np.testing.assert_allclose(losses.gaussian_kl(mean, logvar), ref, rtol=1e-5)
  # Monte Carlo estimate of E_q[log q(z) - log p(z)] for row 0.
  z = np.asarray(losses.reparameterize(jax.random.PRNGKey(0), np.repeat(mean[:1], 200_000, 0),
                                       np.repeat(logvar[:1], 200_000, 0)))
  log_q = -0.5 * (((z - mean[0]) ** 2) / var[0] + np.log(2 * np.pi * var[0])).sum(-1)
  log_p = -0.5 * (z ** 2 + np.log(2 * np.pi)).sum(-1)
  assert abs((log_q - log_p).mean() - ref[0]) < 0.05
  assert float(losses.gaussian_kl(np.zeros((1, 3)), np.zeros((1, 3)))[0]) == 0.0


def test_sequence_nll_sums_masked_token_cross_entropies():
  rng = np.random.default_rng(1)
  logits, targets = rng.normal(size=(3, 5, 11)), rng.integers(0, 11, size=(3, 5))
  mask = np.arange(5)[None] < np.array([[5], [2], [0]])
  lp = _np_log_softmax(logits)
  ref = -(np.take_along_axis(lp, targets[..., None], -1)[..., 0] * mask).sum(-1)
  np.testing.assert_allclose(losses.sequence_nll(logits, targets, mask), ref, rtol=1e-5)


def test_decoder_targets_append_eos_unless_truncated():
  toks = jnp.array([[5, 6, 0, 0], [7, 8, 9, 4]], jnp.int32)
  targets, mask = decoders.decoder_targets(toks)
  np.testing.assert_array_equal(targets, [[5, 6, 1, 0], [7, 8, 9, 4]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_linear_kl_annealing_schedule():
  got = [float(losses.linear_anneal(s, 100)) for s in (0, 25, 100, 1000)]
  np.testing.assert_allclose(got, [0.0, 0.25, 1.0, 1.0])
  assert float(losses.linear_anneal(7, 0)) == 1.0


def test_objective_matches_numpy_elbo_and_annealing_state():
  model = _model(model_kw=dict(elbo_weight=0.1, kl_anneal_steps=4, contrastive_weight=0.01,
                               contrastive_temperature=0.1, contrastive_reduction="sum"))
  batch = _batch()
  v = _init(model, batch)
  params, mutables = v["params"], {"annealing": v["annealing"]}
  rng = jax.random.PRNGKey(3)
  for step in range(3):  # the annealing counter is state: +1 per training call
    loss, metrics, mutables = model.compute_loss(params, batch, rng, mutables)
    assert int(mutables["annealing"]["updates"]) == step + 1
    np.testing.assert_allclose(float(metrics["kl_weight"]), step / 4, rtol=1e-6)
  # Recompute the step-2 objective in NumPy from the module's outputs (same rngs).
  d, z = jax.random.split(rng)
  out = jax.tree.map(np.asarray, model.module.apply(
      {"params": params}, batch["left_tokens"], batch["right_tokens"], batch["left_lang"],
      batch["right_lang"], deterministic=False, sample=True, rngs={"dropout": d, "latent": z}))
  lp = _np_log_softmax(out["logits"].astype(np.float64))
  nll = -(np.take_along_axis(lp, out["targets"][..., None], -1)[..., 0] * out["mask"]).sum(-1)

  def kl(m, lv):
    return 0.5 * (np.exp(lv) + m ** 2 - 1 - lv).sum(-1)

  # Alternation: even rows take z_sem from the left sentence, odd rows from the right.
  take_left = (np.arange(B) % 2 == 0)[:, None]
  sem_mean = np.where(take_left, out["sem_left"][0], out["sem_right"][0])
  np.testing.assert_allclose(out["sem"][0], sem_mean)
  kl_all = kl(*out["sem"]) + kl(*out["lang_left"]) + kl(*out["lang_right"])
  translation = (nll[:, 0] + nll[:, 1]).mean()
  elbo_terms = (nll[:, 2] + nll[:, 3]).mean() + 0.5 * kl_all.mean()   # beta = 2/4
  l, r = out["sem_left"][0], out["sem_right"][0]
  l, r = l / np.linalg.norm(l, axis=1, keepdims=True), r / np.linalg.norm(r, axis=1, keepdims=True)
  s = l @ r.T / 0.1
  c = -0.5 * (np.diag(_np_log_softmax(s)).mean() + np.diag(_np_log_softmax(s.T)).mean())
  ref = translation + 0.1 * elbo_terms + 0.01 * c * B  # contrastive summed over pairs
  np.testing.assert_allclose(float(loss), ref, rtol=1e-4)
  # The other reading of the contrastive weight: InfoNCE averaged over the pairs.
  mean_model = _model(model_kw=dict(elbo_weight=0.1, kl_anneal_steps=4, contrastive_weight=0.01,
                                    contrastive_temperature=0.1, contrastive_reduction="mean"))
  mean_loss, _, _ = mean_model.compute_loss(params, batch, rng,
                                          {"annealing": {"updates": jnp.asarray(2, jnp.int32)}})
  np.testing.assert_allclose(float(mean_loss), ref - 0.01 * c * (B - 1), rtol=1e-4)
  # §6.4's reading: the contrastive loss (mean) is the base, lambda weights the VMSST loss.
  paper = _model(model_kw=dict(elbo_weight=0.1, kl_anneal_steps=4, contrastive_weight=1.0,
                               vmsst_weight=0.0005, contrastive_temperature=0.1))
  paper_loss, pm, _ = paper.compute_loss(params, batch, rng,
                                         {"annealing": {"updates": jnp.asarray(2, jnp.int32)}})
  np.testing.assert_allclose(float(paper_loss), c + 0.0005 * (translation + 0.1 * elbo_terms),
                             rtol=1e-4)
  np.testing.assert_allclose(float(pm["vmsst_loss"]), translation + 0.1 * elbo_terms,
                             rtol=1e-4)
  # Translation passes condition on [0 ; mu_sem(other side)].
  cond_check = model.module.apply(
      {"params": params}, decoders.decoder_targets(batch["left_tokens"])[0],
      batch["left_lang"], jnp.concatenate([jnp.zeros_like(r), out["sem_right"][0]], -1),
      method=VMSST.decode)
  np.testing.assert_allclose(cond_check, out["logits"][:, 0], rtol=1e-4, atol=1e-4)


def test_gradients_reach_both_encoders_and_the_decoder():
  model = _model()
  batch = _batch()
  v = _init(model, batch)
  grads = jax.jit(jax.grad(lambda p: model.compute_loss(
      p, batch, jax.random.PRNGKey(0), {"annealing": v["annealing"]})[0]))(v["params"])
  norms = {k: float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(g))))
           for k, g in grads.items()}
  for k in ("semantic_encoder", "semantic_latent", "language_encoder_0", "language_latent_0",
            "decoder_0", "token_embed"):
    assert norms[k] > 1e-6, norms
  assert "token_embed" not in grads["semantic_encoder"]  # one shared table
  assert "token_embed" not in grads["decoder_0"]


def test_bitranslation_has_no_language_latents_and_bad_combinations_fail():
  model = _model(module_kw=dict(language_latents=False), model_kw=dict(elbo_weight=0.0))
  batch = _batch()
  v = _init(model, batch)
  assert not any(k.startswith("language_") for k in v["params"])
  loss, m, _ = model.compute_loss(v["params"], batch, jax.random.PRNGKey(0),
                                  {"annealing": v["annealing"]})
  assert set(m) == {"loss", "translation_nll", "translation_nll_per_token", "in_batch_accuracy"}
  with pytest.raises(ValueError, match="language_latents=False"):
    _model(module_kw=dict(language_latents=False))  # elbo_weight 0.1 without latents
  with pytest.raises(ValueError, match="elbo_weight must be > 0"):
    _model(model_kw=dict(elbo_weight=0.0))
  with pytest.raises(ValueError, match="single_encoder"):
    _init(_model(module_kw=dict(single_encoder=True)), batch)
  with pytest.raises(ValueError, match="language_encoder_assignment"):
    _init(_model(module_kw=dict(num_language_encoders=2,
                                language_encoder_assignment=(0, 2, 1))), batch)


def test_language_encoder_assignment_selects_rows():
  model = _model(module_kw=dict(num_language_encoders=2, language_encoder_assignment=(1, 0, 1)))
  batch = _batch()
  params = _init(model, batch)["params"]
  mean, _ = model.module.apply({"params": params}, batch["left_tokens"], batch["left_lang"],
                               method=VMSST.language)
  for k in range(2):
    enc_mean, _ = model.module.apply(
        {"params": params}, batch["left_tokens"], batch["left_lang"],
        method=lambda m, t, l: m.language_heads[k](encoders.pool(
            *m.language_encoders[k](t, l), m.pooling)))
    rows = np.asarray([(1, 0, 1)[int(x)] == k for x in batch["left_lang"]])
    np.testing.assert_allclose(np.asarray(mean)[rows], np.asarray(enc_mean)[rows], rtol=1e-5)


# -- device-count invariance --------------------------------------------------

@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("num_partitions", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_loss_and_grads_equal_on_1_and_8_devices(num_partitions):
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  model = _model(model_kw=dict(contrastive_weight=0.01, kl_anneal_steps=2))
  batch = _batch()
  out = []
  for n, parts in ((1, 1), (8, num_partitions)):
    part = partitioning.Partitioner(num_partitions=parts, num_devices=n)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part,
                 {k: v.shape for k, v in batch.items()})
    state = tr.create_state(0)
    gb = part.global_batch(jax.tree.map(np.asarray, batch), tr.batch_shardings)
    fn = jax.jit(jax.value_and_grad(
        lambda p, b, m: model.compute_loss(p, b, jax.random.PRNGKey(5), m)[0]))
    with part.context():
      loss, grads = fn(state.params, gb, {"annealing": {"updates": jnp.ones((), jnp.int32)}})
    out.append((float(loss), jax.tree.map(np.asarray, grads)))
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
  jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=5e-4, atol=1e-5),
               out[0][1], out[1][1])


@pytest.mark.slow   # 90 s cold; the fast tier: test_step's and test_packing's GradCache
@pytest.mark.parametrize("num_devices,chunks", [(1, 4), (8, 2)])
def test_grad_cache_equals_the_uncached_loss_and_grads(num_devices, chunks):
  """GradCache on VMSST-CONTRASTIVE (per-pair NLL / KL terms and semantic means as the
  cached values): the whole-batch loss, gradients and KL-annealing update, on 1 device and
  with the chunks split over 8; each chunk alternates the side feeding z_sem by the rows'
  global indices, without which the loss would differ."""
  from vmx.models.base import GRAD_CACHE_ROW
  from vmx.training import grad_cache, optimizers, partitioning
  from vmx.training.step import TrainStep
  if jax.device_count() < num_devices:
    pytest.skip("needs 8 (simulated) devices")
  model = _model(model_kw={"contrastive_weight": 0.01, "kl_anneal_steps": 4})
  two = [_batch(0), _batch(1)]
  batch = {k: np.concatenate([np.asarray(t[k]) for t in two]) for k in two[0]}   # 16 pairs
  mutables = {"annealing": {"updates": jnp.full((), 2, jnp.int32)}}
  part1 = partitioning.Partitioner(num_devices=1)
  tr1 = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part1,
                {k: v.shape for k, v in batch.items()})
  params = tr1.create_state(0).params
  fn = jax.value_and_grad(lambda p: _with_aux(model.compute_loss(p, batch, None, mutables)),
                          has_aux=True)
  (l1, (_, new1)), g1 = jax.jit(fn)(params)
  part = partitioning.Partitioner(num_devices=num_devices)
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part,
               {k: v.shape for k, v in batch.items()}, grad_cache_chunks=chunks)
  state = tr.create_state(0)
  gb = part.global_batch(batch, tr.batch_shardings)
  with part.context():
    loss, _, grads, new = jax.jit(lambda p, b: grad_cache.loss_and_grads(
        model, p, b, None, chunks, mutables))(state.params, gb)
  np.testing.assert_allclose(float(loss), float(l1), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
               jax.tree.map(np.asarray, g1), jax.tree.map(np.asarray, grads))
  assert int(new["annealing"]["updates"]) == int(new1["annealing"]["updates"]) == 3
  # The rows' global indices matter: a chunk alternating by its own row order differs.
  pairs = model.grad_cache_embed(params, {**batch, GRAD_CACHE_ROW: np.arange(2 * B) + 1}, None)
  shifted, _ = model.objective_of(pairs, batch, jnp.float32(0.5))
  assert abs(float(shifted) - float(l1)) > 1e-4
  state, m = tr.step(state, batch)              # a training step (sampled latents) runs
  assert np.isfinite(float(m["loss"].compute()))


def test_a_split_conditioned_kernel_computes_and_starts_as_the_merged_one():
  """The t5 decoder's ConditionedLinear(split_kernel=True): [x ; c] W with W's rows for x
  (`kernel`, what mT5's weights fill) and for c (`cond_kernel`) apart: the same function
  as the merged (D + C) x F kernel, and each part drawn with its distribution."""
  from vmx.decoders import ConditionedLinear
  x, c = jnp.ones((2, 3, 64)) * 0.5, jnp.arange(256, dtype=jnp.float32).reshape(2, 128) / 256
  split = ConditionedLinear(300, ("embed", "vocab"), use_bias=False, split_kernel=True)
  merged = ConditionedLinear(300, ("embed", "vocab"), use_bias=False)
  ps = split.init(jax.random.PRNGKey(0), x, c)["params"]
  pm = merged.init(jax.random.PRNGKey(0), x, c)["params"]
  assert ps["kernel"].shape == (64, 300) and ps["cond_kernel"].shape == (128, 300)
  for part in ("kernel", "cond_kernel"):     # fan-in D + C for both parts, as merged
    assert float(jnp.std(ps[part])) == pytest.approx(float(jnp.std(pm["kernel"])), rel=0.05)
  w = jnp.concatenate([ps["kernel"], ps["cond_kernel"]])
  np.testing.assert_allclose(np.asarray(split.apply({"params": ps}, x, c)),
                             np.asarray(merged.apply({"params": {"kernel": w}}, x, c)),
                             rtol=1e-5, atol=1e-5)
