"""Evaluation suite: every metric against hand-computed cases, NumPy, scipy, scikit-learn;
blocked kNN == brute force (1 and 8 devices); the harness's files round-trip."""
import dataclasses
import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from scipy import stats

from conftest import write_lines
from vmx.data.languages import iso3
from vmx.errors import DataError
from vmx.evaluation import (bucc, common, geometry, harness, knn, knn_cpu, mining,
                            retrieval, sts, tatoeba, transfer)


def _unit(rng, n, d):
  return mining.normalize(rng.standard_normal((n, d)).astype(np.float32))


def _ref_topk(x, y, k):
  s = x.astype(np.float64) @ y.astype(np.float64).T
  ri = np.argsort(-s, axis=1, kind="stable")[:, :k]
  ci = np.argsort(-s.T, axis=1, kind="stable")[:, :k]
  return s, ri, ci


# ----------------------------------------------------------------------------- kNN

@pytest.mark.parametrize("n,m,k,ndev,rows,chunk", [
    (1000, 777, 4, 1, 64, 1), (1000, 777, 4, 8, 64, 2), (37, 301, 1, 8, 64, 1),
    (300, 64, 20, 1, 64, 2), (500, 900, 5, 1, 48, 3), (400, 333, 3, 2, 80, 1)])
def test_blocked_topk_equals_brute_force(n, m, k, ndev, rows, chunk):
  """k not a power of two, odd numbers of row groups a block (48 / 16, 80 / 16) and of
  tiles a chunk: the tournament's padded rounds; merges every tile and every few."""
  if jax.device_count() < ndev:
    pytest.skip("needs 8 (simulated) devices")
  rng = np.random.default_rng(n + m)
  x, y = _unit(rng, n, 24), _unit(rng, m, 24)
  s, ri, ci = _ref_topk(x, y, k)
  nn = knn.bidirectional_topk(x, y, k=k, block_rows=rows, block_cols=128, group=16,
                              chunk_tiles=chunk, devices=jax.devices()[:ndev], kernel="xla")
  np.testing.assert_array_equal(nn.row_idx, ri)
  np.testing.assert_array_equal(nn.col_idx, ci)
  np.testing.assert_allclose(nn.row_vals, np.take_along_axis(s, ri, 1), atol=1e-5)
  np.testing.assert_allclose(nn.col_vals, np.take_along_axis(s.T, ci, 1), atol=1e-5)
  dense = knn.dense_topk(x, y, k)
  np.testing.assert_array_equal(dense.row_idx, ri)
  np.testing.assert_array_equal(dense.col_idx, ci)


needs_fused = pytest.mark.skipif(not knn_cpu.available(),
                                 reason="the fused kernel was not built (no C compiler) or "
                                        "this CPU lacks AVX2/FMA")


@needs_fused
@pytest.mark.parametrize("n,m,k,d,threads,chunk", [
    (1000, 777, 4, 24, 2, 240), (37, 301, 1, 24, 1, 960), (300, 64, 20, 24, 3, 7),
    (500, 900, 5, 128, 2, 960), (241, 17, 1, 5, 2, 13), (6, 16, 6, 3, 1, 960)])
def test_fused_topk_equals_brute_force(n, m, k, d, threads, chunk, monkeypatch):
  """The fused kernel: D not a multiple of 8, M not of 16 (padded columns), N not of 6 or
  240 (padded rows), chunks split over threads, k up to N; exact scores."""
  monkeypatch.setattr(knn_cpu, "CHUNK_ROWS", chunk)
  rng = np.random.default_rng(n + m + d)
  x, y = _unit(rng, n, d), _unit(rng, m, d)
  s, ri, ci = _ref_topk(x, y, k)
  rv, got_ri, cv, got_ci = knn_cpu.bidirectional_topk(x, y, k, threads=threads)
  np.testing.assert_array_equal(got_ri, ri)
  np.testing.assert_array_equal(got_ci, ci)
  np.testing.assert_allclose(rv, np.take_along_axis(s, ri, 1), atol=1e-5)
  np.testing.assert_allclose(cv, np.take_along_axis(s.T, ci, 1), atol=1e-5)
  auto = knn.bidirectional_topk(x, y, k, devices=jax.devices("cpu"))   # the CPU default
  np.testing.assert_array_equal(auto.row_idx, ri)


@needs_fused
@pytest.mark.parametrize("threads,chunk", [(1, 960), (2, 5), (3, 11)])
def test_fused_topk_ties_go_to_the_lower_index(threads, chunk, monkeypatch):
  """Small integer vectors: exact scores, many ties, duplicate rows. Every split of the
  rows over threads gives (score desc, index asc): a resumed mining job's bytes."""
  monkeypatch.setattr(knn_cpu, "CHUNK_ROWS", chunk)
  rng = np.random.default_rng(7)
  x = rng.integers(-2, 3, (90, 8)).astype(np.float32)
  y = rng.integers(-2, 3, (70, 8)).astype(np.float32)
  x[50:60] = x[:10]
  y[40:] = y[:30]
  s, ri, ci = _ref_topk(x, y, 6)
  rv, got_ri, cv, got_ci = knn_cpu.bidirectional_topk(x, y, 6, threads=threads)
  np.testing.assert_array_equal(got_ri, ri)
  np.testing.assert_array_equal(got_ci, ci)
  np.testing.assert_array_equal(rv, np.take_along_axis(s, ri, 1))
  np.testing.assert_array_equal(cv, np.take_along_axis(s.T, ci, 1))


@pytest.mark.parametrize("n,kk", [(1, 1), (5, 4), (64, 4), (7, 8), (128, 32)])
def test_top_lists_equals_sort(n, kk):
  """The tournament keeps each column's best kk of n candidates, best first, with their ids
  (fewer than kk candidates: padded with -inf); ties included (repeated values)."""
  rng = np.random.default_rng(n + kk)
  v = rng.integers(0, 6, (n, 33)).astype(np.float32)        # many ties
  ids = rng.permutation(n * 33).reshape(n, 33).astype(np.int32)
  tv, ti = (np.asarray(a) for a in knn._top_lists(v, ids, kk))
  ref = -np.sort(-v, axis=0)[:kk]
  want = np.concatenate([ref, np.full((kk - len(ref), 33), -np.inf, np.float32)])
  np.testing.assert_array_equal(tv, want)
  real = np.isfinite(tv)
  for j in range(v.shape[1]):                     # the ids name those values, each once
    value_of = dict(zip(ids[:, j].tolist(), v[:, j].tolist()))
    got = ti[real[:, j], j].tolist()
    assert len(set(got)) == len(got)
    assert [value_of[i] for i in got] == tv[real[:, j], j].tolist()


def test_topk_rejects_bad_shapes():
  with pytest.raises(ValueError, match="k=5"):
    knn.topk(np.ones((3, 2)), np.ones((4, 2)), k=5)
  with pytest.raises(ValueError, match=r"\[N, D\]"):
    knn.bidirectional_topk(np.ones((3, 2)), np.ones((4, 3)), k=1)
  with pytest.raises(ValueError, match="kernel='gpu'"):
    knn.bidirectional_topk(np.ones((3, 2)), np.ones((4, 2)), k=1, kernel="gpu")


# ----------------------------------------------------------------------------- mining

def test_margin_scores_equal_direct_numpy_formula():
  rng = np.random.default_rng(0)
  x, y = _unit(rng, 50, 8), _unit(rng, 70, 8)
  k = 4
  s, ri, ci = _ref_topk(x, y, k)
  x_mean = np.sort(s, axis=1)[:, ::-1][:, :k].mean(1)
  y_mean = np.sort(s.T, axis=1)[:, ::-1][:, :k].mean(1)
  for margin, f in [("ratio", lambda a, b: a / b), ("distance", lambda a, b: a - b),
                    ("absolute", lambda a, b: a)]:
    sc = mining.margin_scores(x, y, k=k, margin=margin)
    for i in range(50):
      for j in range(k):
        t = sc.fwd_idx[i, j]
        assert sc.fwd_scores[i, j] == pytest.approx(f(s[i, t], (x_mean[i] + y_mean[t]) / 2),
                                                    rel=1e-5, abs=1e-6)
    for t in range(70):
      for j in range(k):
        i = sc.bwd_idx[t, j]
        assert sc.bwd_scores[t, j] == pytest.approx(f(s[i, t], (y_mean[t] + x_mean[i]) / 2),
                                                    rel=1e-5, abs=1e-6)


def _laser_max(sc):
  """LASER mine_bitexts.py --retrieval max, verbatim logic."""
  fwd_best = sc.fwd_idx[np.arange(len(sc.fwd_idx)), sc.fwd_scores.argmax(1)]
  bwd_best = sc.bwd_idx[np.arange(len(sc.bwd_idx)), sc.bwd_scores.argmax(1)]
  indices = np.stack((np.concatenate((np.arange(len(fwd_best)), bwd_best)),
                      np.concatenate((fwd_best, np.arange(len(bwd_best))))), axis=1)
  scores = np.concatenate((sc.fwd_scores.max(1), sc.bwd_scores.max(1)))
  seen_s, seen_t, out = set(), set(), set()
  for i in np.argsort(-scores):
    s, t = indices[i]
    if s not in seen_s and t not in seen_t:
      seen_s.add(s), seen_t.add(t), out.add((int(s), int(t)))
  return out, fwd_best, bwd_best


def test_best_pairs_forward_backward_intersect_max():
  rng = np.random.default_rng(1)
  x, y = _unit(rng, 40, 6), _unit(rng, 55, 6)
  sc = mining.margin_scores(x, y, k=4)
  ref_max, fwd_best, bwd_best = _laser_max(sc)
  got = lambda r: {(int(a), int(b)) for a, b, _ in zip(*mining.best_pairs(sc, r))}
  assert got("max") == ref_max
  assert got("forward") == {(i, int(j)) for i, j in enumerate(fwd_best)}
  assert got("backward") == {(int(i), j) for j, i in enumerate(bwd_best)}
  assert got("intersect") == {(i, int(j)) for i, j in enumerate(fwd_best) if bwd_best[j] == i}
  _, _, score = mining.best_pairs(sc, "max")
  assert np.all(np.diff(score) <= 0)


def test_threshold_search_known_optimum():
  # 10 candidates, best first; gold has 6 pairs, 5 of them among the candidates.
  scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
  correct = [1, 1, 1, 0, 1, 0, 0, 1, 0, 0]
  # F1 after each prefix: 2c/(e+6): 2/7, 4/8, 6/9, 6/10, 8/11, 8/12, 8/13, 10/14, 10/15, 10/16
  th = mining.optimize_threshold(scores, correct, n_gold=6)
  assert th == pytest.approx((0.5 + 0.4) / 2)           # 8/11 = 0.727 is the best
  p, r, f = mining.evaluate_pairs({i: s for i, s in enumerate(scores)},
                                  {i for i, c in enumerate(correct) if c}, th)
  assert (p, r) == pytest.approx((100 * 4 / 5, 100 * 4 / 5))  # 4 of 5 kept are gold (5 gold here)
  # brute force over every cut agrees
  best = max(range(1, 11), key=lambda e: 2 * sum(correct[:e]) / (e + 6))
  assert best == 5
  # equal scores cannot be split by a threshold
  assert mining.optimize_threshold([1.0, 1.0, 0.5], [1, 0, 0], n_gold=1) == pytest.approx(0.75)
  assert mining.optimize_threshold([0.3], [0], n_gold=2) == math.inf
  assert mining.optimize_threshold([0.3], [1], n_gold=1) < 0.3


def test_xsim_matches_numpy():
  rng = np.random.default_rng(2)
  x = _unit(rng, 60, 8)
  y = mining.normalize(x + 0.9 * rng.standard_normal(x.shape).astype(np.float32))
  s, _, _ = _ref_topk(x, y, 4)
  xm = np.sort(s, 1)[:, ::-1][:, :4].mean(1)
  ym = np.sort(s.T, 1)[:, ::-1][:, :4].mean(1)
  nn = knn.topk(x, y, 4)
  err_abs, n = mining.xsim_errors(nn, "absolute")
  assert n == 60 and err_abs == int(np.sum(s.argmax(1) != np.arange(60)))
  ratio = np.full_like(s, -np.inf)
  for i in range(60):
    for t in np.argsort(-s[i])[:4]:
      ratio[i, t] = s[i, t] / ((xm[i] + ym[t]) / 2)
  err_ratio, _ = mining.xsim_errors(nn, "ratio")
  assert err_ratio == int(np.sum(ratio.argmax(1) != np.arange(60)))
  assert 0 < err_ratio < 60


# ----------------------------------------------------------------------------- encoders

class MeaningEncoder:
  """Toy encoder: a sentence 'w<ID> ...' maps to a fixed random vector of meaning ID
  (same in every language) plus noise; others to noise. Records the languages it saw."""

  def __init__(self, noise=0.0, dim=32, seed=0):
    self.noise, self.dim, self.rng = noise, dim, np.random.default_rng(seed)
    self.table = np.random.default_rng(123).standard_normal((5000, dim)).astype(np.float32)
    self.langs = []

  def encode(self, sentences, lang=None):
    self.langs.append(lang)
    ids = [int(s.split()[0][1:]) if s.startswith("w") else 4999 for s in sentences]
    return self.table[ids] + self.noise * self.rng.standard_normal(
        (len(sentences), self.dim)).astype(np.float32)


def test_as_encode_fn_adapts_objects_and_callables():
  enc = MeaningEncoder()
  f = common.as_encode_fn(enc)
  assert f(["w1 a", "w2 b"], "deu").shape == (2, 32) and enc.langs == ["deu"]

  class NoLang:
    def encode(self, sentences):
      return np.ones((len(sentences), 3))
  assert common.as_encode_fn(NoLang())(["a"], "deu").shape == (1, 3)
  assert common.as_encode_fn(lambda s, lang: np.ones((len(s), 2)))(["a", "b"], "x").shape == (2, 2)
  with pytest.raises(ValueError, match=r"shape \(3,\)"):
    common.as_encode_fn(lambda s: np.ones(3))(["a", "b", "c"], "x")


# ----------------------------------------------------------------------------- BUCC

def _bucc_dir(root, pair="de-en", split="sample", n=60, n_gold=20, seed=0):
  """Comparable corpora: n_gold true translations (same meaning id) among distractors."""
  rng = np.random.default_rng(seed)
  src, tgt = pair.split("-")
  base = Path(root) / "eval/bucc2018" / pair
  meanings = rng.permutation(4000)
  gold = meanings[:n_gold]
  src_m = np.concatenate([gold, meanings[n_gold:n]])
  tgt_m = np.concatenate([gold, meanings[n:2 * n - n_gold]])
  src_ids = [f"{src}-{i:09d}" for i in rng.permutation(len(src_m))]
  tgt_ids = [f"en-{i:09d}" for i in rng.permutation(len(tgt_m))]
  write_lines(base / f"{pair}.{split}.{src}", [f"{i}\tw{m} {src}" for i, m in zip(src_ids, src_m)])
  write_lines(base / f"{pair}.{split}.en", [f"{i}\tw{m} en" for i, m in zip(tgt_ids, tgt_m)])
  write_lines(base / f"{pair}.{split}.gold", [f"{src_ids[i]}\t{tgt_ids[i]}" for i in range(n_gold)])
  return root


def test_bucc_perfect_encoder_and_train_test_threshold(tmp_path):
  _bucc_dir(tmp_path, split="training", seed=0)
  _bucc_dir(tmp_path, split="test", seed=1)
  enc = MeaningEncoder(noise=0.05)
  res = bucc.evaluate(common.as_encode_fn(enc), ["de-en"], str(tmp_path))
  row = res["scores"]["test"][0]
  assert row["threshold_split"] == "training" and row["split"] == "test"
  assert row["margin_max"]["f1"] == pytest.approx(100.0)
  assert row["cosine_intersect"]["f1"] == pytest.approx(100.0)
  assert {"deu", "eng"} <= set(enc.langs)


def test_bucc_threshold_on_sample_as_xtreme_and_supplied_pairs(tmp_path):
  assert bucc.threshold_and_report_splits(["sample", "training"]) == ("sample", "training")
  assert bucc.threshold_and_report_splits(["sample", "training", "test"]) == ("sample", "test")
  assert bucc.threshold_and_report_splits(["training", "test"]) == ("training", "test")
  assert bucc.threshold_and_report_splits(["sample"]) == ("sample", "sample")
  _bucc_dir(tmp_path, "fr-en", split="sample", seed=0)
  _bucc_dir(tmp_path, "fr-en", split="training", seed=1)
  _bucc_dir(tmp_path, "zh-en", split="sample", seed=2)
  res = bucc.evaluate(common.as_encode_fn(MeaningEncoder(noise=0.05)), data_dir=str(tmp_path))
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert sorted(rows) == ["fr-en", "zh-en"] and res["pairs_missing"] == ["de-en", "ru-en"]
  assert (rows["fr-en"]["threshold_split"], rows["fr-en"]["split"]) == ("sample", "training")
  assert rows["fr-en"]["margin_max"]["f1"] == pytest.approx(100.0)
  assert rows["zh-en"]["languages"] == ["cmn", "eng"]


def test_bucc_duplicate_texts_count_for_every_id(tmp_path):
  base = tmp_path / "eval/bucc2018/fr-en"
  write_lines(base / "fr-en.sample.fr", ["f1\tw1 x", "f2\tw1 x", "f3\tw2 y", "f4\tw3 z"])
  write_lines(base / "fr-en.sample.en", ["e1\tw1 x", "e2\tw2 y", "e3\tw7 z", "e4\tw8 q"])
  write_lines(base / "fr-en.sample.gold", ["f1\te1", "f2\te1", "f3\te2"])
  res = bucc.evaluate(common.as_encode_fn(MeaningEncoder()), ["fr-en"], str(tmp_path), k=2)
  m = res["scores"]["test"][0]["margin_max"]
  assert m["recall"] == pytest.approx(100.0) and m["precision"] == pytest.approx(100.0)


def test_bucc_bad_input_names_file_and_line(tmp_path):
  base = tmp_path / "eval/bucc2018/de-en"
  write_lines(base / "de-en.sample.de", ["d1\tok", "no tab here"])
  write_lines(base / "de-en.sample.en", ["e1\tok"])
  write_lines(base / "de-en.sample.gold", ["d1\te1"])
  with pytest.raises(DataError, match=r"task bucc: .*de-en\.sample\.de:2: expected 'id<TAB>sentence'"):
    bucc.evaluate(common.as_encode_fn(MeaningEncoder()), ["de-en"], str(tmp_path))
  with pytest.raises(DataError, match=r"no gold file for fr-en"):
    bucc.evaluate(common.as_encode_fn(MeaningEncoder()), ["fr-en"], str(tmp_path))


# ----------------------------------------------------------------------------- STS

class VecEncoder:
  """Sentences are 'x,y' coordinates: cosine similarity is known in closed form."""

  def encode(self, sentences, lang=None):
    return np.array([[float(v) for v in s.split(",")] for s in sentences], np.float32)


def _angle(a):
  return f"{math.cos(a):.6f},{math.sin(a):.6f}"


def test_sts_years_vmsst_and_sbert_protocols(tmp_path):
  rng = np.random.default_rng(0)
  truth = {}
  for year, sets in [("STS12", ["A", "B"]), ("STS13", ["SMT", "C"])]:
    for name in sets:
      ang = rng.uniform(0, 1.5, size=12)
      gold = 5 * np.cos(ang) + rng.normal(0, 0.4, size=12)
      lines = [f"{_angle(0)}\t{_angle(a)}" for a in ang] + ["1,0\t0,1"]
      gs = [f"{g:.4f}" for g in gold] + [""]          # last line unscored
      d = tmp_path / f"eval/sts/{year}-en-test"
      write_lines(d / f"STS.input.{name}.txt", lines)
      write_lines(d / f"STS.gs.{name}.txt", gs)
      truth[(year, name)] = (np.cos(ang), gold)
  write_lines(tmp_path / "eval/sts/STS12-en-test/STS.gs.ALL.txt", ["1"])  # no input: ignored
  res = sts.evaluate_sts12_16(common.as_encode_fn(VecEncoder()), ("STS12", "STS13"), str(tmp_path))
  p = lambda y, n: 100 * stats.pearsonr(*truth[(y, n)])[0]
  vmsst = np.mean([np.mean([p("STS12", "A"), p("STS12", "B")]),
                   np.mean([p("STS13", "SMT"), p("STS13", "C")])])
  sp = lambda keys: 100 * stats.spearmanr(np.concatenate([truth[k][0] for k in keys]),
                                          np.concatenate([truth[k][1] for k in keys]))[0]
  sbert = np.mean([sp([("STS12", "A"), ("STS12", "B")]), sp([("STS13", "C")])])  # SMT excluded
  assert res["vmsst_pearson"] == pytest.approx(vmsst, abs=1e-3)
  assert res["sbert_spearman"] == pytest.approx(sbert, abs=1e-3)
  assert res["scores"]["test"][0]["datasets"]["A"]["n"] == 12


def test_sts_line_mismatch_and_stsb(tmp_path):
  d = tmp_path / "eval/sts/STS12-en-test"
  write_lines(d / "STS.input.A.txt", ["1,0\t0,1", "1,0\t1,0"])
  write_lines(d / "STS.gs.A.txt", ["1"])
  with pytest.raises(DataError, match=r"STS.input.A.txt has 2 lines but .*STS.gs.A.txt has 1"):
    sts.evaluate_sts12_16(common.as_encode_fn(VecEncoder()), ("STS12",), str(tmp_path))
  rows, gold, pred = [], [], []
  for i, a in enumerate(np.linspace(0, 1.5, 9)):
    g = 5 * math.cos(a) ** 3
    rows.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g:.3f}\t{_angle(0)}\t{_angle(a)}")
    gold.append(round(g, 3))
    pred.append(math.cos(a))
  for split in ("test", "dev"):
    write_lines(tmp_path / f"eval/sts/STSBenchmark/sts-{split}.csv", rows)
  res = sts.evaluate_stsb(common.as_encode_fn(VecEncoder()), data_dir=str(tmp_path))
  row = res["scores"]["test"][0]
  assert row["spearman"] == pytest.approx(100.0)          # monotone
  assert row["pearson"] == pytest.approx(100 * stats.pearsonr(pred, gold)[0], abs=1e-3)


def test_sts17_crosslingual_layout(tmp_path):
  ang = np.linspace(0.1, 1.4, 10)
  write_lines(tmp_path / "STS.input.track4a.es-en.txt", [f"{_angle(0)}\t{_angle(a)}" for a in ang])
  write_lines(tmp_path / "gs/STS.gs.track4a.es-en.txt",
              [f"{5 - 3 * a:.3f}" if i != 3 else "" for i, a in enumerate(ang)])
  enc = type("E", (VecEncoder,), {"seen": []})()
  orig = enc.encode
  enc.encode = lambda s, lang=None: (enc.seen.append(lang), orig(s))[1]
  res = sts.evaluate_sts17(common.as_encode_fn(enc), str(tmp_path), str(tmp_path / "gs"))
  row = res["scores"]["test"][0]
  assert row["hf_subset"] == "track4a.es-en" and row["n"] == 9
  assert row["spearman"] == pytest.approx(100.0)
  assert enc.seen == ["spa", "eng"]
  with pytest.raises(DataError, match="no STS.input.trackN"):
    sts.evaluate_sts17(common.as_encode_fn(enc), str(tmp_path / "gs"))
  # a track that cannot be read (no gold file; a line without a tab) is reported alone
  write_lines(tmp_path / "STS.input.track1.ar-ar.txt", ["only one sentence"])
  write_lines(tmp_path / "gs/STS.gs.track1.ar-ar.txt", ["3.0"])
  write_lines(tmp_path / "STS.input.track6.tr-en.txt", ["a\tb"])
  res = sts.evaluate_sts17(common.as_encode_fn(VecEncoder()), str(tmp_path), str(tmp_path / "gs"))
  assert [r["hf_subset"] for r in res["scores"]["test"]] == ["track4a.es-en"]
  assert set(res["tracks_failed"]) == {"track1.ar-ar", "track6.tr-en"}
  assert "expected two tab-separated" in res["tracks_failed"]["track1.ar-ar"]


def test_sts2017_extended_adds_the_four_pairs_the_release_lacks(tmp_path):
  """EMMA-X Table 12's MultiSTS: STS2017-extended's en-de, fr-en, it-en and nl-en scored
  beside the release (each column in its language), its copy of a release pair not scored
  twice, a bad file reported alone; the protocol's MultiSTS mean then names the pairs still
  missing; the extended copy alone scores every pair it holds."""
  import zipfile
  from vmx.evaluation.protocols import EMMAX_MULTISTS
  from vmx.evaluation.protocols.figures import sts17_mean
  ang = np.linspace(0.1, 1.4, 10)
  write_lines(tmp_path / "rel/STS.input.track4a.es-en.txt",
              [f"{_angle(0)}\t{_angle(a)}" for a in ang])
  write_lines(tmp_path / "rel/STS.gs.track4a.es-en.txt", [f"{5 - 3 * a:.3f}" for a in ang])
  with zipfile.ZipFile(tmp_path / "STS2017-extended.zip", "w") as z:
    for pair, sign in (("en-de", 1), ("fr-en", -1), ("es-en", 1), ("it-en", 1)):
      z.writestr(f"STS2017-extended/STS.{pair}.txt", "".join(
          f"{_angle(0)}\t{_angle(a)}\t{sign * (5 - 3 * a):.2f}\n" for a in ang))
    z.writestr("STS2017-extended/STS.nl-en.txt", "a\tb\n")
  enc = type("E", (VecEncoder,), {"seen": []})()
  orig = enc.encode
  enc.encode = lambda s, lang=None: (enc.seen.append(lang), orig(s))[1]
  res = sts.evaluate_sts17(common.as_encode_fn(enc), str(tmp_path / "rel"),
                           extended=str(tmp_path / "STS2017-extended.zip"))
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert list(rows) == ["track4a.es-en", "extended.en-de", "extended.fr-en", "extended.it-en"]
  assert rows["extended.en-de"]["spearman"] == pytest.approx(100.0)
  assert rows["extended.fr-en"]["spearman"] == pytest.approx(-100.0)
  assert rows["extended.fr-en"]["columns"] == ["fra", "eng"] and enc.seen[-4:-2] == ["fra", "eng"]
  assert "sentence 1<TAB>sentence 2<TAB>score" in res["tracks_failed"]["extended.nl-en"]
  fig = sts17_mean({"sts17": res}, EMMAX_MULTISTS, "spearman", mteb_only=True)
  assert fig["pairs_missing"] == ["ar-ar", "ar-en", "en-en", "es-es", "nl-en", "tr-en"]
  assert fig["value"] == pytest.approx(np.mean([100.0, 100.0, -100.0, 100.0]))
  alone = sts.evaluate_sts17(common.as_encode_fn(VecEncoder()), None,
                             extended=str(tmp_path / "STS2017-extended.zip"))
  assert [r["hf_subset"] for r in alone["scores"]["test"]] == [
      "extended.en-de", "extended.es-en", "extended.fr-en", "extended.it-en"]
  with pytest.raises(DataError, match=r"no STS\.xx-yy\.txt files in --sts17\.extended="):
    sts.evaluate_sts17(common.as_encode_fn(VecEncoder()), None, extended=str(tmp_path / "rel"))


def _semeval2017_release(tmp_path, bad_track3=False, extra_fields=False):
  """Both zips of the SemEval-2017 STS test release, with the quirks of the real files:
  English-first columns in track2 ar-en, track4b es-en and track6 tr-en; 500 input lines
  and 250 scores in track6; integer scores in track4b; padded Arabic fields with
  no-break spaces; a field starting with a double quote; a U+2028 inside a line; a gold
  zip with a directory
  entry, an input zip without. Sentences name their language ('xx:') and a vector angle
  the encoder reads; returns (input zip, gold zip, {track: expected Spearman}).
  `extra_fields`: as other copies of the release have them, lines of six tracks carry more
  fields than the two sentences (a source, an id, a score, empty fields), one gold file
  starts with a byte order mark and has a second field, another ends in blank lines, and
  one input has Windows line ends."""
  import zipfile
  tracks = {"track1.ar-ar": ("ar", "ar"), "track2.ar-en": ("en", "ar"),
            "track3.es-es": ("es", "es"), "track4a.es-en": ("es", "en"),
            "track4b.es-en": ("en", "es"), "track5.en-en": ("en", "en"),
            "track6.tr-en": ("en", "tr")}
  rng = np.random.default_rng(0)
  inputs, golds, expected = {}, {}, {}
  for key, (c1, c2) in tracks.items():
    ang = rng.uniform(0.05, 1.5, 250)
    pad = " " if c1 == "ar" or c2 == "ar" else ""
    lines = [f"{pad}{c1}:{0.0:.6f}\t\xa0{c2}:{a:.6f}{pad}" for a in ang]
    if key.startswith("track4b"):
      lines[3] = f'"{c1}:0.000000\t{c2}:{ang[3]:.6f}'
      gold = [str(int(np.clip(np.round(5 - 3 * a), 2, 5))) for a in ang]
    else:
      gold = [f"{5 - 3 * a + rng.normal(0, 0.3):.6f}" for a in ang]
    if key.startswith("track3"):   # a line separator inside a field is not a new line
      lines[5] = lines[5] + "\u2028"
    if key.startswith("track6"):   # 250 more input lines, none of them scored
      lines += [f"{c1}:1.000000\t{c2}:{a:.6f}" for a in rng.uniform(0, 1.5, 250)]
    if extra_fields:
      extra = {"track1": lambda i, l: f"{l}\tsource-{i}", "track2": lambda i, l: f"{l}\t\t",
               "track3": lambda i, l: f"{l}\t{i:04d}\tnews", "track4a": lambda i, l: f"{l}\t4.0",
               "track5": lambda i, l: f"{l}\tMSRvid\t2017\t", "track6": lambda i, l: f"{l}\t \t{i}"}
      add = extra.get(key.split(".")[0])
      if add:
        lines = [add(i, l) for i, l in enumerate(lines)]
    expected[key] = 100 * stats.spearmanr(np.cos(ang), [float(g) for g in gold])[0]
    if bad_track3 and key.startswith("track3"):
      gold[7] = "n/a"
    end = "\r\n" if extra_fields and key.startswith("track5") else "\n"
    inputs[f"STS.input.{key}.txt"] = end.join(lines) + end
    golds[f"STS.gs.{key}.txt"] = "\n".join(gold) + "\n"
    if extra_fields and key.startswith("track1"):
      golds[f"STS.gs.{key}.txt"] = "\ufeff" + "\n".join(g + "\tgold" for g in gold) + "\n"
    if extra_fields and key.startswith("track2"):
      golds[f"STS.gs.{key}.txt"] += "\n\n"
  inp_zip, gs_zip = tmp_path / "Sts2017.eval.v1.1.zip", tmp_path / "Sts2017.gs.zip"
  with zipfile.ZipFile(inp_zip, "w") as z:
    z.writestr("STS2017.eval.v1.1/README.txt", "STS 2017 evaluation data")
    z.writestr("STS2017.eval.v1.1/LICENSE.txt", "CC BY-SA 4.0")
    for name, text in inputs.items():
      z.writestr(f"STS2017.eval.v1.1/{name}", text)
  with zipfile.ZipFile(gs_zip, "w") as z:
    z.writestr("STS2017.gs/", "")
    for name, text in golds.items():
      z.writestr(f"STS2017.gs/{name}", text)
  return inp_zip, gs_zip, expected


class LangAngleEncoder:
  """'xx:angle' sentences: records the language each sentence was encoded as."""

  def __init__(self):
    self.mismatched, self.unstripped = [], []

  def encode(self, sentences, lang=None):
    out = []
    for s in sentences:
      if s != s.strip():
        self.unstripped.append(s)
      code, a = s.lstrip('"').split(":")
      if iso3(code) != lang:
        self.mismatched.append((s, lang))
      out.append([math.cos(float(a)), math.sin(float(a))])
    return np.array(out, np.float32)


def test_sts17_reads_the_semeval_release_as_distributed(tmp_path):
  """Both zips as distributed (or unzipped), each track read as it is: column languages
  from the release (not the file name), track6's first 250 lines, integer scores,
  stripped fields; a track that cannot be read is reported alone."""
  import zipfile
  inp_zip, gs_zip, expected = _semeval2017_release(tmp_path)
  for where in ("zips", "unzipped"):
    if where == "zips":
      args = (str(inp_zip), str(gs_zip))
    else:
      d = tmp_path / "unzipped"
      for z in (inp_zip, gs_zip):
        zipfile.ZipFile(z).extractall(d)
      args = (str(d),)      # one directory holding both release directories
    enc = LangAngleEncoder()
    res = sts.evaluate_sts17(common.as_encode_fn(enc), *args)
    rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
    assert set(rows) == set(expected) and not res["tracks_failed"]
    assert not enc.mismatched and not enc.unstripped
    for key, want in expected.items():
      assert rows[key]["spearman"] == pytest.approx(want, abs=1e-6), key
      assert rows[key]["n"] == 250
    assert rows["track2.ar-en"]["columns"] == ["eng", "ara"]
    assert rows["track4a.es-en"]["columns"] == ["spa", "eng"]
    assert [k for k, r in rows.items() if not r["mteb"]] == ["track4b.es-en"]
  # a copy whose lines carry more fields than the two sentences: every track read, no pair
  # missing, the same scores
  (tmp_path / "extra").mkdir()
  inp_zip, gs_zip, expected = _semeval2017_release(tmp_path / "extra", extra_fields=True)
  enc = LangAngleEncoder()
  res = sts.evaluate_sts17(common.as_encode_fn(enc), str(inp_zip), str(gs_zip))
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert set(rows) == set(expected) and not res["tracks_failed"], res["tracks_failed"]
  assert not enc.mismatched and not enc.unstripped
  for key, want in expected.items():
    assert rows[key]["spearman"] == pytest.approx(want, abs=1e-6), key
    assert rows[key]["n"] == 250
  (tmp_path / "bad").mkdir()
  _, _, expected = _semeval2017_release(tmp_path / "bad", bad_track3=True)
  res = sts.evaluate_sts17(common.as_encode_fn(LangAngleEncoder()),
                           str(tmp_path / "bad" / "Sts2017.eval.v1.1.zip"),
                           str(tmp_path / "bad" / "Sts2017.gs.zip"))
  assert list(res["tracks_failed"]) == ["track3.es-es"]
  assert "STS.gs.track3.es-es.txt:8: not a score" in res["tracks_failed"]["track3.es-es"]
  assert len(res["scores"]["test"]) == 6


def test_flores_retrieval_groups_and_geometry(tmp_path):
  """EMMA-X Tables 3-4 on FLORES-200's layout: xx -> En top-1 per language (a language
  with two lines swapped scores 10/12), head (A.1's 68) and long-tail means, geometry per
  group; splits concatenated; misaligned files and a missing English are DataErrors."""
  from vmx.evaluation import flores
  rng = np.random.default_rng(0)
  vec = {i: rng.normal(size=3) for i in range(12)}
  langs = ["eng_Latn", "deu_Latn", "fra_Latn", "xyz_Latn", "uzn_Latn"]
  for split, idx in (("dev", range(0, 5)), ("devtest", range(5, 12))):
    for code in langs:
      order = list(idx)
      if code == "xyz_Latn" and split == "dev":
        order[0], order[1] = order[1], order[0]
      write_lines(tmp_path / "flores" / split / f"{code}.{split}",
                  [f"{code} {i}" for i in order])

  class Enc:
    seen = set()

    def encode(self, sentences, lang=None):
      self.seen.add(lang)
      return np.array([vec[int(s.split()[1])] + 0.01 * (sum(map(ord, s.split()[0])) % 7)
                       for s in sentences],
                      np.float32)

  enc = Enc()
  res = flores.evaluate(common.as_encode_fn(enc), tmp_path / "flores")
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert set(rows) == {"deu_Latn", "fra_Latn", "xyz_Latn", "uzn_Latn"}
  assert res["n_sentences"] == 12
  assert rows["deu_Latn"]["accuracy_xx2en"] == 100.0
  assert rows["xyz_Latn"]["accuracy_xx2en"] == pytest.approx(100 * 10 / 12)
  # A.1's uzb_Latn is FLORES-200's uzn_Latn: a head language
  assert res["groups"]["head"]["n_languages"] == 3 and res["groups"]["head"]["xx2en"] == 100.0
  assert res["groups"]["long_tail"]["xx2en"] == pytest.approx(100 * 10 / 12)
  assert enc.seen == {"eng", "deu", "fra", "xyz", "uzn"}
  assert "bel_Cyrl" in res["head_missing"] and len(flores.EMMAX_FLORES_HEAD) == 68
  assert set(res["geometry"]) == {"head", "all"}            # one long-tail language: no geometry
  assert res["geometry"]["all"]["n_languages"] == 5
  assert np.isfinite(res["geometry"]["all"]["invariance_kl_eq16"])   # 12 sentences > 3 dims
  only = flores.evaluate(common.as_encode_fn(Enc()), tmp_path / "flores", splits=("devtest",),
                         languages=["deu_Latn"], geometry_metrics=False)
  assert only["n_sentences"] == 7 and [r["hf_subset"] for r in only["scores"]["test"]] == [
      "deu_Latn"] and "geometry" not in only
  ids = flores.evaluate(common.as_encode_fn(Enc()), tmp_path / "flores", geometry_metrics=False,
                        model_languages=["deu", "eng", "uzb"])   # a model reading language ids
  assert {r["hf_subset"] for r in ids["scores"]["test"]} == {"deu_Latn", "uzn_Latn"}
  assert ids["languages_skipped"] == ["fra_Latn", "xyz_Latn"]
  write_lines(tmp_path / "flores" / "dev" / "fra_Latn.dev", ["fra_Latn 0"])
  with pytest.raises(DataError, match="fra_Latn: 8 lines, eng_Latn has 12"):
    flores.evaluate(common.as_encode_fn(Enc()), tmp_path / "flores")
  (tmp_path / "flores" / "dev" / "eng_Latn.dev").unlink()
  with pytest.raises(DataError, match="eng_Latn.<split> missing"):
    flores.evaluate(common.as_encode_fn(Enc()), tmp_path / "flores")


# ----------------------------------------------------------------------------- retrieval

def test_ranking_metrics_hand_computed_and_sklearn():
  ranked = [["a", "b", "c", "d"], ["x", "y", "z", "w"], ["p", "q", "r", "s"]]
  rel = [{"b", "d"}, {"x"}, {"nope"}]
  m = retrieval.ranking_metrics(ranked, rel, ks=(1, 2))
  assert m["recall_at_1"] == pytest.approx(100 / 3)     # only query 2 has gold at rank 1
  assert m["recall_at_2"] == pytest.approx(200 / 3)
  ap1 = (1 / 2 + 2 / 4) / 2                              # hits at ranks 2 and 4
  assert m["map_at_20"] == pytest.approx(100 * (ap1 + 1 + 0) / 3)
  assert m["mrr_at_10"] == pytest.approx(100 * (1 / 2 + 1 + 0) / 3)
  from sklearn.metrics import average_precision_score
  y_true = [0, 1, 0, 1]
  assert ap1 == pytest.approx(average_precision_score(y_true, [4, 3, 2, 1]))


def test_retrieval_end_to_end_and_bad_qrels(tmp_path):
  d = tmp_path / "r"
  write_lines(d / "queries.tsv", [f"q{i}\tw{i} question\t{'de' if i % 2 else 'eng'}"
                                  for i in range(30)] + ["q99\tw999 orphan"])
  write_lines(d / "corpus.tsv", [f"d{i}\tw{i} passage" for i in range(40)])
  write_lines(d / "qrels.tsv", [f"q{i}\td{i}" for i in range(30)])
  enc = MeaningEncoder(noise=0.01)
  res = retrieval.evaluate(common.as_encode_fn(enc), str(d))
  subsets = {s["hf_subset"]: s for s in res["scores"]["test"]}
  assert subsets["all"]["recall_at_1"] == pytest.approx(100.0)
  assert subsets["all"]["map_at_20"] == pytest.approx(100.0)
  assert set(subsets) == {"all", "deu", "eng"} and res["n_skipped_queries"] == 1
  assert "deu" in enc.langs
  write_lines(d / "qrels.tsv", ["q1\td1", "q2\tmissing"])
  with pytest.raises(DataError, match=r"qrels.tsv:2: unknown document id 'missing'"):
    retrieval.evaluate(common.as_encode_fn(enc), str(d))


# ----------------------------------------------------------------------------- geometry

def test_gaussian_kl_closed_form_and_full_vs_diag():
  p = (np.array([0.0]), np.array([1.0]))
  q = (np.array([1.0]), np.array([4.0]))
  # KL(N(0,1) || N(1,4)) = log 2 + (1 + 1) / 8 - 1/2
  assert geometry.kl_gaussian(p, q) == pytest.approx(math.log(2) + 2 / 8 - 0.5)
  rng = np.random.default_rng(0)
  mu1, mu2 = rng.normal(size=3), rng.normal(size=3)
  v1, v2 = rng.uniform(0.5, 2, 3), rng.uniform(0.5, 2, 3)
  assert geometry.kl_gaussian((mu1, v1), (mu2, v2)) == pytest.approx(
      geometry.kl_gaussian((mu1, np.diag(v1)), (mu2, np.diag(v2))))
  # Monte Carlo check of the full-covariance formula
  a = rng.normal(size=(3, 3)); s1 = a @ a.T + np.eye(3)
  b = rng.normal(size=(3, 3)); s2 = b @ b.T + np.eye(3)
  xs = rng.multivariate_normal(mu1, s1, size=200000)
  logp = stats.multivariate_normal(mu1, s1).logpdf(xs)
  logq = stats.multivariate_normal(mu2, s2).logpdf(xs)
  assert geometry.kl_gaussian((mu1, s1), (mu2, s2)) == pytest.approx(np.mean(logp - logq),
                                                                      rel=0.02)


def test_geometry_metrics_behave():
  rng = np.random.default_rng(0)
  base = rng.normal(size=(100, 16))
  aligned = {l: base + 0.01 * rng.normal(size=base.shape) for l in ("a", "b", "c")}
  shifted = {l: base + 0.01 * rng.normal(size=base.shape) + 3 * rng.normal(size=16)
             for l in ("a", "b", "c")}
  assert geometry.invariance(aligned) < geometry.invariance(shifted)
  # Eq. 16 by hand: mean of KL(P_a || P_b) over the ordered pairs of languages
  g = {l: geometry.gaussian(mining.normalize(e)) for l, e in shifted.items()}
  by_hand = np.mean([geometry.kl_gaussian(g[a], g[b]) for a in g for b in g if a != b])
  assert geometry.invariance(shifted) == pytest.approx(by_hand)
  assert geometry.canonical_form(aligned) > geometry.canonical_form(shifted)
  from sklearn.metrics import calinski_harabasz_score
  x = np.concatenate([mining.normalize(e) for e in aligned.values()])
  assert geometry.canonical_form(aligned) == pytest.approx(
      calinski_harabasz_score(x, np.tile(np.arange(100), 3)))
  # principal ratio: hand-computed case W = [[1, 0], [0, 2]]: eigenvectors e1, e2 and negatives
  w = np.array([[1.0, 0.0], [0.0, 2.0]])
  z = [math.exp(1) + 1, math.exp(-1) + 1, 1 + math.exp(2), 1 + math.exp(-2)]
  assert geometry.principal_ratio(w) == pytest.approx(min(z) / max(z))
  iso = mining.normalize(rng.normal(size=(20000, 4)))
  aniso = mining.normalize(rng.normal(size=(20000, 4)) + np.array([3, 0, 0, 0]))
  assert geometry.principal_ratio(iso) > 0.9 > 0.2 > geometry.principal_ratio(aniso)


# ----------------------------------------------------------------------------- transfer

def test_transfer_probe_split_and_accuracy(tmp_path):
  rng = np.random.default_rng(0)
  labels = rng.choice(["pos", "neg"], size=120)
  for lang, noise in (("en", 0.0), ("de", 0.0), ("xx", 1.0)):
    lines = []
    for i, y in enumerate(labels):
      m = (1 if y == "pos" else 2) if rng.uniform() > noise else int(rng.integers(1, 3))
      lines.append(f"w{m} item {i}\t{y}")
    write_lines(tmp_path / f"cls-{lang}.tsv", lines)
  res = transfer.evaluate(common.as_encode_fn(MeaningEncoder(noise=0.1)),
                          str(tmp_path / "cls-{lang}.tsv"), ["en", "de", "xx"], n_train=80)
  acc = {s["hf_subset"]: s for s in res["scores"]["test"]}
  assert acc["en-de"]["accuracy"] == pytest.approx(100.0) and acc["en-de"]["n"] == 40
  assert acc["en-xx"]["accuracy"] < 90
  assert res["main_score"] == pytest.approx((acc["en-de"]["accuracy"] + acc["en-xx"]["accuracy"]) / 2)
  write_lines(tmp_path / "cls-yy.tsv", ["w1 a\tpos"] * 100 + ["w2 b\tunseen"] * 20)
  with pytest.raises(DataError, match=r"labels \['unseen'\]"):
    transfer.evaluate(common.as_encode_fn(MeaningEncoder()), str(tmp_path / "cls-{lang}.tsv"),
                      ["yy"], n_train=80)
  write_lines(tmp_path / "cls-zz.tsv", ["w1 a\tpos"] * 50)
  with pytest.raises(DataError, match=r"cls-zz.tsv has 50 lines, .*cls-en.tsv has 120"):
    transfer.evaluate(common.as_encode_fn(MeaningEncoder()), str(tmp_path / "cls-{lang}.tsv"),
                      ["zz"], n_train=80)


# ----------------------------------------------------------------------------- tatoeba

def test_tatoeba_xsim_and_head_tail_groups(tmp_path):
  d = tmp_path / "eval/tatoeba/v1"
  for lang in ("deu", "pes", "xyz"):
    write_lines(d / f"tatoeba.{lang}-eng.{lang}", [f"w{i} {lang}" for i in range(30)])
    write_lines(d / f"tatoeba.{lang}-eng.eng", [f"w{i} eng" for i in range(30)])
  res = tatoeba.evaluate(common.as_encode_fn(MeaningEncoder(noise=0.01)), ["deu", "pes", "xyz"],
                         str(tmp_path), own_languages=["deu", "fas"])
  assert res["languages"]["deu"]["mean"] == pytest.approx(100.0)
  assert res["languages"]["deu"]["xsim"] == pytest.approx(0.0)
  assert res["groups"]["head"]["n_languages"] == 2 and res["groups"]["long_tail"]["n_languages"] == 1
  # multilingual USE has German, not Persian: pes and xyz are outside its 16
  assert res["groups"]["outside_use"]["n_languages"] == 2
  assert len(tatoeba.USE16) == 14 and set(tatoeba.USE16) <= set(tatoeba.EMMAX_HEAD)
  # a model trained on `fas` (tatoeba-challenge's code) knows Tatoeba's `pes`
  assert res["groups"]["own"]["n_languages"] == 2
  assert tatoeba.available_languages(str(tmp_path)) == ["deu", "pes", "xyz"]


# ----------------------------------------------------------------------------- harness

def _harness_data(root):
  d = Path(root)
  for lang in ("deu", "fra"):
    write_lines(d / f"eval/tatoeba/v1/tatoeba.{lang}-eng.{lang}", [f"w{i} {lang}" for i in range(40)])
    write_lines(d / f"eval/tatoeba/v1/tatoeba.{lang}-eng.eng", [f"w{i} eng" for i in range(40)])
  rows = [f"g\tf\t2012\t{i:04d}\t{(i % 5) + 0.5}\tw{i} a\tw{i if i % 2 else i + 1} b" for i in range(30)]
  write_lines(d / "eval/sts/STSBenchmark/sts-test.csv", rows)
  write_lines(d / "eval/sts/STSBenchmark/sts-dev.csv", rows)
  geo = {}
  for lang in ("en", "de", "fr"):
    geo[lang] = write_lines(d / f"nway/x.{lang}.gz", [f"w{i} {lang}" for i in range(50)], gz=True)
  return geo


def test_harness_writes_mteb_like_files_summary_and_plots(tmp_path):
  geo = _harness_data(tmp_path / "data")
  cfg = harness.EvalConfig(data_dir=str(tmp_path / "data"), geometry_files=geo, geometry_n=50,
                           progress=False)
  out = tmp_path / "out"
  enc = MeaningEncoder(noise=0.05)
  results = harness.run(enc, tasks=["tatoeba", "stsb", "geometry"], output_dir=str(out),
                        config=cfg, model_info={"name": "toy", "revision": "r1"})
  for name, r in results.items():
    on_disk = json.loads((out / f"{name}.json").read_text())
    assert on_disk == json.loads(json.dumps(r))          # round-trips
    for key in ("task_name", "main_score", "dataset_revision", "evaluation_time", "model",
                "scores", "mteb_version"):
      assert key in on_disk
    for split in on_disk["scores"].values():
      for s in split:
        assert {"main_score", "hf_subset", "languages"} <= set(s)
  assert results["tatoeba"]["main_score"] == pytest.approx(100.0)
  assert results["tatoeba"]["model"] == {"name": "toy", "revision": "r1"}
  summary = (out / "summary.md").read_text()
  assert "| tatoeba | 100.00 |" in summary and "| geometry |" in summary
  assert (out / "tatoeba_languages.png").stat().st_size > 1000
  assert (out / "geometry_projection.png").stat().st_size > 1000
  # the data revision changes with the data
  rev = results["stsb"]["dataset_revision"]
  write_lines(tmp_path / "data/eval/sts/STSBenchmark/sts-test.csv",
              ["g\tf\t2012\t0\t1.0\tw1 a\tw2 b", "g\tf\t2012\t1\t2.0\tw1 a\tw1 b",
               "g\tf\t2012\t2\t3.0\tw3 a\tw3 b"])
  again = harness.run(enc, tasks=["stsb"], config=cfg)
  assert again["stsb"]["dataset_revision"] != rev


def test_harness_resume_keeps_results_of_this_model_and_settings_only(tmp_path, monkeypatch):
  """An interrupted evaluation continues: a task whose result file was written for this
  model, vmx version and settings is kept, whatever the other tasks' settings; another
  model, another data directory, a damaged file or resume=False run it again."""
  _harness_data(tmp_path / "data")
  cfg = harness.EvalConfig(data_dir=str(tmp_path / "data"), progress=False)
  out, enc = tmp_path / "out", MeaningEncoder(noise=0.05)
  model = {"name": "toy", "revision": "r1"}
  first = harness.run(enc, tasks=["stsb"], output_dir=str(out), config=cfg,
                      model_info=model, resume=True)
  from vmx.evaluation import evaluators
  real, calls = evaluators.Stsb.run, []
  monkeypatch.setattr(evaluators.Stsb, "run", lambda *a: calls.append(1) or real(*a))
  run = lambda **kw: harness.run(enc, tasks=["stsb"], output_dir=str(out),
                                 **{"config": cfg, "model_info": model, "resume": True, **kw})
  assert run()["stsb"] == json.loads(json.dumps(first["stsb"])) and calls == []
  run(config=dataclasses.replace(cfg, dev_max_sentences=5))    # another task's settings
  assert calls == []
  shutil.copytree(tmp_path / "data", tmp_path / "data2")
  run(config=dataclasses.replace(cfg, data_dir=str(tmp_path / "data2")))   # other data
  assert len(calls) == 1
  run(model_info={"name": "toy", "revision": "r2"})              # another checkpoint
  assert len(calls) == 2
  run(model_info={"name": "toy", "revision": "r2"}, resume=False)
  assert len(calls) == 3
  (out / "stsb.json").write_text('{"task_name": "stsb", "main')   # damaged
  run(model_info={"name": "toy", "revision": "r2"})
  assert len(calls) == 4 and json.loads((out / "stsb.json").read_text())["main_score"]


def test_harness_missing_data_fails_that_task_only(tmp_path):
  geo = _harness_data(tmp_path / "data")
  cfg = harness.EvalConfig(data_dir=str(tmp_path / "data"), geometry_files=geo, progress=False)
  out = tmp_path / "out"
  with pytest.raises(harness.EvaluationFailed,
                     match=r"bucc: DataError: task bucc: no gold file for any of de-en, fr-en, "
                           r"ru-en, zh-en.*retrieval: "
                           r"DataError: task retrieval: needs --retrieval.dirs"):
    harness.run(MeaningEncoder(), tasks=["tatoeba", "bucc", "retrieval", "stsb"],
                output_dir=str(out), config=cfg)
  assert (out / "tatoeba.json").exists() and (out / "stsb.json").exists()
  summary = (out / "summary.md").read_text()
  assert "| bucc | failed |" in summary and "| stsb |" in summary
  with pytest.raises(ValueError, match="unknown suite"):
    harness.resolve_tasks("nope")
  missing = harness.EvalConfig(data_dir=str(tmp_path / "data"), tatoeba_languages=["spa"],
                               progress=False)
  with pytest.raises(harness.EvaluationFailed, match=r"task tatoeba: .*tatoeba\.spa-eng\.spa"):
    harness.run(MeaningEncoder(), tasks=["tatoeba"], config=missing)


def test_eval_cli_bad_input_is_one_line(tmp_path):
  import subprocess
  import sys
  from conftest import REPO
  run = lambda *a: subprocess.run([sys.executable, str(REPO / "launch/eval.py"), *a],
                                  capture_output=True, text=True, cwd=REPO, timeout=300)
  p = run(f"--checkpoint_dir={tmp_path / 'nope'}")
  assert p.returncode == 2 and "nope: no such file or directory" in p.stderr, p.stderr[-2000:]
  assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
  p = run(f"--checkpoint_dir={tmp_path}")
  assert p.returncode == 2 and "not a vmx model_dir (no vmx_model.json)" in p.stderr
  (tmp_path / "vmx_model.json").write_text("{}")
  p = run(f"--checkpoint_dir={tmp_path}", "--suite=nope")
  assert p.returncode == 2 and "unknown suite" in p.stderr
  p = run(f"--checkpoint_dir={tmp_path}", "--protocol=infoxlm", "--tatoeba_vector=seven")
  assert p.returncode == 2 and "--tatoeba_vector='seven': expected LAYER,POOLING" in p.stderr


def test_geometry_eqs_16_to_18_on_a_hand_computed_example():
  """EMMA-X Eqs. 16-18 as printed: full unnormalized scatter, B / W without the CH factor,
  eigenvectors without their negatives."""
  from sklearn.metrics import calinski_harabasz_score
  from vmx.evaluation import geometry
  rng = np.random.default_rng(0)
  embs = {l: rng.normal(size=(6, 3)) + i for i, l in enumerate(("a", "b", "c"))}
  unit = {l: e / np.linalg.norm(e, axis=1, keepdims=True) for l, e in embs.items()}
  # Eq. 17 by hand: clusters are the 6 sentences, 3 translations each
  c = np.mean([unit[l] for l in unit], axis=0)
  between = 3 * np.sum((c - c.mean(axis=0)) ** 2)
  within = sum(np.sum((unit[l] - c) ** 2) for l in unit)
  assert geometry.canonical_form_eq17(embs) == pytest.approx(between / within)
  x = np.concatenate(list(unit.values()))
  labels = np.tile(np.arange(6), 3)
  n, k = 18, 6
  assert geometry.canonical_form_eq17(embs) == pytest.approx(
      calinski_harabasz_score(x, labels) * (k - 1) / (n - k))
  # Eq. 16 by hand: KL between N(mu_a, S_a), S = sum (x - mu)(x - mu)^T (no 1/n)
  def kl(a, b):
    ma, mb = unit[a].mean(0), unit[b].mean(0)
    sa = (unit[a] - ma).T @ (unit[a] - ma)
    sb = (unit[b] - mb).T @ (unit[b] - mb)
    inv = np.linalg.inv(sb)
    return 0.5 * (np.trace(inv @ sa) + (mb - ma) @ inv @ (mb - ma) - 3
                  + np.log(np.linalg.det(sb)) - np.log(np.linalg.det(sa)))
  want = np.mean([kl(a, b) for a in unit for b in unit if a != b])
  assert geometry.invariance_eq16(embs) == pytest.approx(want)
  assert np.isnan(geometry.invariance_eq16({l: e[:2] for l, e in embs.items()}))  # n <= d
  # Eq. 18: the eigenvectors as returned, no negatives (the signed variant is never above it)
  _, vecs = np.linalg.eigh(x.T @ x)
  z = np.exp(x @ vecs).sum(axis=0)
  assert geometry.isotropy_eq18(embs) == pytest.approx(z.min() / z.max())
  assert geometry.isotropy(embs) <= geometry.isotropy_eq18(embs) + 1e-12


def _separable(tmp_path, langs=("en", "de", "fr")):
  """text<TAB>label files of 3 classes per language and split; `ClassEncoder` maps 'c<Y>
  <n>' to class Y's centre plus noise (+ a per-language shift)."""
  rng = np.random.default_rng(0)
  for lang in langs:
    for split, n in (("train", 150), ("dev", 60), ("test", 90)):
      ys = rng.integers(0, 3, n)
      write_lines(tmp_path / f"{lang}.{split}.tsv",
                  [f"c{y} {rng.integers(1 << 30)}\tlabel{y}" for y in ys])


class ClassEncoder:
  def __init__(self, shift=0.3):
    self.centres = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32) * 2
    self.shift = shift

  def encode(self, sentences, lang=None):
    y = np.array([int(s[1]) for s in sentences])
    noise = np.stack([np.random.default_rng(int(s.split()[1])).standard_normal(16)
                      for s in sentences]).astype(np.float32)
    return self.centres[y] + 0.7 * noise + (self.shift if lang != "eng" else 0.0)


def test_mlp_probe_is_accurate_deterministic_per_seed_and_averaged(tmp_path):
  """EMS §5.4-5.5: an MLP probe, the mean of runs with different seeds."""
  _separable(tmp_path)
  enc = common.as_encode_fn(ClassEncoder())
  kw = dict(test_pattern=str(tmp_path / "{lang}.test.tsv"), languages=["de", "fr"],
            source="en", train_pattern=str(tmp_path / "{lang}.train.tsv"), probe="mlp")
  res = transfer.evaluate(enc, seeds=[0, 1, 2], dev_pattern=str(tmp_path / "{lang}.dev.tsv"),
                          **kw)
  rows = res["scores"]["test"]
  assert [r["hf_subset"] for r in rows] == ["en-de", "en-fr"]
  for r in rows:
    assert len(r["accuracy_per_seed"]) == 3 and r["n"] == 90
    assert r["accuracy"] == pytest.approx(np.mean(r["accuracy_per_seed"]))
  assert res["main_score"] == pytest.approx(np.mean([r["accuracy"] for r in rows]))
  assert res["main_score"] > 90
  assert res["probe"] == "mlp" and len(res["best_epochs"]) == 3
  again = transfer.evaluate(enc, seeds=[2, 0], dev_pattern=str(tmp_path / "{lang}.dev.tsv"),
                            **kw)
  for r, a in zip(rows, again["scores"]["test"]):    # the same seed, the same run
    assert a["accuracy_per_seed"] == [r["accuracy_per_seed"][2], r["accuracy_per_seed"][0]]
  held_out = transfer.evaluate(enc, seeds=[0], **kw)   # no dev file: 10 % of train held out
  assert held_out["main_score"] > 80 and held_out["n_train"] == 150
  with pytest.raises(ValueError, match="probe='svm'"):
    transfer.evaluate(enc, probe="svm", **{k: v for k, v in kw.items() if k != "probe"})
  write_lines(tmp_path / "en.dev.tsv", ["c1 5\tlabel9"])
  with pytest.raises(DataError, match=r"en\.dev\.tsv: labels \['label9'\]"):
    transfer.evaluate(enc, dev_pattern=str(tmp_path / "{lang}.dev.tsv"), **kw)


def test_mlp_probe_is_lasers_network_with_dropout_and_the_best_dev_epoch():
  """LASER's MLDoc classifier (EMS §5.4): dropout 0.2, hidden 10 and 8 (tanh), Adam 1e-3,
  batch 12, 500 epochs; the kept parameters are the best dev epoch's (their dev accuracy is
  the recorded one); dropout is in the training (another rate, another network) and not in
  prediction."""
  assert transfer.MLP["dropout"] == 0.2 and transfer.MLP["epochs"] == 500
  assert transfer.MLP["hidden"] == (10, 8) and transfer.MLP["batch_size"] == 12
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(3, 6)) * 1.5
  def data(n):
    y = rng.integers(0, 3, n)
    return (centres[y] + rng.normal(size=(n, 6))).astype(np.float32), [f"l{c}" for c in y]
  x, y = data(100)
  dx, dy = data(40)
  p = transfer.MlpProbe(0, {"epochs": 30}).fit(x, y, dx, dy)
  assert 1 <= p.best_epoch <= 30
  assert 100 * np.mean(p.predict(dx) == np.asarray(dy)) == pytest.approx(p.dev_accuracy)
  np.testing.assert_array_equal(p.predict(x), p.predict(x))        # no dropout at prediction
  q = transfer.MlpProbe(0, {"epochs": 30, "dropout": 0.0}).fit(x, y, dx, dy)
  assert not np.allclose(p.params[0][0], q.params[0][0])
  assert [w.shape for w, _ in p.params] == [(6, 10), (10, 8), (8, 3)]


def test_transfer_benchmark_both_directions(tmp_path):
  """MLDoc / Amazon (EMS Tables 10-12): en->xx and xx->en for each other language."""
  _separable(tmp_path)
  bench = transfer.Benchmark("toy", "Table X", ("en", "de", "fr"), "{lang}.{split}.tsv")
  res = transfer.evaluate_benchmark(common.as_encode_fn(ClassEncoder()), bench, tmp_path,
                                    seeds=[0])   # the mean over seeds: test_mlp_probe_...
  rows = {r["hf_subset"]: r for r in res["scores"]["test"]}
  assert set(rows) == {"en-de", "en-fr", "de-en", "fr-en"}
  assert rows["de-en"]["direction"] == "xx->en" and rows["en-fr"]["direction"] == "en->xx"
  assert res["en2xx"] == pytest.approx((rows["en-de"]["accuracy"] + rows["en-fr"]["accuracy"]) / 2)
  assert res["main_score"] == pytest.approx(np.mean([r["accuracy"] for r in rows.values()]))
  assert res["main_score"] > 85
  assert "amazon_v1_dir=DIR: DIR/{lang}.{domain}.{train,dev,test}.tsv" in \
      transfer.AMAZON_V1.layout("amazon_v1_dir")
  (tmp_path / "fr.dev.tsv").unlink()
  with pytest.raises(DataError, match=r"task toy: .*fr\.dev\.tsv: no such file"):
    transfer.evaluate_benchmark(common.as_encode_fn(ClassEncoder()), bench, tmp_path)


# ----------------------------------------------------------------------------- paracrawl

def _paracrawl(d, lang="de", n=400):
  """OPUS-named files: pair i is 'x<i> ..' / 'y<i> ..'; one duplicate source text, one
  empty target line. `PairEncoder` puts both sides of pair i at vector i, except the
  English side of every `PairEncoder.broken`-th pair (at minus it: never retrieved)."""
  pair = "-".join(sorted((lang, "en")))
  xx = [f"x{i} {lang}" for i in range(n)]
  en = [f"y{i} en" for i in range(n)]
  xx[7], en[11] = "x3 " + lang, ""
  write_lines(d / f"ParaCrawl.{pair}.{lang}", xx)
  write_lines(d / f"ParaCrawl.{pair}.en", en)
  return d / f"ParaCrawl.{pair}.{lang}", d / f"ParaCrawl.{pair}.en"


class PairEncoder:
  def __init__(self, broken=5):
    self.table = np.random.default_rng(1).standard_normal((1000, 64)).astype(np.float32)
    self.broken = broken

  def encode(self, sentences, lang=None):
    ids = np.array([int(s.split()[0][1:]) for s in sentences])
    v = self.table[ids].copy()
    if lang == "eng":
      v[ids % self.broken == 0] *= -1
    return v + 0.05 * np.random.default_rng(len(ids)).standard_normal(v.shape)


def test_paracrawl_margin_p_at_1_on_a_known_answer(tmp_path):
  """EMS §5.3: queries against a larger pool, ratio margin (k=4), P@1 both directions."""
  from vmx.evaluation import paracrawl
  _paracrawl(tmp_path, "de")
  _paracrawl(tmp_path, "fr")                       # OPUS's name: ParaCrawl.en-fr.*
  res = paracrawl.evaluate(common.as_encode_fn(PairEncoder()), tmp_path, n_queries=40,
                           n_candidates=300, seed=3)
  assert [r["hf_subset"] for r in res["scores"]["test"]] == ["de-en", "fr-en"]
  assert "bg" in res["languages_missing"] and len(res["languages_missing"]) == 19
  src, tgt, lines, n = paracrawl.draw(tmp_path / "ParaCrawl.de-en.de",
                                      tmp_path / "ParaCrawl.de-en.en", 40, 300, seed=3)
  assert n == 400 and len(src) == len(set(src)) == 300 and "" not in tgt
  ids = [(int(s.split()[0][1:]), int(t.split()[0][1:])) for s, t in zip(src, tgt)]
  assert [t for _, t in ids] == list(lines - 1)              # line L is pair L - 1
  # a query is found iff its pair is a translation (line 8's 'x3' is not) and not broken
  want = 100 * np.mean([s == t and t % 5 != 0 for s, t in ids[:40]])
  de = res["scores"]["test"][0]
  assert 0 < want < 100 and de["p_at_1_en2xx"] == pytest.approx(want)
  assert de["p_at_1_xx2en"] == pytest.approx(want) and de["main_score"] == de["p_at_1_en2xx"]
  assert de["first_query_lines"] == lines[:5].tolist()
  again = paracrawl.draw(tmp_path / "ParaCrawl.de-en.de", tmp_path / "ParaCrawl.de-en.en",
                         40, 300, seed=3)
  assert again[0] == src and paracrawl.draw(tmp_path / "ParaCrawl.de-en.de",
                                            tmp_path / "ParaCrawl.de-en.en", 40, 300,
                                            seed=4)[0] != src


def test_paracrawl_bad_input_names_the_file(tmp_path):
  from vmx.evaluation import paracrawl
  enc = common.as_encode_fn(PairEncoder())
  xx, en = _paracrawl(tmp_path, "de", n=100)
  write_lines(en, [f"y{i} en" for i in range(99)])
  with pytest.raises(DataError, match=r"ParaCrawl\.de-en\.de has 100 lines, .*"
                                      r"ParaCrawl\.de-en\.en has 99"):
    paracrawl.evaluate(enc, tmp_path, n_queries=10, n_candidates=50)
  en.unlink()
  with pytest.raises(DataError, match=r"task paracrawl: .*ParaCrawl\.de-en\.en: no such file"):
    paracrawl.evaluate(enc, tmp_path, n_queries=10, n_candidates=50)
  with pytest.raises(DataError, match=r"ParaCrawl\.en-fr\.fr: no such file"):
    paracrawl.evaluate(enc, tmp_path, ["fr"], n_queries=10, n_candidates=50)
  _paracrawl(tmp_path, "de", n=100)
  with pytest.raises(DataError, match=r"has 100 lines, fewer than the 200 candidates"):
    paracrawl.evaluate(enc, tmp_path, n_queries=10, n_candidates=200)
  from vmx.evaluation import evaluators
  with pytest.raises(DataError, match=r"needs --paracrawl.dir"):
    evaluators.Paracrawl().run(evaluators.Context(enc, enc, common.DataFiles("paracrawl")))
