"""Wieting et al., Beyond Contrastive Learning (VMSST): Table 1 (English STS, cross-lingual
STS17, Tatoeba, BUCC and their Score), Table 2 and B.1's Tables 9, 10 (Spearman, per pair),
A.3's Table 8 (Tatoeba over seen / unseen languages) and Table 13 (BUCC per pair)."""
from __future__ import annotations

from vmx.evaluation import common
from vmx.evaluation.protocols.base import Missing, Protocol, sts17_optional
from vmx.evaluation.protocols.figures import bucc_f1, figure, sts17_mean, tatoeba_mean

VMSST_STS17 = {"xl_same": ("ar-ar", "es-es"), "xl_diff": ("ar-en", "es-en", "tr-en")}


def _vmsst(results) -> list:
  out = []
  sts = results.get("sts12-16")
  if sts:
    out.append({"table": "Table 1", "column": "Eng. Sem. Sim.", "value": sts["vmsst_pearson"],
                "metric": "Pearson x100: mean over datasets per year, then over years (§6.2)",
                "task": "sts12-16"})
    out.append({"table": "Table 9", "column": "Eng. STS, Spearman (SBERT's way)",
                "value": sts["sbert_spearman"], "metric": "Spearman x100 on each year's "
                "concatenation, 2013 SMT left out, mean over years (B.1)", "task": "sts12-16"})
  xl = {}
  for metric, table in (("pearson", "Table 1"), ("spearman", "Table 2")):
    same = sts17_mean(results, VMSST_STS17["xl_same"], metric)
    diff = sts17_mean(results, VMSST_STS17["xl_diff"], metric)
    xl[metric] = sts17_mean(results, VMSST_STS17["xl_same"] + VMSST_STS17["xl_diff"], metric)
    out += figure(table, "XL Sem. Sim.", xl[metric]) + figure(table, "XL (s.)", same) \
        + figure(table, "XL (d.)", diff)
  for pair in VMSST_STS17["xl_same"] + VMSST_STS17["xl_diff"]:   # B.1's per-pair columns
    for metric in ("pearson", "spearman"):
      out += figure("Table 10", f"{pair}, {metric.capitalize()}",
                     sts17_mean(results, (pair,), metric))
  tat = tatoeba_mean(results, None, "mean")
  out += figure("Table 1", "Tatoeba", tat)
  out += _vmsst_seen_unseen(results)
  c, m = bucc_f1(results, "cosine", "forward"), bucc_f1(results, "margin")
  out += figure("Table 1", "BUCC (c.)", c) + figure("Table 1", "BUCC (m.)", m)
  bucc = results.get("bucc")
  for r in (bucc["scores"]["test"] if bucc else ()):       # Table 13: per pair
    for scoring, retrieval, label in (("cosine", "forward", "Cosine"), ("margin", "max", "Margin")):
      out.append({"table": "Table 13", "column": f"{label}, {r['hf_subset']}",
                  "value": r[f"{scoring}_{retrieval}"]["f1"], "task": "bucc",
                  "metric": f"F1 x100, {scoring} scoring, {retrieval} retrieval"})
  parts = {"english": sts and sts["vmsst_pearson"],
           "cross-lingual": xl["pearson"] and xl["pearson"]["value"],
           "tatoeba": tat and tat["value"],
           "bucc": (c["value"] + m["value"]) / 2 if c and m else None}
  have = {k: v for k, v in parts.items() if v is not None}
  if have:
    out.append({"table": "Table 1", "column": "Score", "value": common.mean(list(have.values())),
                "metric": "mean of the six subtasks (§6.2); here of those vmx has",
                "subtasks": sorted(have), "subtasks_missing": sorted(
                    [k for k in parts if k not in have] + ["nq", "mkqa"]),
                "task": "tatoeba" if "tatoeba" in have else "bucc" if "bucc" in have else
                        "sts12-16" if "english" in have else "sts17"})
  return out


def _vmsst_seen_unseen(results) -> list:
  """A.3's Table 8: Tatoeba (both directions) over the languages the model trained on and
  over the others; [] when the model does not say which languages it trained on."""
  res = results.get("tatoeba")
  rows = res["scores"]["test"] if res else []
  if not rows or "seen" not in rows[0]:
    return []
  out = []
  for column, seen in (("Tat. (seen)", True), ("Tat. (unseen)", False)):
    langs = [r["languages"][0] for r in rows if r["seen"] is seen]
    fig = tatoeba_mean(results, langs, "mean") if langs else None
    out += figure("Table 8", column, fig and {**fig, "languages": langs})
  return out


def _vmsst_missing(results) -> list:
  res = results.get("tatoeba")
  rows = res["scores"]["test"] if res else []
  if rows and "seen" not in rows[0]:
    return [Missing("Table 8", "Tatoeba, languages seen / unseen in training",
                    "the encoder does not say which languages it trained on (a vmx model "
                    "directory's vmx_model.json `languages` does)")]
  return []


PROTOCOL = Protocol(
    "vmsst", "Wieting et al., Beyond Contrastive Learning (VMSST)",
    ("sts12-16", "tatoeba", "bucc"), _vmsst,
    (Missing("Table 1", "NQ (PAQ question retrieval)"),
     Missing("Table 1", "MKQA (PAQ question retrieval)"),
     Missing("Table 1", "BUCC test split", "eval/bucc2018/<pair>/<pair>.test.{xx,en,gold}: "
             "vmx reads the SAMPLE split it has")),
    optional_tasks=sts17_optional("Tables 1, 2, 10", "STS17 (XL Sem. Sim.)"),
    missing_from=_vmsst_missing)
