#!/usr/bin/env python
"""Per-device memory of a full train step at any scale, without allocating it.

  python benchmarks/memory_report.py --gin_file=vmsst_24l.gin --mesh=data:16,model:8

Builds the experiment's model, optimizer and partitioner on a simulated CPU mesh of
data x model devices, compiles the jitted train step ahead of time on abstract
(ShapeDtypeStruct) state and batch, and prints one JSON line with XLA's per-device
memory analysis: argument, output, alias (donated state reused as output) and temp
bytes, `per_device_gib` = (arguments + outputs + temporaries) / 2^30 (the issue's
definition; donated outputs alias arguments, so `per_device_gib_net` subtracts the
alias bytes), parameter counts, and XLA's FLOP count per device (a step-time bound).
The figures are from the CPU compiler's buffer assignment: TPU/GPU temporaries differ
in detail, not in order of magnitude.
Other flags as launch/train.py (--gin.BATCH_SIZE=..., --gin_search_paths=...).
"""
import importlib.util  # noqa: F401
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_mesh(text: str) -> tuple[int, int]:
  m = re.fullmatch(r"data:(\d+),model:(\d+)", text.replace(" ", ""))
  if not m:
    raise SystemExit(f"error: --mesh={text!r}: expected data:N,model:M (e.g. data:16,model:8)")
  return int(m.group(1)), int(m.group(2))


def main(argv):
  from vmx import experiment, gin_utils
  bindings, rest = gin_utils.split_gin_bindings(argv)
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  gin_utils.add_gin_flags(p)
  p.add_argument("--mesh", default="data:8,model:1", help="data:N,model:M")
  args = p.parse_args(rest)
  data, model_par = parse_mesh(args.mesh)
  n = data * model_par
  # The simulated device count must be set before jax initializes its backend.
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                 os.environ.get("XLA_FLAGS", ""))
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import jax.numpy as jnp
  import numpy as np

  model, tx, B, L, _ = experiment.build_experiment(
      args.gin_file, bindings + [f"NUM_PARTITIONS = {model_par}"], args.gin_search_paths)
  from vmx.training import partitioning
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput
  from vmx.training.step import TrainStep
  part = partitioning.Partitioner(num_partitions=model_par, num_devices=n)
  if B % data:
    raise SystemExit(f"error: batch size {B} is not divisible by data={data}")
  # Every task (InfoXLM: mmlm, tlm, xlco) gets BATCH_SIZE examples of MAX_LENGTH tokens.
  uniform = pipeline.uniform_config(model.FEATURE_CONVERTER_CLS, B, L)
  shapes = TokenCacheInput(uniform).batch_shapes(model)
  t0 = time.time()
  trainer = TrainStep(model, tx, part, shapes)
  batch = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=trainer.batch_shardings[k])
           for k, s in shapes.items()}
  with part.context():
    compiled = trainer.train_step.lower(trainer.abstract_state, batch).compile()
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float((cost or {}).get("flops", 0.0))
  params = trainer.abstract_state.params
  n_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
  top = {k: int(sum(np.prod(x.shape) for x in jax.tree.leaves(v)))
         for k, v in params.items()}
  per_dev = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
  out = {"gin_file": args.gin_file, "mesh": {"data": data, "model": model_par},
         "devices": n, "global_batch": B, "max_length": L,
         "argument_bytes": int(mem.argument_size_in_bytes),
         "output_bytes": int(mem.output_size_in_bytes),
         "alias_bytes": int(mem.alias_size_in_bytes),
         "temp_bytes": int(mem.temp_size_in_bytes),
         "per_device_gib": per_dev / 2 ** 30,
         "per_device_gib_net": (per_dev - mem.alias_size_in_bytes) / 2 ** 30,
         "params": n_params, "params_by_module": top,
         # XLA's count for one device's share of the step; a step-time lower bound is
         # flops / the device's peak (e.g. 123e12 bf16 FLOP/s per TPU v3 chip).
         "flops_per_device": flops,
         "compile_s": round(time.time() - t0, 1), "backend": jax.default_backend()}
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  from vmx import cli
  cli.run_main(main)
