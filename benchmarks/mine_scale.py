#!/usr/bin/env python
r"""The mining job at scale: N x N sentences through launch/mine.py's stages, each timed,
the job's peak memory, faiss on the same vectors, and an estimate for larger corpora.

  python benchmarks/mine_scale.py --checkpoint_dir=DIR --n=100000 [--faiss]
  python benchmarks/mine_scale.py --checkpoint_dir=DIR --n=1000000 --faiss \
      --faiss_queries=50000

Sentences are made up (6-20 words of a 2,000-word list, numbered: no two alike), so the
cost is the encoder's and the search's, not the data's. The job runs in this process
(vmx/bitext.py, shards of --shard_size); `--faiss` then searches the job's own vectors
with faiss both ways (two searches, as LASER's mine_bitexts): `IndexFlatIP` (exact; top-1
agreement with the job's) and `IndexIVFFlat` (approximate; its top-1 recall against the
exact neighbours). `--faiss_queries` searches a sample of the queries and scales the time
(a 10^6 x 10^6 flat search would take faiss as long as the job). `--exact_sample` checks
the job's top-1 against NumPy's exact search where faiss is not installed (a GPU image).
`--n_source` runs a slice of the N x N job (fewer sources against all N targets) and
scales the search to N x N. The estimate scales the measured stages: scan, embed and score
linearly in N, the search as N^2. Prints one JSON line. Figures: docs/performance.md,
"Mining".
"""
import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9   # (KiB on Linux)


def main(argv):
  from vmx import cli
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True)
  p.add_argument("--n", type=int, default=100_000, help="sentences a side")
  p.add_argument("--n_source", type=int, default=None,
                 help="embed and search only this many source sentences against the N "
                      "targets, and scale the search's and faiss's times to N x N (each "
                      "source costs the same; the search's compilation and per-shard host "
                      "work are scaled too, so it errs long); no --estimate; default N")
  p.add_argument("--shard_size", type=int, default=100_000)
  p.add_argument("--faiss", action="store_true",
                 help="also faiss IndexFlatIP and IndexIVFFlat on the same vectors (faiss-cpu)")
  p.add_argument("--faiss_queries", type=int, default=None,
                 help="faiss searches this many queries a side and its time is scaled to N "
                      "(a flat search costs the same per query); default all N")
  p.add_argument("--ivf_lists", type=int, default=None,
                 help="IndexIVFFlat's lists (default 4 sqrt(N)), trained on 40 a list")
  p.add_argument("--ivf_probe", type=int, default=16, help="lists an IVF search visits")
  p.add_argument("--exact_sample", type=int, default=None,
                 help="check the job's forward top-1 of the first Q sources against NumPy's "
                      "exact search over every target (no faiss needed)")
  p.add_argument("--work_dir", default=None,
                 help="keep the corpora (DIR/source, DIR/target), the job's files (DIR/work) "
                      "and DIR/out.tsv there: a stopped run continues when rerun with the "
                      "same flags (its stage times are then the rerun's); default a "
                      "temporary directory")
  p.add_argument("--estimate", type=int, nargs="*", default=[1_000_000, 10_000_000])
  args = p.parse_args(argv)
  sampling = {"--faiss_queries": args.faiss_queries, "--ivf_lists": args.ivf_lists,
              "--ivf_probe": args.ivf_probe, "--exact_sample": args.exact_sample,
              "--n_source": args.n_source}
  for flag, value in sampling.items():
    if value is not None and value < 1:
      p.error(f"{flag}={value}: expected at least 1")
  if not args.faiss and (args.faiss_queries or args.ivf_lists):
    p.error("--faiss_queries / --ivf_lists: set --faiss too")
  args.n_source = min(args.n_source or args.n, args.n)
  import numpy as np
  from vmx import bitext
  from vmx.inference import Encoder
  enc = Encoder.from_checkpoint(args.checkpoint_dir, batch_size=256)
  enc.encode(["warm up"], lang=enc.languages[0] if enc.languages else None)
  base_rss = _rss_gb()
  rng = np.random.default_rng(0)
  words = np.array([f"w{i}" for i in range(2000)])
  lang = {"source": None, "target": None}
  if enc.languages:
    lang = {"source": enc.languages[0], "target": enc.languages[-1]}
  with (contextlib.nullcontext(args.work_dir) if args.work_dir
        else tempfile.TemporaryDirectory()) as d:
    os.makedirs(d, exist_ok=True)
    sides = (("source", args.n_source), ("target", args.n))
    if not all(os.path.exists(os.path.join(d, side)) for side, _ in sides):
      for side, n in sides:       # (kept ones are reused: the job checks its shards' lines)
        with open(os.path.join(d, side), "w") as f:
          for i in range(n):
            f.write(" ".join(rng.choice(words, rng.integers(6, 21))) + f" {side[0]}{i}\n")
    t0 = time.time()
    s = bitext.mine(enc, args.checkpoint_dir, os.path.join(d, "source"),
                    os.path.join(d, "target"), os.path.join(d, "out.tsv"),
                    os.path.join(d, "work"), bitext.Settings(
                        retrieval="forward", shard_size=args.shard_size,
                        source_lang=lang["source"], target_lang=lang["target"]),
                    overwrite=True)
    wall = time.time() - t0
    job_rss = _rss_gb()
    stages = dict(s["stage_seconds"])
    stages["score"] = round(wall - sum(stages.values()), 2)     # and write
    scale = args.n / args.n_source
    dim = int(np.load(os.path.join(d, "work", "source", "00000.npy"), mmap_mode="r").shape[1])
    out = {"n": args.n, "n_source": args.n_source, "dim": dim,
           "shard_size": args.shard_size, "checkpoint": args.checkpoint_dir,
           "stage_seconds": stages, "job_seconds": round(wall, 1),
           "peak_rss_gb": round(job_rss, 3), "rss_before_job_gb": round(base_rss, 3),
           "two_float32_matrices_gb": round((args.n_source + args.n) * dim * 4 / 1e9, 3)}
    if scale != 1:
      out["knn_seconds_scaled_to_n_x_n"] = round(stages["knn"] * scale, 1)
    out["backend"] = _backend()
    if args.exact_sample or args.faiss:    # the job's vectors, read once for both checks
      x, y = _load(args, d, "source"), _load(args, d, "target")
      if args.exact_sample:
        out.update(_exact(args, d, x, y))
      if args.faiss:
        out.update(_faiss(args, d, x, y, stages["knn"] * scale))
  if scale != 1:   # the linear stages ran on N_SOURCE + N sentences
    print(json.dumps(out))
    return
  linear = stages["scan"] + stages["embed"] + stages["score"]
  out["estimates_seconds"] = {f"{m:,}": round(linear * m / args.n
                                              + stages["knn"] * (m / args.n) ** 2)
                              for m in args.estimate}
  print(json.dumps(out))


def _backend() -> str:
  import jax
  return f"{jax.default_backend()} ({jax.devices()[0].device_kind}, {jax.device_count()})"


def _load(args, d, side):
  import numpy as np
  shards = -(-(args.n_source if side == "source" else args.n) // args.shard_size)
  return np.concatenate([np.load(os.path.join(d, "work", side, f"{i:05d}.npy"))
                         for i in range(shards)])


def _exact(args, d, x, y) -> dict:
  """The job's forward top-1 of the first Q sources (of its first shard) against NumPy's
  float32 search over every target, from the same products: agreement when the job's
  pick scores the best (a tie agrees), and the largest score the job left above its
  pick."""
  import numpy as np
  z = np.load(os.path.join(d, "work", "knn", "fwd_00000.npz"))
  q = min(args.exact_sample, len(z["idx"]))
  pick = z["idx"][:q, 0]
  best = np.full(q, -np.inf, np.float32)
  job = np.full(q, -np.inf, np.float32)
  for a in range(0, len(y), 100_000):      # [Q, 100,000] products at a time
    s = x[:q] @ y[a:a + 100_000].T
    best = np.maximum(best, s.max(axis=1))
    rows = np.nonzero((pick >= a) & (pick < a + len(s[0])))[0]
    job[rows] = s[rows, pick[rows] - a]
  return {"exact_sample": q,
          "exact_top1_agreement": float(np.mean(job >= best)),
          "exact_top1_max_score_gap": float(np.max(best - job))}


def _faiss(args, d, x, y, knn_seconds) -> dict:
  """faiss on the job's own vectors, both ways (two searches, as LASER's mine_bitexts):
  IndexFlatIP (exact) and IndexIVFFlat (approximate: its top-1 recall against vmx's
  exact neighbours). With --faiss_queries=Q, each side's first Q queries (the made-up
  sentences are in no order) are searched and the time scaled by N / Q (IVF's training
  and adding are counted whole). With --n_source below N, only the forward search runs
  (sources against an index of the N targets) and counts twice: at N x N the backward
  search is the same work."""
  import faiss
  import numpy as np
  dim = x.shape[1]
  fwd = np.concatenate([np.load(os.path.join(d, "work", "knn", f"fwd_{i:05d}.npz"))["idx"]
                        for i in range(-(-args.n_source // args.shard_size))])
  both = args.n_source == args.n
  q = min(args.faiss_queries or args.n_source, args.n_source)
  scale = args.n / q
  out = {"faiss_threads": faiss.omp_get_max_threads(), "faiss_queries_a_side": q,
         "faiss_directions_run": 2 if both else 1}
  t = time.perf_counter()
  ix, iy = faiss.IndexFlatIP(dim), faiss.IndexFlatIP(dim)
  iy.add(y)
  if both:
    ix.add(x)
  added = time.perf_counter() - t
  t = time.perf_counter()
  _, fi = iy.search(x[:q], 4)
  if both:
    ix.search(y[:q], 4)
  flat = added + (time.perf_counter() - t) * scale
  out["faiss_flat_ip_seconds"] = round(flat if both else 2 * flat, 2)
  out["top1_agreement_with_faiss"] = float(np.mean(fwd[:q, 0] == fi[:, 0]))
  out["knn_speedup_over_faiss"] = round(out["faiss_flat_ip_seconds"] / knn_seconds, 2)
  del ix, iy
  lists = args.ivf_lists or int(4 * np.sqrt(args.n))
  t = time.perf_counter()
  ivf = []
  for base in ((y, x) if both else (y,)):
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
    index.train(base[np.random.default_rng(0).permutation(len(base))[:40 * lists]])
    index.add(base)
    index.nprobe = args.ivf_probe
    ivf.append(index)
  built = time.perf_counter() - t
  t = time.perf_counter()
  _, vi = ivf[0].search(x[:q], 4)
  if both:
    ivf[1].search(y[:q], 4)
  searched = built + (time.perf_counter() - t) * scale
  out.update({"faiss_ivf_seconds": round(searched if both else 2 * searched, 2),
              "faiss_ivf_lists": lists, "faiss_ivf_probe": args.ivf_probe,
              "faiss_ivf_top1_recall": float(np.mean(fwd[:q, 0] == vi[:, 0]))})
  return out


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main, host_malloc="off")   # memory, not step speed (vmx/cli.py)
