#!/usr/bin/env python
r"""GEMM-only lower bound on a dual-encoder train step, per matmul library.

Times, one at a time, every matrix product of one CONTRASTIVE train step (both sides
of a shared Transformer encoder, forward and backward) and adds the times up. No
train step can be faster than that sum on the same library and machine: it leaves
out LayerNorm, GELU, softmax, the loss and the optimizer, and lets every GEMM run
alone on all cores. Use it to judge a throughput target before chasing it:

  python benchmarks/gemm_bound.py --layers=4 --d=256 --heads=4 --d_ff=1024 \
      --length=32 --batch=64 [--backend=jax|torch|numpy]

jax runs the products as XLA:CPU compiles them inside a train step (dW = x^T dy as a
dot contracting dimension 0 of both operands); torch (MKL/oneDNN) and numpy (its
BLAS) get the same shapes through transposed views. torch is not a vmx dependency:
run that backend in the venv of benchmarks/torch_mnrl_baseline.py.

Prints one JSON line: gemm_flops_per_step, gemm_bound_s, bound_pairs_per_s,
peak_flops (a 2048^3 product), and per kind of product (fwd, dX, dW, attention) its
FLOPs per step and achieved FLOP/s.
"""
import argparse
import json
import statistics
import time


def products(layers: int, d: int, heads: int, d_ff: int, length: int, batch: int):
  """(kind, count, a_shape, b_shape, form) of one train step's matmuls.

  form: 'nn' a @ b; 'nt' a @ b^T; 'tn' a^T @ b (contracting the first dims);
  'bnn' / 'bnt' batched over the leading dim. Counts cover both sides and all layers.
  """
  n, hd = batch * length, d // heads
  sides = 2 * layers
  out = []
  for k, f in ((d, d), (d, d), (d, d), (d, d), (d, d_ff), (d_ff, d)):  # q k v o wi wo
    out += [("fwd", sides, (n, k), (k, f), "nn"),
            ("dX", sides, (n, f), (k, f), "nt"),
            ("dW", sides, (n, k), (n, f), "tn")]
  bh = batch * heads
  # logits q k^T and context p v, forward; their backward is two products of each shape.
  out += [("attention", sides * 3, (bh, length, hd), (bh, length, hd), "bnt"),
          ("attention", sides * 3, (bh, length, length), (bh, length, hd), "bnn")]
  return out


def flops(a_shape, b_shape, form) -> int:
  if form == "nn":
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]
  if form == "nt":
    return 2 * a_shape[0] * a_shape[1] * b_shape[0]
  if form == "tn":
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]
  return 2 * a_shape[0] * a_shape[1] * a_shape[2] * (b_shape[1] if form == "bnt" else b_shape[2])


def make_runner(backend: str):
  """fn(a_shape, b_shape, form) -> zero-argument callable that runs the product once."""
  if backend == "jax":
    import jax
    import jax.numpy as jnp
    from jax import lax
    dims = {"nn": (((1,), (0,)), ((), ())), "nt": (((1,), (1,)), ((), ())),
            "tn": (((0,), (0,)), ((), ())), "bnn": (((2,), (1,)), ((0,), (0,))),
            "bnt": (((2,), (2,)), ((0,), (0,)))}

    def runner(a_shape, b_shape, form):
      a = jax.random.normal(jax.random.PRNGKey(0), a_shape, jnp.float32)
      b = jax.random.normal(jax.random.PRNGKey(1), b_shape, jnp.float32)
      f = jax.jit(lambda x, y: lax.dot_general(x, y, dims[form]))
      return lambda: f(a, b).block_until_ready()
    return runner
  if backend == "torch":
    import torch

    def runner(a_shape, b_shape, form):
      a, b = torch.randn(*a_shape), torch.randn(*b_shape)
      ops = {"nn": lambda: a @ b, "nt": lambda: a @ b.t(), "tn": lambda: a.t() @ b,
             "bnn": lambda: torch.bmm(a, b), "bnt": lambda: torch.bmm(a, b.transpose(1, 2))}
      return ops[form]
    return runner
  if backend == "numpy":
    import numpy as np

    def runner(a_shape, b_shape, form):
      rng = np.random.default_rng(0)
      a = rng.standard_normal(a_shape, np.float32)
      b = rng.standard_normal(b_shape, np.float32)
      ops = {"nn": lambda: a @ b, "nt": lambda: a @ b.T, "tn": lambda: a.T @ b,
             "bnn": lambda: a @ b, "bnt": lambda: a @ b.transpose(0, 2, 1)}
      return ops[form]
    return runner
  raise ValueError(f"--backend={backend!r}: expected jax, torch or numpy")


def median_time(fn, repeats: int) -> float:
  for _ in range(3):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  for k, v in dict(layers=4, d=256, heads=4, d_ff=1024, length=32, batch=64,
                   repeats=20).items():
    p.add_argument(f"--{k}", type=int, default=v)
  p.add_argument("--backend", default="jax", choices=("jax", "torch", "numpy"))
  a = p.parse_args()
  if a.d % a.heads:
    p.error(f"--d={a.d} is not divisible by --heads={a.heads}")
  runner = make_runner(a.backend)
  per_kind = {}
  total_s = total_flops = 0.0
  for kind, count, a_shape, b_shape, form in products(a.layers, a.d, a.heads, a.d_ff,
                                                      a.length, a.batch):
    t = median_time(runner(a_shape, b_shape, form), a.repeats)
    fl = flops(a_shape, b_shape, form)
    k = per_kind.setdefault(kind, {"flops": 0.0, "s": 0.0})
    k["flops"] += count * fl
    k["s"] += count * t
    total_s += count * t
    total_flops += count * fl
  n = 2048
  peak_s = median_time(runner((n, n), (n, n), "nn"), max(3, a.repeats // 4))
  out = {"backend": a.backend, "gemm_flops_per_step": total_flops, "gemm_bound_s": total_s,
         "bound_pairs_per_s": a.batch / total_s, "peak_flops": 2 * n ** 3 / peak_s}
  for kind, k in per_kind.items():
    out[f"{kind}_flops_per_step"] = k["flops"]
    out[f"{kind}_achieved_flops"] = k["flops"] / k["s"]
  print(json.dumps(out))


if __name__ == "__main__":
  main()
