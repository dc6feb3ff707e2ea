"""Mao et al., EMS: Tatoeba P@1 over its seen and unseen languages and Table 6's and Table
13's language groups (Tables 4, 5, 6, 13), BUCC (Table 8), ParaCrawl retrieval (Table 9)
and MLDoc / Amazon review transfer (Tables 10-12, MLDoc's directions in Table 13) where
their data are given."""
from __future__ import annotations

from vmx.evaluation import paracrawl, tatoeba, transfer
from vmx.evaluation.protocols.base import Missing, Protocol
from vmx.evaluation.protocols.figures import bucc_f1, figure, tatoeba_mean

# EMS (Mao et al.) Tatoeba groups, Tatoeba v1 codes. Table 4 lists the 58 languages EMS
# trains on that Tatoeba has (Table 1's 61 less gu, my, yo: footnote 20), naming ms `max`,
# lv `lvs`, fa `pes`, sw `swh`, zh `cmn`; Table 5 the other 54 of Tatoeba's 112. Each Table
# 6 group below reproduces every average Table 6 prints for it (LASER, SBERT-distill, EMS,
# LaBSE) from the per-language Table 4 figures, to the printed rounding; where the caption's
# count differs, the count does not reproduce them and the list that does is used:
# - mUSE (15): mUSE's languages less English, its two Chinese (PRC, Taiwan) one Tatoeba
#   `cmn`: 14. Adding any other of the 58 breaks the fit.
# - XTREME (38): XTREME's 40 less en, my, yo (not in Tatoeba): its Tatoeba 36 plus ms
#   (`max`), 37. The 36 alone do not fit (EMS 88.7, not 88.2), nor does any 38th language.
# - SBERT-distill (48): the 47 of the 58 that paraphrase-xlm-r-multilingual-v1 (the model
#   EMS evaluates, §4.4) lists, less ku (`kur`) and ms (`max`): 45. No 48-language set
#   within three changes of the 47 fits (94.8 / 95.0); among the 47 less up to three
#   languages, every set that fits drops kur and max, and dropping those two alone does.
# - <LASER (43): EMS has fewer pairs than LASER in Table 1 (ta, equal, is out).
# - >300k (42) / <300k (11): languages LASER trains on (Table 1 not "-") where LASER's and
#   EMS's pairs are both above / both below 300k; pes, jav, mon (no LASER data) and nob, urd
#   (one above, one below) are in neither. Table 13's >300k (43) / <300k (15) (the review's
#   "42/11 vs 43/15") split all 58 by EMS's own pairs and reproduce its EMS row (95.4,
#   73.7); vmx reports both splits, each under its own table.
EMS_SEEN58 = ("afr", "ara", "ben", "bul", "cat", "ces", "cmn", "dan", "deu", "ell", "epo",
              "est", "eus", "fin", "fra", "glg", "heb", "hin", "hrv", "hun", "hye", "ind",
              "ita", "jav", "jpn", "kat", "kaz", "kor", "kur", "lit", "lvs", "mal", "mar",
              "max", "mkd", "mon", "nld", "nob", "pes", "pol", "por", "ron", "rus", "slk",
              "slv", "spa", "sqi", "srp", "swe", "swh", "tam", "tel", "tgl", "tha", "tur",
              "ukr", "urd", "vie")
EMS_UNSEEN54 = ("amh", "ang", "arq", "arz", "ast", "awa", "aze", "bel", "ber", "bos", "bre",
                "cbk", "ceb", "cha", "cor", "csb", "cym", "dsb", "dtp", "fao", "fry", "gla",
                "gle", "gsw", "hsb", "ido", "ile", "ina", "isl", "kab", "khm", "kzj", "lat",
                "lfn", "mhr", "nds", "nno", "nov", "oci", "orv", "pam", "pms", "swg", "tat",
                "tuk", "tzl", "uig", "uzb", "war", "wuu", "xho", "yid", "yue", "zsm")
_EMS_UNDER300K_OWN = ("afr", "hin", "hye", "jav", "kat", "kaz", "kur", "mar", "mon", "nob",
                      "swh", "tam", "tel", "tgl", "urd")
EMS_TABLE6 = {
    "mUSE (15)": ("ara", "cmn", "deu", "fra", "ita", "jpn", "kor", "nld", "pol", "por",
                  "rus", "spa", "tha", "tur"),
    "XTREME (38)": tuple(sorted(tatoeba.XTREME36 + ("max",))),
    "SBERT-distill (48)": tuple(l for l in EMS_SEEN58 if l not in (
        "afr", "ben", "epo", "eus", "jav", "kaz", "mal", "swh", "tam", "tel", "tgl", "kur",
        "max")),
    "<LASER (43)": tuple(l for l in EMS_SEEN58 if l not in (
        "cat", "epo", "glg", "hye", "jav", "kaz", "kor", "mal", "mar", "mon", "pes", "spa",
        "tam", "tgl", "ukr")),
    ">300k (42)": tuple(l for l in EMS_SEEN58 if l not in _EMS_UNDER300K_OWN + ("pes",)),
    "<300k (11)": tuple(l for l in _EMS_UNDER300K_OWN if l not in ("jav", "mon", "nob", "urd")),
}
EMS_TABLE13 = {">300k (43)": tuple(l for l in EMS_SEEN58 if l not in _EMS_UNDER300K_OWN),
               "<300k (15)": _EMS_UNDER300K_OWN}
EMS_TRANSFER = tuple(transfer.BENCHMARKS)   # mldoc, amazon_v1, amazon_v2: data in --<task>_dir


def _ems(results) -> list:
  """P@1 as §5.1: the mean of both directions (`mean`) per language, then over the group."""
  out = figure("Table 4", "Tatoeba P@1, Avg. (EMS's 58 languages)",
                tatoeba_mean(results, EMS_SEEN58, "mean"))
  out += figure("Table 5", "Tatoeba P@1, Avg. (54 unseen languages)",
                 tatoeba_mean(results, EMS_UNSEEN54, "mean"))
  for group, langs in EMS_TABLE6.items():
    fig = tatoeba_mean(results, langs, "mean")
    out += figure("Table 6", f"Tatoeba P@1, {group}",
                   fig and {**fig, "group_size": len(langs)})
  for group, langs in EMS_TABLE13.items():
    out += figure("Table 13", f"Tatoeba P@1, {group} (EMS's own pairs)",
                   tatoeba_mean(results, langs, "mean"))
  out += figure("Table 8", "BUCC F1 (margin)", bucc_f1(results, "margin"))
  pc = results.get("paracrawl")
  if pc and pc["scores"]["test"]:
    row = pc["scores"]["test"][0]
    out.append({"table": "Table 9", "column": "ParaCrawl P@1, Avg.", "value": pc["main_score"],
                "metric": f"P@1 x100, en->xx, ratio margin k={pc['k']}, {row['n_queries']} "
                          f"queries / {row['n_candidates']} candidates",
                "xx2en": pc["p_at_1_xx2en"],
                "pairs": [r["hf_subset"] for r in pc["scores"]["test"]],
                "pairs_missing": pc["languages_missing"], "task": "paracrawl"})
  for task in EMS_TRANSFER:
    res = results.get(task)
    if not res:
      continue
    bench = transfer.BENCHMARKS[task]
    metric = f"accuracy x100, {res['probe']} probe, mean of {len(res['seeds'])} seeds"
    out.append({"table": bench.table, "column": f"{task} Avg. (both directions)",
                "value": res["main_score"], "metric": metric,
                "directions": len(res["scores"]["test"]), "task": task})
    if task == "mldoc":
      out.append({"table": "Table 13", "column": "MLDoc en->X Avg.", "value": res["en2xx"],
                  "metric": metric, "task": task})
      out.append({"table": "Table 13", "column": "MLDoc X->en Avg.", "value": res["xx2en"],
                  "metric": metric, "task": task})
  return out


EMS_OPTIONAL = {
    "paracrawl": (Missing("Table 9", "ParaCrawl sentence retrieval (2k queries, 200k "
                          "candidates)", paracrawl.LAYOUT), "dir"),
    **{task: (Missing(transfer.BENCHMARKS[task].table, task,
                      transfer.BENCHMARKS[task].layout(f"{task}.dir")), "dir")
       for task in EMS_TRANSFER}}


PROTOCOL = Protocol(
    "ems", "Mao et al., EMS",
    ("tatoeba", "bucc"), _ems, optional_tasks=dict(EMS_OPTIONAL))
