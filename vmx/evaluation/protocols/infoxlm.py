"""Chi et al., InfoXLM: Tables 2 and 3 (Tatoeba over the 14 languages with parallel data and
the 22 others, each direction, with §4.2's vector) and Fig. 1 (Tatoeba per layer); its
fine-tuned XNLI is launch/finetune.py's (vmx/finetune/)."""
from __future__ import annotations

from vmx.evaluation import tatoeba
from vmx.evaluation.protocols.base import FINETUNE, Missing, Protocol
from vmx.evaluation.protocols.figures import INFOXLM_PARALLEL14, figure, tatoeba_mean

INFOXLM_OTHER22 = tuple(l for l in tatoeba.XTREME36 if l not in INFOXLM_PARALLEL14)


def _infoxlm(results) -> list:
  """Tables 2 and 3 with §4.2's vector (the mean of layer 7: the `tatoeba_vector` task,
  whatever vector the run embeds), the 14 languages with parallel data and the 22
  without, each direction apart; Fig. 1 from `tatoeba_layers`."""
  out = []
  for table, group, langs in (("Table 2", "14 languages with parallel data", INFOXLM_PARALLEL14),
                              ("Table 3", "22 languages without", INFOXLM_OTHER22)):
    for d in ("xx2en", "en2xx"):
      out += figure(table, f"Tatoeba {group}, {d}",
                     tatoeba_mean(results, langs, d, task="tatoeba_vector"))
  layers = results.get("tatoeba_layers")
  for r in (layers["scores"]["test"] if layers else ()):
    out.append({"table": "Fig. 1", "column": f"layer {r['layer']}", "value": r["accuracy_xx2en"],
                "metric": "Tatoeba accuracy x100, xx->en, mean-pooled hidden states of the layer",
                "n_languages": r["n_languages"], "vector": r["vector"],
                "task": "tatoeba_layers"})
  return out


def _infoxlm_missing(results) -> list:
  """Tables 2-3 scored with another vector than §4.2's (an encoder without a layer 7)."""
  res = results.get("tatoeba_vector")
  if res and res.get("vector_unavailable"):
    return [Missing("Tables 2, 3", f"Tatoeba with §4.2's vector ({res['vector_requested']}); "
                    f"the figures use {res['vector']}", res["vector_unavailable"])]
  return []


INFOXLM_OPTIONAL = {
    "tatoeba_layers": (Missing("Fig. 1", "Tatoeba xx->en accuracy of each layer (14 "
                               "languages)", "--tatoeba_layers.layers=all (or 1,4,7): one "
                               "Tatoeba pass over the 14 languages per layer"), "layers")}


PROTOCOL = Protocol(
    "infoxlm", "Chi et al., InfoXLM",
    ("tatoeba_vector",), _infoxlm,
    (Missing("Tables 1, 7, 10", "XNLI (fine-tuned, cross-lingual transfer)",
             FINETUNE.format(protocol="infoxlm", flag="gin.XNLI_DIR")),
     Missing("Table 4", "MLQA (fine-tuned extractive QA, zero-shot from SQuAD v1.1)",
             FINETUNE.format(protocol="infoxlm", flag="gin.MLQA_DIR=DIR --gin.SQUAD_DIR")
             .replace("<file>", "mlqa_infoxlm_base"))),
    tatoeba_languages=tatoeba.XTREME36, optional_tasks=dict(INFOXLM_OPTIONAL),
    missing_from=_infoxlm_missing)
