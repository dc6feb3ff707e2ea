"""The exact kNN both ways on a CPU from a fused kernel (`_knn_cpu.c`): the same contract
as `knn.bidirectional_topk`, without materializing or re-reading the similarity matrix.

Each 6 x 16 block of inner products is checked, in registers, against the k-th best of its
rows and columns; the rare block that beats one is inserted into the lists. Rows are split
in chunks over `threads` worker threads (the C call releases the GIL); each worker keeps
its own column lists, merged at the end.

Deterministic whatever the threads: every score is computed the same way in any chunk,
and ties go to the lower index (a list keeps the first of equal scores it meets, and the
workers' column lists are merged by score, then index). A resumed mining job rewrites the
same bytes.

The library is built by setup.py (an optional extension: without a C compiler, or on a
CPU without AVX2 and FMA, `available()` is False and knn.py uses its XLA kernel).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import glob
import os
import threading

import numpy as np
from tqdm.auto import tqdm

NR = 16             # columns a micro-kernel block (_knn_cpu.c's NR: its packed layout)
CHUNK_ROWS = 960    # rows a worker takes at a time: small enough to share work evenly


@functools.lru_cache(maxsize=None)
def _lib():
  """The kernel's shared library, or None when it was not built or this CPU lacks AVX2."""
  here = os.path.dirname(os.path.abspath(__file__))
  paths = sorted(glob.glob(os.path.join(here, "_knn_cpu*.so")))
  if not paths:
    return None
  lib = ctypes.CDLL(paths[0])
  if not lib.vmx_knn_supported():
    return None
  p, i64 = ctypes.c_void_p, ctypes.c_int64
  lib.vmx_knn_pack_cols.argtypes = [p, i64, i64, p]
  lib.vmx_knn_pack_cols.restype = None
  lib.vmx_knn_rows.argtypes = [p, i64, i64, i64, p, i64, ctypes.c_int, p, p, p, p, p, p]
  lib.vmx_knn_rows.restype = None
  lib.block_rows = lib.vmx_knn_block_rows()   # the scratch's rows (the C file's MC)
  return lib


def available() -> bool:
  return _lib() is not None


def default_threads() -> int:
  """The CPUs this process may run on (its affinity, e.g. a container's share)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _aligned(n: int) -> np.ndarray:
  """n float32s at a 32-byte boundary (the kernel's aligned AVX loads)."""
  buf = np.empty(n + 8, np.float32)
  start = (-buf.ctypes.data % 32) // 4
  return buf[start:start + n]


def bidirectional_topk(x_NxD, y_MxD, k: int = 4, threads: int | None = None,
                       progress: bool = False):
  """x→y and y→x top-k by inner product, best first, ties to the lower index: (row_vals,
  row_idx) [N, k] and (col_vals, col_idx) [M, k], knn.TopK's fields."""
  lib = _lib()
  if lib is None:
    raise RuntimeError("vmx/evaluation/_knn_cpu was not built, or this CPU lacks AVX2/FMA "
                       "(reinstall with a C compiler: pip install -e .)")
  x = np.ascontiguousarray(x_NxD, np.float32)
  y = np.ascontiguousarray(y_MxD, np.float32)
  if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
    raise ValueError(f"need [N, D] and [M, D] arrays, got {x.shape} and {y.shape}")
  (N, D), M = x.shape, len(y)
  if k < 1 or k > min(N, M):
    raise ValueError(f"k={k} must be in [1, min(N, M)] for {N} x {M} vectors")
  if max(N, M) >= 2**31:
    raise ValueError(f"{N} x {M} vectors: the kernel's ids are int32 (search in shards)")
  panels = -(-M // NR)
  yp = _aligned(panels * D * NR)
  lib.vmx_knn_pack_cols(y.ctypes.data, M, D, yp.ctypes.data)
  row_v = np.full((N, k), -np.inf, np.float32)
  row_i = np.zeros((N, k), np.int32)
  local, states = threading.local(), []

  def work(r0: int) -> int:
    if not hasattr(local, "col_v"):     # this worker's column lists, made once
      local.col_v = np.full((M, k), -np.inf, np.float32)
      local.col_i = np.zeros((M, k), np.int32)
      local.thr = np.full(panels * NR, np.inf, np.float32)
      local.thr[:M] = -np.inf
      local.apack = _aligned(lib.block_rows * D)
      states.append((local.col_v, local.col_i))
    r1 = min(N, r0 + CHUNK_ROWS)
    lib.vmx_knn_rows(x.ctypes.data, r0, r1, D, yp.ctypes.data, M, k,
                     row_v[r0:].ctypes.data, row_i[r0:].ctypes.data,
                     local.col_v.ctypes.data, local.col_i.ctypes.data,
                     local.thr.ctypes.data, local.apack.ctypes.data)
    return r1 - r0

  threads = max(1, min(threads or default_threads(), -(-N // CHUNK_ROWS)))
  bar = tqdm(total=N, desc=f"knn {N}x{M}", unit="row", disable=not progress)
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for done in pool.map(work, range(0, N, CHUNK_ROWS)):
      bar.update(done)
  bar.close()
  col_v = np.concatenate([s[0] for s in states], 1)
  col_i = np.concatenate([s[1] for s in states], 1)
  if len(states) > 1:    # best score first, then the lower index
    order = np.lexsort((col_i, -col_v), axis=1)[:, :k]
    col_v, col_i = np.take_along_axis(col_v, order, 1), np.take_along_axis(col_i, order, 1)
  return row_v, row_i, col_v, col_i
