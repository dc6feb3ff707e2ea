"""The figure helpers the papers' protocols share: the mean Tatoeba accuracy over a
language group in one direction, BUCC F1, the mean STS17 correlation over pairs, EMMA-X
Table 4's geometry columns, and `figure`, the one row each paper's module builds its
tables from."""
from __future__ import annotations

from typing import Optional, Sequence

from vmx.evaluation import common, tatoeba

# InfoXLM's 14 languages with parallel data (Table 9), MPCL's "Tatoeba(14avg.)" too
INFOXLM_PARALLEL14 = tatoeba.INFOXLM_PARALLEL14


def tatoeba_rows(results, task: str = "tatoeba") -> dict:
  res = results.get(task)
  if not res:
    return {}
  return {r["languages"][0]: r for r in res["scores"]["test"]}


def tatoeba_mean(results, languages: Optional[Sequence[str]], direction: str,
                 task: str = "tatoeba") -> Optional[dict]:
  """Mean accuracy ×100 over `languages` (None: all evaluated) in `direction`
  (`xx2en`, `en2xx` or `mean`, the mean of both) of harness task `task`; None if none of
  them was evaluated."""
  rows = tatoeba_rows(results, task)
  keys = [l for l in (languages or rows) if l in rows]
  if not keys:
    return None
  field = {"xx2en": "accuracy_xx2en", "en2xx": "accuracy_en2xx", "mean": "main_score"}[direction]
  value = common.mean([rows[l][field] for l in keys])
  out = {"value": value, "metric": f"accuracy x100, {direction}", "n_languages": len(keys),
         "task": task}
  if languages is not None:
    out["languages_missing"] = sorted(set(languages) - set(rows))
  return out


def figure(table, column, fig) -> list:
  return [] if fig is None else [{"table": table, "column": column, **fig}]


def bucc_f1(results, scoring: str, retrieval: str = "max") -> Optional[dict]:
  """BUCC F1 ×100 averaged over the pairs present, `scoring` cosine or margin, each
  sentence's best candidate by `retrieval` (mining.RETRIEVALS: `forward` keeps each
  source sentence's highest-scoring English sentence)."""
  res = results.get("bucc")
  if not res or not res["scores"]["test"]:
    return None
  rows = res["scores"]["test"]
  return {"value": common.mean([r[f"{scoring}_{retrieval}"]["f1"] for r in rows]),
          "metric": f"F1 x100, {scoring} scoring, {retrieval} retrieval, "
                    f"threshold on {rows[0]['threshold_split']}, {rows[0]['split']} split",
          "pairs": [r["hf_subset"] for r in rows], "task": "bucc"}


def sts17_mean(results, pairs: Optional[Sequence[str]], metric: str,
           mteb_only: bool = False) -> Optional[dict]:
  """The mean over `pairs` (e.g. 'ar-en'; None: every pair present) of STS17 `metric` ×100.
  es-en has two tracks (4a, 4b) and the VMSST paper does not say which it used: they are
  averaged into one es-en value, so each pair counts once. `mteb_only`: the tracks MTEB's
  STS17 has (4a for es-en), as MPCL evaluates through MTEB."""
  res = results.get("sts17")
  if not res:
    return None
  by_pair = {}      # a pair in either order (STS2017-extended names some the other way)
  for r in res["scores"]["test"]:
    if mteb_only and not r.get("mteb", True):
      continue
    by_pair.setdefault(_pair_key(r["hf_subset"].split(".", 1)[1]), []).append(r)
  wanted = list(by_pair) if pairs is None else [_pair_key(p) for p in pairs]
  got = {p: by_pair[p] for p in wanted if p in by_pair}
  if not got:
    return None
  return {"value": common.mean([common.mean([r[metric] for r in rows]) for rows in got.values()]),
          "metric": f"{metric} x100", "tracks": [r["hf_subset"] for rows in got.values()
                                                for r in rows],
          "pairs_missing": sorted(p for p in pairs or () if _pair_key(p) not in by_pair),
          "task": "sts17"}


def _pair_key(pair: str) -> str:
  return "-".join(sorted(pair.split("-")))


# Table 4's columns: (the equation as printed, the metric, vmx's variant of it).
_GEOMETRY_COLUMNS = (
    ("invariance_kl_eq16", "invariance KL (Eq. 16)",
     "full unnormalized scatter; NaN when a language has no more sentences than dimensions",
     "invariance_kl"),
    ("canonical_form_eq17", "canonical form CH (Eq. 17)", "between / within scatter",
     "canonical_form_ch"),
    ("isotropy_eq18", "isotropy PR (Eq. 18)", "eigenvectors as the solver returns them",
     "isotropy_pr"))


def geometry_figures(metrics: dict, suffix: str, **extra) -> list:
  """Table 4's three figures from geometry metrics, each with vmx's variant beside it."""
  return [{"table": "Table 4", "column": column + suffix, "value": metrics[key],
           "metric": metric, "variant": {variant: metrics[variant]}, **extra}
          for key, column, metric, variant in _GEOMETRY_COLUMNS]
