"""SeqIO's offline cache of vmx tasks (the seqio reader's `use_cached=True`), in one process.

seqio caches a task's examples as they are at its `CacheDatasetPlaceholder` (for vmx's
pair and monolingual tasks: tokenized, before the run's language ids and truncation) in
`<cache dir>/<task name>/`: `<split>.tfrecord-*-of-N`, `info.<split>.json` (features),
`stats.<split>.json` (counts) and `COMPLETED`, written last. A run reads them with
`DatasetConfig.use_cached = True` and the cache dir on seqio's search path
(`launch/train.py --seqio_additional_cache_dirs=DIR`), and then yields exactly the
batches the uncached pipeline would.

`cache_task` writes that layout with seqio's own preprocessing and example encoding,
which is enough for corpora of millions of pairs on one machine;
`python -m seqio.scripts.cache_tasks_main --module_import=tasks ...` (Apache Beam, e.g.
on Dataflow) writes the same layout for larger ones. vmx adds `vmx_cache.json` with the
vocabulary's fingerprint: the task names do not name the vocabulary, so a run whose
vocabulary differs from the cache's is stopped (`check_cached`) instead of training on
another vocabulary's ids.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

import seqio
import tensorflow as tf
from tqdm.auto import tqdm

from vmx import storage
from vmx.data import seqio_vocab
from vmx.errors import ConfigError

VMX_CACHE_INFO = "vmx_cache.json"


def cache_task(task_name: str, cache_root: str, splits: Optional[Sequence[str]] = None,
               overwrite: bool = False, progress: bool = True) -> str:
  """Writes the offline cache of a registered task under `cache_root`; returns its dir.

  A complete cache (its COMPLETED file) is kept unless `overwrite`; an incomplete one
  (an interrupted run) is written again from the start.
  """
  task = seqio.get_mixture_or_task(task_name)
  if not isinstance(task, seqio.Task):
    raise ConfigError(f"{task_name} is a mixture: cache its tasks ({cached_tasks(task_name)})")
  if not task.supports_caching:
    raise ConfigError(f"task {task_name} has no CacheDatasetPlaceholder: it cannot be cached "
                      f"(N-way tasks sample their views before tokenizing)")
  out = storage.path(cache_root) / seqio.utils.get_task_dir_from_name(task_name)
  if (out / "COMPLETED").exists():
    if not overwrite:
      return str(out)
    (out / "COMPLETED").unlink()
  out.mkdir(parents=True, exist_ok=True)
  for split in splits or task.splits:
    _write_split(task, str(out), split, progress)
  vocab = seqio_vocab.task_vocabulary(task)
  storage.write_atomic(out / VMX_CACHE_INFO, json.dumps(
      {"task": task_name, "vocabulary_sha256": vocab and seqio_vocab.fingerprint(vocab)},
      indent=1))
  storage.write_atomic(out / "COMPLETED", "")
  return str(out)


def _write_split(task: seqio.Task, out: str, split: str, progress: bool):
  ds = task.source.get_dataset(split=split, shuffle=False)
  ds = task.preprocess_precache(ds, seed=None)
  features, stats = None, {"examples": 0}
  prefix = seqio.utils.get_cached_tfrecord_prefix(out, split)
  examples = ds.as_numpy_iterator()
  if progress:
    examples = tqdm(examples, desc=f"{task.name}:{split}", unit=" examples",
                    total=task.num_input_examples(split))
  with tf.io.TFRecordWriter(f"{prefix}-00000-of-00001") as writer:
    for ex in examples:
      if features is None:   # the layout of seqio's beam_utils.GetInfo
        features = {}
        for k, v in ex.items():
          t = tf.constant(v)
          shape = t.shape.as_list()
          features[k] = {"shape": [None] + shape[1:] if shape else [], "dtype": t.dtype.name}
      writer.write(seqio.utils.dict_to_tfexample(ex).SerializeToString())
      stats["examples"] += 1
      for k, v in ex.items():
        if k in task.output_features and getattr(v, "ndim", 0) == 1:
          stats[f"{k}_tokens"] = stats.get(f"{k}_tokens", 0) + int(len(v))
          stats[f"{k}_max_tokens"] = max(stats.get(f"{k}_max_tokens", 0), int(len(v)))
  if features is None:
    raise ConfigError(f"task {task.name}: split {split!r} has no examples to cache")
  storage.write_atomic(seqio.utils.get_cached_info_path(out, split), json.dumps(
      {"num_shards": 1, "features": features, "seqio_version": seqio.__version__}, indent=1))
  storage.write_atomic(seqio.utils.get_cached_stats_path(out, split), json.dumps(stats))


def cached_tasks(name: str) -> list[str]:
  """The tasks of a task or mixture (recursively), in order."""
  provider = seqio.get_mixture_or_task(name)
  if isinstance(provider, seqio.Mixture):
    return [t.name for t in provider.tasks]
  return [provider.name]


def check_cached(mixture_or_task_name: str, split: str):
  """Before a run reads a cache: every task is cached for `split` and with the task's
  vocabulary; raises ConfigError saying what to run otherwise."""
  for name in cached_tasks(mixture_or_task_name):
    task = seqio.get_mixture_or_task(name)
    if not task.supports_caching:
      raise ConfigError(f"use_cached=True, but task {name} cannot be cached (no "
                        f"CacheDatasetPlaceholder); set DatasetConfig.use_cached = False")
    if not task.cache_dir:
      raise ConfigError(
          f"use_cached=True, but task {name} is in no cache dir (searched: "
          f"{seqio.utils.get_global_cache_dirs() or 'none set'}); write it with "
          f"`python launch/cache_tasks.py --tasks={mixture_or_task_name} "
          f"--output_cache_dir=DIR` and pass --seqio_additional_cache_dirs=DIR")
    if not storage.path(seqio.utils.get_cached_info_path(task.cache_dir, split)).exists():
      raise ConfigError(f"use_cached=True, but the cache of task {name} at {task.cache_dir} "
                        f"has no split {split!r}")
    info = storage.path(task.cache_dir) / VMX_CACHE_INFO
    vocab = seqio_vocab.task_vocabulary(task)
    if info.exists() and vocab is not None:
      cached = json.loads(info.read_text()).get("vocabulary_sha256")
      if cached and cached != seqio_vocab.fingerprint(vocab):
        raise ConfigError(
            f"the cache of task {name} at {task.cache_dir} was written with another "
            f"vocabulary (sha256 {cached[:12]}…, this run's: "
            f"{seqio_vocab.fingerprint(vocab)[:12]}…): write a cache for this vocabulary "
            f"in another dir, or set DatasetConfig.use_cached = False")
