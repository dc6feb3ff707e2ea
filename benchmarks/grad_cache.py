#!/usr/bin/env python
"""GradCache: step memory and time against the uncached step, by global batch size.

  python benchmarks/grad_cache.py [--gin_file=contrastive_tiny.gin] [--batches=128,512,2048]
      [--chunk=128] [--steps=3] [--gin.KEY=VALUE ...]

(any experiment whose model has a GradCache split: contrastive_*, mpcl*, ems*; the batch
holds the model's own features, e.g. MPCL's views.)

For each global batch B, compiles the experiment's train step uncached and with
`grad_cache_chunks = B / chunk` (vmx/training/grad_cache.py), and prints one JSON line
each: XLA's temporary bytes of the compiled step (activations; flat in B with GradCache,
growing with B without) and the mean wall time of `--steps` steps on random tokens after
a warm-up step, then a table with the time ratio (GradCache / uncached; the target is
<= 1.5: one extra forward pass). Memory comes from the compiler's buffer assignment (no
allocation); the default device is used (CPU here, a GPU/TPU where there is one).
"""
import importlib.util  # noqa: F401  (gin's search-path bug, see launch/train.py)
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(model, tx, shapes, chunks: int, steps: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from vmx.training import partitioning
  from vmx.training.step import TrainStep
  part = partitioning.Partitioner(num_devices=1)
  trainer = TrainStep(model, tx, part, shapes, grad_cache_chunks=chunks)
  abstract_batch = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=trainer.batch_shardings[k])
                    for k, s in shapes.items()}
  with part.context():
    compiled = trainer.train_step.lower(trainer.abstract_state, abstract_batch).compile()
  mem = compiled.memory_analysis()
  rng = np.random.default_rng(0)
  vocab = model.module.encoder.vocab_size
  # Token rows: random ids; per-example scalars (language ids): 0, a valid id everywhere.
  batch = {k: (rng.integers(3, vocab, size=s) if len(s) > 1 else np.zeros(s)).astype(np.int32)
           for k, s in shapes.items()}
  state = trainer.create_state(0)
  state, m = trainer.step(state, batch)                  # compile + warm-up
  jax.block_until_ready(m["loss"].compute())
  t0 = time.perf_counter()
  for _ in range(steps):
    state, m = trainer.step(state, batch)
  jax.block_until_ready(m["loss"].compute())
  return {"temp_mib": mem.temp_size_in_bytes / 2 ** 20,
          "step_s": (time.perf_counter() - t0) / steps, "loss": float(m["loss"].compute())}


def main(argv):
  from vmx import experiment, gin_utils
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput
  bindings, rest = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--batches", default="128,512,2048")
  p.add_argument("--chunk", type=int, default=128)
  p.add_argument("--steps", type=int, default=3)
  args = p.parse_args(rest)
  gin_files = args.gin_file or ["contrastive_tiny.gin"]
  batches = [int(b) for b in args.batches.split(",")]
  rows = []
  for b in batches:
    if b % args.chunk:
      raise SystemExit(f"error: --batches: {b} is not a multiple of --chunk={args.chunk}")
    model, tx, _, length, _ = experiment.build_experiment(
        gin_files, bindings + [f"BATCH_SIZE = {b}"], args.gin_search_paths)
    uniform = pipeline.uniform_config(model.FEATURE_CONVERTER_CLS, b, length)
    shapes = TokenCacheInput(uniform).batch_shapes(model)
    row = {"global_batch": b, "chunk": args.chunk, "max_length": length}
    for name, chunks in (("uncached", 1), ("grad_cache", b // args.chunk)):
      r = measure(model, tx, shapes, chunks, args.steps)
      row.update({f"{name}_{k}": v for k, v in r.items()})
    row["time_ratio"] = row["grad_cache_step_s"] / row["uncached_step_s"]
    print(json.dumps(row), flush=True)
    rows.append(row)
  print(f"\n| global batch | uncached temp MiB | GradCache temp MiB (chunk {args.chunk}) "
        f"| uncached s/step | GradCache s/step | time ratio |\n|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['global_batch']} | {r['uncached_temp_mib']:.1f} | "
          f"{r['grad_cache_temp_mib']:.1f} | {r['uncached_step_s']:.3f} | "
          f"{r['grad_cache_step_s']:.3f} | {r['time_ratio']:.2f} |")
  return rows


if __name__ == "__main__":
  from vmx import cli
  cli.run_main(main)
