"""Exact k-nearest-neighbour search in both directions from one blocked, sharded pass.

`bidirectional_topk(x_NxD, y_MxD, k)` returns, for every row of x, its k most
similar rows of y (inner product; cosine for L2-normalized rows) AND, for every
row of y, its k most similar rows of x. The N x M similarity matrix is computed
once, tile by tile, and never materialized.

Why it is cheap: a full top-k over every tile costs as much as the matmul on
CPU, so each tile is reduced to GROUP MAXIMA only (the max over `group`
consecutive columns, and over `group` consecutive rows; one cheap reduction
each). The exact k nearest neighbours of a row lie inside the k groups with the
largest maxima (any top-k entry's group has a maximum >= the k-th best value,
and at most k groups can), so the pass keeps, per row, the top-k groups of y and,
per column, the top-k groups of x, and rescores only those k * group
candidates with exact dot products.

The top-k groups are kept as running lists, merged every `chunk_tiles` tiles: the
chunk's group maxima are reduced to their best pow2(k) both ways by a tournament of
bitonic merges (`_top_lists`), elementwise over the long axis, so it vectorizes. On CPU
a chunk is one tile, whose candidates merge while they are in cache: the pass is 8-11 %
faster than with XLA:CPU's `lax.top_k` merging 32 tiles' candidates, and ~25 % faster
than the same tournament over 32 tiles (docs/performance.md, "The kernel's merges").

On a CPU with AVX2, `default_kernel` is instead knn_cpu's fused C kernel, which checks
every score against the k-th best of its row and column while it is still in registers:
no group maxima, no rescoring (docs/performance.md, "A fused kernel on CPU").

Sharding: x is split by rows over a 1-D mesh of all devices (`shard_map`); y is
replicated and scanned in column tiles of `block_cols`, grouped in chunks of
`chunk_tiles` tiles. Each device's row block is `block_rows` rows. Per-device memory
beyond the inputs: one [block_rows, block_cols] tile, the group maxima of one chunk
(2 x block_rows x chunk_tiles x block_cols / group floats) and the [M, pow2(k)] running
column lists (the output's size). Column lists are merged across devices at the end.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from vmx.evaluation import knn_cpu

NEG = -jnp.inf
# float32 products at full precision: a GPU's default may take TF32 and a TPU's bf16
# passes, and either can change which neighbours an exact search returns (the cost of
# HIGHEST on a TPU is not measured; on CPU it is nothing)
EXACT = jax.lax.Precision.HIGHEST


class TopK(NamedTuple):
  """x→y: row_vals/row_idx [N, k]; y→x: col_vals/col_idx [M, k]; best first."""
  row_vals: np.ndarray
  row_idx: np.ndarray
  col_vals: np.ndarray
  col_idx: np.ndarray


def _mesh(devices=None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  return Mesh(np.array(devices), ("rows",), axis_types=(AxisType.Auto,))


def _on_cpu(devices=None) -> bool:
  return (list(devices) if devices is not None else jax.devices())[0].platform == "cpu"


def default_block_rows(devices=None) -> int:
  """`bidirectional_topk`'s rows a block a device: 1,024 on CPU; 8,192 on an accelerator,
  where on an H200 a block of 1,024 rows left the device a third idle
  (benchmarks/knn_blocks.py: 0.46 s against 0.32 s for 10^5 x 10^5, the same lists; a
  TPU's best is not measured)."""
  return 1024 if _on_cpu(devices) else 8192


def default_chunk_tiles(devices=None) -> int:
  """`bidirectional_topk`'s tiles a merge: 1 on CPU, where a tile's candidates merge while
  they are in cache (measured); 32 on an accelerator, where each merge is a few kernel
  launches, the cadence measured there with `lax.top_k` (the tournament is not measured
  on an accelerator yet: benchmarks/knn_blocks.py)."""
  return 1 if _on_cpu(devices) else 32


def _round_up(n, m):
  return -(-n // m) * m


def _pow2(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _exchange(v, i, d):
  """Compare-exchange along axis 1 of [p, m, w] lists at distance d: in every block of 2d
  positions, position j gets the larger of (j, j + d) and j + d the smaller. Elementwise
  over w, the long minor axis, so it vectorizes."""
  p, m, w = v.shape
  v = v.reshape(p, m // (2 * d), 2, d, w)
  i = i.reshape(p, m // (2 * d), 2, d, w)
  a, b, ia, ib = v[:, :, 0], v[:, :, 1], i[:, :, 0], i[:, :, 1]
  c = a >= b
  v = jnp.stack([jnp.where(c, a, b), jnp.where(c, b, a)], 2).reshape(p, m, w)
  i = jnp.stack([jnp.where(c, ia, ib), jnp.where(c, ib, ia)], 2).reshape(p, m, w)
  return v, i


def _merge_sorted(va, ia, vb, ib, keep):
  """The best `keep` of two lists sorted best first along axis 1 ([p, m, w] each, m a power
  of two; keep is m or 2m), sorted: a bitonic merge."""
  vb, ib = vb[:, ::-1], ib[:, ::-1]
  if keep == 2 * va.shape[1]:
    v, i = jnp.concatenate([va, vb], 1), jnp.concatenate([ia, ib], 1)
  else:   # a's j-th best against b's (m-1-j)-th: the best m of the union, bitonic
    c = va >= vb
    v, i = jnp.where(c, va, vb), jnp.where(c, ia, ib)
  d = v.shape[1] // 2
  while d:
    v, i = _exchange(v, i, d)
    d //= 2
  return v, i


def _top_lists(v_NxW, i_NxW, kk):
  """The best kk (a power of two) of N candidates for each of W columns, sorted best
  first: [kk, W] values and ids. A tournament of merges, each elementwise over W."""
  v, i = v_NxW[:, None], i_NxW[:, None]
  while v.shape[0] > 1:
    if v.shape[0] % 2:
      v = jnp.concatenate([v, jnp.full_like(v[:1], NEG)])
      i = jnp.concatenate([i, jnp.zeros_like(i[:1])])
    n, m = v.shape[:2]
    v, i = v.reshape(n // 2, 2, m, -1), i.reshape(n // 2, 2, m, -1)
    v, i = _merge_sorted(v[:, 0], i[:, 0], v[:, 1], i[:, 1], min(2 * m, kk))
  if v.shape[1] < kk:
    pad = kk - v.shape[1]
    v = jnp.concatenate([v, jnp.full((1, pad, v.shape[2]), NEG, v.dtype)], 1)
    i = jnp.concatenate([i, jnp.zeros((1, pad, i.shape[2]), i.dtype)], 1)
  return v[0], i[0]


def _block_pass(k, group):
  """One device's row block against all of y: group-level top-k both ways.

  y comes as chunks of tiles. Per chunk, the tiles' group maxima are reduced to their
  best kk = pow2(k) both ways (`_top_lists`) and merged into the running lists: the row
  block's [kk, br] (carried through the scan) and the chunk's columns' [kk, T * bc]
  (scanned in and out). Buffers are bounded by the chunk, not by M.

  Padding rows/columns are copies of the last real row/column, so a group that
  mixes real and padding entries has a legitimate maximum (its padding repeats a
  value of its own last real entry); groups made only of padding are masked.
  """
  kk = _pow2(k)

  def f(x_blk, r0, n_valid, y_chunks, c_valid, col_v, col_g):
    # x_blk [br, D]; y_chunks [nch, T, bc, D]; col_v/col_g [nch, kk, T*bc]: running
    # per-column best row-group maxima and their (global) row-group ids.
    br = x_blk.shape[0]
    nch, T, bc = y_chunks.shape[:3]
    width = T * bc
    row_gids = r0 // group + jnp.arange(br // group, dtype=jnp.int32)
    row_ok = (row_gids * group < n_valid)[:, None]

    def tile(_, y_c):
      s = jnp.dot(x_blk, y_c.T, preferred_element_type=jnp.float32, precision=EXACT)
      return None, (s.reshape(br, bc // group, group).max(axis=2).T,   # [bc/g, br]
                    s.reshape(br // group, group, bc).max(axis=1))     # [br/g, bc]

    def chunk(carry, inp):
      rv, rg = carry
      y_ch, c, cv, cg = inp
      _, (row_gm, col_gm) = jax.lax.scan(tile, None, y_ch)
      col_gids = c * (width // group) + jnp.arange(width // group, dtype=jnp.int32)
      row_gm = row_gm.reshape(width // group, br)
      row_gm = jnp.where((col_gids * group < c_valid)[:, None], row_gm, NEG)
      tv, tg = _top_lists(row_gm, jnp.broadcast_to(col_gids[:, None], row_gm.shape), kk)
      rv, rg = _merge_sorted(rv[None], rg[None], tv[None], tg[None], kk)
      col_gm = jnp.moveaxis(col_gm, 0, 1).reshape(br // group, width)
      col_gm = jnp.where(row_ok, col_gm, NEG)
      tv, tg = _top_lists(col_gm, jnp.broadcast_to(row_gids[:, None], col_gm.shape), kk)
      cv, cg = _merge_sorted(cv[None], cg[None], tv[None], tg[None], kk)
      return (rv[0], rg[0]), (cv[0], cg[0])

    init = (jnp.full((kk, br), NEG, jnp.float32), jnp.zeros((kk, br), jnp.int32))
    (_, row_g), (col_v, col_g) = jax.lax.scan(
        chunk, init, (y_chunks, jnp.arange(nch, dtype=jnp.int32), col_v, col_g))
    return row_g[:k].T, col_v, col_g
  return f


@functools.lru_cache(maxsize=16)
def _pass_fn(mesh: Mesh, k: int, group: int):
  body = _block_pass(k, group)

  def per_device(x_blk, r0, n_valid, y_tiles, c_valid, col_v, col_g):
    r0 = r0 + jax.lax.axis_index("rows") * x_blk.shape[0]
    row_g, cv, cg = body(x_blk, r0, n_valid, y_tiles, c_valid, col_v[0], col_g[0])
    return row_g, cv[None], cg[None]

  f = jax.shard_map(per_device, mesh=mesh,
                    in_specs=(P("rows"), P(), P(), P(), P(), P("rows"), P("rows")),
                    out_specs=(P("rows"), P("rows"), P("rows")), check_vma=False)
  return jax.jit(f, donate_argnums=(5, 6))


@functools.lru_cache(maxsize=16)
def _rescore_fn(mesh: Mesh, k: int, group: int, chunk: int):
  """Exact top-k among the k candidate groups of each query row."""
  def per_device(q, base, gid, n_base):
    # q [Q, D]; base [Bp, D] (padded to groups); gid [Q, k] group ids into base.
    groups = base.reshape(-1, group, base.shape[-1])

    def one(args):
      q_c, g_c = args                                                   # [c, D], [c, k]
      cand = groups[g_c].reshape(g_c.shape[0], k * group, -1)          # [c, k*g, D]
      idx = (g_c[:, :, None] * group + jnp.arange(group)).reshape(g_c.shape[0], -1)
      s = jnp.einsum("cd,cjd->cj", q_c, cand, preferred_element_type=jnp.float32,
                     precision=EXACT)
      s = jnp.where(idx < n_base, s, NEG)
      v, pos = jax.lax.top_k(s, k)
      return v, jnp.take_along_axis(idx, pos, axis=1)

    Q = q.shape[0]
    v, i = jax.lax.map(one, (q.reshape(Q // chunk, chunk, -1), gid.reshape(Q // chunk, chunk, k)))
    return v.reshape(Q, k), i.reshape(Q, k)

  f = jax.shard_map(per_device, mesh=mesh, in_specs=(P("rows"), P(), P("rows"), P()),
                    out_specs=(P("rows"), P("rows")), check_vma=False)
  return jax.jit(f)


def _rescore(mesh, q, base, gid, n_base, k, group, chunk=128):
  ndev = mesh.devices.size
  Q = len(q)
  Qp = _round_up(Q, ndev * chunk)
  qp = np.zeros((Qp, q.shape[1]), np.float32)
  qp[:Q] = q
  gp = np.zeros((Qp, k), np.int32)
  gp[:Q] = gid
  Bp = _round_up(len(base), group)
  bp = np.zeros((Bp, base.shape[1]), np.float32)
  bp[:len(base)] = base
  rows, rep = NamedSharding(mesh, P("rows")), NamedSharding(mesh, P())
  v, i = _rescore_fn(mesh, k, group, chunk)(
      jax.device_put(qp, rows), jax.device_put(bp, rep), jax.device_put(gp, rows),
      jax.device_put(np.int32(len(base)), rep))
  return np.asarray(v)[:Q], np.asarray(i)[:Q]


def default_kernel(devices=None) -> str:
  """The kernel `bidirectional_topk` uses: "fused" (knn_cpu's, on all of this process's
  CPU cores) when the devices are CPUs and it was built for this CPU; else "xla" (this
  module's blocked pass, sharded over the devices)."""
  return "fused" if _on_cpu(devices) and knn_cpu.available() else "xla"


def bidirectional_topk(x_NxD, y_MxD, k: int = 4, block_rows: int | None = None,
                       block_cols: int = 2048, group: int = 16,
                       chunk_tiles: int | None = None,
                       devices=None, progress: bool = False,
                       kernel: str | None = None) -> TopK:
  """The k nearest neighbours by inner product, x→y and y→x, from one blocked pass.

  `kernel`: "xla" (this module's pass, sharded over `devices`) or "fused" (knn_cpu: a
  C kernel on this process's CPU cores, exact, ties to the lower index); default
  `default_kernel(devices)`. The rest are the XLA pass's: `block_rows` is per device
  (default: `default_block_rows`); block sizes are rounded to multiples of `group`; the
  running lists merge every `chunk_tiles` column tiles (default: `default_chunk_tiles`).
  Vectors are used as given (normalize rows for cosine similarity). The XLA pass breaks
  ties between equal similarities arbitrarily.
  """
  kernel = kernel or default_kernel(devices)
  if kernel == "fused":
    return TopK(*knn_cpu.bidirectional_topk(x_NxD, y_MxD, k, progress=progress))
  if kernel != "xla":
    raise ValueError(f"kernel={kernel!r}: expected 'xla' or 'fused'")
  x = np.ascontiguousarray(x_NxD, np.float32)
  y = np.ascontiguousarray(y_MxD, np.float32)
  if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
    raise ValueError(f"need [N, D] and [M, D] arrays, got {x.shape} and {y.shape}")
  N, M = len(x), len(y)
  if k < 1 or k > min(N, M):
    raise ValueError(f"k={k} must be in [1, min(N, M)] for {N} x {M} vectors")
  # every row needs >= k real groups of y and every column >= k real groups of x
  while group > 1 and group * k > min(N, M):
    group //= 2
  mesh = _mesh(devices)
  ndev = mesh.devices.size
  block_rows = block_rows or default_block_rows(mesh.devices.flat)
  br = _round_up(min(block_rows, -(-N // ndev)), group)
  bc = _round_up(min(block_cols, M), group)
  nc = -(-M // bc)                                   # tiles
  chunk_tiles = chunk_tiles or default_chunk_tiles(mesh.devices.flat)
  nch = -(-nc // chunk_tiles)                        # chunks of about equal size
  T = -(-nc // nch)
  Mp = nch * T * bc
  kk = _pow2(k)
  y_pad = np.empty((Mp, x.shape[1]), np.float32)
  y_pad[:M] = y
  y_pad[M:] = y[-1]
  rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("rows"))
  y_chunks = jax.device_put(y_pad.reshape(nch, T, bc, -1), rep)
  col_v = jax.device_put(np.full((ndev, nch, kk, T * bc), -np.inf, np.float32), rows)
  col_g = jax.device_put(np.zeros((ndev, nch, kk, T * bc), np.int32), rows)
  step = _pass_fn(mesh, k, group)
  step_rows = br * ndev
  scalar = lambda v: jax.device_put(np.int32(v), rep)
  starts = range(0, N, step_rows)
  if progress:
    starts = tqdm(starts, desc=f"knn {N}x{M}", unit="block")
  row_g = []
  for r0 in starts:
    blk = np.empty((step_rows, x.shape[1]), np.float32)
    chunk = x[r0:r0 + step_rows]
    blk[:len(chunk)] = chunk
    blk[len(chunk):] = x[-1]
    g, col_v, col_g = step(jax.device_put(blk, rows), scalar(r0), scalar(N), y_chunks,
                           scalar(M), col_v, col_g)
    row_g.append(g)
    jax.block_until_ready(col_v)  # one block at a time: concurrent blocks fight for cores
  row_g = np.concatenate([np.asarray(g) for g in row_g])[:N]
  # column states: merge the devices' partial top-k groups
  cv = np.asarray(col_v)[:, :, :k].transpose(1, 3, 0, 2).reshape(Mp, ndev * k)[:M]
  cg = np.asarray(col_g)[:, :, :k].transpose(1, 3, 0, 2).reshape(Mp, ndev * k)[:M]
  order = np.argsort(-cv, axis=1, kind="stable")[:, :k]
  col_g = np.take_along_axis(cg, order, axis=1)
  rv, ri = _rescore(mesh, x, y, row_g, M, k, group)
  cv, ci = _rescore(mesh, y, x, col_g, N, k, group)
  return TopK(rv, ri, cv, ci)


def dense_topk(x_NxD, y_MxD, k: int = 4) -> TopK:
  """Small inputs: the full similarity matrix in NumPy, top-k both ways."""
  s = np.asarray(x_NxD, np.float32) @ np.asarray(y_MxD, np.float32).T

  def top(m):
    part = np.argpartition(-m, k - 1, axis=1)[:, :k] if k < m.shape[1] else \
        np.tile(np.arange(m.shape[1]), (m.shape[0], 1))
    vals = np.take_along_axis(m, part, 1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(vals, order, 1), np.take_along_axis(part, order, 1)

  rv, ri = top(s)
  cv, ci = top(s.T)
  return TopK(rv, ri, cv, ci)


def topk(x_NxD, y_MxD, k: int = 4, max_dense: int = 1 << 24, **kw) -> TopK:
  """`dense_topk` when N * M <= max_dense (no compilation), else `bidirectional_topk`."""
  if len(x_NxD) * len(y_MxD) <= max_dense:
    if k < 1 or k > min(len(x_NxD), len(y_MxD)):
      raise ValueError(f"k={k} must be in [1, min(N, M)] for {len(x_NxD)} x {len(y_MxD)} "
                       f"vectors")
    return dense_topk(x_NxD, y_MxD, k)
  return bidirectional_topk(x_NxD, y_MxD, k, **kw)


class Rescoring(NamedTuple):
  """A search in a quantized geometry whose candidates are rescored with float vectors:
  `geometry` maps float vectors to what an int8 / binary index holds (quantized and
  mapped back: `Encoder.to_geometry`); `multiplier` x k candidates are rescored."""
  geometry: Callable[[np.ndarray], np.ndarray]
  multiplier: int = 4


def rescored_topk(x_NxD, y_MxD, rescoring: Rescoring, k: int = 4, **kw) -> TopK:
  """Both directions' k nearest neighbours of float vectors x and y, found as an index of
  quantized vectors finds them and then rescored (sentence-transformers' rescoring, with
  its int8 calibration fix, sentence-transformers #4058): each side's `multiplier` x k
  nearest in the quantized geometry, rescored as the float query against the
  candidates' quantized vectors (what the index stores), the best k kept. Rescoring
  reorders the candidates; a neighbour the quantized search missed stays missed."""
  x = np.asarray(x_NxD, np.float32)
  y = np.asarray(y_MxD, np.float32)
  if rescoring.multiplier < 1:
    raise ValueError(f"rescoring multiplier={rescoring.multiplier}: expected at least 1")
  gx, gy = rescoring.geometry(x), rescoring.geometry(y)
  wide = topk(gx, gy, min(k * rescoring.multiplier, len(x), len(y)), **kw)
  rv, ri = _rescored(x, gy, wide.row_idx, k)
  cv, ci = _rescored(y, gx, wide.col_idx, k)
  return TopK(rv, ri, cv, ci)


def _rescored(q_NxD, base_MxD, cand_NxC, k: int, floats: int = 1 << 24):
  """(values, indices) [N, k]: each query's candidates scored against `base`, best first
  (a stable sort: ties keep the search's order); as many queries at a time as gather
  `floats` candidate values (64 MiB)."""
  if not len(q_NxD):
    return np.zeros((0, k), np.float32), np.zeros((0, k), cand_NxC.dtype)
  rows = max(1, floats // max(1, cand_NxC.shape[1] * base_MxD.shape[1]))
  vals, idx = [], []
  for i in range(0, len(q_NxD), rows):
    c = cand_NxC[i:i + rows]
    s = np.einsum("nd,ncd->nc", q_NxD[i:i + rows], base_MxD[c])
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    vals.append(np.take_along_axis(s, order, 1))
    idx.append(np.take_along_axis(c, order, 1))
  return np.concatenate(vals), np.concatenate(idx)
