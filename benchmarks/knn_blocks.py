#!/usr/bin/env python
r"""The kNN kernel's block sizes on this machine's devices: one N x M search of random unit
vectors (a mining job's shard pair) timed for each setting, its neighbours checked against
the first setting's.

  python benchmarks/knn_blocks.py --n=100000 --dim=128 \
      --settings 8192x2048x16x32 8192x2048x16x1 1024x2048x16x1 fused

A setting is block_rows x block_cols x group x chunk_tiles of the XLA pass
(vmx/evaluation/knn.py's `bidirectional_topk`, kernel="xla"; the defaults: the
accelerators' blocks merging every 32 tiles and every tile, and CPU's), or `fused`: the
fused C kernel (vmx/evaluation/knn_cpu.py; a CPU with AVX2, where it is the default). Prints one JSON line: per setting the best of --reps searches
(the first call compiles and is not timed) and whether its lists equal the first's.
Figures: docs/performance.md, "Mining at scale".
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--n", type=int, default=100_000, help="rows a side")
  p.add_argument("--dim", type=int, default=128)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--settings", nargs="+", default=["8192x2048x16x32", "8192x2048x16x1",
                                                   "1024x2048x16x1"])
  args = p.parse_args(argv)
  settings = []
  for s in args.settings:
    if s == "fused":
      settings.append((s, dict(kernel="fused")))
      continue
    try:
      br, bc, g, ct = (int(v) for v in s.split("x"))
    except ValueError:
      p.error(f"--settings {s!r}: expected ROWSxCOLSxGROUPxCHUNK, e.g. 1024x2048x16x32")
    settings.append((s, dict(block_rows=br, block_cols=bc, group=g, chunk_tiles=ct,
                             kernel="xla")))
  import jax
  import numpy as np
  from vmx.evaluation import knn, mining
  rng = np.random.default_rng(0)
  x, y = (mining.normalize(rng.standard_normal((args.n, args.dim), dtype=np.float32))
          for _ in range(2))
  out = {"backend": f"{jax.default_backend()} ({jax.devices()[0].device_kind})",
         "n": args.n, "dim": args.dim, "k": args.k, "settings": {}}
  first = None
  for name, kw in settings:
    try:
      r = knn.bidirectional_topk(x, y, args.k, devices=jax.local_devices(), **kw)  # compiles
      best = float("inf")
      for _ in range(args.reps):
        t = time.perf_counter()
        r = knn.bidirectional_topk(x, y, args.k, devices=jax.local_devices(), **kw)
        best = min(best, time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001  (one setting's failure, e.g. out of memory)
      out["settings"][name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
      continue
    first = first or r
    same = all(np.array_equal(a, b) for a, b in zip((r.row_idx, r.col_idx),
                                                    (first.row_idx, first.col_idx)))
    out["settings"][name] = {"seconds": round(best, 4),
                             "pairs_per_s": args.n * args.n / best,
                             "same_lists_as_first": same}
    print(f"[knn_blocks] {name}: {out['settings'][name]}", flush=True)
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1:])
