#!/usr/bin/env python
"""Bidirectional k-NN margin scoring: vmx's blocked one-pass search vs faiss-cpu.

  pip install faiss-cpu   # or: pip install -e '.[bench]'
  python benchmarks/mining_throughput.py --n=50000 --dim=512

Both sides get the same random L2-normalized vectors (x: n, y: n) and compute
the k nearest neighbours in both directions plus ratio-margin scores of every
candidate (`vmx.evaluation.mining.score_candidates`). faiss: two exact
`IndexFlatIP` searches (x in y, y in x). vmx: `knn.bidirectional_topk` (one pass
over similarity tiles; `--kernel`, default `knn.default_kernel()`: the fused C kernel on a
CPU with AVX2, else the XLA pass over all devices). vmx is timed warm (after one run of the same
shape) and cold (including compilation). Prints one JSON line; `ratio` is faiss
time / vmx warm time. Results must agree (index agreement is printed).
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--n", type=int, default=50000)
  p.add_argument("--m", type=int, default=None, help="targets (default: n)")
  p.add_argument("--dim", type=int, default=512)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--block_rows", type=int, default=None,
                 help="rows a block a device (default: the kernel's, 1,024 on CPU, 8,192 on "
                      "an accelerator)")
  p.add_argument("--block_cols", type=int, default=2048)
  p.add_argument("--kernel", choices=["xla", "fused"], default=None,
                 help="knn.bidirectional_topk's kernel (default: knn.default_kernel())")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--skip_faiss", action="store_true")
  args = p.parse_args()
  import jax
  import numpy as np
  from vmx.evaluation import knn, mining

  rng = np.random.default_rng(args.seed)
  m = args.m or args.n
  x = mining.normalize(rng.standard_normal((args.n, args.dim), dtype=np.float32))
  y = mining.normalize(rng.standard_normal((m, args.dim), dtype=np.float32))
  kernel = args.kernel or knn.default_kernel()
  kw = dict(k=args.k, block_rows=args.block_rows, block_cols=args.block_cols, kernel=kernel)
  rows = args.block_rows or knn.default_block_rows()

  def run_vmx():
    t = time.perf_counter()
    nn = knn.bidirectional_topk(x, y, **kw)
    mining.score_candidates(nn, "ratio")
    return time.perf_counter() - t, nn

  vmx_cold, _ = run_vmx()
  vmx_warm, nn = run_vmx()
  out = {"n": args.n, "m": m, "dim": args.dim, "k": args.k, "devices": jax.device_count(),
         "backend": jax.default_backend(), "kernel": kernel, "vmx_s": round(vmx_warm, 3),
         "vmx_cold_s": round(vmx_cold, 3)}
  if kernel == "xla":
    out["tile_mib"] = round(rows * args.block_cols * 4 / 2**20, 1)
  if not args.skip_faiss:
    import faiss
    t = time.perf_counter()
    iy = faiss.IndexFlatIP(args.dim)
    iy.add(y)
    d_xy, i_xy = iy.search(x, args.k)
    ix = faiss.IndexFlatIP(args.dim)
    ix.add(x)
    d_yx, i_yx = ix.search(y, args.k)
    mining.score_candidates(knn.TopK(d_xy, i_xy, d_yx, i_yx), "ratio")
    faiss_s = time.perf_counter() - t
    out.update(faiss_s=round(faiss_s, 3), faiss_threads=faiss.omp_get_max_threads(),
               ratio=round(faiss_s / vmx_warm, 3), ratio_cold=round(faiss_s / vmx_cold, 3),
               agree_x2y=float(np.mean(nn.row_idx == i_xy)),
               agree_y2x=float(np.mean(nn.col_idx == i_yx)),
               max_abs_diff=float(max(np.abs(nn.row_vals - d_xy).max(),
                                      np.abs(nn.col_vals - d_yx).max())))
  out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
  print(json.dumps(out), flush=True)


if __name__ == "__main__":
  main()
