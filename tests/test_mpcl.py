"""MPCL: the multi-positive loss vs NumPy, = single-positive InfoNCE for one positive;
N-way groups from files; warm-up phase switch; 1 vs 8 devices; every config builds."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DATA_DIR, needs_data, write_lines
from vmx import encoders, losses
from vmx.models import dual_encoder, mpcl


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def anchor_views(V, anchors, positives):
  """The views that anchor a loss term: view 0 (MPCL), every view ('all'), or with one
  positive each pair's first view 0, 2, 4, ... (+Single: every pair its own term)."""
  if anchors == "all":
    return range(V)
  return range(0, V, 2) if positives == "one" else [0]


def mpcl_loss(views, t, rescale=False, anchors="first", positives="all", **kw):
  """The loss MPCLModel trains with for these settings."""
  return losses.multi_positive_infonce(views, t, rescale, anchors=anchors, positives=positives,
                                       **kw)


def _np_mpcl(views, t, rescale=False, anchors="first", positives="all", anchors_at=None):
  """The loss by loops; `anchors_at`: these views anchor the terms (default: the settings')."""
  G, V, D = views.shape
  z = views / np.linalg.norm(views, axis=-1, keepdims=True)
  flat = z.reshape(G * V, D)
  out = []
  for g in range(G):
    for v in (anchor_views(V, anchors, positives) if anchors_at is None else anchors_at):
      i = g * V + v
      if positives == "all":
        pos = [g * V + k for k in range(V) if k != v]
        excluded = [i]
      else:   # one positive (the partner view); the group's other views excluded
        pos = [g * V + (v ^ 1)]
        excluded = [g * V + k for k in range(V) if k != (v ^ 1)]
      others = [j for j in range(G * V) if j not in excluded]
      s = flat[i] @ flat.T
      if rescale:
        lo, hi = s[others].min(), s[others].max()
        s = (2 * (s - lo) / (hi - lo) - 1) / t
      else:
        s = s / t
      out.append(np.log(np.sum(np.exp(s[others]))) - np.log(np.sum(np.exp(s[pos]))))
  return float(np.mean(out))


@pytest.mark.parametrize("rescale", [False, True])
def test_multi_positive_loss_matches_numpy(rescale):
  rng = np.random.default_rng(0)
  views = rng.normal(size=(5, 4, 8)).astype(np.float32)
  loss, m = losses.multi_positive_infonce(jnp.asarray(views), 0.05, rescale)
  assert float(loss) == pytest.approx(_np_mpcl(views.astype(np.float64), 0.05, rescale), rel=1e-4)
  assert 0 <= float(m["positive_accuracy"]) <= 1


@pytest.mark.parametrize("anchors,positives", [("all", "all"), ("first", "one"), ("all", "one")])
@pytest.mark.parametrize("num_views", [4, 6])
def test_controls_match_numpy(anchors, positives, num_views):
  rng = np.random.default_rng(2)
  views = rng.normal(size=(5, num_views, 8)).astype(np.float32)
  for rescale in (False, True):
    loss, m = mpcl_loss(jnp.asarray(views), 0.05, rescale, anchors, positives)
    ref = _np_mpcl(views.astype(np.float64), 0.05, rescale, anchors, positives)
    assert float(loss) == pytest.approx(ref, rel=1e-4)
    assert 0 <= float(m["positive_accuracy"]) <= 1
  with pytest.raises(ValueError, match="odd"):
    losses.multi_positive_infonce(jnp.asarray(views[:, :3]), positives="one")


def test_single_gives_every_pair_of_a_group_its_own_term():
  """+Single (§3.5): pulling the views of pair 2-3 (or 4-5) together lowers the loss, as it
  does for pair 0-1; and the loss is the mean of the three pairs' own InfoNCE terms."""
  rng = np.random.default_rng(5)
  views = rng.normal(size=(4, 6, 8)).astype(np.float64)
  base = float(losses.multi_positive_infonce(jnp.asarray(views, jnp.float32), 0.05,
                                              positives="one")[0])
  for first in (0, 2, 4):
    closer = views.copy()
    closer[:, first + 1] = closer[:, first] + 0.05 * closer[:, first + 1]
    got = float(losses.multi_positive_infonce(jnp.asarray(closer, jnp.float32), 0.05,
                                                  positives="one")[0])
    assert got < base - 0.1, first
  per_pair = []
  for first in (0, 2, 4):     # each pair alone: its anchor, its positive, the same denominator
    order = [first, first + 1] + [k for k in range(6) if k not in (first, first + 1)]
    per_pair.append(_np_mpcl(views[:, order], 0.05, False, "first", "one", anchors_at=[0]))
  assert base == pytest.approx(np.mean(per_pair), rel=1e-4)


def test_one_positive_is_single_positive_infonce_with_the_same_denominator():
  rng = np.random.default_rng(1)
  pairs = rng.normal(size=(6, 2, 8)).astype(np.float64)
  z = pairs / np.linalg.norm(pairs, axis=-1, keepdims=True)
  flat = z.reshape(12, 8)
  t = 0.1
  ref = []
  for g in range(6):
    s = flat[2 * g] @ flat.T / t
    s[2 * g] = -np.inf                                     # j != i
    ref.append(-_np_log_softmax(s[None])[0, 2 * g + 1])    # NT-Xent for the anchor
  loss, _ = losses.multi_positive_infonce(jnp.asarray(pairs, jnp.float32), t)
  assert float(loss) == pytest.approx(np.mean(ref), rel=1e-5)


def _model(num_views=3, **kw):
  enc = encoders.TransformerEncoder(vocab_size=40, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  return mpcl.MPCLModel(dual_encoder.DualEncoder(encoder=enc), num_views=num_views, **kw)


def _views_batch(b=4, v=3, length=8, seed=0, hard_negative=False):
  rng = np.random.default_rng(seed)
  toks = rng.integers(1, 40, size=(b, v + hard_negative, length)).astype(np.int32)
  toks[:, :, 6:] = 0
  out = {"views": toks[:, :v].reshape(b, v * length)}
  return {**out, "hard_negative": toks[:, v]} if hard_negative else out


def test_single_positive_warmup_then_mpcl():
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  model = _model(single_positive_steps=2)
  batch = _views_batch()
  tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3),
               partitioning.Partitioner(num_devices=1), {"views": batch["views"].shape})
  state = tr.create_state(0)
  phases = []
  for _ in range(3):
    state, m = tr.step(state, batch)
    phases.append(float(m["multi_positive_phase"].compute()))
    if phases[-1] == 0:
      assert float(m["loss"].compute()) == pytest.approx(float(m["single_positive_loss"].compute()))
  assert phases == [0.0, 0.0, 1.0]
  assert float(m["loss"].compute()) == pytest.approx(float(m["mpcl_loss"].compute()))
  assert int(state.flax_mutables["phase"]["updates"]) == 3


def test_single_trains_on_every_pair_in_the_warm_up_too():
  """+Single is single-positive throughout: its warm-up loss is the +Single loss of all
  pairs, not Eq. 1 on views 0-1 alone (MPCL's warm-up)."""
  model = _model(num_views=4, positives="one", single_positive_steps=5)
  batch = _views_batch(v=4)
  params = model.get_initial_variables(jax.random.PRNGKey(0), {"views": batch["views"].shape})
  emb = model.embed_views(params["params"], batch)
  warm, m = model.objective(emb, jnp.bool_(False))
  want, _ = losses.multi_positive_infonce(emb, model.temperature, model.rescale,
                                          positives="one")
  assert float(warm) == pytest.approx(float(want)) == pytest.approx(float(m["mpcl_loss"]))
  first_pair, _ = losses.multi_positive_infonce(emb[:, :2], model.temperature, model.rescale)
  assert abs(float(warm) - float(first_pair)) > 1e-3


def test_model_rejects_bad_settings_and_embeds_left_tokens():
  with pytest.raises(ValueError, match="num_views=1"):
    _model(num_views=1)
  enc = encoders.TransformerEncoder(vocab_size=40, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, num_languages=3)
  with pytest.raises(ValueError, match="language ids"):
    mpcl.MPCLModel(dual_encoder.DualEncoder(encoder=enc))
  model = _model()
  batch = _views_batch()
  params = model.get_initial_variables(jax.random.PRNGKey(0), {"views": batch["views"].shape})
  views = batch["views"].reshape(4, 3, 8)
  emb = model.encode_tokens(params["params"], views[:, 1], None)
  all_views = model.embed_views(params["params"], batch)
  np.testing.assert_allclose(emb, losses.l2_normalize(all_views[:, 1]), rtol=1e-5, atol=1e-6)
  assert model.FEATURE_CONVERTER_CLS(pack=False).get_model_feature_lengths({"views": 8}) == \
      {"views": 24}


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_loss_and_grads_equal_on_1_and_8_devices():
  from conftest import assert_same_loss_and_grads_on_1_and_8_devices
  model = _model()
  phase = {"phase": {"updates": jnp.ones((), jnp.int32)}}
  assert_same_loss_and_grads_on_1_and_8_devices(
      model, _views_batch(b=8), lambda p, b: model.compute_loss(p, b, None, phase)[0])


@pytest.mark.parametrize("num_devices,chunks", [pytest.param(1, 4, marks=pytest.mark.slow),
                                                (8, 2)])
def test_grad_cache_steps_equal_the_uncached_steps(num_devices, chunks):
  """GradCache on MPCL (train.grad_cache_chunks): the same losses and parameters as the
  whole-batch steps across the warm-up -> MPCL switch (the update counter advances once a
  step, in the loss), on 1 device and with the chunks split over 8."""
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  if jax.device_count() < num_devices:
    pytest.skip("needs 8 (simulated) devices")
  model = _model(single_positive_steps=1)
  batch = _views_batch(b=16)
  out = []
  for n, c in ((1, 1), (num_devices, chunks)):
    part = partitioning.Partitioner(num_devices=n)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-2), part,
                 {"views": batch["views"].shape}, grad_cache_chunks=c)
    state, seen = tr.create_state(0), []
    for _ in range(3):
      state, m = tr.step(state, batch)
      seen.append((float(m["loss"].compute()), float(m["multi_positive_phase"].compute())))
    out.append((seen, jax.tree.map(np.asarray, state.params),
                int(state.flax_mutables["phase"]["updates"])))
  (seen1, p1, u1), (seen2, p2, u2) = out
  assert [p for _, p in seen1] == [p for _, p in seen2] == [0.0, 1.0, 1.0]
  np.testing.assert_allclose([l for l, _ in seen2], [l for l, _ in seen1], rtol=1e-5)
  assert u1 == u2 == 3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p2)


def test_nway_task_yields_aligned_views(tmp_path):
  """Every example's views are translations of ONE group, in distinct languages."""
  from vmx.data import feature_converters, pipeline, readers, registration, seqio_reader, vocab
  langs = ["aa", "bb", "cc", "dd"]
  files = {}
  for l in langs:
    lines = [f"group{i} in {l}" if not (l == "dd" and i % 2) else "" for i in range(40)]
    files[l] = write_lines(tmp_path / f"x.{l}", lines)
  got_langs, rows = readers.read_nway_lines(files)
  assert got_langs == langs and rows[1] == ["group1 in aa", "group1 in bb", "group1 in cc", ""]
  vp = vocab.vocabulary_path(str(tmp_path / "v.model"), list(files.values()), 60, [])
  name = registration.register_nway_task("test_nway.views3", langs, rows, vp, num_views=3,
                                   shuffle_buffer_size=64)
  fc = feature_converters.MultiViewFeatureConverter(num_views=3)
  cfg = pipeline.DatasetConfig(name, {"views": 16}, batch_size=8, seed=1)
  tok = vocab.Tokenizer(vp)
  anchors = set()
  for batch in seqio_reader.get_dataset(cfg, fc, seed=1).take(10).as_numpy_iterator():
    assert batch["views"].shape == (8, 48)
    for ex in batch["views"].reshape(8, 3, 16):
      texts = [tok.sp.decode([int(t) for t in v if t]) for v in ex]
      groups = {t.split()[0] for t in texts}
      assert len(groups) == 1, texts                        # one sentence, K+1 translations
      assert len({t.split()[-1] for t in texts}) == 3, texts  # distinct languages
      anchors.add(texts[0].split()[-1])
  assert anchors == set(langs)                              # any language can be the anchor
  # each pass over the 40 groups draws new views: group 3's anchors differ across passes
  cfg1 = pipeline.DatasetConfig(name, {"views": 16}, batch_size=1, shuffle=False, seed=1)
  seen = [tok.sp.decode([int(t) for t in b["views"][0, :16] if t]) for b in
          seqio_reader.get_dataset(cfg1, fc, seed=1).take(400).as_numpy_iterator()]
  group3 = {s.split()[-1] for s in seen if s.startswith("group3 ")}
  assert len(group3) >= 2, group3
  write_lines(tmp_path / "x.dd", ["short"])
  from vmx.errors import DataError
  with pytest.raises(DataError, match=r"x.dd has 1 lines"):
    readers.read_nway_lines({**files, "dd": str(tmp_path / "x.dd")})


@needs_data
def test_real_nway_corpora_are_aligned():
  import gzip
  import tasks
  langs, rows = tasks.nway_groups("wmt-newstest-multiway", ["de", "en", "ru"], DATA_DIR)
  with gzip.open(f"{DATA_DIR}/train/wmt-newstest-multiway/2013/newstest2013.ru.gz", "rt") as f:
    ru = [l.strip() for l in f]
  with gzip.open(f"{DATA_DIR}/train/wmt-newstest-multiway/2013/newstest2013.de.gz", "rt") as f:
    de = [l.strip() for l in f]
  i = len(rows) - len(de)                                   # 2013 is the last block
  assert rows[i] == [de[0], rows[i][1], ru[0]] and rows[-1][2] == ru[-1]
  assert sum(bool(r[0] and r[1]) for r in rows) > 0.99 * len(rows)   # de, en in every year


MPCL_FILES = ["mpcl_tiny.gin", "mpcl_single_tiny.gin", "mpcl.gin", "mpcl_single.gin",
              "ablations/mpcl_single_pairs_tiny.gin", "mpcl_hard_negative.gin",
              "mpcl_xlmr.gin", "mpcl_xlmr_single.gin", "mpcl_xlmr_single_pairs.gin",
              "mpcl_mbert.gin", "mpcl_mbert_single.gin", "mpcl_labse.gin", "mpcl_msimcse.gin"]


# The fast tier steps one file per distinct code path (from scratch +Multiple / +Single,
# random pairs, an XLM-R backbone, LaBSE's pooled CLS, hard negatives); the slow tier the
# rest, which differ from these only in sizes, checkpoints and learning rates.
SLOW_MPCL_FILES = ("mpcl.gin", "mpcl_single.gin", "mpcl_xlmr_single.gin",
                   "mpcl_xlmr_single_pairs.gin", "mpcl_mbert.gin", "mpcl_mbert_single.gin",
                   "mpcl_msimcse.gin")


@pytest.mark.parametrize("name", [pytest.param(f, marks=pytest.mark.slow)
                                  if f in SLOW_MPCL_FILES else f for f in MPCL_FILES])
def test_every_mpcl_file_builds_and_takes_a_step(name):
  from conftest import build_and_step
  model, _, metrics = build_and_step(
      name, ["NUM_LAYERS = 1", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32",
             "VOCAB_SIZE = 40", "MAX_LENGTH = 8", "BATCH_SIZE = 4"],
      lambda m, b: _views_batch(b=b, v=m.num_views, hard_negative=m.hard_negatives))
  # the paper's files: K = 5 positives (§3.5); the CPU-scale files: 3; pairs: 1
  assert model.num_views == (2 if "pairs" in name else 4 if "tiny" in name else 6)
  assert model.positives == ("one" if "single" in name and "tiny" not in name
                             or name == "mpcl_single_tiny.gin" else "all")
  assert model.hard_negatives == ("hard_negative" in name)   # §3.5's XLM-R w/ hard negative
  assert np.isfinite(float(metrics["loss"].compute()))
  enc = model.module.encoder
  if name.startswith(("mpcl_xlmr", "mpcl_mbert", "mpcl_labse", "mpcl_msimcse")):
    assert enc.family == "bert"                         # an imported pretrained encoder
    # §3.3: LM base models warm up on Eq. 1 for 2,000 steps; sentence embedding models not
    warm = 0 if name in ("mpcl_labse.gin", "mpcl_msimcse.gin") else 2000
    assert model.single_positive_steps == warm
    assert model.module.pooling == ("pooler" if name == "mpcl_labse.gin" else "first")


def test_learning_rate_scale_at_halves_after_the_warmup():
  from vmx.training import optimizers
  sched = optimizers.learning_rate_schedule("constant", 2e-5, warmup_steps=1, scale_at={2000: 0.5})
  assert float(sched(1999)) == pytest.approx(2e-5)
  assert float(sched(2000)) == pytest.approx(1e-5)
  assert float(sched(10000)) == pytest.approx(1e-5)


def test_nway_tsv_groups_by_id_and_bible_text_for_the_vocabulary(tmp_path):
  from vmx.data import readers
  from vmx.errors import DataError
  p = write_lines(tmp_path / "b.tsv", ["f1\teus\tv1\tkaixo", "f2\tfin\tv1\thei", "f3\tfin\tv1\tmoi",
                                       "f1\teus\tv2\tagur", "f2\tfin\tv3\tterve"])
  langs, rows = readers.read_nway_tsv(p)
  assert langs == ["eus", "fin"] and rows == [["kaixo", "hei"], ["agur", ""], ["", "terve"]]
  with pytest.raises(DataError, match=r"no lines for languages \['deu'\]"):
    readers.read_nway_tsv(p, ["deu"])
  h = write_lines(tmp_path / "h.tsv", ["file\tiso639\tverse_id\ttext", "f1\teus\tv1\tkaixo"])
  assert readers.read_nway_tsv(h, header=True) == (["eus"], [["kaixo"]])


@needs_data
def test_bible_verses_groups():
  import tasks
  langs, rows = tasks.nway_groups("bible-verses", None, DATA_DIR)
  assert len(langs) == 46 and "iso639" not in langs
  assert sum(sum(bool(t) for t in r) >= 4 for r in rows) > 8000   # usable 4-view groups


@needs_data
def test_real_nway_pipeline_yields_aligned_translations(tmp_path):
  """From the real newstest files through SeqIO: each example's views are one group's
  sentences (K + 1 translations of one sentence)."""
  import tasks
  from vmx.data import feature_converters, pipeline, seqio_reader, vocab
  langs = ["de", "en", "fr"]
  _, rows = tasks.nway_groups("wmt-newstest-multiway", langs, DATA_DIR)
  files = tasks.nway_text_files("wmt-newstest-multiway", langs, DATA_DIR)[:3]
  vp = vocab.vocabulary_path(str(tmp_path / "v.model"), files, 1000, [])
  name = tasks.nway_task("wmt-newstest-multiway", langs, vp, 3, DATA_DIR, shuffle_buffer_size=256)
  tok = vocab.Tokenizer(vp)
  norm = lambda t: " ".join(t.split())
  group_of = {}
  for r in rows:
    for t in r:
      group_of.setdefault(norm(tok.sp.decode(tok.sp.encode(t)[:64])), set()).add(tuple(r))
  cfg = pipeline.DatasetConfig(name, {"views": 64}, batch_size=4, seed=0)
  fc = feature_converters.MultiViewFeatureConverter(num_views=3)
  for batch in seqio_reader.get_dataset(cfg, fc, seed=0).take(3).as_numpy_iterator():
    for ex in batch["views"].reshape(4, 3, 64):
      texts = [norm(tok.sp.decode([int(t) for t in v if t])) for v in ex]
      common = set.intersection(*(group_of[t] for t in texts))
      assert common, texts                                   # all three from one group
      assert len(set(texts)) == 3


def test_single_pairs_cut_each_group_into_separate_pairs_of_its_split():
  """MPCL §3.5's +Single data: a group of K languages (or more) becomes K / 2 rows of two
  texts each, every drawn sentence in exactly one pair, the same pairs on every call
  (seeded by the group's texts), each pair in its group's split, a group's pairs a
  split's number of groups apart (never in one window of the reader); a group with fewer
  languages is dropped; the bindings are checked."""
  import collections
  from tasks.nway import pairs_key
  from vmx.data import nway
  from vmx.errors import ConfigError, DataError
  langs = ["aa", "bb", "cc", "dd", "ee", "ff"]
  rows = [[f"g{i} {l}" for l in langs] for i in range(300)]
  rows += [[f"short{i} {l}" if j < 3 else "" for j, l in enumerate(langs)] for i in range(20)]
  src = nway.NwaySource(langs, rows, 2, validation_percent=10, pairs_from_groups=6)
  pairs = {k: [[t.decode() for t in r] for r in v] for k, v in src._rows.items()}   # noqa: SLF001
  assert sum(map(len, pairs.values())) == 300 * 3                 # 3 pairs a group of six
  by_group = collections.defaultdict(list)
  for split, split_rows in pairs.items():
    for i, r in enumerate(split_rows):
      texts = [t for t in r if t]
      assert len(texts) == 2                                      # a pair a row
      group = {t.split()[0] for t in texts}
      assert len(group) == 1 and not group & {f"short{i}" for i in range(20)}
      by_group[group.pop()].append((split, r, i))
  for g, members in by_group.items():
    assert len(members) == 3 and len({s for s, _, _ in members}) == 1, g   # one split a group
    cells = [i for _, r, _ in members for i, t in enumerate(r) if t]
    assert sorted(cells) == list(range(6)), g                     # each sentence once
    at = sorted(i for _, _, i in members)                         # a split's groups apart
    assert min(b - a for a, b in zip(at, at[1:])) == len(pairs[members[0][0]]) // 3
  first = [nway.single_pairs(r, 6) for r in rows[:50]]
  assert first == [nway.single_pairs(r, 6) for r in rows[:50]]    # deterministic
  assert len({tuple(map(tuple, p)) for p in first}) > 1           # ... not one fixed pairing
  four = nway.single_pairs(rows[0], 4)                            # K < N: four of six drawn
  assert len(four) == 2 and sum(bool(t) for r in four for t in r) == 4
  with pytest.raises(DataError, match=r"no N-way group has 6 languages"):
    nway.NwaySource(langs, rows[300:], 2, pairs_from_groups=6)
  assert pairs_key(None, 6, "tasks.x") == "" and pairs_key(6, 2, "tasks.x") == ".pairs6"
  with pytest.raises(ConfigError, match=r"tasks.x.pairs_from_groups=6 makes examples of two "
                                        r"views, but num_views \(NUM_VIEWS\) is 6"):
    pairs_key(6, 6, "tasks.x")
  with pytest.raises(ConfigError, match=r"tasks.x.pairs_from_groups=5: expected an even"):
    pairs_key(5, 2, "tasks.x")
