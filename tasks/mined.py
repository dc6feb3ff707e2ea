"""Pairs with hard negatives a model mined itself (launch/mine_negatives.py,
vmx/negatives.py: `source<TAB>positive<TAB>negative...` lines) as N-way hard-negative tasks:
each pair two views (the source and its translation, drawn in either order) and its first
mined negative, read by the hard-negative variants of CONTRASTIVE
(`DualEncoderModel.hard_negatives`) and MPCL (`MPCLModel.hard_negatives`). One file is
`mined_negatives_task`; a directory of them, one per `<source>-<target>.tsv` (a mixture's
tasks mined by `launch/mine_negatives.py --pairs=DIR`), is `mined_negatives_mixture`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import gin
from etils import epy

from vmx import negatives
from vmx.data import readers, task_settings
with epy.lazy_imports():   # SeqIO and TensorFlow: only when a task is registered
  from vmx.data import registration
from vmx.errors import ConfigError, DataError
from tasks.parallel import held_out


def mined_negatives_task(negatives_file: Optional[str] = gin.REQUIRED,
                         languages: Sequence[str] = gin.REQUIRED,
                         vocabulary: str = gin.REQUIRED, num_views: int = 2,
                         data_dir: Optional[str] = None,
                         shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                         validation_percent: int = task_settings.VALIDATION_PERCENT,
                         holdout: Sequence[str] = ()) -> str:
  """Registers the hard-negative task of a file launch/mine_negatives.py wrote
  (`source<TAB>positive<TAB>negative...`, vmx/negatives.py),
  `mined_negatives.views<V>.<languages>.<hash of the file>`: each group is a pair in
  `languages` (source, target) and its first mined negative (a target-language sentence,
  in whichever slot the sampler draws). `num_views` 2: the anchor and its translation
  (MPCL's Eq. 2 with one positive and the hard negatives is supervised SimCSE's loss;
  CONTRASTIVE reads the two views as its pair)."""
  if negatives_file is None:
    raise ConfigError("tasks.mined_negatives_task.negatives_file is not set: pass "
                      "--gin.MINED_NEGATIVES_FILE=\"'PATH'\" (launch/mine_negatives.py writes it)")
  if len(languages) != 2:
    raise ConfigError(f"tasks.mined_negatives_task.languages={list(languages)!r}: expected "
                      "the source's and the target's codes")
  rows, negatives = [], []
  for i, line in readers.iter_lines(negatives_file):
    if not line.strip():
      continue
    parts = line.split("\t")
    if len(parts) < 3 or not all(p.strip() for p in parts[:3]):
      raise DataError(f"{negatives_file}:{i}: expected 'source<TAB>positive<TAB>negative...', "
                      f"got {line[:80]!r} (launch/mine_negatives.py writes this layout)")
    rows.append([parts[0].strip(), parts[1].strip()])
    negatives.append([parts[2].strip()] * 2)
  if not rows:
    raise DataError(f"{negatives_file}: no pair with a hard negative")
  h, suffix = held_out(holdout, data_dir, "tasks.mined_negatives_task")
  key = registration.short_hash(readers.stamp([negatives_file]))
  return registration.register_nway_hard_negative_task(
      f"mined_negatives.views{num_views}.{'_'.join(languages)}.{key}{suffix}",
      list(languages), rows, negatives, vocabulary, num_views, shuffle_buffer_size,
      validation_percent, h, [negatives_file])


def mined_negatives_mixture(directory: Optional[str] = gin.REQUIRED,
                            vocabulary: str = gin.REQUIRED, alpha: float = 0.3,
                            num_views: int = 2, data_dir: Optional[str] = None,
                            shuffle_buffer_size: int = task_settings.DEFAULT_SHUFFLE_BUFFER,
                            validation_percent: int = task_settings.VALIDATION_PERCENT,
                            holdout: Sequence[str] = ()) -> str:
  """`mined_negatives_task` of every `<source>-<target>.tsv` file of `directory` (what
  `launch/mine_negatives.py --pairs=DIR` writes), the languages from its name, mixed with
  p ∝ n^alpha (n: a task's training examples, the pairs that kept a negative; the
  one-hour recipe mixes its pair tasks with the same rule). A file holding no mined pair
  (a task of one pair has no other target to be its negative) is left out, named."""
  if directory is None:
    raise ConfigError("tasks.mined_negatives_mixture.directory is not set: pass "
                      "--gin.MINED_NEGATIVES_DIR=\"'DIR'\" (launch/mine_negatives.py "
                      "--pairs=PAIRS_DIR --output=DIR writes it)")
  mined, empty = [], []
  for p, src, tgt in negatives.pair_files(directory):
    (mined if _has_a_line(p) else empty).append((p, src, tgt))
  if empty:   # e.g. a 1-pair task: no other target of its file to be its negative
    print(f"[vmx] tasks.mined_negatives_mixture: {len(empty)} file(s) of {directory} hold "
          f"no mined pair, left out: {', '.join(p.name for p, _, _ in empty)}", flush=True)
  if not mined:
    raise DataError(f"{directory}: no file holds a mined pair")
  names = [mined_negatives_task(str(p), [src, tgt], vocabulary, num_views, data_dir,
                                shuffle_buffer_size, validation_percent, holdout)
           for p, src, tgt in mined]
  key = registration.short_hash("|".join(names))
  return registration.register_mixture(f"mined_negatives.mix_{key}_a{alpha}", names, alpha)


def _has_a_line(path) -> bool:
  return any(line.strip() for _, line in readers.iter_lines(path))
