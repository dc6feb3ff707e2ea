"""How a run finds its built token caches without SeqIO: a record per data description.

A token cache's directory is named by its fingerprint (fingerprint.py), which only SeqIO's
registered task can compute. So when a run opens or builds the caches of a gin data
description (a `Deferred`, vmx/data/deferred.py: `tasks.parallel_mixture(...)` with its
arguments), it also writes `<root>/runs/<key>.json`, keyed by that description and the
code that makes the examples. The record holds the mixture's name, its tasks and rates,
their input counts, the input files' stamp (paths, sizes, content hashes, readers.stamp)
and, per (split, lengths, converter), each task's cache directory and fingerprint.

The next run of the same experiment (a restart, another host of a pod, a Beam-built cache
with launch/cache_tasks.py's record) finds the record, checks that every input file is as
stamped and that every directory holds a finished cache of the recorded fingerprint, and
reads the caches without registering a task: no SeqIO, no TensorFlow. Anything that
differs (a file edited, another argument, a code change, a missing or other cache) makes
the record not match: the run registers its tasks with SeqIO and opens or builds its
caches as before, proving them by fingerprint, and writes the record again.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Mapping, Optional

from vmx import storage
from vmx.data import readers
from vmx.data.token_cache import disk_format
from vmx.data.token_cache.table import Table
from vmx.errors import DataError

RECORD_FORMAT = 1
RUNS = "runs"
NOT_FOUND = "no record of this data description"


def default_root() -> str:
  """`VMX_CACHE_DIR`'s parent /arrays (beside the vocabularies and teacher caches)."""
  return str(storage.cache_dir().parent / "arrays")


def record_path(root, key: str):
  return storage.path(root or default_root()) / RUNS / f"{key[:32]}.json"


def cache_key(split: str, lengths: Mapping[str, int], layout) -> str:
  """The key of one cache set inside a record (split, lengths, converter)."""
  return json.dumps({"split": split, "lengths": {k: int(v) for k, v in sorted(lengths.items())},
                     "converter": layout.describe()}, sort_keys=True)


@dataclasses.dataclass
class Record:
  """What a run needs of its data without SeqIO (see the module docstring)."""
  key: str
  name: str
  tasks: list            # [{"name", "rate", "draw": None | views.Draw's description}]
  files: list            # input files (stamped)
  stamp: str
  examples: dict         # split -> [input examples per task]
  caches: dict           # cache_key -> [{"directory", "fingerprint"}] per task
  path: object = None

  def to_json(self) -> str:
    d = {"format": RECORD_FORMAT, "key": self.key, "name": self.name, "tasks": self.tasks,
         "files": self.files, "stamp": self.stamp, "examples": self.examples,
         "caches": self.caches, "written_at": time.time()}
    return json.dumps(d, indent=1, sort_keys=True)

  def num_examples(self, split: str) -> Optional[int]:
    """The input examples of `split` over all tasks (None: not recorded)."""
    counts = self.examples.get(split)
    return None if counts is None else int(sum(counts))

  def tables(self, split: str, lengths, layout, root) -> Optional[list]:
    """The tasks' Tables of (split, lengths, converter), or None where the record has
    none or a directory no longer holds the recorded cache."""
    entries = self.caches.get(cache_key(split, lengths, layout))
    if not entries or len(entries) != len(self.tasks):
      return None
    base = storage.path(root or default_root())
    out = []
    for e in entries:
      directory = base / e["directory"]
      if not (directory / disk_format.MANIFEST).exists():
        return None
      try:
        table = Table(directory, f"delete {directory} and run again")
      except DataError:
        return None
      if table.info.get("fingerprint") != e["fingerprint"]:
        return None
      out.append(table)
    return out


def find(key: str, root) -> tuple[Optional[Record], str]:
  """(the record of `key` under `root` if its input files are as stamped, else None; why
  not, in words)."""
  path = record_path(root, key)
  try:
    d = json.loads(path.read_text())
  except FileNotFoundError:
    return None, NOT_FOUND
  except (OSError, ValueError) as e:
    return None, f"{path}: unreadable ({type(e).__name__})"
  if d.get("format") != RECORD_FORMAT or d.get("key") != key:
    return None, f"{path}: another format or key"
  try:
    stamp = readers.stamp(d["files"])
  except DataError as e:
    return None, f"an input file is gone ({e})"
  if stamp != d["stamp"]:
    return None, "an input file changed"
  return Record(key, d["name"], d["tasks"], d["files"], d["stamp"], d.get("examples", {}),
                d["caches"], path), ""


def write(key: str, root, name: str, tasks: list, files: list, split: str,
          examples: Optional[list], lengths, layout, directories: list,
          fingerprints: list) -> Record:
  """Adds (split, lengths, converter)'s caches (and `split`'s input counts) to the record
  of `key`, written anew when its tasks or files differ, atomically; a record that
  already says all this is left as it is."""
  record, _ = find(key, root)
  stamp = readers.stamp(files)
  if record is None or record.name != name or record.tasks != tasks or record.files != files:
    record = Record(key, name, tasks, list(files), stamp, {}, {})
  base = str(storage.path(root or default_root())).rstrip("/") + "/"
  entry = []
  for d, f in zip(directories, fingerprints):
    d = str(storage.path(d))
    if not d.startswith(base):
      return record   # a cache outside the root: not findable from it
    entry.append({"directory": d[len(base):], "fingerprint": f})
  ck = cache_key(split, lengths, layout)
  if record.caches.get(ck) == entry and (examples is None
                                         or record.examples.get(split) == examples):
    return record
  record.caches[ck] = entry
  if examples is not None:
    record.examples[split] = list(examples)
  record.path = record_path(root, key)
  record.path.parent.mkdir(parents=True, exist_ok=True)
  storage.write_atomic(record.path, record.to_json())
  return record
