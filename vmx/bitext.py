"""Bitext mining as a job: two monolingual corpora in, margin-scored sentence pairs out
(Artetxe & Schwenk 2019a; LASER's mine_bitexts.py), at any corpus size, resumable.

`mine(encoder, source, target, output, work_dir, settings)` runs four stages. Every file
it writes appears whole (vmx/storage.py's `write_atomic`), so a killed job reruns from
its last finished file and its output equals an uninterrupted run's, byte for byte:

1. **scan**: each corpus read once. Lines are numbered from 1; empty (or whitespace-only)
   lines are skipped and counted; invalid UTF-8 or a missing file is an error naming the
   file (and line) before anything is encoded. Every `shard_size` kept lines form a shard.
2. **embed**: each shard encoded by the checkpoint (the vector its protocol scores, unit
   rows) into WORK_DIR/{source,target}/NNNNN.npy, beside NNNNN.json: the SHA-256 of the
   shard's lines, its size and the encoder's revision. A shard whose record matches is not
   encoded again; one whose record does not (another corpus, another checkpoint) is an
   error naming the shard and the WORK_DIR.
3. **knn**: the exact k nearest neighbours both ways (vmx/evaluation/knn.py: on CPU the
   fused kernel over this process's cores, else the blocked XLA pass over every local
   device; NumPy for small tiles), one source shard against every
   target shard at a time: WORK_DIR/knn/fwd_NNNNN.npz holds the source shard's lists, and
   WORK_DIR/knn/bwd_P_of_N.npz every target's lists over the source shards process P has
   done, and which. Memory: one source and one target shard of vectors and the target's
   [M, k] lists; nothing holds a whole corpus's vectors.
4. **score**: LASER's margin over the k neighbours' mean similarities
   (`mining.score_candidates`), the retrieval (`mining.best_pairs`: forward, backward,
   intersect, or max's greedy one-to-one merge), then the threshold and / or the top N;
   the pairs' texts read back in one pass over each corpus into a local temporary file
   (`Texts`); OUTPUT.json the summary, then OUTPUT written a shard's worth of pairs at a
   time (`storage.open_atomic`) as `score<TAB>source<TAB>target` lines, the best first.

Stages 2 and 3 run on an `Engine`: `LocalEngine` here, where several processes
(`jax.distributed`: launch/mine.py's --multihost or --coordinator_address, one WORK_DIR all
of them reach, e.g. gs://) share them: shard i is process i % N's; they wait for each other
between stages, and process 0 scores and writes. Or vmx/bitext_beam.py's `BeamEngine`:
Beam workers run the same shard functions (`Job.embed_shard`, `Job.search_shard`).

Stages 1-3 depend on the corpora, the checkpoint (its revision, prefix size and
precision), the languages, k and the shard size (WORK_DIR/job.json
records them and a rerun with others is refused); stage 4's settings may change from run
to run on the same WORK_DIR (another threshold re-scores in seconds). Duplicate lines are
kept as they are (LASER's `--unify` is a corpus step before mining: a duplicate target
counts twice among a source's k neighbours). The [N, k] and [M, k] neighbour lists
(12 bytes an entry) and the pairs' text offsets are held in memory by the score stage.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import mmap
import os
import tempfile
import time
from typing import Callable, Optional, Protocol

import numpy as np

from vmx import signals, storage
from vmx.data import readers
from vmx.errors import DataError, InputError
from vmx.evaluation import knn as knn_lib
from vmx.evaluation import mining

MARGINS = {"ratio": "ratio", "distance": "distance", "cosine": "absolute"}
SIDES = ("source", "target")
JOB_FILE = "job.json"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a mining job does. `k`, `shard_size` fix stages 1-3; the rest only stage 4."""
  k: int = 4
  margin: str = "ratio"            # ratio | distance | cosine (MARGINS)
  retrieval: str = "max"           # forward | backward | intersect | max (mining.RETRIEVALS)
  threshold: Optional[float] = None
  top_n: Optional[int] = None
  shard_size: int = 100_000
  source_lang: Optional[str] = None
  target_lang: Optional[str] = None
  batch_size: Optional[int] = None

  def check(self):
    if self.margin not in MARGINS:
      raise InputError(f"margin={self.margin!r}: expected one of {sorted(MARGINS)}")
    if self.retrieval not in mining.RETRIEVALS:
      raise InputError(f"retrieval={self.retrieval!r}: expected one of {mining.RETRIEVALS}")
    if not isinstance(self.k, int) or self.k < 1:
      raise InputError(f"k={self.k!r}: expected a positive integer")
    if self.shard_size < 1:
      raise InputError(f"shard_size={self.shard_size}: expected a positive integer")
    if self.top_n is not None and self.top_n < 1:
      raise InputError(f"top_n={self.top_n}: expected a positive integer")


class Corpus:
  """A text file's kept lines: their count, their shards and the lines skipped."""

  def __init__(self, path: str, shard_size: int, counts: Optional[tuple] = None):
    """Scans the file, or takes (kept, empty) from a scan made elsewhere (`counts`: a Beam
    worker gets the driver's)."""
    self.path, self.shard_size = str(path), shard_size
    self.kept, self.empty = counts or (0, 0)
    if counts is not None:
      return
    for _, line in readers.iter_lines(path):   # invalid UTF-8: DataError naming path:line
      if line.strip():
        self.kept += 1
      else:
        self.empty += 1
    if not self.kept:
      raise DataError(f"{path}: no sentence to mine (empty or blank lines only)")

  @property
  def shards(self) -> int:
    return -(-self.kept // self.shard_size)

  def shard_lines(self):
    """Yields (shard index, its kept lines), in order."""
    lines, shard = [], 0
    for _, line in readers.iter_lines(self.path):
      if line.strip():
        lines.append(line)
        if len(lines) == self.shard_size:
          yield shard, lines
          lines, shard = [], shard + 1
    if lines:
      yield shard, lines


class Texts:
  """The texts of chosen kept lines of a corpus (`wanted`: kept-line indices, any order,
  repeats allowed), found in one pass over the corpus and spilled to a local file: memory
  holds offsets (about 24 bytes a chosen line), not texts. `chunk(a, b)` gives the texts
  of wanted[a:b], in that order."""

  def __init__(self, corpus: Corpus, wanted: np.ndarray, spill: str):
    uniq, self._inv = np.unique(np.asarray(wanted, np.int64), return_inverse=True)
    self._start = np.zeros(len(uniq), np.int64)
    self._len = np.zeros(len(uniq), np.int64)
    j, i, pos = 0, 0, 0
    nxt = int(uniq[0]) if len(uniq) else -1
    with open(spill, "wb") as f:
      for _, line in readers.iter_lines(corpus.path):
        if j == len(uniq):
          break
        if not line.strip():
          continue
        if i == nxt:
          b = line.encode("utf-8")
          self._start[j], self._len[j] = pos, len(b)
          f.write(b)
          pos += len(b)
          j += 1
          nxt = int(uniq[j]) if j < len(uniq) else -1
        i += 1
    self._file = open(spill, "rb")
    self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if pos else None

  def chunk(self, a: int, b: int) -> list:
    idx = self._inv[a:b]
    mm = self._mm if self._mm is not None else b""
    return [mm[s:s + n].decode("utf-8")
            for s, n in zip(self._start[idx].tolist(), self._len[idx].tolist())]

  def close(self):
    if self._mm is not None:
      self._mm.close()
    self._file.close()


def _digest(lines) -> str:
  h = hashlib.sha256()
  for line in lines:
    h.update(line.encode("utf-8"))
    h.update(b"\n")
  return h.hexdigest()


def save_arrays(path, **arrays):
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  storage.write_atomic(path, buf.getvalue())


def load_arrays(path) -> dict:
  with np.load(io.BytesIO(storage.path(path).read_bytes())) as z:
    return {k: z[k] for k in z.files}


def log(msg: str):
  print(f"[mine] {msg}", flush=True)


class Job:
  """A mining job's WORK_DIR: its record, its shards and its neighbour lists."""

  def __init__(self, work_dir, encoder, checkpoint: str, source: Corpus, target: Corpus,
               settings: Settings):
    import jax  # (the caller has started jax)
    self.dir = storage.path(work_dir)
    self.encoder, self.settings = encoder, settings
    self.corpora = {"source": source, "target": target}
    self.record = {"checkpoint": checkpoint, "revision": encoder.revision, "model": encoder.name,
                   "dim": encoder.dim, "quantized": encoder.quantized,
                   "source": source.path, "target": target.path,
                   "source_sentences": source.kept, "target_sentences": target.kept,
                   "source_lang": settings.source_lang, "target_lang": settings.target_lang,
                   "k": settings.k, "shard_size": settings.shard_size}
    # several processes (jax.distributed): shard i is process i % count's
    self.process, self.processes = jax.process_index(), jax.process_count()

  def mine(self, i: int) -> bool:
    return i % self.processes == self.process

  def open(self):
    """Creates WORK_DIR or checks that it was made by this job (process 0 writes)."""
    f = self.dir / JOB_FILE
    if self.process == 0:
      self.dir.mkdir(parents=True, exist_ok=True)
      storage.remove_leftovers(self.dir)
      if not f.exists():
        storage.write_atomic(f, json.dumps(self.record, indent=1))
    _barrier("vmx.mine.open")
    self.check()

  def check(self):
    """WORK_DIR's record is this job's, or an error saying what differs."""
    old = json.loads((self.dir / JOB_FILE).read_text())
    diff = sorted(k for k in self.record if old.get(k) != self.record[k])
    if diff:
      what = ", ".join(f"{k}: {old.get(k)!r} there, {self.record[k]!r} now" for k in diff)
      raise InputError(f"{self.dir} holds another mining job ({what}); pass another "
                       "--work_dir or remove it")

  # --- stage 2: embeddings in shards ---

  def shard_path(self, side: str, i: int):
    return self.dir / side / f"{i:05d}.npy"

  def embed(self, side: str, lang: Optional[str]):
    """Encodes this process's shards of the side that are not yet on disk."""
    corpus = self.corpora[side]
    (self.dir / side).mkdir(parents=True, exist_ok=True)
    storage.remove_leftovers(self.dir / side)
    done, t0 = 0, time.time()
    for i, lines in corpus.shard_lines():
      if self.mine(i) and self.embed_shard(side, i, lines, lang):
        done += len(lines)
        log(f"embedded {side} shard {i + 1}/{corpus.shards} ({len(lines):,} sentences; "
            f"{done / max(time.time() - t0, 1e-9):,.0f}/s)")

  def embedded(self, side: str, i: int) -> bool:
    return (self.shard_path(side, i).with_suffix(".json").exists()
            and self.shard_path(side, i).exists())

  def embed_shard(self, side: str, i: int, lines: list, lang: Optional[str]) -> bool:
    """Encodes shard i of the side (its kept `lines`) unless it is on disk; True if it
    encoded. A shard on disk with other lines is an error naming it."""
    corpus = self.corpora[side]
    rec = {"sentences": len(lines), "sha256": _digest(lines), "revision": self.encoder.revision}
    meta = self.shard_path(side, i).with_suffix(".json")
    if self.embedded(side, i):
      old = json.loads(meta.read_text())
      if old.get("sha256") != rec["sha256"] or old.get("sentences") != rec["sentences"]:
        raise InputError(f"{self.shard_path(side, i)} holds other sentences than shard {i} "
                         f"of {corpus.path} (the corpus changed?): pass another --work_dir")
      return False
    with signals.activity(f"embedding {side} shard {i + 1}/{corpus.shards}"):
      emb, cut = self.encoder.encode_counting(lines, lang=lang, progress=False,
                                              batch_size=self.settings.batch_size)
      buf = io.BytesIO()
      np.save(buf, np.ascontiguousarray(emb, np.float32))
      storage.write_atomic(self.shard_path(side, i), buf.getvalue())
      storage.write_atomic(meta, json.dumps({**rec, "truncated": int(cut),
                                             "dim": int(emb.shape[1])}))
    return True

  def truncated(self, side: str) -> int:
    """Sentences of the side truncated to the model's max_length (the shards' records)."""
    return sum(json.loads(self.shard_path(side, i).with_suffix(".json").read_text())
               ["truncated"] for i in range(self.corpora[side].shards))

  def vectors(self, side: str, i: int) -> np.ndarray:
    return np.load(io.BytesIO(self.shard_path(side, i).read_bytes()))

  # --- stage 3: neighbour lists ---

  def knn(self, tile_topk: Optional[Callable] = None):
    """This process's source shards' forward lists, and its running backward lists
    (knn/bwd_P_of_N.npz: the lists over the source shards it has done, and which)."""
    tile_topk = tile_topk or _tile_topk
    k, src, tgt = self.settings.k, self.corpora["source"], self.corpora["target"]
    d = self.dir / "knn"
    state, done, bwd_v, bwd_i = self.backward_state()
    mine = [i for i in range(src.shards) if self.mine(i)]
    if done:
      log(f"knn: {len(done)}/{len(mine)} source shards done before, continuing")
    t0, n = time.time(), 0
    for i in (i for i in mine if i not in done):
      with signals.activity(f"finding neighbours of source shard {i + 1}/{src.shards}"):

        def backward(rows, col_v, col_i):     # target rows' lists over source shard i
          bwd_v[rows], bwd_i[rows] = merge_lists(bwd_v[rows], bwd_i[rows], col_v, col_i, k)

        fwd_v, fwd_i = self.search_shard(i, backward, tile_topk)
        save_arrays(d / f"fwd_{i:05d}.npz", vals=fwd_v, idx=fwd_i)
        done.add(i)
        save_arrays(state, shards=np.array(sorted(done), np.int64), vals=bwd_v, idx=bwd_i)
      n += len(fwd_v)
      log(f"knn: source shard {i + 1}/{src.shards} against {tgt.shards} target shard(s) "
          f"({n / max(time.time() - t0, 1e-9):,.0f} source sentences/s)")

  def backward_state(self):
    """(its file, the source shards done, vals, idx): this process's running backward
    lists (knn/bwd_P_of_N.npz), empty when none was saved. Lists of another number of
    processes are an error."""
    d = self.dir / "knn"
    d.mkdir(parents=True, exist_ok=True)
    storage.remove_leftovers(d)
    others = sorted(f.name for f in d.glob("bwd_*.npz")
                    if not f.name.endswith(f"_of_{self.processes}.npz"))
    if others:
      raise InputError(f"{d} holds neighbour lists of a job run by another number of "
                       f"processes ({others[0]}): rerun with that number, or another "
                       "--work_dir")
    state = d / f"bwd_{self.process}_of_{self.processes}.npz"
    if state.exists():
      z = load_arrays(state)
      return state, set(z["shards"].tolist()), z["vals"], z["idx"]
    n, k = self.corpora["target"].kept, self.settings.k
    return (state, set(), np.full((n, k), -np.inf, np.float32),
            np.full((n, k), -1, np.int64))

  def search_shard(self, i: int, backward: Callable, tile_topk: Optional[Callable] = None):
    """Source shard i against every target shard, in order: returns its forward lists
    (global target ids) and gives each target shard's lists over shard i to
    `backward(rows, vals, idx)` (a slice of the targets; global source ids)."""
    tile_topk = tile_topk or _tile_topk
    k = self.settings.k
    x = self.vectors("source", i)
    x0 = i * self.settings.shard_size
    fwd_v = np.full((len(x), k), -np.inf, np.float32)
    fwd_i = np.full((len(x), k), -1, np.int64)
    for j in range(self.corpora["target"].shards):
      y = self.vectors("target", j)
      y0 = j * self.settings.shard_size
      nn = tile_topk(x, y, min(k, len(x), len(y)))
      fwd_v, fwd_i = merge_lists(fwd_v, fwd_i, nn.row_vals, nn.row_idx + y0, k)
      backward(slice(y0, y0 + len(y)), nn.col_vals, nn.col_idx + x0)
    return fwd_v, fwd_i

  def lists(self) -> knn_lib.TopK:
    """Every process's lists as one TopK (the backward lists merged in process order)."""
    d = self.dir / "knn"
    fwd = [load_arrays(d / f"fwd_{i:05d}.npz") for i in range(self.corpora["source"].shards)]
    bwd_v = bwd_i = None
    for p in range(self.processes):
      z = load_arrays(d / f"bwd_{p}_of_{self.processes}.npz")
      bwd_v, bwd_i = ((z["vals"], z["idx"]) if bwd_v is None else
                      merge_lists(bwd_v, bwd_i, z["vals"], z["idx"], self.settings.k))
    return knn_lib.TopK(np.concatenate([f["vals"] for f in fwd]),
                        np.concatenate([f["idx"] for f in fwd]), bwd_v, bwd_i)


class Engine(Protocol):
  """Where stages 2 and 3 run: `LocalEngine` (this process and its jax.distributed peers)
  or vmx/bitext_beam.py's `BeamEngine` (Beam workers). Either leaves the same files."""

  def embed(self, job: Job) -> None: ...

  def knn(self, job: Job) -> None: ...


class LocalEngine:
  """Stages 2 and 3 here: each process its shards (i % processes), then a barrier."""

  def embed(self, job: Job):
    for side, lang in (("source", job.settings.source_lang),
                       ("target", job.settings.target_lang)):
      with signals.activity(f"embedding the {side} corpus"):   # (between shards)
        job.embed(side, lang)
    _barrier("vmx.mine.embedded")

  def knn(self, job: Job):
    with signals.activity("finding neighbours"):
      job.knn()
    _barrier("vmx.mine.searched")


def _barrier(name: str):
  """Every process waits here for the others (one process: nothing)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def _tile_topk(x, y, k) -> knn_lib.TopK:
  import jax  # (the caller has started jax)
  return knn_lib.topk(x, y, k=k, devices=jax.local_devices())


def merge_lists(v1, i1, v2, i2, k):
  """The k best of two [R, *] candidate lists per row, best first (the first list wins
  ties: the merge order is the shards' order)."""
  v = np.concatenate([v1, v2], axis=1)
  i = np.concatenate([i1, i2], axis=1)
  order = np.argsort(-v, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(v, order, axis=1), np.take_along_axis(i, order, axis=1)


def select(nn: knn_lib.TopK, settings: Settings):
  """(source index, target index, score) of the mined pairs, best first: the margin, the
  retrieval, then the threshold and the top N."""
  src, tgt, score = mining.best_pairs(mining.score_candidates(nn, MARGINS[settings.margin]),
                                      settings.retrieval)
  if settings.threshold is not None:
    keep = score >= settings.threshold
    src, tgt, score = src[keep], tgt[keep], score[keep]
  if settings.top_n is not None:
    src, tgt, score = src[:settings.top_n], tgt[:settings.top_n], score[:settings.top_n]
  return src, tgt, score


def check_output(output: str, overwrite: bool):
  """OUTPUT's path; an existing OUTPUT is refused unless `overwrite`."""
  out = storage.path(output)
  if out.exists() and not overwrite:
    raise InputError(f"{output} exists: pass --overwrite to replace it")
  return out


def mine(encoder, checkpoint: str, source: str, target: str, output: str, work_dir: str,
         settings: Settings, overwrite: bool = False, engine: Optional[Engine] = None) -> dict:
  """Runs (or continues) a mining job with `encoder` (`checkpoint` names it in the job's
  record); returns its summary (also OUTPUT.json, written before OUTPUT: a job is done
  once OUTPUT exists). Stages 2 and 3 run on `engine` (default `LocalEngine`: several
  processes, jax.distributed, share the shards); process 0 scores and writes, and
  returns the summary (the others None)."""
  engine = engine or LocalEngine()
  settings.check()
  out = check_output(output, overwrite)
  t0 = time.time()
  stages = {}
  with signals.activity("reading the corpora"):
    corpora = {"source": Corpus(source, settings.shard_size),
               "target": Corpus(target, settings.shard_size)}
  for side, c in corpora.items():
    log(f"{side}: {c.path}: {c.kept:,} sentences in {c.shards} shard(s)"
        + (f", {c.empty:,} empty line(s) skipped" if c.empty else ""))
  smaller = min(c.kept for c in corpora.values())
  if settings.k > smaller:
    raise InputError(f"k={settings.k} is more than the {smaller} sentences of the smaller "
                     "corpus")
  job = Job(work_dir, encoder, checkpoint, corpora["source"], corpora["target"], settings)
  job.open()
  signals.saved(f"finished shards and neighbour lists are kept in {job.dir}; rerun the "
                "same command to continue")
  stages["scan"] = time.time() - t0
  engine.embed(job)
  stages["embed"] = time.time() - t0 - sum(stages.values())
  engine.knn(job)
  stages["knn"] = time.time() - t0 - sum(stages.values())
  if job.process != 0:                 # process 0 scores and writes
    _barrier("vmx.mine.done")
    return None
  with contextlib.ExitStack() as stack:
    with signals.activity("scoring the pairs"):
      src, tgt, score = select(job.lists(), settings)
      truncated = {side: job.truncated(side) for side in SIDES}
      spill = stack.enter_context(tempfile.TemporaryDirectory(prefix="vmx-mine-"))
      texts = {}
      for side, idx in (("source", src), ("target", tgt)):   # one pass over each corpus
        texts[side] = Texts(corpora[side], idx, os.path.join(spill, side))
        stack.callback(texts[side].close)
    summary = {"output": str(out), "pairs": len(score), "work_dir": str(job.dir),
               **{f"{side}_sentences": c.kept for side, c in corpora.items()},
               **{f"{side}_empty_lines_skipped": c.empty for side, c in corpora.items()},
               **{f"{side}_truncated": n for side, n in truncated.items()},
               "checkpoint": checkpoint, "revision": encoder.revision,
               **{k: v for k, v in dataclasses.asdict(settings).items() if k != "batch_size"},
               "score_quantiles": ({q: float(np.quantile(score, float(q))) for q in
                                    ("0.0", "0.1", "0.5", "0.9", "1.0")} if len(score) else {}),
               "seconds": round(time.time() - t0, 1),
               "stage_seconds": {k: round(v, 2) for k, v in stages.items()}}
    storage.write_atomic(str(out) + ".json", json.dumps(summary, indent=1))
    # OUTPUT last (a job is done once it exists), a shard's worth of pairs at a time; a
    # signal while writing stops before the rename (the activity is inside the file's)
    with storage.open_atomic(out) as f, signals.activity("writing the pairs"):
      for a in range(0, len(score), settings.shard_size):
        b = a + settings.shard_size
        f.write("".join(f"{v:.6f}\t{x}\t{y}\n" for v, x, y in zip(
            score[a:b].tolist(), texts["source"].chunk(a, b), texts["target"].chunk(a, b))))
  _barrier("vmx.mine.done")
  return summary
