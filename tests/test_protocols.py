"""Each paper's evaluation protocol (vmx/evaluation/protocols/): the direction and group
arithmetic against NumPy, and `launch/eval.py --protocol=...` end to end on a tiny
checkpoint, its JSON naming the paper's tables and what vmx cannot read yet."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA_DIR, REPO, needs_data, toy_train


def _fake_tatoeba(rng, langs):
  rows = []
  for l in langs:
    a, b = rng.uniform(0, 100, 2)
    rows.append({"languages": [l, "eng"], "accuracy_xx2en": a, "accuracy_en2xx": b,
                 "main_score": (a + b) / 2})
  return {"tatoeba": {"scores": {"test": rows}}}


def test_directions_and_groups_match_numpy():
  from vmx.evaluation import protocols, tatoeba
  rng = np.random.default_rng(0)
  langs = list(tatoeba.XTREME36) + ["aze", "lit", "xho", "zza"]
  res = _fake_tatoeba(rng, langs)
  rows = {r["languages"][0]: r for r in res["tatoeba"]["scores"]["test"]}
  for group in (protocols.INFOXLM_PARALLEL14, protocols.INFOXLM_OTHER22, protocols.EMMAX_HEAD):
    for d, field in (("xx2en", "accuracy_xx2en"), ("en2xx", "accuracy_en2xx"),
                     ("mean", "main_score")):
      want = np.mean([rows[l][field] for l in group if l in rows])
      got = protocols.tatoeba_mean(res, group, d)
      assert got["value"] == pytest.approx(want) and got["metric"].endswith(d)
  assert len(protocols.INFOXLM_PARALLEL14) == 14 and len(protocols.INFOXLM_OTHER22) == 22
  assert len(protocols.EMMAX_HEAD) == 41           # A.1's 42 codes less English
  head = protocols.tatoeba_mean(res, protocols.EMMAX_HEAD, "xx2en")
  assert head["n_languages"] == 38 and "ukr" in head["languages_missing"]
  figs = protocols.PROTOCOLS["emmax"].figures(res)  # long tail: every other evaluated language
  tail = [f for f in figs if f["column"].startswith("Tatoeba long-tail")][0]
  assert tail["value"] == pytest.approx(np.mean([rows[l]["accuracy_xx2en"]
                                                 for l in ("xho", "zza")]))


def test_vmsst_sts17_means_and_score():
  from vmx.evaluation import protocols
  sts17 = [{"hf_subset": f"track{i}.{p}", "pearson": v, "spearman": v - 1}
           for i, (p, v) in enumerate([("ar-ar", 50.0), ("es-es", 70.0), ("ar-en", 20.0),
                                        ("es-en", 25.0), ("tr-en", 40.0), ("en-en", 90.0),
                                        ("es-en", 35.0)])]   # es-en: tracks 4a and 4b
  res = {"sts17": {"scores": {"test": sts17}}, "sts12-16": {"vmsst_pearson": 60.0,
                                                            "sbert_spearman": 55.0}}
  figs = {f["column"]: f for f in protocols.PROTOCOLS["vmsst"].figures(res)
          if f["table"] == "Table 1"}
  assert figs["XL (s.)"]["value"] == pytest.approx(60.0)
  assert figs["XL (d.)"]["value"] == pytest.approx(30.0)
  assert figs["XL Sem. Sim."]["value"] == pytest.approx(42.0)     # the five sets
  assert figs["Score"]["value"] == pytest.approx(51.0)             # (60 + 42) / 2
  assert set(figs["Score"]["subtasks_missing"]) == {"bucc", "mkqa", "nq", "tatoeba"}


def test_mpcl_sts17_takes_mteb_sets_and_emmax_flores_groups():
  """MPCL scores STS17 through MTEB, whose es-en is track 4a only; EMMA-X's Table 3 FLORES
  head / long-tail figures and Table 4's geometry per group come from the flores task,
  the equations as printed with vmx's variants beside them."""
  from vmx.evaluation import protocols
  sts17 = [{"hf_subset": "track4a.es-en", "spearman": 30.0, "mteb": True},
           {"hf_subset": "track4b.es-en", "spearman": 10.0, "mteb": False},
           {"hf_subset": "track5.en-en", "spearman": 80.0, "mteb": True}]
  figs = {f["column"]: f for f in protocols.PROTOCOLS["mpcl"].figures(
      {"sts17": {"scores": {"test": sts17}}})}
  sts = [f for c, f in figs.items() if c.startswith("STS17")][0]
  assert sts["value"] == pytest.approx(55.0) and sts["tracks"] == ["track4a.es-en",
                                                                   "track5.en-en"]
  geo = {k: float(i) for i, k in enumerate(("invariance_kl_eq16", "canonical_form_eq17",
                                            "isotropy_eq18", "invariance_kl",
                                            "canonical_form_ch", "isotropy_pr"))}
  fl = {"groups": {"head": {"xx2en": 90.0, "en2xx": 91.0, "n_languages": 60},
                   "long_tail": {"xx2en": 70.0, "en2xx": 72.0, "n_languages": 120},
                   "all": {"xx2en": 76.7, "en2xx": 0.0, "n_languages": 180}},
        "head_missing": ["bel_Cyrl"], "splits": ["dev", "devtest"], "n_sentences": 2009,
        "geometry": {g: {**geo, "n_languages": 3} for g in ("head", "long_tail", "all")}}
  figs = {f["column"]: f for f in protocols.PROTOCOLS["emmax"].figures({"flores": fl})}
  assert figs["FLORES head (A.1's 68), xx->En"]["value"] == 90.0
  assert figs["FLORES long-tail, xx->En"]["value"] == 70.0
  eq16 = figs["invariance KL (Eq. 16), FLORES all"]
  assert eq16["value"] == 0.0 and eq16["variant"] == {"invariance_kl": 3.0}
  assert figs["isotropy PR (Eq. 18), FLORES head"]["variant"] == {"isotropy_pr": 5.0}
  assert len([c for c in figs if "FLORES" in c]) == 2 + 3 * 3


def _bucc_row(pair, **f1):
  row = {"hf_subset": pair, "threshold_split": "sample", "split": "sample"}
  for scoring in ("cosine", "margin"):
    for retrieval in ("forward", "backward", "intersect", "max"):
      row[f"{scoring}_{retrieval}"] = {"f1": f1.get(f"{scoring}_{retrieval}", 0.0)}
  return row


def test_vmsst_bucc_spearman_tables_and_seen_languages():
  """§6.2's BUCC (c.) keeps each sentence's highest-scoring English sentence (forward
  retrieval), not the max strategy; Tables 2 and 10 are Spearman (Table 10 both); A.3's
  Table 8 splits Tatoeba by the languages the model trained on; every figure names its
  vector and its task."""
  from vmx.evaluation import protocols
  bucc = [_bucc_row("de-en", cosine_forward=40.0, cosine_max=10.0, margin_max=80.0),
          _bucc_row("fr-en", cosine_forward=20.0, cosine_max=30.0, margin_max=60.0)]
  sts17 = [{"hf_subset": f"track{i}.{p}", "pearson": v, "spearman": v + 10}
           for i, (p, v) in enumerate([("ar-ar", 50.0), ("es-es", 70.0), ("ar-en", 20.0),
                                        ("es-en", 25.0), ("tr-en", 40.0)])]
  tat = [{"languages": [l, "eng"], "accuracy_xx2en": a, "accuracy_en2xx": a + 2,
          "main_score": a + 1, "seen": l in ("deu", "fra")}
         for l, a in (("deu", 60.0), ("fra", 40.0), ("xho", 10.0))]
  vec = "mean of the last layer"
  res = {"bucc": {"scores": {"test": bucc}, "vector": vec},
         "sts17": {"scores": {"test": sts17}, "vector": vec},
         "tatoeba": {"scores": {"test": tat}, "vector": vec},
         "sts12-16": {"vmsst_pearson": 60.0, "sbert_spearman": 58.0, "vector": vec}}
  report = protocols.report(protocols.PROTOCOLS["vmsst"], res, {}, None)
  figs = {(f["table"], f["column"]): f for f in report["figures"]}
  assert figs[("Table 1", "BUCC (c.)")]["value"] == pytest.approx(30.0)       # forward
  assert "forward" in figs[("Table 1", "BUCC (c.)")]["metric"]
  assert figs[("Table 1", "BUCC (m.)")]["value"] == pytest.approx(70.0)
  assert figs[("Table 13", "Cosine, de-en")]["value"] == 40.0
  assert figs[("Table 1", "Score")]["value"] == pytest.approx(
      np.mean([60.0, 41.0, np.mean([61.0, 41.0, 11.0]), 50.0]))
  assert figs[("Table 1", "XL Sem. Sim.")]["value"] == pytest.approx(41.0)    # Pearson
  assert figs[("Table 2", "XL Sem. Sim.")]["value"] == pytest.approx(51.0)    # Spearman
  assert figs[("Table 2", "XL (s.)")]["value"] == pytest.approx(70.0)
  assert figs[("Table 10", "tr-en, Spearman")]["value"] == 50.0
  assert figs[("Table 10", "tr-en, Pearson")]["value"] == 40.0
  assert figs[("Table 8", "Tat. (seen)")]["value"] == pytest.approx(51.0)
  assert figs[("Table 8", "Tat. (unseen)")]["value"] == pytest.approx(11.0)
  assert figs[("Table 8", "Tat. (unseen)")]["languages"] == ["xho"]
  assert all(f["vector"] == vec and f["task"] in res for f in report["figures"])
  assert "Table 8" not in {m["table"] for m in report["missing"]}
  for r in tat:                       # a model that does not say what it trained on
    del r["seen"]
  report = protocols.report(protocols.PROTOCOLS["vmsst"], res, {}, None)
  assert "Table 8" not in {f["table"] for f in report["figures"]}
  assert "Table 8" in {m["table"] for m in report["missing"]}


def test_emmax_multists_is_table_2_spearman_over_its_pairs():
  from vmx.evaluation import protocols
  sts17 = [{"hf_subset": "track1.ar-ar", "spearman": 70.0, "mteb": True},
           {"hf_subset": "track4a.es-en", "spearman": 30.0, "mteb": True},
           {"hf_subset": "track4b.es-en", "spearman": 0.0, "mteb": False},
           {"hf_subset": "track6.tr-en", "spearman": 50.0, "mteb": True}]
  figs = {(f["table"], f["column"]): f for f in protocols.PROTOCOLS["emmax"].figures(
      {"sts17": {"scores": {"test": sts17}}})}
  f = figs[("Table 2", "MultiSTS (zero-shot, Spearman)")]
  assert f["value"] == pytest.approx(50.0) and f["task"] == "sts17"
  assert set(f["pairs_missing"]) == {"ar-en", "en-de", "en-en", "es-es", "fr-en", "it-en",
                                     "nl-en"}
  from vmx.evaluation import harness
  report = protocols.report(protocols.PROTOCOLS["emmax"], {}, {}, harness.settings_of())
  xrete = {m["benchmark"].split(" (")[0] for m in report["missing"]}
  assert {"XNLI", "ANLI / AmericasNLI", "PAWS-X", "QE", "LAReQA", "Mewsli-X", "XCOPA",
          "MultiEURLEX", "MultiARC", "MultiSTS"} <= xrete
  assert any("launch/finetune.py --gin_file=finetune/<file>.gin --protocol=emmax "
             "--gin.PAWSX_DIR=DIR" in m["layout"] for m in report["missing"])


# EMS Table 4, P@1 per language (mean of both directions), in protocols.EMS_SEEN58's order:
# the EMS and SBERT-distill rows. Table 6 prints each group's mean of these.
EMS_TABLE4 = {
    "EMS": [94.0, 93.9, 83.8, 95.8, 97.0, 97.4, 95.9, 97.0, 99.3, 96.5, 98.9, 97.8, 94.9, 98.0,
            96.2, 97.1, 92.5, 93.4, 97.5, 97.4, 87.8, 95.8, 96.7, 55.6, 95.8, 73.5, 63.8, 92.3,
            31.3, 97.3, 96.9, 77.8, 88.2, 69.9, 97.0, 73.9, 97.7, 97.5, 96.0, 98.2, 95.9, 97.9,
            95.2, 97.5, 97.1, 98.6, 98.4, 96.4, 97.0, 53.2, 52.8, 69.7, 84.8, 97.4, 98.6, 96.0,
            86.0, 97.7],
    "SBERT-distill": [84.5, 87.7, 77.6, 94.0, 96.4, 96.3, 95.0, 96.2, 98.7, 95.5, 68.8, 95.8,
                      48.6, 96.4, 94.7, 96.0, 88.4, 96.4, 97.0, 94.7, 91.3, 94.1, 94.9, 37.3,
                      94.2, 91.4, 73.7, 90.1, 43.7, 95.8, 96.4, 94.0, 91.0, 58.5, 92.2, 91.7,
                      96.0, 98.0, 94.8, 97.0, 94.8, 96.4, 93.5, 96.2, 95.5, 98.0, 97.5, 93.8,
                      95.7, 27.6, 85.7, 89.1, 32.4, 96.3, 97.2, 94.3, 92.2, 97.2]}
EMS_TABLE6 = {"EMS": (96.6, 88.2, 95.0, 91.8, 95.4, 72.0),
              "SBERT-distill": (94.9, 85.5, 94.8, None, 92.1, 73.3)}


def test_ems_language_groups_reproduce_table6_from_table4():
  """The group lists (protocols.EMS_TABLE6, EMS_TABLE13) give back the averages the paper
  prints, from its own per-language figures, to the printed rounding."""
  from vmx.evaluation import protocols, tatoeba
  seen = protocols.EMS_SEEN58
  assert len(seen) == 58 and len(protocols.EMS_UNSEEN54) == 54
  assert not set(seen) & set(protocols.EMS_UNSEEN54)
  assert {len(v) for v in protocols.EMS_TABLE6.values()} <= {14, 37, 45, 43, 42, 11}
  for group in list(protocols.EMS_TABLE6.values()) + list(protocols.EMS_TABLE13.values()):
    assert set(group) <= set(seen), group
  assert set(protocols.EMS_TABLE6["XTREME (38)"]) == set(tatoeba.XTREME36) | {"max"}
  for model, row in EMS_TABLE4.items():
    p1 = dict(zip(seen, row))
    for (group, langs), want in zip(protocols.EMS_TABLE6.items(), EMS_TABLE6[model]):
      if want is not None:
        got = np.mean([p1[l] for l in langs])
        assert got == pytest.approx(want, abs=0.05 + 1e-9), (model, group)
  p1 = dict(zip(seen, EMS_TABLE4["EMS"]))
  assert np.mean(EMS_TABLE4["EMS"]) == pytest.approx(89.8, abs=0.05 + 1e-9)          # Table 4 Avg.
  for (group, langs), want in zip(protocols.EMS_TABLE13.items(), (95.4, 73.7)):  # Table 13
    assert np.mean([p1[l] for l in langs]) == pytest.approx(want, abs=0.05 + 1e-9), group


def test_ems_figures_and_optional_tasks():
  from vmx.evaluation import harness, protocols, tatoeba
  rng = np.random.default_rng(0)
  res = _fake_tatoeba(rng, list(protocols.EMS_SEEN58) + ["xho", "zsm"])
  res["paracrawl"] = {"main_score": 80.0, "p_at_1_xx2en": 70.0, "languages_missing": ["bg"],
                      "k": 4, "scores": {"test": [{"hf_subset": "de-en", "n_queries": 2000,
                                                   "n_candidates": 200000}]}}
  res["mldoc"] = {"main_score": 75.0, "en2xx": 74.0, "xx2en": 76.0, "probe": "mlp",
                  "seeds": [0, 1, 2, 3, 4], "scores": {"test": [{}] * 14}}
  rows = {r["languages"][0]: r for r in res["tatoeba"]["scores"]["test"]}
  figs = {(f["table"], f["column"]): f for f in protocols.PROTOCOLS["ems"].figures(res)}
  for group, langs in protocols.EMS_TABLE6.items():
    f = figs[("Table 6", f"Tatoeba P@1, {group}")]
    assert f["value"] == pytest.approx(np.mean([rows[l]["main_score"] for l in langs]))
    assert f["n_languages"] == f["group_size"] == len(langs)
  unseen = figs[("Table 5", "Tatoeba P@1, Avg. (54 unseen languages)")]
  assert unseen["n_languages"] == 2 and len(unseen["languages_missing"]) == 52
  assert figs[("Table 9", "ParaCrawl P@1, Avg.")]["value"] == 80.0
  assert figs[("Table 10", "mldoc Avg. (both directions)")]["value"] == 75.0
  assert figs[("Table 13", "MLDoc X->en Avg.")]["value"] == 76.0
  ems = protocols.PROTOCOLS["ems"]
  bare = harness.settings_of()
  assert protocols.tasks_of([ems], bare) == ["tatoeba", "bucc"]
  missing = {m["benchmark"]: m["layout"] for m in protocols.report(ems, {}, {}, bare)["missing"]}
  assert set(missing) == {"ParaCrawl sentence retrieval (2k queries, 200k candidates)",
                          "mldoc", "amazon_v1", "amazon_v2"}
  assert "--mldoc.dir=DIR: DIR/{lang}.{train,dev,test}.tsv" in missing["mldoc"]
  assert "MLP" in missing["mldoc"] and "ParaCrawl.<pair>" in missing[
      "ParaCrawl sentence retrieval (2k queries, 200k candidates)"]
  given = harness.settings_of(harness.EvalConfig(paracrawl_dir="/x", mldoc_dir="/y"))
  assert protocols.tasks_of([ems], given) == ["tatoeba", "bucc", "paracrawl", "mldoc"]
  assert len(protocols.report(ems, {}, {}, given)["missing"]) == 2
  infoxlm = protocols.PROTOCOLS["infoxlm"]
  assert protocols.tasks_of([infoxlm], harness.settings_of(
      harness.EvalConfig(tatoeba_layers="all"))) == [
      "tatoeba_vector", "tatoeba_layers"]
  assert "tatoeba_layers" not in protocols.tasks_of([infoxlm], bare)
  assert tatoeba.INFOXLM_PARALLEL14 == protocols.INFOXLM_PARALLEL14


def test_layer_figures_of_a_tiny_random_model(tmp_path):
  """InfoXLM Fig. 1: each layer's mean-pooled states give a Tatoeba row; for a model whose
  own vector is the mean of its last layer, the last layer's row is its usual evaluation."""
  import jax
  from conftest import write_lines
  from vmx import encoders
  from vmx.data import vocab
  from vmx.evaluation import harness, layerwise, protocols
  from vmx.inference import Encoder
  from vmx.models.infoxlm import InfoXLM, InfoXLMModel
  rng = np.random.default_rng(0)
  words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu".split()
  langs = ["deu", "fra"]
  for lang in langs:
    xs = [" ".join(rng.choice(words, 4)) for _ in range(30)]
    d = tmp_path / "eval/tatoeba/v1"
    write_lines(d / f"tatoeba.{lang}-eng.{lang}", [f"{x} {lang}" for x in xs])
    write_lines(d / f"tatoeba.{lang}-eng.eng", [f"{x} eng" for x in xs])
  text = write_lines(tmp_path / "text", [" ".join(rng.choice(words + langs + ["eng"], 5))
                                         for _ in range(200)])
  tok = vocab.load_tokenizer(vocab.train_sentencepiece([str(text)], str(tmp_path / "v.model"),
                                                       40))
  enc = encoders.TransformerEncoder(vocab_size=40, num_layers=2, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=16)
  model = InfoXLMModel(InfoXLM(enc, pooling="mean"), mask_id=1, random_low=3, queue_size=8)
  params = model.get_initial_variables(jax.random.PRNGKey(0),
                                       model.inference_shapes(16))["params"]
  encoder = Encoder(model, params, tok, langs + ["eng"], 16)
  sents = ["alpha beta deu", "gamma delta eta fra"]
  np.testing.assert_array_equal(layerwise.layer_encoder(encoder, 2).encode(sents),
                                encoder.encode(sents))
  assert not np.allclose(layerwise.layer_encoder(encoder, 1).encode(sents),
                         encoder.encode(sents), atol=1e-3)
  cfg = harness.EvalConfig(data_dir=str(tmp_path), tatoeba_languages=langs,
                           tatoeba_layer_languages=langs, progress=False, plots=False)
  res = harness.run(encoder, tasks=["tatoeba", "tatoeba_layers"], config=cfg)
  rows = res["tatoeba_layers"]["scores"]["test"]
  assert [r["layer"] for r in rows] == [1, 2]
  assert rows[1]["accuracy_xx2en"] == res["tatoeba"]["mean"]["xx2en"]
  assert rows[1]["accuracy_en2xx"] == res["tatoeba"]["mean"]["en2xx"]
  figs = [f for f in protocols.PROTOCOLS["infoxlm"].figures(res) if f["table"] == "Fig. 1"]
  assert [f["column"] for f in figs] == ["layer 1", "layer 2"]
  assert figs[0]["value"] == rows[0]["accuracy_xx2en"] and figs[0]["n_languages"] == 2
  from vmx.errors import ConfigError
  with pytest.raises(ConfigError, match="layers 1 .. 2"):
    layerwise.layer_encoder(encoder, 3)
  # a scanned stack cut only at layer 2 reads layer 1 (and 3) as the unscanned one does
  # (§4.2's layer 7 of a run scanned around its universal layer 8)
  deep = dict(vocab_size=40, num_layers=3, emb_dim=16, num_heads=2, mlp_dim=32, max_length=16)
  m_scan = InfoXLMModel(InfoXLM(encoders.TransformerEncoder(**deep, scan_layers=True,
                                                            scan_boundaries=(2,)),
                                universal_layer=2, pooling="mean"),
                        mask_id=1, random_low=3, queue_size=8)
  m_flat = InfoXLMModel(InfoXLM(encoders.TransformerEncoder(**deep), universal_layer=2,
                                pooling="mean"), mask_id=1, random_low=3, queue_size=8)
  p_scan = m_scan.get_initial_variables(jax.random.PRNGKey(1),
                                        m_scan.inference_shapes(16))["params"]
  p_flat = {**p_scan, "encoder": layerwise.unscanned_params(p_scan["encoder"])}
  assert "layers_from_2" in p_scan["encoder"] and "layers_2" in p_flat["encoder"]
  for k in (1, 3):
    np.testing.assert_allclose(
        layerwise.layer_encoder(Encoder(m_scan, p_scan, tok, langs + ["eng"], 16), k).encode(sents),
        layerwise.layer_encoder(Encoder(m_flat, p_flat, tok, langs + ["eng"], 16), k).encode(sents),
        rtol=1e-5, atol=1e-6)
  with pytest.raises(ConfigError, match="needs a vmx Encoder"):
    layerwise.layer_encoder(object(), 1)


def _toy_tatoeba(tmp_path, langs, n=30):
  """Tatoeba v1 files for `langs` under tmp_path and a 40-piece tokenizer of their words."""
  from conftest import write_lines
  from vmx.data import vocab
  rng = np.random.default_rng(0)
  words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu".split()
  for lang in langs:
    xs = [" ".join(rng.choice(words, 4)) for _ in range(n)]
    d = tmp_path / "eval/tatoeba/v1"
    write_lines(d / f"tatoeba.{lang}-eng.{lang}", [f"{x} {lang}" for x in xs])
    write_lines(d / f"tatoeba.{lang}-eng.eng", [f"{x} eng" for x in xs])
  text = write_lines(tmp_path / "text", [" ".join(rng.choice(words + list(langs) + ["eng"], 5))
                                         for _ in range(200)])
  return vocab.load_tokenizer(vocab.train_sentencepiece([str(text)], str(tmp_path / "v.model"),
                                                        40))


def test_infoxlm_tables_2_3_score_section_4_2s_vector_whatever_the_run_embeds(tmp_path):
  """`--protocol=infoxlm` on an infoxlm_base.gin-shaped model (12 layers, XLCO on layer 8's
  CLS, which is what it embeds): Tables 2 and 3 come from the mean of layer 7, each
  direction over its 14 / 22 languages, and say so; a model without a layer 7 is scored
  with its own vector, which the figures name, and the paper's vector is listed missing."""
  import jax
  from vmx import encoders
  from vmx.evaluation import harness, layerwise, protocols, tatoeba
  from vmx.inference import Encoder
  from vmx.models.infoxlm import InfoXLM, InfoXLMModel
  langs = ["deu", "ara", "fra", "nld", "ita"]          # 14: deu ara fra; 22: nld ita
  tok = _toy_tatoeba(tmp_path, langs)

  def make(num_layers, **kw):
    enc = encoders.TransformerEncoder(vocab_size=40, num_layers=num_layers, emb_dim=16,
                                      num_heads=2, mlp_dim=32, max_length=16)
    model = InfoXLMModel(InfoXLM(enc, **kw), mask_id=1, random_low=3, queue_size=8)
    params = model.get_initial_variables(jax.random.PRNGKey(0),
                                         model.inference_shapes(16))["params"]
    return Encoder(model, params, tok, langs + ["eng"], 16)

  base = make(12, universal_layer=8)                   # infoxlm_base.gin: RETRIEVAL_LAYER None
  cfg = harness.EvalConfig(data_dir=str(tmp_path), tatoeba_languages=langs, progress=False,
                           plots=False)
  res = harness.run(base, tasks=["tatoeba", "tatoeba_vector"], config=cfg)
  assert res["tatoeba"]["vector"] == "layer 8, CLS"
  assert res["tatoeba_vector"]["vector"] == "layer 7, mean"
  report = protocols.report(protocols.PROTOCOLS["infoxlm"], res, {}, harness.settings_of(cfg))
  figs = {(f["table"], f["column"]): f for f in report["figures"]}
  want = tatoeba.evaluate(layerwise.layer_encoder(base, 7, "mean").encode, langs, str(tmp_path))
  per = want["languages"]
  for table, group, members in (("Table 2", "14 languages with parallel data",
                                 ["deu", "ara", "fra"]),
                                ("Table 3", "22 languages without", ["nld", "ita"])):
    for d in ("xx2en", "en2xx"):
      f = figs[(table, f"Tatoeba {group}, {d}")]
      assert f["vector"] == "layer 7, mean" and f["n_languages"] == len(members)
      assert f["value"] == pytest.approx(np.mean([per[l][d] for l in members]))
  assert not any("Tables 2, 3" == m["table"] for m in report["missing"])
  assert {m["table"] for m in report["missing"]} == {"Tables 1, 7, 10", "Table 4", "Fig. 1"}
  assert "Tatoeba with" not in json.dumps(report["missing"])
  shallow = make(2, pooling="mean")                    # no layer 7: its own vector, named
  res = harness.run(shallow, tasks=["tatoeba_vector"], config=cfg)
  report = protocols.report(protocols.PROTOCOLS["infoxlm"], res, {}, harness.settings_of(cfg))
  assert {f["vector"] for f in report["figures"]} == {"mean of the last layer"}
  gone = [m for m in report["missing"] if m["table"] == "Tables 2, 3"]
  assert len(gone) == 1 and "layer 7, mean" in gone[0]["benchmark"]
  assert "layers 1 .. 2" in gone[0]["layout"]


@needs_data
def test_every_protocol_runs_end_to_end_on_a_tiny_checkpoint(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  toy_train(tmp_path / "run", name, vp, total_steps=2, period=2)
  out = tmp_path / "eval"
  proc = subprocess.run(
      [sys.executable, "launch/eval.py", f"--checkpoint_dir={tmp_path / 'run'}",
       "--protocol=vmsst,ems,infoxlm,emmax,mpcl", "--languages=deu,fra,ara,jpn,xho",
       f"--data_dir={DATA_DIR}", f"--output_dir={out}", "--no_plots", "--no_progress",
       "--geometry_n=200", "--tatoeba_layers=all", "--tatoeba_layer_languages=deu,ara"],
      capture_output=True, text=True, cwd=REPO, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  tables = {"vmsst": {"Table 1"}, "ems": {"Table 4", "Table 5", "Table 6", "Table 13", "Table 8"},
            "infoxlm": {"Table 2", "Table 3", "Fig. 1"},
            "emmax": {"Tables 1, 2", "Table 3", "Table 4", "Table 5"}, "mpcl": {"Table 1"}}
  for proto, want in tables.items():
    r = json.loads((out / f"protocol_{proto}.json").read_text())
    assert r["protocol"] == proto and r["paper"] and not r["tasks_failed"]
    assert want <= {f["table"] for f in r["figures"]}, (proto, r["figures"])
    assert all(f["value"] is not None and np.isfinite(f["value"]) or "Eq. 16" in f["column"]
               for f in r["figures"])
    assert r["missing"], proto                     # every paper uses data vmx lacks
    assert all(f["vector"] and f["task"] for f in r["figures"]), proto   # each names its vector
  vmsst = json.loads((out / "protocol_vmsst.json").read_text())
  assert "STS17 (XL Sem. Sim.)" in {m["benchmark"] for m in vmsst["missing"]}   # no --sts17_dir
  assert "missing: Table 1, MKQA" in proc.stdout
  ems = json.loads((out / "protocol_ems.json").read_text())
  assert {"mldoc", "amazon_v1", "amazon_v2"} <= {m["benchmark"] for m in ems["missing"]}
  mUSE = [f for f in ems["figures"] if f["column"] == "Tatoeba P@1, mUSE (15)"][0]
  assert mUSE["n_languages"] == 4 and mUSE["group_size"] == 14       # ara deu fra jpn
  infoxlm = json.loads((out / "protocol_infoxlm.json").read_text())
  assert [f["column"] for f in infoxlm["figures"] if f["table"] == "Fig. 1"] == ["layer 1"]
  # the toy model has no layer 7: Tables 2-3 name the vector they used, §4.2's is missing
  assert "Tables 2, 3" in {m["table"] for m in infoxlm["missing"]}
  assert "vector: " in proc.stdout


@needs_data
def test_reproduction_commands_parse(monkeypatch):
  """Every command of docs/reproduction.md runs as written as far as it can without the
  paper's data and hardware: each train / finetune command's gin files and bindings
  parse (every macro set), each eval command's flags parse (paths not checked: they are
  the user's), each protocol named exists."""
  import importlib.util
  import shlex
  import gin
  from vmx import experiment, finetune  # noqa: F401  (registers finetune)
  from vmx.evaluation import protocols
  text = (REPO / "docs" / "reproduction.md").read_text()
  lines = [l for l in text.splitlines() if l.startswith("python launch/")]
  assert len(lines) >= 30
  spec = importlib.util.spec_from_file_location("vmx_eval_launcher", REPO / "launch" / "eval.py")
  eval_launcher = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(eval_launcher)
  monkeypatch.setattr(eval_launcher, "_check_paths", lambda args, given: None)
  monkeypatch.setattr(eval_launcher, "_check_selected", lambda args: None)
  from vmx.gin_utils import split_gin_bindings
  for line in lines:
    argv = shlex.split(line)[2:]
    script = shlex.split(line)[1]
    if script in ("launch/train.py", "launch/finetune.py"):
      bindings, rest = split_gin_bindings(argv)
      files = [a.split("=", 1)[1] for a in rest if a.startswith("--gin_file=")]
      flags = {a.split("=", 1)[0] for a in rest if not a.startswith("--gin_file=")}
      assert flags <= {"--multihost", "--protocol"}, (line, flags)
      if "--protocol" in flags:
        assert [a.split("=", 1)[1] for a in rest if a.startswith("--protocol=")][0] in \
            protocols.FINETUNED, line
      gin.clear_config()
      try:
        experiment.parse_gin(files, bindings, "")
      finally:
        gin.clear_config()
    elif script == "launch/eval.py":
      args, _, tasks = eval_launcher.parse_args(argv)
      assert tasks and args.protocols, line
    else:
      assert script == "launch/import_checkpoint.py", line


@needs_data
@pytest.mark.slow
def test_eval_sigterm_exits_75_and_the_rerun_keeps_the_finished_tasks(tmp_path, toy_task):
  """The signal contract in launch/eval.py: SIGTERM while the second task runs ends with
  exit 75 and a `preempted:` line naming that task; the first task's result file is kept,
  and the same command keeps it (not run again) and finishes the rest."""
  import signal
  name, vp, _, _ = toy_task
  toy_train(tmp_path / "run", name, vp, total_steps=2, period=2)
  out = tmp_path / "eval"
  cmd = [sys.executable, "launch/eval.py", f"--checkpoint_dir={tmp_path / 'run'}",
         "--tasks=stsb,tatoeba", "--languages=deu,fra,ara,jpn,xho", f"--data_dir={DATA_DIR}",
         f"--output_dir={out}", "--no_plots", "--no_progress"]
  p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       cwd=REPO)
  seen = []
  for line in p.stdout:                  # the first task is written, the second has begun
    seen.append(line)
    if line.startswith("[vmx eval] tatoeba ..."):
      break
  assert (out / "stsb.json").exists(), "".join(seen)[-2000:]
  p.send_signal(signal.SIGTERM)
  rest, err = p.communicate(timeout=300)
  assert p.returncode == 75, err[-2000:]
  last = [l for l in err.splitlines() if l.strip()][-1]
  assert last.startswith("preempted: SIGTERM while evaluating tatoeba: "), err[-2000:]
  assert "Traceback" not in err and not (out / "tatoeba.json").exists()
  kept = (out / "stsb.json").read_text()
  again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
  assert again.returncode == 0, again.stderr[-2000:]
  assert "[vmx eval] stsb: main score" in again.stdout and "(kept:" in again.stdout
  assert (out / "stsb.json").read_text() == kept and (out / "tatoeba.json").exists()
