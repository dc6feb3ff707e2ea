"""Drawing an N-way example's views when its row is read (MPCL), without SeqIO.

The token cache stores each N-way group tokenized in every language (`tokens` [n, N, L],
`present` [n, N]; hard-negative tasks also `negative_tokens`, `negative_present`,
vmx/data/nway.py). `Draw` picks, per example, V distinct languages of its group uniformly
(view 0 the anchor) from the generator seeded by the example's position in the stream
(vmx/data/stream.py), and with hard negatives the negative's language from the generator of
(seed, HARD_NEGATIVE_STREAM): the rule of nway.py's `sample_views`, in numpy. A run that
finds its token cache (vmx/data/token_cache/lookup.py) rebuilds it from `describe()`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

HARD_NEGATIVE_STREAM = 1   # the index reader's hard-negative draw: generator (seed, g, 1)


def drawn(present_N, seed, k: int) -> np.ndarray:
  """[k] indices of distinct present entries, uniformly at random from the generator
  seeded by `seed`."""
  scores = np.random.default_rng(seed).random(len(present_N))
  scores[~present_N] = -1.0
  return np.argsort(-scores, kind="stable")[:k]


@dataclasses.dataclass(frozen=True)
class Draw:
  """The views of N-way rows: `num_views` V, and whether a hard negative is drawn too."""
  num_views: int
  hard_negatives: bool = False

  def __call__(self, stored: dict, seeds_B) -> dict:
    """`views` [B, V * L] (and `hard_negative` [B, L]) from stored rows, each from the
    generator seeded by its row of `seeds_B` [B, k]."""
    tokens, present = stored["tokens"], stored["present"]
    v = self.num_views
    out = {"views": np.empty((len(tokens), v * tokens.shape[-1]), tokens.dtype)}
    for b, seed in enumerate(seeds_B):
      out["views"][b] = tokens[b, drawn(present[b], seed, v)].reshape(-1)
    if self.hard_negatives:
      neg_tokens, neg_present = stored["negative_tokens"], stored["negative_present"]
      out["hard_negative"] = np.empty((len(neg_tokens), neg_tokens.shape[-1]), neg_tokens.dtype)
      for b, seed in enumerate(seeds_B):
        out["hard_negative"][b] = neg_tokens[
            b, drawn(neg_present[b], [*seed, HARD_NEGATIVE_STREAM], 1)[0]]
    return out

  def describe(self) -> dict:
    return dataclasses.asdict(self)
