"""Dev sets carved from the training data: reading, hold-out from training, the `dev`
evaluation task (hand-computed accuracies) and periodic harness evaluation in train()."""
import json
import os

import numpy as np
import pytest

from conftest import needs_data, write_lines

LANGS = ("cs", "de", "es", "fr", "ru")


@pytest.fixture
def dev_data(tmp_path):
  """A data dir with a 3-line newstest2013: `<lang> satz <i>` / `english <i>`; the German
  file has lines 0 and 1 swapped."""
  d = tmp_path / "data"
  base = d / "train/wmt-newstest-multiway/2013"
  for lang in LANGS:
    order = [1, 0, 2] if lang == "de" else [0, 1, 2]
    write_lines(base / f"newstest2013.{lang}.gz", [f"{lang} satz {i}" for i in order], gz=True)
  write_lines(base / "newstest2013.en.gz", [f"english {i}" for i in range(3)], gz=True)
  return str(d)


def one_hot_encode(sentences, lang):
  """Sentence `... i` -> e_i: a translation pair shares its vector."""
  out = np.zeros((len(sentences), 8), np.float32)
  out[np.arange(len(sentences)), [int(s.split()[-1]) for s in sentences]] = 1.0
  return out


def test_dev_task_scores_match_hand_computed_accuracies(dev_data):
  from vmx.errors import DataError
  from vmx.evaluation import dev
  r = dev.evaluate(one_hot_encode, ["newstest2013"], dev_data, max_sentences=None,
                   languages=["cs", "deu"])
  subs = {s["hf_subset"]: s for s in r["scores"]["dev"]}
  assert list(subs) == ["newstest2013/cs", "newstest2013/de"]
  assert subs["newstest2013/cs"]["main_score"] == 100.0
  # de lines 0/1 swapped: only sentence 2 finds its translation, in both directions
  assert subs["newstest2013/de"]["accuracy_xx2en"] == pytest.approx(100 / 3)
  assert subs["newstest2013/de"]["accuracy_en2xx"] == pytest.approx(100 / 3)
  assert subs["newstest2013/de"]["languages"] == ["deu", "eng"]
  assert r["main_score"] == pytest.approx((100 + 100 / 3) / 2)
  assert r["sets"] == {"newstest2013": pytest.approx((100 + 100 / 3) / 2)}
  # the first 2 sentences: de has none right
  r2 = dev.evaluate(one_hot_encode, ["newstest2013"], dev_data, max_sentences=2,
                    languages=["de"])
  assert r2["main_score"] == 0.0 and r2["scores"]["dev"][0]["n"] == 2
  # a model reading language ids: only its languages; a set with none of them is skipped
  r3 = dev.evaluate(one_hot_encode, ["newstest2013"], dev_data, model_languages=["fra", "eng"])
  assert [s["hf_subset"] for s in r3["scores"]["dev"]] == ["newstest2013/fr"]
  r4 = dev.evaluate(one_hot_encode, ["newstest2013"], dev_data, model_languages=["xx"])
  assert r4["skipped"] == ["newstest2013"]
  with pytest.raises(DataError, match=r"unknown dev set\(s\) \['newstest2031'\]"):
    dev.evaluate(one_hot_encode, ["newstest2031"], dev_data)
  with pytest.raises(DataError, match=r"dev set tico19: missing file "
                                      r"train/tico19-multiway/tico19.am.gz"):
    dev.evaluate(one_hot_encode, ["tico19"], dev_data)


def test_harness_runs_the_dev_task_and_writes_it(dev_data, tmp_path):
  from vmx.evaluation import harness
  cfg = harness.EvalConfig(data_dir=dev_data, dev_sets=["newstest2013"], dev_max_sentences=None,
                           plots=False,
                           progress=False)
  res = harness.run(one_hot_encode, tasks=["dev"], config=cfg, output_dir=str(tmp_path / "out"))
  assert res["dev"]["main_score"] == pytest.approx(100 * (4 + 1 / 3) / 5)
  saved = json.loads((tmp_path / "out/dev.json").read_text())
  assert saved["main_score"] == pytest.approx(res["dev"]["main_score"])
  assert "newstest2013" in (tmp_path / "out/summary.md").read_text()


def test_holdout_drops_every_example_with_a_dev_sentence(dev_data, tmp_path, toy_task):
  """Pair, text and N-way sources skip examples holding a dev sentence on either side
  (after stripping); task names say so; an unknown dev set names the binding."""
  import tasks
  from vmx.data import devsets, nway, sources
  from vmx.errors import DataError
  h = devsets.HeldOut(["newstest2013"], dev_data)
  assert "de satz 1" in h.sentences() and "english 2" in h.sentences()
  src = write_lines(tmp_path / "c.xx", ["free a", "  cs satz 2 ", "free c", "free e"])
  tgt = write_lines(tmp_path / "c.en", ["english 1", "free b", "free d", "free f"])
  plain = sources.moses_source(src, tgt, validation_percent=0)
  held = sources.moses_source(src, tgt, validation_percent=0, holdout=h)
  assert plain.counts() == {"train": 4} and held.counts() == {"train": 2}
  got = [(ex["inputs"].decode(), ex["targets"].decode())
         for ex in held.get_dataset("train").as_numpy_iterator()]
  assert got == [("free c", "free d"), ("free e", "free f")]
  text = sources.text_source([src, tgt], validation_percent=0, holdout=h)
  assert sorted(ex["inputs"].decode() for ex in text.get_dataset("train").as_numpy_iterator()
                ) == ["free a", "free b", "free c", "free d", "free e", "free f"]
  nway = nway.nway_source(["xx", "en"], [["fr satz 0", "x"], ["a", "b"], ["c", "english 0"]],
                            2, validation_percent=0, holdout=h)
  assert nway.num_input_examples("train") == 1
  vp = toy_task[1]
  assert tasks.moses_task("held_xx_en", src, tgt, "xx", "en", vp, ["xx", "en"],
                          validation_percent=0, holdout=["newstest2013"],
                          data_dir=dev_data) == "held_xx_en"
  import seqio
  assert seqio.get_mixture_or_task("held_xx_en").num_input_examples("train") == 2
  with pytest.raises(DataError, match=r"tasks.moses_task.holdout: unknown dev set"):
    tasks.moses_task("bad", src, tgt, "xx", "en", vp, ["xx", "en"], holdout=["flores"],
                     data_dir=dev_data)


def test_periodic_harness_evaluation_writes_dev_scalars_and_keeps_the_best(
    tmp_path, toy_task, dev_data, monkeypatch):
  from vmx.errors import ConfigError
  from vmx.evaluation import dev
  from vmx.evaluation.periodic import HarnessEvalConfig
  from conftest import toy_train
  name, vp, _, _ = toy_task
  scores = []

  def scripted(encode, sets, data_dir, max_sentences, languages, model_languages, progress):
    assert encode(["alpha beta"], "eng").shape[0] == 1   # the current parameters encode
    assert model_languages is None                        # contrastive: no language ids
    v = scores.pop(0)
    return {"scores": {"dev": [{"hf_subset": "newstest2013/cs", "main_score": v + 1}]},
            "main_score": v, "sets": {"newstest2013": v}}

  monkeypatch.setattr(dev, "evaluate", scripted)
  cfg = HarnessEvalConfig(tasks=["dev"], data_dir=dev_data, dev_sets=["newstest2013"])
  assert cfg.metric_names() == ["dev/main_score", "dev/newstest2013"]
  d = tmp_path / "run"
  scores[:] = [5.0, 30.0, 20.0]
  toy_train(d, name, vp, total_steps=4, period=2, keep=5, eval_cfg=cfg, eval_period=2,
            best_metric="dev/newstest2013/cs")
  rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if "dev/main_score" in r]
  assert [(r["step"], r["dev/main_score"], r["dev/newstest2013"], r["dev/newstest2013/cs"])
          for r in evals] == [(0, 5.0, 5.0, 6.0), (2, 30.0, 30.0, 31.0), (4, 20.0, 20.0, 21.0)]
  assert all(r["eval/seconds"] > 0 for r in evals)
  assert json.loads((d / "best/best.json").read_text())["step"] == 2
  # Resumed when finished: the last step's evaluation is in metrics.jsonl, so it is not
  # run again (`scripted` has no scores left to give).
  toy_train(d, name, vp, total_steps=4, period=2, keep=5, eval_cfg=cfg, eval_period=2,
            best_metric="dev/newstest2013/cs")
  rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "dev/main_score" in r] == [0, 2, 4]
  with pytest.raises(ConfigError, match=r"HarnessEvalConfig.tasks: unknown task"):
    HarnessEvalConfig(tasks=["dve"])
  with pytest.raises(ConfigError, match=r"best_metric='tatoeba/mean' is not a metric"):
    toy_train(tmp_path / "other", name, vp, eval_cfg=cfg, eval_period=2,
              best_metric="tatoeba/mean")
  scores[:] = [1.0]
  with pytest.raises(ConfigError, match=r"'dev/newstest2013/de' is not a metric of this "
                                        r"run's evaluation \(.*\); did you mean "
                                        r"'dev/newstest2013'"):
    toy_train(tmp_path / "other2", name, vp, eval_cfg=cfg, eval_period=2,
              best_metric="dev/newstest2013/de")


@needs_data
def test_real_dev_sets_and_their_hold_out_from_newstest_pairs():
  """newstest2013 (3,000 x 5 languages) and TICO-19's first 1,000 (38 variants) read
  aligned; holding them out drops newstest2013's pairs from the merged wmt-newstest."""
  from vmx.data import devsets, sources
  data = os.environ["VMX_DATA_DIR"]
  langs, en = devsets.read("newstest2013", data)
  assert sorted(langs) == sorted(LANGS) and len(en) == 3000
  assert all(len(v) == 3000 for v in langs.values())
  t_langs, t_en = devsets.read("tico19", data)
  assert len(t_langs) == 38 and len(t_en) == 1000
  h = devsets.HeldOut(["newstest2013"], data)
  root = f"{data}/train/wmt-newstest/de-en"
  plain = sources.moses_source(f"{root}/train.de.gz", f"{root}/train.en.gz", "skip", 0)
  held = sources.moses_source(f"{root}/train.de.gz", f"{root}/train.en.gz", "skip", 0, h)
  dropped = plain.counts()["train"] - held.counts()["train"]
  assert 2900 <= dropped <= 3100, dropped
  for ex in held.get_dataset("train").take(2000).as_numpy_iterator():
    assert not h.sentences() & {ex["inputs"].decode().strip(), ex["targets"].decode().strip()}


def test_parallel_corpora_mixture_mixes_corpora_without_the_dev_sets(dev_data, toy_task):
  """tatoeba-challenge and wmt-newstest pairs in one mixture (p ∝ n^alpha over every
  (corpus, language) task), the held-out dev sentences dropped from both."""
  from pathlib import Path
  import seqio
  import tasks
  from vmx.errors import DataError
  vp = toy_task[1]
  root = Path(dev_data) / "train"
  write_lines(root / "tatoeba-challenge/deu-eng/train.deu.gz",
              [f"hallo {i}" for i in range(6)], gz=True)
  write_lines(root / "tatoeba-challenge/deu-eng/train.eng.gz",
              [f"hello {i}" for i in range(6)], gz=True)
  write_lines(root / "wmt-newstest/de-en/train.de.gz",
              ["de satz 0", "neu 1", "neu 2"], gz=True)
  write_lines(root / "wmt-newstest/de-en/train.en.gz", ["english 0", "new 1", "new 2"], gz=True)
  name = tasks.parallel_corpora_mixture(
      {"tatoeba-challenge": ["deu"], "wmt-newstest": ["de"]}, vp, ["deu", "eng", "de", "en"],
      alpha=0.5, data_dir=dev_data, validation_percent=0, holdout=["newstest2013"])
  assert name.startswith("pairs.mix_") and name.endswith("_a0.5.minus_newstest2013")
  mix = seqio.get_mixture_or_task(name)
  rates = {t.name: mix.get_rate(t) for t in mix.tasks}
  assert set(rates) == {"tatoeba_challenge.deu_eng.minus_newstest2013",
                        "wmt_newstest.de_en.minus_newstest2013"}
  assert rates["tatoeba_challenge.deu_eng.minus_newstest2013"] / rates[
      "wmt_newstest.de_en.minus_newstest2013"] == pytest.approx((6 / 2) ** 0.5)
  assert tasks.corpora_text_files({"wmt-newstest": ["de"]}, dev_data) == [
      str(root / "wmt-newstest/de-en/train.de.gz"), str(root / "wmt-newstest/de-en/train.en.gz")]
  with pytest.raises(DataError, match=r"parallel_corpora_mixture.corpora=\[\]: expected"):
    tasks.parallel_corpora_mixture([], vp, ["deu"])


def test_tatoeba_test_set_is_held_out_in_code(tmp_path):
  """VMSST §6.1 removes Tatoeba from its training data: `holdout=['tatoeba']` drops every
  pair sharing a sentence (either side, any language) with the Tatoeba v1 test set; the
  shared tatoeba-challenge pairs were built without them (nothing to drop), so the filter
  removes exactly the planted ones."""
  from vmx.data import devsets, sources
  data = os.environ.get("VMX_DATA_DIR")
  if not data or not os.path.isdir(f"{data}/eval/tatoeba/v1"):
    pytest.skip("real data not found (set VMX_DATA_DIR)")
  h = devsets.HeldOut(["tatoeba"], data)
  sentences = h.sentences()
  deu = [l.strip() for l in open(f"{data}/eval/tatoeba/v1/tatoeba.deu-eng.deu", encoding="utf-8")]
  eng = [l.strip() for l in open(f"{data}/eval/tatoeba/v1/tatoeba.deu-eng.eng", encoding="utf-8")]
  assert deu[5] in sentences and eng[7] in sentences and len(sentences) > 150_000
  root = f"{data}/train/tatoeba-challenge/deu-eng"
  real = sources.moses_source(f"{root}/train.deu.gz", f"{root}/train.eng.gz", "skip", 0)
  held = sources.moses_source(f"{root}/train.deu.gz", f"{root}/train.eng.gz", "skip", 0, h)
  assert held.counts() == real.counts()              # the shared data are Tatoeba-free
  src = write_lines(tmp_path / "c.de", ["frei a", f" {deu[5]} ", "frei c"])
  tgt = write_lines(tmp_path / "c.en", ["free a", "free b", eng[7]])
  planted = sources.moses_source(src, tgt, validation_percent=0, holdout=h)
  assert planted.counts() == {"train": 1}
  assert devsets.check_names(["tatoeba", "tico19"], "x", test_sets=True) == ["tatoeba",
                                                                            "tico19"]
  from vmx.errors import DataError
  with pytest.raises(DataError, match="tatoeba: a test set"):   # never a dev set
    devsets.check_names(["tatoeba"], "HarnessEvalConfig.dev_sets")


def test_periodic_tatoeba_writes_its_language_groups(monkeypatch):
  """HarnessEvalConfig writes `tatoeba/<group>` (e.g. tatoeba/outside_use, what the
  one-hour recipe's goal is about) for each group with languages, so BEST_METRIC can
  select on it; an empty group writes nothing."""
  from vmx.evaluation import harness, periodic

  def group(mean, n):
    return {"mean": mean, "xx2en": mean, "en2xx": mean, "xsim": 0.0, "n_languages": n}

  def scripted(encoder, evaluators, **kw):
    assert list(evaluators) == ["tatoeba"]
    return {"tatoeba": {
        "scores": {"test": [{"hf_subset": "deu-eng", "main_score": 90.0},
                            {"hf_subset": "kab-eng", "main_score": 10.0}]},
        "main_score": 50.0,
        "groups": {"xtreme36": group(90.0, 1), "head": group(90.0, 1),
                   "long_tail": group(10.0, 1), "outside_use": group(10.0, 1),
                   "own": group(float("nan"), 0)}}}

  monkeypatch.setattr(harness, "run", scripted)
  cfg = periodic.HarnessEvalConfig(tasks=["tatoeba"])
  scalars, _ = cfg.run(encoder=None)
  assert scalars == {"tatoeba/main_score": 50.0, "tatoeba/deu-eng": 90.0,
                     "tatoeba/kab-eng": 10.0, "tatoeba/xtreme36": 90.0, "tatoeba/head": 90.0,
                     "tatoeba/long_tail": 10.0, "tatoeba/outside_use": 10.0}
  periodic.check_best_metric("tatoeba/outside_use", cfg, eval_period=10)
  assert periodic.metric_value("tatoeba/outside_use", scalars) == 10.0
