"""Guo et al., EMMA-X: Tatoeba and FLORES over A.1's head and long-tail languages (Table 3),
XTREME's 36 (Table 5), BUCC and zero-shot MultiSTS (Tables 1, 2), the geometry metrics
(Table 4), and the XRETE tasks vmx runs elsewhere (fine-tuned: launch/finetune.py) or
cannot run, each listed missing with why."""
from __future__ import annotations

from vmx.evaluation import tatoeba
from vmx.evaluation.protocols.base import FINETUNE, Missing, Protocol, sts17_optional
from vmx.evaluation.protocols.figures import (bucc_f1, figure, geometry_figures, sts17_mean,
                                              tatoeba_rows, tatoeba_mean)

EMMAX_HEAD = tatoeba.EMMAX_HEAD
# EMMA-X Table 12's MultiSTS pairs (Reimers & Gurevych 2020's STS2017-extended, MTEB's
# STS17): the SemEval-2017 release has six of them (es-en: track 4a); en-de, fr-en, it-en
# and nl-en are STS2017-extended's translations, read with --sts17.extended (the figure
# lists the pairs it could not score under `pairs_missing`).
EMMAX_MULTISTS = ("ar-ar", "ar-en", "en-de", "en-en", "es-en", "es-es", "fr-en", "it-en",
                  "nl-en", "tr-en")


def _emmax(results) -> list:
  rows = tatoeba_rows(results)
  tail = [l for l in rows if l not in EMMAX_HEAD]
  out = figure("Table 3", "Tatoeba head (A.1), xx->En", tatoeba_mean(results, EMMAX_HEAD,
                                                                       "xx2en"))
  out += figure("Table 3", "Tatoeba long-tail, xx->En", tatoeba_mean(results, tail, "xx2en")
                 if tail else None)
  xtreme = tatoeba_mean(results, tatoeba.XTREME36, "xx2en")
  out += figure("Table 5", "Tatoeba XTREME 36, xx->En", xtreme)
  # Tables 1 and 2 report BUCC and Tatoeba zero-shot (§5.2, following XTREME)
  out += figure("Tables 1, 2", "Tatoeba (XTREME's 36), xx->En", xtreme)
  out += figure("Tables 1, 2", "BUCC F1 (cosine)", bucc_f1(results, "cosine"))
  out += figure("Table 2", "MultiSTS (zero-shot, Spearman)",
                 sts17_mean(results, EMMAX_MULTISTS, "spearman", mteb_only=True))
  fl = results.get("flores")
  if fl:
    for group, label in (("head", "FLORES head (A.1's 68)"), ("long_tail", "FLORES long-tail")):
      g = fl["groups"][group]
      if g["n_languages"]:
        out.append({"table": "Table 3", "column": f"{label}, xx->En", "value": g["xx2en"],
                    "metric": "accuracy x100, xx->En, cosine", "n_languages": g["n_languages"],
                    "splits": fl["splits"], "n_sentences": fl["n_sentences"], "task": "flores",
                    **({"languages_missing": fl["head_missing"]} if group == "head" else {})})
    for group, geo_g in fl.get("geometry", {}).items():
      out += geometry_figures(geo_g, f", FLORES {group}", n_languages=geo_g["n_languages"],
                               task="flores")
    return out
  geo = results.get("geometry")
  if geo:
    sub = geo["scores"]["test"][0]
    out += geometry_figures(sub, "", languages=sub["languages"], task="geometry")
  return out


EMMAX_OPTIONAL = {
    "flores": (Missing("Tables 3, 4", "FLORES-200 head (68) / long-tail retrieval xx->En, "
                       "and the geometry metrics on it",
                       "--flores.dir=DIR: FLORES-200's flores200_dataset/ with "
                       "<split>/<lang_Script>.<split> (vmx/evaluation/flores.py); without it "
                       "Table 4 is computed on newstest2013"), "dir"),
    **sts17_optional("Table 2", "MultiSTS (zero-shot): STS17's SemEval-2017 pairs")}


# EMMA-X XRETE (Table 1: fine-tuned, translate-train-all, except BUCC and Tatoeba; Table 2:
# zero-shot): what vmx runs elsewhere or cannot run, and why.
EMMAX_XRETE_MISSING = (
    Missing("Table 1", "XNLI (fine-tuned)", FINETUNE.format(protocol="emmax", flag="gin.XNLI_DIR")),
    Missing("Table 1", "ANLI / AmericasNLI (fine-tuned)",
            FINETUNE.format(protocol="emmax", flag="gin.ANLI_DIR")),
    Missing("Table 1", "PAWS-X (fine-tuned)",
            FINETUNE.format(protocol="emmax", flag="gin.PAWSX_DIR")),
    Missing("Table 1", "MultiSTS (fine-tuned on English NLI and STS, Siamese)",
            "not built: a Siamese regression fine-tuning; Table 2's zero-shot MultiSTS is run"),
    Missing("Tables 1, 2", "QE (WMT21 QE Task 1, Pearson)",
            "not built: a regression head over source and translation"),
    Missing("Tables 1, 2", "LAReQA (mAP@20)", "not built: XQuAD-R answer retrieval (Table 1 "
            "fine-tuned on SQuAD); its pool in vmx's retrieval layout (queries.tsv, corpus.tsv, "
            "qrels.tsv) is scored by --retrieval.dirs, not mapped to this table"),
    Missing("Tables 1, 2", "Mewsli-X (mAP@20)", "not built: entity retrieval (Table 1 "
            "fine-tuned); as LAReQA, --retrieval.dirs scores it in vmx's retrieval layout"),
    Missing("Table 1", "XCOPA", "not built: multiple choice (premise, two alternatives)"),
    Missing("Table 1", "MultiEURLEX", "not built: multi-label legal document classification"),
    Missing("Table 1", "MultiARC", "not built: review rating, scored by MAE"))


PROTOCOL = Protocol(
    "emmax", "Guo et al., EMMA-X",
    ("tatoeba", "bucc", "geometry"), _emmax, EMMAX_XRETE_MISSING,
    optional_tasks=dict(EMMAX_OPTIONAL))
