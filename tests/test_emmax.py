"""EMMA-X: GMM posterior, mixup ranks, ranking InfoNCE, s_r EMA (NumPy references), the
EM loop recovering planted ranks, phased training (switch, kill/resume), 1 vs 8 devices,
bad settings."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import initial_variables
from vmx import encoders, losses, rank_losses
from vmx.errors import ConfigError
from vmx.models.emmax import EmmaX, EmmaXModel


def np_gmm_log_posterior(rel, prior_logits, mean, log_var):
  d = rel.shape[1]
  log_prior = prior_logits - np.log(np.exp(prior_logits - prior_logits.max()).sum()) \
      - prior_logits.max()
  var = np.exp(log_var)
  out = np.zeros((rel.shape[0], mean.shape[0]))
  for m in range(rel.shape[0]):
    for r in range(mean.shape[0]):
      out[m, r] = (log_prior[r] - 0.5 * d * math.log(2 * math.pi) - 0.5 * log_var[r].sum()
                   - 0.5 * (((rel[m] - mean[r]) ** 2) / var[r]).sum())
    mx = out[m].max()
    out[m] -= mx + math.log(np.exp(out[m] - mx).sum())
  return out


def test_gmm_posterior_matches_numpy_and_stays_finite_far_away():
  rng = np.random.default_rng(0)
  r, d = 4, 6
  prior, mean = rng.normal(size=r), rng.normal(size=(r, d))
  log_var = rng.normal(size=(r, d))
  rel = rng.normal(size=(5, d))
  rel[3] *= 1e4            # far from every mean: densities underflow in linear space
  rel[4] = mean[2]         # on a mean
  got = np.asarray(rank_losses.gmm_log_posterior(jnp.asarray(rel), jnp.asarray(prior),
                                            jnp.asarray(mean), jnp.asarray(log_var)))
  want = np_gmm_log_posterior(rel, prior, mean, log_var)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(np.exp(got).sum(1), 1.0, rtol=1e-5)
  # The pairwise form (no [B, K, D] relations) equals the direct one.
  a, o = rng.normal(size=(3, d)), rng.normal(size=(4, d))
  pair = np.asarray(rank_losses.gmm_pairwise_log_posterior(
      jnp.asarray(a), jnp.asarray(o), jnp.asarray(prior), jnp.asarray(mean), jnp.asarray(log_var)))
  direct = np_gmm_log_posterior((a[:, None] - o[None]).reshape(12, d), prior, mean, log_var)
  np.testing.assert_allclose(pair.reshape(12, r), direct, rtol=1e-4, atol=1e-3)


def test_mixup_ranks_follow_eq_3():
  """EMMA-X Eq. 3: r = ⌈(1 - λ)·1 + λ·N⌉ with λ the weight of the random sentence y'
  (vmx's lam weights the translation: λ = 1 - lam). N = 4: a mix is rank 2, 3 or 4,
  a third of lam ~ U(0, 1) each; only lam = 1 (the translation itself) is rank 1."""
  lam = np.array([1.0, 0.99, 0.67, 0.66, 0.34, 0.33, 0.01, 0.0], np.float32)
  paper_lambda = 1.0 - lam
  want = [math.ceil((1 - x) * 1 + x * 4) - 1 for x in paper_lambda]   # 0-based
  assert want == [0, 1, 1, 2, 2, 3, 3, 3]
  assert list(np.asarray(rank_losses.mixup_rank(jnp.asarray(lam), 4))) == want
  shares = np.bincount(np.asarray(rank_losses.mixup_rank(
      jnp.asarray(np.random.default_rng(0).uniform(size=30000), jnp.float32), 4)), minlength=4)
  np.testing.assert_allclose(shares / shares.sum(), [0, 1 / 3, 1 / 3, 1 / 3], atol=0.01)


def np_ranking_infonce(sim, ranks, valid, taus):
  total = 0.0
  for r, tau in enumerate(taus):
    for b in range(sim.shape[0]):   # Eq. 7: the expectation over every anchor x_b
      pos = valid[b] & (ranks[b] == r)
      if pos.any():
        den = valid[b] & (ranks[b] >= r)
        total += -math.log(np.exp(sim[b][pos] / tau).sum()
                           / np.exp(sim[b][den] / tau).sum()) / sim.shape[0]
  return total


def test_ranking_infonce_matches_numpy():
  rng = np.random.default_rng(1)
  sim = rng.uniform(-1, 1, size=(5, 9))
  ranks = rng.integers(0, 4, size=(5, 9))
  valid = rng.uniform(size=(5, 9)) > 0.2
  taus = np.asarray([0.04, 0.06, 0.08])
  got, _ = rank_losses.ranking_infonce_loss(jnp.asarray(sim), jnp.asarray(ranks), jnp.asarray(valid),
                                       jnp.asarray(taus, jnp.float32))
  np.testing.assert_allclose(float(got), np_ranking_infonce(sim, ranks, valid, taus), rtol=1e-4)
  # Gradients flow only through the similarities and are finite with empty ranks.
  g = jax.grad(lambda s: rank_losses.ranking_infonce_loss(s, jnp.zeros((5, 9), jnp.int32),
                                                     jnp.asarray(valid), jnp.asarray(taus))[0])(
      jnp.asarray(sim))
  assert np.all(np.isfinite(np.asarray(g)))


def test_paired_batch_infonce_matches_numpy():
  rng = np.random.default_rng(4)
  x, y = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
  got, m = losses.paired_batch_infonce(jnp.asarray(x), jnp.asarray(y), 0.5)
  z = np.concatenate([x, y])
  terms, hits = [], []
  for i in range(10):
    p = (i + 5) % 10
    others = [j for j in range(10) if j != i]
    s = {j: z[i] @ z[j] / 0.5 for j in others}
    terms.append(-(s[p] - math.log(sum(np.exp(v) for v in s.values()))))
    hits.append(max(others, key=s.get) == p)
  np.testing.assert_allclose(float(got), np.mean(terms), rtol=1e-5)
  np.testing.assert_allclose(float(m["in_batch_accuracy"]), np.mean(hits))


def test_random_partners_skip_the_anchor_and_its_translation():
  from vmx.models.emmax import _draw_excluding
  a = jnp.asarray(np.arange(4000) % 6)
  p = (a + 3) % 6
  o = np.asarray(_draw_excluding(jax.random.PRNGKey(0), a, p, 6))
  assert not np.any(o == np.asarray(a)) and not np.any(o == np.asarray(p))
  assert o.min() >= 0 and o.max() < 6
  counts = np.bincount(o[np.asarray(a) == 0], minlength=6)     # 4 allowed, ~1/4 each
  assert counts[0] == counts[3] == 0 and counts[[1, 2, 4, 5]].min() > 120


def test_rank_similarity_ema_and_nearest_rank():
  s = jnp.asarray([1.0, 0.75, 0.5, 0.25])
  sims = jnp.asarray([0.9, 0.7, 0.2, 0.3, 0.1])
  ranks = jnp.asarray([0, 0, 3, 3, 2])
  valid = jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0])     # the last pair is dropped
  new = np.asarray(rank_losses.rank_similarity_ema(s, sims, ranks, valid, 0.1))
  np.testing.assert_allclose(new, [0.9 * 1.0 + 0.1 * 0.8, 0.75, 0.5, 0.9 * 0.25 + 0.1 * 0.25],
                             rtol=1e-6)
  got = np.asarray(rank_losses.nearest_rank(jnp.asarray([[0.95, 0.65, 0.3, -0.4]]), s))
  assert list(got[0]) == [0, 1, 3, 3]


def _planted(rng, n_anchor, per_rank, d, num_ranks):
  """Unit anchors and, per anchor, candidates at planted ranks: rank r has cosine
  cos_r with the anchor (1 for rank 1 down to ~0 for rank N)."""
  cosines = np.linspace(0.95, 0.0, num_ranks)
  x = rng.normal(size=(n_anchor, d))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  ys, ranks = [], []
  for r, c in enumerate(cosines):
    for _ in range(per_rank):
      noise = rng.normal(size=(n_anchor, d))
      noise -= (noise * x).sum(1, keepdims=True) * x
      noise /= np.linalg.norm(noise, axis=1, keepdims=True)
      ys.append(c * x + math.sqrt(1 - c * c) * noise)
      ranks.append(np.full(n_anchor, r))
  return x, np.stack(ys, 1), np.stack(ranks, 1)          # [A, D], [A, C, D], [A, C]


def test_em_on_planted_ranks_recovers_them():
  """Phase 2's G side of the EM on fixed embeddings with planted rank structure: G learns
  from c*_M (nearest s_r), s_r follows c*_G (Eq. 11); G's argmax must then agree with
  the planted ranks far above chance (1/N)."""
  import optax
  from vmx.models.emmax import GmmClassifier
  rng = np.random.default_rng(0)
  n, d = 4, 16
  x, y, planted = _planted(rng, 64, 8, d, n)
  rel = jnp.asarray((x[:, None] - y).reshape(-1, d), jnp.float32)
  sim = jnp.asarray(np.einsum("ad,acd->ac", x, y).reshape(-1), jnp.float32)
  planted = planted.reshape(-1)
  g = GmmClassifier(n, d)
  params = g.init(jax.random.PRNGKey(0), rel[:2])["params"]
  tx = optax.adam(3e-2)
  opt = tx.init(params)
  s = jnp.asarray((n - np.arange(n)) / n, jnp.float32)        # s_r at (N - r + 1) / N

  @jax.jit
  def step(params, opt, s):
    c_m = rank_losses.nearest_rank(sim, s)
    def loss(p):
      logp = g.apply({"params": p}, rel)
      return -jnp.mean(jnp.take_along_axis(logp, c_m[:, None], axis=1))
    grads = jax.grad(loss)(params)
    upd, opt = tx.update(grads, opt)
    params = optax.apply_updates(params, upd)
    c_g = jnp.argmax(g.apply({"params": params}, rel), axis=1)
    s = rank_losses.rank_similarity_ema(s, sim, c_g, jnp.ones_like(sim), 0.05)
    return params, opt, s
  for _ in range(300):
    params, opt, s = step(params, opt, s)
  pred = np.asarray(jnp.argmax(g.apply({"params": params}, rel), axis=1))
  agreement = float(np.mean(pred == planted))
  assert agreement > 0.8, agreement                    # chance: 0.25
  assert np.all(np.diff(np.asarray(s)) < 0)            # s_1 > s_2 > ... > s_N


def tiny_model(stage="em", **kw):
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, dropout_rate=0.1)
  kw = {"queue_size": 16, "classifier_batch_size": 24, "rank_ema": 0.05, **kw}
  return EmmaXModel(EmmaX(enc, num_ranks=4, pooling="mean"), stage=stage, **kw)


def _batch(stage, b=8, rng=0):
  r = np.random.default_rng(rng)
  t = lambda: r.integers(3, 60, size=(b, 8)).astype(np.int32)
  return {"left_tokens": t(), "right_tokens": t()} if stage == "warmup" else {"tokens": t()}


def test_classifier_term_does_not_train_the_encoder_and_ranks_are_targets():
  model = tiny_model("em")
  shapes = {"tokens": (8, 8)}
  v = initial_variables(model, shapes)
  mut = {k: v[k] for k in ("momentum", "queue", "rank_sims")}
  mut["queue"] = {"keys": losses.l2_normalize(jax.random.normal(jax.random.PRNGKey(1), (16, 16))),
                  "next": jnp.int32(0), "filled": jnp.int32(16)}
  batch = _batch("em")
  for term in ("classifier_loss", "ranking_loss"):
    def f(p):
      return model.compute_loss(p, batch, jax.random.PRNGKey(2), mut)[1][term]
    g = jax.jit(jax.grad(f))(v["params"])
    enc_norm = optax_norm(g["encoder"])
    cls_norm = optax_norm(g["classifier"])
    if term == "classifier_loss":
      assert enc_norm == 0.0 and cls_norm > 0
    else:
      assert enc_norm > 0 and cls_norm == 0.0


def optax_norm(tree):
  return float(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


@pytest.mark.slow   # 50 s cold; the fast tier: the phase switch's bit-exact kill / resume
def test_queue_and_state_after_steps_and_1_vs_8_devices():
  from conftest import assert_same_loss_and_grads_on_1_and_8_devices
  model = tiny_model("em")
  v = initial_variables(model, {"tokens": (8, 8)})
  mut = {k: v[k] for k in ("momentum", "queue", "rank_sims")}
  batch = _batch("em")
  _, m, new = model.compute_loss(v["params"], batch, jax.random.PRNGKey(3), mut)
  assert int(new["queue"]["filled"]) == 8 and int(new["queue"]["next"]) == 8
  np.testing.assert_allclose(np.linalg.norm(np.asarray(new["queue"]["keys"][:8]), axis=1), 1.0,
                             rtol=1e-5)
  _, _, new2 = model.compute_loss(v["params"], _batch("em", rng=1), jax.random.PRNGKey(4), new)
  _, _, new3 = model.compute_loss(v["params"], _batch("em", rng=2), jax.random.PRNGKey(5), new2)
  assert int(new3["queue"]["filled"]) == 16 and int(new3["queue"]["next"]) == 8   # wrapped
  full = {**mut, "queue": new2["queue"], "rank_sims": new2["rank_sims"]}

  def loss_of(params, batch):
    return model.compute_loss(params, batch, jax.random.PRNGKey(7), full)[0]
  assert_same_loss_and_grads_on_1_and_8_devices(model, batch, loss_of)
  wm = tiny_model("warmup")
  assert_same_loss_and_grads_on_1_and_8_devices(
      wm, _batch("warmup"),
      lambda p, b: wm.compute_loss(p, b, jax.random.PRNGKey(7), full)[0])


def test_eq_11_counts_each_anchor_s_own_key_as_rank_1():
  """The authors' update_mean: the pairs of known rank (an anchor and its own key) enter
  Eq. 11 with rank 1, so s_1 keeps meaning "the same sentence" on text alone, where G
  gives rank 1 to strays only (docs/emmax.md, the collapse)."""
  model = tiny_model("em", rank_ema=1.0)
  batch = _batch("em")
  v = initial_variables(model, {"tokens": (8, 8)})
  mut = {k: v[k] for k in ("momentum", "queue", "rank_sims")}
  mut["queue"] = {"keys": losses.l2_normalize(jax.random.normal(jax.random.PRNGKey(1), (16, 16))),
                  "next": jnp.int32(0), "filled": jnp.int32(16)}
  params = jax.tree.map(lambda a: a, v["params"])   # G: every pair "unrelated" (rank N)
  params["classifier"] = {**params["classifier"],
                          "prior_logits": jnp.asarray([-1e4, -1e4, -1e4, 0.0])}
  _, m, new = model.compute_loss(params, batch, None, mut)
  x = model._gamma(params, jnp.asarray(batch["tokens"]), None)
  keys = model._keys(params, mut, jnp.asarray(batch["tokens"]))
  own = np.sum(np.asarray(x) * np.asarray(keys), axis=1)
  sim = np.asarray(x) @ np.concatenate([np.asarray(keys), np.asarray(mut["queue"]["keys"])]).T
  others = sim[~np.eye(8, 24, dtype=bool)]
  sims = np.asarray(new["rank_sims"])
  np.testing.assert_allclose(sims[0], own.mean(), rtol=1e-5)       # own keys: rank 1
  np.testing.assert_allclose(sims[3], others.mean(), rtol=1e-5)    # G's rank N: the rest
  np.testing.assert_allclose(sims[1:3], np.asarray(mut["rank_sims"])[1:3])   # no pair: kept
  assert float(m["rank1_fraction"]) == 0.0   # the metric counts G's ranks of valid pairs


def _parallel_batch(n_t=4, n_p=2, rng=0):
  r = np.random.default_rng(rng)
  t = lambda n: r.integers(3, 60, size=(n, 8)).astype(np.int32)
  return {"text/tokens": t(n_t), "pairs/left_tokens": t(n_p), "pairs/right_tokens": t(n_p)}


def test_em_parallel_forces_translations_to_rank_1_and_queues_every_anchor():
  from vmx.data import feature_converters as fcs
  model = tiny_model("em", em_parallel=True)
  assert set(model.FEATURE_CONVERTER_CLS) == {"text", "pairs"}
  assert model.FEATURE_CONVERTER_CLS["pairs"] is fcs.PairFeatureConverter
  batch = _parallel_batch()
  tokens, partner = model._em_anchors(jax.tree.map(jnp.asarray, batch))
  assert tokens.shape == (8, 8) and list(np.asarray(partner)) == [-1] * 4 + [6, 7, 4, 5]
  v = initial_variables(model, {k: v.shape for k, v in batch.items()})
  mut = {k: v[k] for k in ("momentum", "queue", "rank_sims")}
  # A G whose every answer is "unrelated" (rank N): only the golden pairs are positives,
  # so the ranking loss is the InfoNCE of the 2 x 2 translation pairs alone.
  params = jax.tree.map(lambda a: a, v["params"])
  params["classifier"] = {**params["classifier"],
                          "prior_logits": jnp.asarray([-1e4, -1e4, -1e4, 0.0])}
  _, m, new = model.compute_loss(params, batch, jax.random.PRNGKey(1), mut)
  assert int(new["queue"]["filled"]) == 8
  np.testing.assert_allclose(float(m["rank1_fraction"]), 4 / (8 * 7), rtol=1e-5)
  assert np.isfinite(float(m["ranking_loss"])) and float(m["ranking_loss"]) > 0
  with pytest.raises(ConfigError, match="multiple of the 8 keys"):
    tiny_model("em", em_parallel=True, queue_size=12).validate_data(
        {"text": 100, "pairs": 100}, {"text": 4, "pairs": 2})
  with pytest.raises(ConfigError, match="larger than the 14 sentences"):
    tiny_model("em", em_parallel=True, queue_size=16).validate_data(
        {"text": 6, "pairs": 4}, {"text": 4, "pairs": 2})
  with pytest.raises(ConfigError, match="em_parallel"):
    tiny_model("em", em_parallel="yes")

  def loss_of(p, b):
    return model.compute_loss(p, b, jax.random.PRNGKey(7), new)[0]
  from conftest import assert_same_loss_and_grads_on_1_and_8_devices
  assert_same_loss_and_grads_on_1_and_8_devices(model, _parallel_batch(8, 4), loss_of)


def test_bad_settings_fail_at_start_up():
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  with pytest.raises(ConfigError, match="N >= 2"):
    EmmaXModel(EmmaX(enc, num_ranks=1))
  with pytest.raises(ConfigError, match="stage"):
    EmmaXModel(EmmaX(enc), stage="phase3")
  with pytest.raises(ConfigError, match="max_temperature"):
    EmmaXModel(EmmaX(enc), temperature=0.1, max_temperature=0.05)
  model = tiny_model("em", queue_size=256)
  with pytest.raises(ConfigError, match="larger than the 100 sentences"):
    model.validate_data({None: 100}, {None: 8})
  with pytest.raises(ConfigError, match="not a multiple"):
    model.validate_data({None: 1000}, {None: 24})
  from vmx.training.phases import Phase
  with pytest.raises(ConfigError, match="every phase needs data"):
    Phase("em", 10, None)


def phased_train(model_dir, toy_task, *, total=(4, 4), stop_at_step=None, queue_size=16,
                 text_task=None, em_parallel=False):
  from conftest import toy_text_task
  from vmx.data import pipeline
  from vmx.modeldir import checkpoints
  from vmx.training import optimizers, partitioning
  from vmx.training.phases import Phase
  from vmx.training.trainer import train
  name, vp, _, _ = toy_task
  lr = optimizers.learning_rate_schedule("linear", 1e-2, 2, total_steps=sum(total))
  tx = optimizers.multi_optimizer(
      {"classifier": optimizers.create_optimizer("adam", 1e-3),
       "encoder": optimizers.create_optimizer("adam", lr)},
      [("^classifier/", "classifier"), (".*", "encoder")])
  text = pipeline.DatasetConfig(text_task or toy_text_task(vp), {"inputs": 8}, 8)
  if em_parallel:      # 4 sentences of text + both sides of 2 pairs
    text = pipeline.MultiTaskConfig({
        "text": pipeline.DatasetConfig(text.mixture_or_task_name, {"inputs": 8}, 4),
        "pairs": pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, 2)})
  phases = [
      Phase("warmup", total[0], pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, 8),
            model=tiny_model("warmup", queue_size=queue_size)),
      Phase("em", total[1], text),
  ]
  state, _ = train(model=tiny_model("em", queue_size=queue_size, em_parallel=em_parallel),
                   phases=phases, optimizer=tx,
                   learning_rate=lr, model_dir=str(model_dir), total_steps=sum(total),
                   vocabulary=vp, languages=["xx", "en"],
                   partitioner=partitioning.Partitioner(num_devices=2),
                   checkpoint_cfg=checkpoints.CheckpointConfig(period=3, keep=3),
                   log_period=2, random_seed=1, progress=False, stop_at_step=stop_at_step)
  return state


def test_phase_switch_and_kill_resume_are_bit_exact(tmp_path, toy_task, capsys):
  import json
  full = jax.device_get(phased_train(tmp_path / "full", toy_task))
  out = capsys.readouterr().out
  assert "phase 'em' (4 steps, to step 8)" in out
  rows = [json.loads(l) for l in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
  # The phases log their own terms; the switch is logged at the boundary.
  assert any("train/infonce_loss" in r and r["step"] == 4 for r in rows)
  assert any("train/ranking_loss" in r for r in rows)
  assert any(r.get("train/phase") == 1.0 and r["step"] == 4 for r in rows)
  # Killed inside phase 1 (step 2: a stopped run saves its last step), inside phase 2
  # (step 7), then crashed there before its checkpoints after the switch were written
  # (resumes from the switch's own checkpoint, step 4), then finished.
  import shutil
  parts = tmp_path / "parts"
  for stop in (2, 7):
    phased_train(parts, toy_task, stop_at_step=stop)
  for step in (6, 7):
    shutil.rmtree(parts / f"checkpoint_{step}")
  resumed = jax.device_get(phased_train(parts, toy_task))
  rows = [json.loads(l) for l in (parts / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/phase" in r] == [4]     # one switch row
  jax.tree.map(np.testing.assert_array_equal, full.params, resumed.params)
  jax.tree.map(np.testing.assert_array_equal, full.flax_mutables, resumed.flax_mutables)
  jax.tree.map(np.testing.assert_array_equal, full.opt_state, resumed.opt_state)
  # Phase 1 filled the queue and moved s_r; s_r stays ordered.
  assert int(full.flax_mutables["queue"]["filled"]) == 16


def test_em_parallel_phase_trains_from_text_and_pairs(tmp_path, toy_task):
  state = phased_train(tmp_path / "p", toy_task, total=(2, 3), em_parallel=True)
  assert int(state.step) == 5
  # warm-up: 8 right-side keys a step; phase 2: 4 + 2 x 2 = 8 anchors a step.
  assert int(state.flax_mutables["queue"]["filled"]) == 16
  assert int(state.flax_mutables["queue"]["next"]) == (2 * 8 + 3 * 8) % 16


def test_phased_run_checks(tmp_path, toy_task):
  with pytest.raises(ConfigError, match="add up to"):
    from vmx.training.phases import Phase
    from vmx.training.trainer import train
    from vmx.data import pipeline
    name, vp, _, _ = toy_task
    train(model=tiny_model(), phases=[Phase("a", 3, pipeline.DatasetConfig(
        name, {"inputs": 8, "targets": 8}, 8), model=tiny_model("warmup"))],
        optimizer=None, model_dir=str(tmp_path), total_steps=5, vocabulary=vp,
        languages=["xx", "en"])
  with pytest.raises(ConfigError, match="larger than the"):
    phased_train(tmp_path / "q", toy_task, queue_size=512)


def test_emmax_large_config_builds_and_steps_with_two_optimizers():
  """emmax_large.gin (shrunk) builds and takes a phase-2 step; the classifier subset moves
  by one Adam step of 3e-5 (its means start at 0)."""
  from conftest import build_and_step
  bindings = ["NUM_LAYERS = 1", "EMB_DIM = 32", "NUM_HEADS = 2", "MLP_DIM = 64",
              "MAX_LENGTH = 16", "BATCH_SIZE = 8", "QUEUE_SIZE = 16",
              "CLASSIFIER_BATCH_SIZE = 32", "VOCAB_SIZE = 1000", "DROPOUT_RATE = 0.0"]

  def make_batch(model, b):
    assert model.stage == "em" and model.num_ranks == 4 and model.queue_size == 16
    assert model.temperature == 0.04 and model.momentum == 0.999
    return {"tokens": np.random.default_rng(0).integers(5, 900, (b, 16)).astype(np.int32)}
  model, state, metrics = build_and_step("emmax_large.gin", bindings, make_batch)
  assert np.isfinite(float(metrics["loss"].compute()))
  v = initial_variables(model, {"tokens": (8, 16)})
  moved = np.abs(np.asarray(state.params["classifier"]["mean"])
                 - np.asarray(v["params"]["classifier"]["mean"])).max()
  assert 0 < moved <= 3e-5 * 1.01      # one Adam step of lr 3e-5 moves a weight by <= lr
  assert int(state.flax_mutables["queue"]["filled"]) == 8


def test_non_parallel_text_never_holds_both_sides_of_a_pair(tmp_path):
  from conftest import write_lines
  from vmx.data import sources
  xx = write_lines(tmp_path / "a.xx", [f"x{i}" for i in range(9)])
  en = write_lines(tmp_path / "a.en.gz", [f"e{i}" for i in range(9)], gz=True)
  read = lambda src: [ex["inputs"].decode() for ex in
                      src.get_dataset("train", shuffle=False).as_numpy_iterator()]
  assert read(sources.text_source([xx], 0, validation_percent=0)) == [
      f"x{i}" for i in range(0, 9, 2)]
  assert read(sources.text_source([en], 1, validation_percent=0)) == [
      f"e{i}" for i in range(1, 9, 2)]
  assert len(read(sources.text_source([xx, en], validation_percent=0))) == 18


def test_warmup_contrast_eq2_is_the_one_way_infonce_of_eq_2():
  """`warmup_contrast='eq2'`: phase 1's InfoNCE as Eq. 2 prints it, x -> y against the other
  y' of the batch (NumPy), where the default contrasts all 2B sentences (the authors' code)."""
  batch = _batch("warmup")
  losses_ = {}
  for mode in ("eq2", "both_sides"):
    model = tiny_model("warmup", warmup_contrast=mode)
    v = initial_variables(model, {k: x.shape for k, x in batch.items()})
    _, m, _ = model.compute_loss(v["params"], batch, None, None)
    losses_[mode] = float(m["infonce_loss"])
    if mode == "eq2":
      x = np.asarray(model._gamma(v["params"], batch["left_tokens"], None), np.float64)
      y = np.asarray(model._gamma(v["params"], batch["right_tokens"], None), np.float64)
      s = x @ y.T / model.temperature
      want = -np.mean(np.diag(s) - np.log(np.exp(s).sum(axis=1)))
      assert losses_[mode] == pytest.approx(want, rel=1e-4)
  assert losses_["eq2"] != pytest.approx(losses_["both_sides"], rel=1e-3)
  with pytest.raises(ConfigError, match="warmup_contrast"):
    tiny_model("warmup", warmup_contrast="eq3")


def test_e_step_against_the_queue_alone():
  """`e_step_candidates='queue'` (§3.3): the anchors are compared with the K queued keys
  only, not with the batch's own keys; the two settings differ, both are finite."""
  batch = _batch("em")
  out = {}
  for mode in ("queue", "batch_and_queue"):
    model = tiny_model("em", e_step_candidates=mode)
    v = initial_variables(model, {"tokens": (8, 8)})
    mut = {k: v[k] for k in ("momentum", "queue", "rank_sims")}
    mut["queue"] = {"keys": losses.l2_normalize(jax.random.normal(jax.random.PRNGKey(1),
                                                                   (16, 16))),
                    "next": jnp.int32(0), "filled": jnp.int32(16)}
    _, m, new = model.compute_loss(v["params"], batch, jax.random.PRNGKey(2), mut)
    out[mode] = m
    assert np.isfinite(float(m["ranking_loss"])) and int(new["queue"]["filled"]) == 16
    fractions = sum(float(m[f"rank{r}_fraction"]) for r in range(1, 5))
    assert fractions == pytest.approx(1.0, abs=1e-5)
  assert float(out["queue"]["ranking_loss"]) != pytest.approx(
      float(out["batch_and_queue"]["ranking_loss"]), rel=1e-4)
  with pytest.raises(ConfigError, match="em_parallel"):
    tiny_model("em", e_step_candidates="queue", em_parallel=True)
