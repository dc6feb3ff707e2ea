#!/usr/bin/env python
"""What EMMA-X's E-step makes of translations and of random pairs, checkpoint by checkpoint.

  VMX_DATA_DIR=../shared/data python benchmarks/emmax_em_phase.py --model_dir=/tmp/vmx/emmax_tiny

For each checkpoint of an EMMA-X run (`--steps`, default every one kept) and the dev set's
translation pairs (`--dev_set`, newstest2013 by default: carved from the training corpora,
never trained on), it prints one JSON line:
- `translation` / `random`: over the true pairs (x_i, y_i) and as many random pairs
  (x_i, y_j), j != i: the mean cosine, the shares G's E-step (Eq. 9, argmax of the GMM
  posterior of gamma(x) - gamma(y)) gives each rank, and the shares M's E-step (Eq. 10,
  the nearest s_r) gives each rank, s_r taken from the run's last logged
  `train/rank<r>_similarity` at or before the step (the initial s_r before any);
- `retrieval`: xx -> en top-1 over the pairs (the dev metric's one direction);
- `gmm`: the mixture's prior, the norm of each rank's mean and each rank's mean variance.
A faithful EM phase keeps translations in rank 1 and random pairs in the last rank; the
collapse of docs/emmax.md shows as random pairs moving to ranks 1-2 and the cosine of
random pairs rising to that of translations.
"""
import importlib.util  # noqa: F401  (gin-config 0.5 gotcha)
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def logged_rank_sims(model_dir: str, step: int, n: int):
  """s_r as the run last logged them at or before `step` (None before any log)."""
  from vmx.training.metrics import read_rows
  best = None
  for rec in read_rows(os.path.join(model_dir, "metrics.jsonl")):
    if rec.get("step", 0) <= step and "train/rank1_similarity" in rec:
      best = [rec[f"train/rank{r + 1}_similarity"] for r in range(n)]
  return best


def shares(ranks, n: int) -> list:
  import numpy as np
  return [round(float(x), 4) for x in np.bincount(ranks.reshape(-1), minlength=n) / ranks.size]


def main(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model_dir", required=True)
  p.add_argument("--steps", default="", help="comma-separated checkpoint steps (default: all)")
  p.add_argument("--dev_set", default="newstest2013")
  p.add_argument("--languages", default="", help="dev languages (default: the model's)")
  p.add_argument("--max_sentences", type=int, default=1000)
  args = p.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from vmx.data import devsets
  from vmx.data.languages import iso3, resolve
  from vmx.inference import Encoder
  from vmx.models.emmax import EmmaX, EmmaXModel
  from vmx.modeldir.checkpoints import read_only_manager
  from vmx.errors import InputError
  from vmx import rank_losses

  steps = ([int(s) for s in args.steps.split(",") if s] or
           sorted(read_only_manager(args.model_dir).all_steps()))
  texts = english = langs = None
  for step in steps:
    enc = Encoder.from_checkpoint(args.model_dir, step)
    model = enc.model
    if not isinstance(model, EmmaXModel):
      raise InputError(f"{args.model_dir} is a {type(model).__name__} run, not EMMA-X")
    n = model.num_ranks
    if texts is None:    # the dev pairs once: every checkpoint has the run's languages
      wanted = [l for l in args.languages.split(",") if l]
      langs = [l for l in devsets.dev_set(args.dev_set).languages
               if (not wanted or iso3(l) in wanted) and resolve(iso3(l), enc.languages)]
      texts, english = devsets.read(args.dev_set, None, langs, args.max_sentences)
    sims = logged_rank_sims(args.model_dir, step, n)
    rank_sims = jnp.asarray(sims if sims else model.initial_rank_sims(), jnp.float32)
    out = {"step": step, "s_r": [round(float(s), 4) for s in rank_sims],
           "s_r_from": "the run's log" if sims else "their initial values (none logged yet)",
           "languages": langs}
    rng = np.random.default_rng(0)
    agg = {"translation": [], "random": [], "cos_t": [], "cos_r": [], "m_t": [], "m_r": [],
           "top1": []}
    for lang in langs:
      keep = [i for i, x in enumerate(texts[lang]) if x and english[i]]
      x = enc.encode([texts[lang][i] for i in keep], iso3(lang))
      y = enc.encode([english[i] for i in keep], "eng")
      m = len(keep)
      perm = (np.arange(m) + rng.integers(1, m, m)) % m            # j != i
      logp_t = model.module.apply({"params": enc.params}, jnp.asarray(x - y),
                                  method=EmmaX.classify)
      logp_r = model.module.apply({"params": enc.params}, jnp.asarray(x - y[perm]),
                                  method=EmmaX.classify)
      cos_t, cos_r = np.sum(x * y, 1), np.sum(x * y[perm], 1)
      agg["translation"].append(np.asarray(jnp.argmax(logp_t, -1)))
      agg["random"].append(np.asarray(jnp.argmax(logp_r, -1)))
      agg["m_t"].append(np.asarray(rank_losses.nearest_rank(jnp.asarray(cos_t), rank_sims)))
      agg["m_r"].append(np.asarray(rank_losses.nearest_rank(jnp.asarray(cos_r), rank_sims)))
      agg["cos_t"].append(cos_t)
      agg["cos_r"].append(cos_r)
      agg["top1"].append(np.mean(np.argmax(x @ y.T, 1) == np.arange(m)))
    cat = {k: np.concatenate(v) for k, v in agg.items() if k != "top1"}
    for kind, g, mm, c in (("translation", "translation", "m_t", "cos_t"),
                           ("random", "random", "m_r", "cos_r")):
      out[kind] = {"cosine": round(float(cat[c].mean()), 4),
                   "g_rank_shares": shares(cat[g], n), "m_rank_shares": shares(cat[mm], n)}
    out["retrieval_xx2en_top1"] = round(float(np.mean(agg["top1"])), 4)
    cls = enc.params["classifier"]
    if "mean" in cls:
      out["gmm"] = {
          "prior": [round(float(v), 4) for v in np.asarray(
              jax.nn.softmax(cls["prior_logits"]))],
          "mean_norm": [round(float(v), 4) for v in np.linalg.norm(np.asarray(cls["mean"]), axis=1)],
          "mean_variance": [float(f"{v:.3g}") for v in np.exp(np.asarray(cls["log_var"])).mean(1)]}
    print(json.dumps(out), flush=True)
  return 0


if __name__ == "__main__":
  from vmx import cli
  cli.run_main(main)
