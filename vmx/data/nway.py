"""N-way groups (MPCL): one sentence in N languages, V of them drawn per example.

A group is a row of N texts ("" = language missing). `NwaySource` holds the groups (split
by the hash of their texts), `sample_views` draws V distinct languages per example (view 0
the anchor) for the seqio reader; the token cache stores every language tokenized and
`draw_views` draws the views when a row is read (vmx/data/stream.py), from a seed that is
a function of its position: the same rule in numpy. `NwayHardNegativeSource` adds a
sentence that contradicts each group (MPCL §3.5).
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from vmx.data import devsets, views
from vmx.data.views import HARD_NEGATIVE_STREAM
from vmx.data.sources import VALIDATION_PERCENT
from vmx.errors import DataError


def nway_split(row: Sequence[str], validation_percent: int) -> str:
  """`validation` or `train` for an N-way group, by the hash of its texts."""
  digest = hashlib.sha256("\t".join(row).encode("utf-8")).digest()
  return "validation" if int.from_bytes(digest[:8], "big") % 100 < validation_percent else "train"


class NwaySource(seqio.FunctionDataSource):
  """N-way groups as string vectors `texts` [N] ("" = language missing): `train` repeats
  without end (with a running `draw` number: each pass samples new views), `validation`
  is one pass; groups with fewer than `min_views` languages, and (`holdout`) groups with
  a sentence of those dev sets, are dropped here.

  For the index-based input (vmx/data/token_cache, stream.py) the groups are cached
  tokenized, every language ([N, L] ids, `stored_examples`), and `draw_views` draws the
  views of each example when it is read, from a seed that is a function of its position
  in the stream: the rule of `sample_views` below, in numpy.
  """

  hard_negatives = False

  def __init__(self, languages: Sequence[str], rows: Sequence[Sequence[str]], min_views: int,
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None, paths: Sequence[str] = (),
               pairs_from_groups: Optional[int] = None):
    """`pairs_from_groups` K (MPCL's +Single data, `single_pairs`): groups with at least K
    languages, each cut into K / 2 pairs, every pair a row of its own (`min_views` 2)."""
    self.paths = [str(p) for p in paths]   # the files the rows were read from (if known)
    read = len(rows)
    if holdout:
      rows = [r for r in rows if holdout.keeps(r)]
    need = pairs_from_groups or min_views
    kept = [r for r in rows if sum(bool(t) for t in r) >= need]
    if not kept:
      by = (f" after the hold-out of {', '.join(holdout.names)} removed {read - len(rows)} of "
            f"its {read} groups" if holdout and len(rows) < read else "")
      raise DataError(f"no N-way group has {need} languages (of {list(languages)})"
                      f"{by}")
    splits = {"train": [], "validation": []}
    # a group's pairs stay in its split, and are laid out pair index by pair index (every
    # group's first pair, then every group's second, ...): rows a split apart, so the
    # reader's windows never hold two pairs of one group (each a false negative of the
    # other) and they meet in a batch as rarely as any two rows
    parts = {k: [[] for _ in range(max(1, (pairs_from_groups or 0) // 2))] for k in splits}
    for r in kept:
      for j, x in enumerate(single_pairs(r, pairs_from_groups) if pairs_from_groups else (r,)):
        parts[nway_split(r, validation_percent)][j].append([t.encode("utf-8") for t in x])
    splits = {k: [row for part in v for row in part] for k, v in parts.items()}
    if not validation_percent:
      del splits["validation"]
    self.languages, self.num_views = list(languages), min_views
    self._width = len(languages)   # texts a row holds (a subclass may store more per row)
    self._rows = splits
    self._fingerprint = None
    self._holdout = holdout.key if holdout else ""
    self._validation_percent = validation_percent
    self._pairs_from = pairs_from_groups
    super().__init__(self._dataset, splits=tuple(splits),
                     num_input_examples={k: len(v) for k, v in splits.items()})

  def _table(self, split) -> tf.Tensor:
    if split not in self._rows:
      raise DataError(f"N-way source: no split {split!r}; it has {list(self._rows)}")
    return tf.constant(np.array(self._rows[split], dtype=object).reshape(-1, self._width),
                       tf.string)

  def _dataset(self, split, shuffle_files, seed=None):
    del shuffle_files, seed  # one in-memory table: order is shuffled downstream
    ds = tf.data.Dataset.from_tensor_slices(self._table(split))
    # Training is endless, with a running draw number: each pass over the groups samples
    # new views (seqio's own repeat would replay the same per-example seeds every epoch).
    if split == "train":
      ds = ds.repeat()
    return ds.enumerate().map(lambda i, t: {"texts": t, "draw": i})

  def fingerprint(self) -> str:
    if self._fingerprint is None:
      h = hashlib.sha256(repr((self.languages, self.num_views, self._validation_percent,
                               self._holdout) + ((self._pairs_from,) if self._pairs_from
                                                 else ())).encode())
      for split in sorted(self._rows):
        for r in self._rows[split]:
          h.update(b"\x00".join(r) + b"\x01")
      self._fingerprint = h.hexdigest()
    return self._fingerprint

  def stored_examples(self, task: seqio.Task, split: str, lengths, start: int = 0,
                      end: Optional[int] = None):
    """Batches of `tokens` [n, N, L] (every language tokenized, zero-padded, cut to L)
    and `present` [n, N] (the group has that language), of groups [start, end)."""
    vocab, length = task.output_features["views"].vocabulary, int(lengths["views"])

    def tokenize(texts):
      ids = vocab.encode_tf(texts)   # as seqio.preprocessors.tokenize (add_eos=False)
      return {"tokens": ids.to_tensor(0, shape=[self._width, length]),
              "present": tf.strings.length(texts) > 0}
    ds = tf.data.Dataset.from_tensor_slices(self._table(split)[start:end]).map(
        tokenize, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(4096).as_numpy_iterator()

  def view_draw(self) -> views.Draw:
    """How a read row's views are drawn (vmx/data/views.py)."""
    return views.Draw(self.num_views, self.hard_negatives)

  def draw_views(self, stored: dict, seeds_B) -> dict:
    """`views` [B, V * L] (and `hard_negative` [B, L]): `view_draw()` of the rows."""
    return self.view_draw()(stored, seeds_B)


def single_pairs(row: Sequence[str], k: int) -> list[list[str]]:
  """MPCL §3.5's +Single examples of one group: k of its languages drawn uniformly (a
  generator seeded by the SHA-256 of the group's texts: the same pairs on every machine
  and run), paired in the order drawn, so each drawn sentence is in one pair. k / 2 rows
  of the group's width, each with the two texts of its pair ("" elsewhere)."""
  if k < 2 or k % 2:
    raise DataError(f"N-way pairs from groups of {k} languages: expected an even number >= 2")
  seed = int.from_bytes(hashlib.sha256("\t".join(row).encode("utf-8")).digest()[:8], "big")
  order = views.drawn(np.array([bool(t) for t in row]), seed, k)
  out = []
  for a, b in zip(order[0::2], order[1::2]):
    pair = [""] * len(row)
    pair[a], pair[b] = row[a], row[b]
    out.append(pair)
  return out


def _drawn_tf(texts_N, seed, k: int):
  """[k] indices of distinct non-empty texts, uniformly at random (stateless, `seed`)."""
  scores = tf.random.stateless_uniform(tf.shape(texts_N), seed)
  scores = tf.where(tf.strings.length(texts_N) > 0, scores, -1.0)
  return tf.math.top_k(scores, k=k)[1]


def nway_source(languages: Sequence[str], rows: Sequence[Sequence[str]], min_views: int,
                validation_percent: int = VALIDATION_PERCENT,
                holdout: Optional[devsets.HeldOut] = None,
                paths: Sequence[str] = (),
                pairs_from_groups: Optional[int] = None) -> NwaySource:
  """The N-way source of `rows` (see NwaySource), read from `paths`."""
  return NwaySource(languages, rows, min_views, validation_percent, holdout, paths,
                    pairs_from_groups)


@seqio.map_over_dataset(num_seeds=1)
def sample_views(ex, seed, num_views: int):
  """V = num_views distinct languages of the group, uniformly at random: view 0 is the
  anchor (so every language is equally likely to be the anchor), the rest positives."""
  texts = ex["texts"]
  seed = tf.random.experimental.stateless_fold_in(seed, ex["draw"])
  return {"views": tf.gather(texts, _drawn_tf(texts, seed, num_views))}


def pad_views(dataset: tf.data.Dataset, sequence_length):
  """Tokenized views (ragged [V, None]) -> dense [V, L], truncated and zero-padded."""
  length = sequence_length["views"]

  def pad(ex):
    v = ex["views"]
    return {"views": v.to_tensor(0, shape=[v.nrows(), length])}
  return dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)


# Hard negatives for N-way groups (MPCL's "XLM-R w/ hard negative" variant, §3.5).


class NwayHardNegativeSource(NwaySource):
  """N-way groups, each with a sentence that contradicts it: `rows[i]` the group's
  sentence in the N `languages` (the views, as NwaySource) and `negatives[i]` the
  contradicting sentence in the same N languages ("" = missing), e.g. an XNLI premise and
  one of its contradiction hypotheses (tasks/xnli_mt.py). Groups with fewer than
  `min_views` languages or no hard negative are dropped; `holdout` and the
  validation split look at both.

  An example is NwaySource's V views, then the hard negative in ONE language drawn
  uniformly from those it has (§3.5: "randomly selected from all languages"): in the
  tf.data stream `texts` [N], `negatives` [N] and `draw`, and after
  `sample_views_and_hard_negative` `views` [V + 1, L], the hard negative last
  (MultiViewHardNegativeFeatureConverter splits it off).

  Index reader: the cache also holds `negative_tokens` [n, N, L] and `negative_present`
  [n, N]; `draw_views` draws the views exactly as NwaySource does from the example's
  seed, and the hard negative's language from the generator of (seed, HARD_NEGATIVE_STREAM):
  a function of (seed, position), as the views.
  """
  hard_negatives = True   # vmx/data/pipeline.py checks it against the model's converter

  def __init__(self, languages: Sequence[str], rows: Sequence[Sequence[str]],
               negatives: Sequence[Sequence[str]], min_views: int,
               validation_percent: int = VALIDATION_PERCENT,
               holdout: Optional[devsets.HeldOut] = None, paths: Sequence[str] = ()):
    if len(rows) != len(negatives):
      raise DataError(f"N-way hard negatives: {len(rows)} groups but {len(negatives)} rows of "
                      f"hard negatives")
    n = len(languages)
    if any(len(r) != n for r in rows) or any(len(g) != n for g in negatives):
      raise DataError(f"N-way hard negatives: every group and hard negative needs {n} texts "
                      f"(one per language of {list(languages)})")
    joined = [[*r, *g] for r, g in zip(rows, negatives)
              if sum(bool(t) for t in r) >= min_views and any(g)]
    if not joined:
      raise DataError(f"no N-way group has {min_views} languages (of {list(languages)}) and "
                      f"a hard negative")
    # NwaySource's table, holdout and split over the 2N columns [group; hard negative]
    # (every joined row has >= min_views texts, so its own filter keeps them all).
    super().__init__([*languages, *languages], joined, min_views, validation_percent, holdout,
                     paths)
    self.languages = list(languages)   # (rows keep their 2N texts: self._width)

  def _dataset(self, split, shuffle_files, seed=None):
    n = len(self.languages)
    return super()._dataset(split, shuffle_files, seed).map(
        lambda ex: {"texts": ex["texts"][:n], "negatives": ex["texts"][n:], "draw": ex["draw"]})

  def stored_examples(self, task: seqio.Task, split: str, lengths, start: int = 0,
                      end: Optional[int] = None):
    """NwaySource's `tokens` [n, N, L] and `present` [n, N], and the hard negatives'
    `negative_tokens` [n, N, L] and `negative_present` [n, N]."""
    n = len(self.languages)
    for b in super().stored_examples(task, split, lengths, start, end):   # [n, 2N, L], [n, 2N]
      yield {"tokens": b["tokens"][:, :n], "present": b["present"][:, :n],
             "negative_tokens": b["tokens"][:, n:], "negative_present": b["present"][:, n:]}


@seqio.map_over_dataset(num_seeds=1)
def sample_views_and_hard_negative(ex, seed, num_views: int):
  """`sample_views`'s V views (the same rule), then the hard negative in one language
  drawn uniformly from those it has: `views` [V + 1] (the hard negative last)."""
  texts, negatives = ex["texts"], ex["negatives"]
  seed = tf.random.experimental.stateless_fold_in(seed, ex["draw"])
  neg_seed = tf.random.experimental.stateless_fold_in(seed, HARD_NEGATIVE_STREAM)
  return {"views": tf.concat([tf.gather(texts, _drawn_tf(texts, seed, num_views)),
                              tf.gather(negatives, _drawn_tf(negatives, neg_seed, 1))],
                             axis=0)}
