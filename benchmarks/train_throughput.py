#!/usr/bin/env python
r"""Training throughput of a gin experiment on synthetic full-length batches.

  python benchmarks/train_throughput.py --gin_file=contrastive_tiny.gin \
      --gin.NUM_LAYERS=4 --gin.EMB_DIM=256 --gin.NUM_HEADS=4 --gin.MLP_DIM=1024 \
      --gin.VOCAB_SIZE=32000 --gin.MAX_LENGTH=32 --gin.BATCH_SIZE=64

Same flags as launch/train.py (no data or vocabulary is read). Prints one JSON line:
step_s, pairs_per_s, tokens_per_s, model_flops_per_step (XLA's cost analysis of the
step, the same rule for every model), encoder_flops_per_step (the analytic 3 x forward
matmul FLOPs of both encoder passes, for comparison), achieved_flops, peak_flops (a large
f32 matmul timed in this process), mfu = achieved / peak, and
host_malloc ("tuned" when vmx.host_memory kept freed memory in the process; set
VMX_HOST_MALLOC=off to measure glibc's defaults).
"""
import importlib.util  # noqa: F401
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmx import cli, gin_utils  # noqa: E402


def measure_peak_flops(n: int = 2048, repeats: int = 10) -> float:
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


def encoder_forward_flops(enc, batch: int, length: int) -> float:
  d, f, L = enc.emb_dim, enc.mlp_dim, length
  hd = (enc.head_dim or d // enc.num_heads) * enc.num_heads
  per_token_layer = 2 * (3 * d * hd + hd * d) + 2 * 2 * d * f + 2 * 2 * L * hd
  return batch * L * enc.depth * per_token_layer


def main(argv):
  import jax
  from vmx import host_memory  # configured by cli.run_main, before jax started
  import numpy as np

  bindings, rest = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  args = p.parse_args(rest)
  from vmx import experiment  # lazy: jax only after cli.run_main's host set-up
  model, tx, B, L, part = experiment.build_experiment(args.gin_file, bindings,
                                                     args.gin_search_paths)
  from vmx.training.step import TrainStep
  enc = model.module.encoder
  shapes = {"left_tokens": (B, L), "right_tokens": (B, L), "left_lang": (B,), "right_lang": (B,)}
  trainer = TrainStep(model, tx, part, shapes)
  state = trainer.create_state(0)
  rng = np.random.default_rng(0)
  batch = {"left_tokens": rng.integers(3, enc.vocab_size, (B, L), dtype=np.int32),
           "right_tokens": rng.integers(3, enc.vocab_size, (B, L), dtype=np.int32),
           "left_lang": np.zeros(B, np.int32), "right_lang": np.zeros(B, np.int32)}
  gbatch = part.global_batch(batch, trainer.batch_shardings)
  with part.context():
    compiled = trainer.train_step.lower(state, gbatch).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla_flops = float(cost.get("flops", 0.0)) if cost else 0.0
  for _ in range(args.warmup):
    state, m = trainer.step(state, batch)
  jax.block_until_ready(state)
  t = time.perf_counter()
  for _ in range(args.steps):
    state, m = trainer.step(state, batch)
  jax.block_until_ready(state)
  step_s = (time.perf_counter() - t) / args.steps
  # The step's FLOPs as XLA counts them, for every model alike (attention softmax and
  # the like included); `encoder_flops_per_step` is the analytic count of the encoder
  # alone on both sides, forward and backward, for comparison.
  model_flops = xla_flops
  peak = measure_peak_flops()
  achieved = model_flops / step_s
  out = {"step_s": step_s, "pairs_per_s": B / step_s, "tokens_per_s": 2 * B * L / step_s,
         "model_flops_per_step": model_flops, "xla_flops_per_step": xla_flops,
         "encoder_flops_per_step": 3 * 2 * encoder_forward_flops(enc, B, L),
         "achieved_flops": achieved, "peak_flops": peak, "mfu": achieved / peak,
         "batch_size": B, "max_length": L, "devices": jax.device_count(),
         "backend": jax.default_backend(), "host_malloc": host_memory.configure()}
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  cli.run_main(main)
