"""Each paper's evaluation protocol (vmx/evaluation/protocols.py): the direction and group
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
  figs = protocols._emmax(res)                     # long tail: every other evaluated language
  tail = [f for f in figs if f["column"].startswith("Tatoeba long-tail")][0]
  assert tail["value"] == pytest.approx(np.mean([rows[l]["accuracy_xx2en"]
                                                 for l in ("xho", "zza")]))


def test_vmsst_sts17_means_and_score():
  from vmx.evaluation import protocols
  sts17 = [{"hf_subset": f"track{i}.{p}", "pearson": v, "spearman": v - 1}
           for i, (p, v) in enumerate([("ar-ar", 50.0), ("es-es", 70.0), ("ar-en", 20.0),
                                        ("es-en", 25.0), ("tr-en", 40.0), ("en-en", 90.0),
                                        ("es-en", 35.0)])]   # es-en: tracks 4a and 4b
  res = {"sts17": {"scores": {"test": sts17}}, "sts12-16": {"vmsst_pearson": 60.0}}
  figs = {f["column"]: f for f in protocols._vmsst(res)}
  assert figs["XL (s.)"]["value"] == pytest.approx(60.0)
  assert figs["XL (d.)"]["value"] == pytest.approx(30.0)
  assert figs["XL Sem. Sim."]["value"] == pytest.approx(42.0)     # the five sets
  assert figs["Score"]["value"] == pytest.approx(51.0)             # (60 + 42) / 2
  assert set(figs["Score"]["subtasks_missing"]) == {"bucc", "mkqa", "nq", "tatoeba"}


@needs_data
def test_every_protocol_runs_end_to_end_on_a_tiny_checkpoint(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  toy_train(tmp_path / "run", name, vp, total_steps=2, period=2)
  out = tmp_path / "eval"
  proc = subprocess.run(
      [sys.executable, "launch/eval.py", f"--checkpoint_dir={tmp_path / 'run'}",
       "--protocol=vmsst,ems,infoxlm,emmax,mpcl", "--languages=deu,fra,ara,jpn,xho",
       f"--data_dir={DATA_DIR}", f"--output_dir={out}", "--no_plots", "--no_progress",
       "--geometry_n=200"], capture_output=True, text=True, cwd=REPO, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  tables = {"vmsst": {"Table 1"}, "ems": {"Tables 4 / 5", "Table 6", "Table 8"}, "infoxlm": {"Table 2", "Table 3"},
            "emmax": {"Table 2", "Table 3", "Table 4", "Table 5"}, "mpcl": {"Table 1"}}
  for proto, want in tables.items():
    r = json.loads((out / f"protocol_{proto}.json").read_text())
    assert r["protocol"] == proto and r["paper"] and not r["tasks_failed"]
    assert want <= {f["table"] for f in r["figures"]}, (proto, r["figures"])
    assert all(f["value"] is not None and np.isfinite(f["value"]) or "Eq. 16" in f["column"]
               for f in r["figures"])
    assert r["missing"], proto                     # every paper uses data vmx lacks
  vmsst = json.loads((out / "protocol_vmsst.json").read_text())
  assert "STS17" in {m["benchmark"] for m in vmsst["missing"]}   # no --sts17_dir given
  assert "missing: Table 1, MKQA" in proc.stdout
