"""MPCL's hard-negative variant (Zhao et al. §3.5): the loss with hard negatives vs a
hand-written NumPy reference (and = the plain loss without them, bitwise); XNLI-MT files
(the real layout, both label spellings) -> groups of a premise's translations and its
contradiction hypotheses; the draws (views as the plain N-way rule, the hard negative a
function of the position); a tiny model trained through the trainer on a synthetic
XNLI-MT fixture, its resume equal to the uninterrupted run."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import write_lines
from vmx import encoders, losses
from vmx.errors import ConfigError, DataError
from vmx.models import dual_encoder, mpcl
from test_mpcl import anchor_views, mpcl_loss


# --- the loss ---

def _np_mpcl_hard(views, negs, t, rescale=False, anchors="first", positives="all"):
  """(loss, hard_negative_accuracy) of Eq. 2 with every hard negative of the batch in
  every anchor's denominator, by loops."""
  G, V, D = views.shape
  H = negs.shape[1]
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  flat, hn = unit(views).reshape(G * V, D), unit(negs).reshape(G * H, D)
  losses_, hits = [], []
  for g in range(G):
    for v in anchor_views(V, anchors, positives):
      i = g * V + v
      if positives == "all":
        pos, excluded = [g * V + k for k in range(V) if k != v], [i]
      else:
        pos, excluded = [g * V + (v ^ 1)], [g * V + k for k in range(V) if k != (v ^ 1)]
      sv, sn = flat @ flat[i], hn @ flat[i]
      den = np.array([sv[j] for j in range(G * V) if j not in excluded] + list(sn))
      if rescale:
        lo, hi = den.min(), den.max()
        f = lambda s: (2 * (s - lo) / (hi - lo) - 1) / t  # noqa: E731
      else:
        f = lambda s: s / t  # noqa: E731
      losses_.append(np.log(np.exp(f(den)).sum()) - np.log(np.exp(f(sv[pos])).sum()))
      hits.append(sv[pos].max() > sn[g * H:(g + 1) * H].max())
  return float(np.mean(losses_)), float(np.mean(hits))


@pytest.mark.parametrize("anchors,positives", [("first", "all"), ("all", "all"), ("first", "one")])
@pytest.mark.parametrize("rescale", [False, True])
def test_hard_negative_loss_matches_numpy(rescale, anchors, positives):
  rng = np.random.default_rng(3)
  views = rng.normal(size=(5, 4, 8)).astype(np.float32)
  for h in (1, 2):
    negs = rng.normal(size=(5, h, 8)).astype(np.float32)
    negs[1, 0] = views[1, 0] + 0.1 * negs[1, 0]     # one hard negative close to its anchor
    loss, m = mpcl_loss(jnp.asarray(views), 0.05, rescale, anchors, positives,
                        hard_negatives_GxHxD=jnp.asarray(negs))
    ref, hit = _np_mpcl_hard(views.astype(np.float64), negs.astype(np.float64), 0.05, rescale,
                             anchors, positives)
    assert float(loss) == pytest.approx(ref, rel=1e-4)
    assert float(m["hard_negative_accuracy"]) == pytest.approx(hit)
    plain, _ = mpcl_loss(jnp.asarray(views), 0.05, rescale, anchors, positives)
    assert float(loss) > float(plain)             # more negatives in every denominator


def test_no_hard_negatives_is_the_plain_loss_bitwise():
  """H = 0 hard negatives: the same loss, metrics and gradients as the loss without them
  (whose values tests/test_mpcl.py pins to NumPy)."""
  rng = np.random.default_rng(4)
  views = jnp.asarray(rng.normal(size=(6, 4, 8)).astype(np.float32))
  empty = jnp.zeros((6, 0, 8), jnp.float32)
  for rescale, a, p in ((False, "first", "all"), (True, "all", "one")):
    f = lambda v, neg: losses.multi_positive_infonce(  # noqa: E731
        v, 0.05, rescale, anchors=a, positives=p, hard_negatives_GxHxD=neg)
    (l0, m0), g0 = jax.jit(jax.value_and_grad(lambda v: f(v, None), has_aux=True))(views)
    (l1, m1), g1 = jax.jit(jax.value_and_grad(lambda v: f(v, empty), has_aux=True))(views)
    assert np.asarray(l0).tobytes() == np.asarray(l1).tobytes()
    np.testing.assert_array_equal(g0, g1)
    assert m0.keys() == m1.keys() and "hard_negative_accuracy" not in m1
  with pytest.raises(ValueError, match=r"expected \[6, H, 8\]"):
    losses.multi_positive_infonce(views, hard_negatives_GxHxD=jnp.zeros((5, 1, 8)))


# --- XNLI-MT files ---

LANGS = ["de", "en", "fr", "zh"]


def _xnli_mt(root, n=24, langs=LANGS, header=True):
  """XNLI-MT-1.0/multinli/multinli.train.<lang>.tsv: premise p{i}, hypotheses e{i} n{i}
  c{i} (entailment, neutral, contradiction) in shuffled order; the training files'
  `contradictory` spelling, `contradiction` in the last language; the zh translation of
  premise 3 empty."""
  rng = np.random.default_rng(0)
  rows = []
  for i in range(n):
    for j in rng.permutation(3):
      rows.append((i, "enc"[j], ["entailment", "neutral", "contradictory"][j]))
  d = root / "XNLI-MT-1.0" / "multinli"
  for lang in langs:
    spell = (lambda s: s.replace("contradictory", "contradiction")) if lang == langs[-1] else str
    lines = (["premise\thypo\tlabel"] if header else []) + [
        f"{'' if (i == 3 and lang == 'zh') else f'p{i} {lang} words'}\t{k}{i} {lang} words"
        f"\t{spell(label)}" for i, k, label in rows]
    write_lines(d / f"multinli.train.{lang}.tsv", lines)
  return d


def test_xnli_mt_groups_are_premises_with_their_contradictions(tmp_path):
  import tasks
  d = _xnli_mt(tmp_path)
  for where in (d, d.parent):                     # multinli/ or the XNLI-MT-1.0/ above it
    langs, premises, negatives = tasks.xnli_mt_groups(str(where), LANGS)
    assert langs == LANGS and len(premises) == len(negatives) == 24
    for p, c in zip(premises, negatives):
      i = p[0].split()[0][1:]
      assert p == [f"p{i} {l} words" if not (i == "3" and l == "zh") else "" for l in LANGS]
      assert c == [f"c{i} {l} words" for l in LANGS]   # its contradiction, not e / n
  headless = _xnli_mt(tmp_path / "h", header=False)
  assert tasks.read_xnli_mt(tasks.xnli_mt_files(str(headless), LANGS))[1] == premises


def test_xnli_mt_bad_files_are_named(tmp_path):
  import tasks
  d = _xnli_mt(tmp_path)
  files = tasks.xnli_mt_files(str(d), LANGS)
  with pytest.raises(DataError, match=r"no multinli.train.<lang>.tsv for languages \['ru'\]"):
    tasks.xnli_mt_files(str(d), ["de", "ru"])
  with pytest.raises(ConfigError, match="XNLI_MT_DIR"):
    tasks.xnli_mt_files(None, LANGS)
  fr = open(files["fr"]).read().splitlines()
  write_lines(d / "multinli.train.fr.tsv", fr[:1] + fr[2:] + fr[1:2])     # shifted by a line
  with pytest.raises(DataError, match=r"multinli.train.de.tsv:2 and .*multinli.train.fr.tsv:2: "
                                      r"labels .* differ"):
    tasks.read_xnli_mt(files)
  write_lines(d / "multinli.train.fr.tsv", fr[:-1])
  with pytest.raises(DataError, match=r"multinli.train.fr.tsv ends before"):
    tasks.read_xnli_mt(files)
  write_lines(d / "multinli.train.fr.tsv", fr[:5] + ["a\tb\tunknown"] + fr[6:])
  with pytest.raises(DataError, match=r"multinli.train.fr.tsv:6: label 'unknown'"):
    tasks.read_xnli_mt(files)
  write_lines(d / "multinli.train.fr.tsv", fr[:5] + ["a\tb"] + fr[6:])
  with pytest.raises(DataError, match=r"multinli.train.fr.tsv:6: 2 tab-separated field"):
    tasks.read_xnli_mt(files)


# --- the draws ---

def test_views_are_the_plain_draws_and_the_hard_negative_a_function_of_the_position():
  from vmx.data import nway
  rows = [["a0", "", "c0", "d0"], ["a1", "b1", "c1", "d1"]]
  negs = [["x0", "y0", "", "w0"], ["x1", "y1", "z1", "w1"]]
  src = nway.NwayHardNegativeSource(["a", "b", "c", "d"], rows, negs, 2, validation_percent=0)
  plain = nway.NwaySource(["a", "b", "c", "d"], rows, 2, validation_percent=0)
  assert src.num_input_examples("train") == 2 and src.languages == ["a", "b", "c", "d"]
  tokens = np.arange(2 * 4 * 3).reshape(2, 4, 3)          # token rows name (group, language)
  stored = {"tokens": tokens, "present": np.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool),
            "negative_tokens": 100 + tokens,
            "negative_present": np.array([[1, 1, 0, 1], [1, 1, 1, 1]], bool)}
  seeds = [(7, g) for g in range(400)]
  pick = lambda a: {k: v[a] for k, v in stored.items()}   # noqa: E731
  got = src.draw_views(pick(np.zeros(400, int)), seeds)
  np.testing.assert_array_equal(
      got["views"], plain.draw_views(pick(np.zeros(400, int)), seeds)["views"])
  lang = (got["hard_negative"][:, 0] - 100) // 3
  assert set(lang.tolist()) == {0, 1, 3}                  # every language it has, not 2
  assert min(np.bincount(lang, minlength=4)[[0, 1, 3]]) > 100
  one = src.draw_views(pick(np.array([0])), [(7, 5)])
  np.testing.assert_array_equal(one["hard_negative"][0], got["hard_negative"][5])
  with pytest.raises(DataError, match="and a hard negative"):
    nway.NwayHardNegativeSource(["a", "b"], [["a", "b"]], [["", ""]], 2)


# --- through the pipelines and the trainer ---

@pytest.fixture(scope="module")
def xnli_task(tmp_path_factory):
  """(task name, vocabulary, {premise text: contradiction texts}) of the fixture, 3 views."""
  import tasks
  from vmx.data import vocab
  root = tmp_path_factory.mktemp("xnli_mt")
  d = _xnli_mt(root, n=60)
  texts = tasks.xnli_mt_text_files(str(d), LANGS)
  vp = vocab.vocabulary_path(str(root / "v.model"), texts, 150, [])
  name = tasks.xnli_mt_task(str(d), LANGS, vp, 3, shuffle_buffer_size=64, validation_percent=0)
  _, premises, negatives = tasks.xnli_mt_groups(str(d), LANGS)
  return name, vp, {p: set(c) for ps, c in zip(premises, negatives) for p in ps if p}


def _check_examples(batch, vp, contradictions, v=3, length=8):
  from vmx.data import vocab
  tok = vocab.Tokenizer(vp)
  text = lambda ids: " ".join(tok.sp.decode([int(t) for t in ids if t]).split())  # noqa: E731
  for views, neg in zip(batch["views"].reshape(-1, v, length), batch["hard_negative"]):
    views = [text(r) for r in views]
    assert len({s.split()[0] for s in views}) == 1, views         # one premise, v languages
    assert len({s.split()[1] for s in views}) == v, views
    assert text(neg) in contradictions[views[0]], (views, text(neg))   # its contradiction


@pytest.mark.parametrize("reader", ["index", "seqio"])
def test_batches_hold_a_premise_and_its_contradiction(xnli_task, reader):
  from vmx.data import pipeline
  name, vp, contradictions = xnli_task
  fc = _model(hard_negatives=True).FEATURE_CONVERTER_CLS
  cfg = pipeline.DatasetConfig(name, {"views": 8}, batch_size=16, reader=reader)
  it = pipeline.train_iterator(cfg, fc, seed=0, progress=False)
  for _ in range(2):
    batch = next(it)
    assert batch["views"].shape == (16, 24) and batch["hard_negative"].shape == (16, 8)
    _check_examples(batch, vp, contradictions)
  if reader == "index":   # the task has hard negatives, the plain model reads none
    with pytest.raises(ConfigError, match="has hard negatives but the model reads none"):
      pipeline.train_iterator(cfg, _model().FEATURE_CONVERTER_CLS, seed=0, progress=False)


def _model(num_views=3, **kw):
  enc = encoders.TransformerEncoder(vocab_size=150, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, dropout_rate=0.1)
  return mpcl.MPCLModel(dual_encoder.DualEncoder(encoder=enc), num_views=num_views, **kw)


def test_the_loss_reads_the_hard_negatives_and_its_gradients_are_finite():
  model = _model(hard_negatives=True, single_positive_steps=1)
  rng = np.random.default_rng(0)
  batch = {"views": rng.integers(1, 150, size=(4, 24)).astype(np.int32),
           "hard_negative": rng.integers(1, 150, size=(4, 8)).astype(np.int32)}
  params = model.get_initial_variables(jax.random.PRNGKey(0),
                                      {k: v.shape for k, v in batch.items()})["params"]
  phase = {"phase": {"updates": jnp.ones((), jnp.int32)}}
  (loss, (m, _)), grads = jax.jit(jax.value_and_grad(
      lambda p: (lambda l, m, u: (l, (m, u)))(*model.compute_loss(p, batch, None, phase)),
      has_aux=True))(params)
  emb = jax.jit(lambda p: model._embed(p, batch))(params)
  ref, _ = losses.multi_positive_infonce(emb[:, :3], 0.05, True, hard_negatives_GxHxD=emb[:, 3:])
  assert float(loss) == pytest.approx(float(ref), rel=1e-6) and "hard_negative_accuracy" in m
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  with pytest.raises(ConfigError, match="no 'hard_negative' feature"):
    model.compute_loss(params, {"views": batch["views"]}, None, phase)


def _train(model_dir, name, vp, stop_at_step=None):
  from vmx.data import pipeline
  from vmx.modeldir import checkpoints
  from vmx.training import optimizers, partitioning
  from vmx.training.trainer import train
  state, metrics = train(
      model=_model(hard_negatives=True, single_positive_steps=2),
      train_dataset_cfg=pipeline.DatasetConfig(name, {"views": 8}, batch_size=8),
      optimizer=optimizers.create_optimizer("adam", 1e-2), model_dir=str(model_dir),
      total_steps=5, vocabulary=vp, languages=[],
      partitioner=partitioning.Partitioner(num_devices=2),
      checkpoint_cfg=checkpoints.CheckpointConfig(period=3, keep=2), log_period=1,
      random_seed=1, progress=False, stop_at_step=stop_at_step)
  return state, metrics


def test_tiny_training_with_hard_negatives_resumes_as_uninterrupted(xnli_task, tmp_path):
  """The trainer on the XNLI-MT fixture (index reader, dropout on, the warm-up -> MPCL
  switch at step 2): stopped at step 3 and resumed, the run equals the uninterrupted one."""
  import json
  name, vp, _ = xnli_task
  full, _ = _train(tmp_path / "full", name, vp)
  _train(tmp_path / "split", name, vp, stop_at_step=3)
  resumed, _ = _train(tmp_path / "split", name, vp)
  assert int(resumed.step) == 5 and int(resumed.flax_mutables["phase"]["updates"]) == 5
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.params, resumed.params)
  rows = [json.loads(l) for l in open(tmp_path / "full" / "metrics.jsonl")]
  train_rows = [r for r in rows if "train/loss" in r]
  assert [r["train/multi_positive_phase"] for r in train_rows] == [0, 0, 1, 1, 1]
  assert all(np.isfinite(r["train/loss"]) and 0 <= r["train/hard_negative_accuracy"] <= 1
             for r in train_rows)



def test_mpcl_trains_on_xnli_mt_premises_when_supplied(xnli_task, tmp_path):
  """§3.1: with XNLI-MT's folder, mpcl.gin's groups are every training line's premise in
  the run's languages (not only the contradiction lines, no hard negative), drawn as
  NUM_VIEWS distinct languages; without it, the newstest groups of the data directory."""
  import gin
  import tasks
  from vmx import experiment
  from vmx.data import pipeline
  from vmx.errors import ConfigError
  _, vp, _ = xnli_task
  d = _xnli_mt(tmp_path, n=30)
  langs, premises, none = tasks.xnli_mt_groups(str(d), LANGS, "premises")
  assert none is None and len(premises) == 90          # every line: 30 premises x 3
  name = tasks.mpcl_mixture(str(d), LANGS, {"wmt-newstest-multiway": ["de", "en"]}, vp, 3)
  assert name.startswith("xnli_mt.views3.")
  it = pipeline.train_iterator(pipeline.DatasetConfig(name, {"views": 8}, batch_size=8),
                               _model().FEATURE_CONVERTER_CLS, seed=0, progress=False)
  from vmx.data import vocab
  tok = vocab.Tokenizer(vp)
  for views in next(it)["views"].reshape(-1, 3, 8):
    texts = [" ".join(tok.sp.decode([int(t) for t in r if t]).split()) for r in views]
    assert len({t.split()[0] for t in texts}) == 1 and texts[0].startswith("p")
    assert len({t.split()[1] for t in texts}) == 3
  with pytest.raises(ConfigError, match="NUM_VIEWS=5 views of distinct languages"):
    tasks.mpcl_mixture(str(d), LANGS, {}, vp, 5)
  gin.clear_config()
  experiment.parse_experiment(["mpcl.gin"], [f"XNLI_MT_DIR = '{d}'"])
  try:
    assert gin.query_parameter("tasks.mpcl_mixture.xnli_mt_directory").scopes == ["XNLI_MT_DIR"]
    assert gin.query_parameter("%MIXTURE_OR_TASK_NAME").selector == "tasks.mpcl_mixture"
    assert gin.query_parameter("%MPCL_LANGUAGES") == ["en", "de", "fr", "es", "ru", "zh"]
    assert gin.query_parameter("%XNLI_MT_DIR") == str(d)
  finally:
    gin.clear_config()
