#!/usr/bin/env python
"""One command, one JSON: every family's training step on this machine's accelerator.

  python benchmarks/accelerator.py                 # a GPU/TPU: base size, ~6 minutes
  python benchmarks/accelerator.py --smoke         # CPU, tiny sizes, ~1 minute (CI)
  OUT=/some/dir python benchmarks/accelerator.py   # also writes $OUT/accelerator.json

What it measures (docs/performance.md, "On a GPU", has the figures and the command that
carries what the device image lacks):
- per family (CONTRASTIVE, VMSST, EMS, MPCL, InfoXLM's MMLM+TLM+XLCO, EMMA-X) at base
  size (12 layers, d 768, the XLM-R vocabulary, bf16 activations, the papers' lengths),
  on synthetic full-length batches: steps/s, examples/s, tokens/s, the step's FLOPs as
  XLA counts them against an analytic count of the encoder passes, MFU (XLA's FLOPs over
  the device's bf16 peak), the device's peak memory against the compiled step's own
  estimate (`memory_analysis`, what benchmarks/memory_report.py reports ahead of time),
  and input_wait_fraction (the step waiting for the next host batch from a prefetching
  thread: synthetic batches, so this is the host's placement cost, not the reader's);
- bf16 against f32: the tiny CONTRASTIVE model trained on the same seeded batches; the
  losses' largest relative difference over the last steps, against TOLERANCE;
- restart: train, save with vmx's Checkpointer, restore, go on; the resumed parameters
  must equal the uninterrupted run's bit for bit;
- packing: base CONTRASTIVE on batches as full as the one-hour recipe's, unpacked and
  packed (vmx/data/packing.py), examples/s and the useful token fraction;
- attention: `jax.nn.dot_product_attention` (cuDNN where the backend has it, else XLA)
  against vmx's einsum attention with padding and segment masks, speed and numerics;
- last, VMSST 24L at the largest batch that fits (halved from 512 until it runs).

--profile adds where each family's step spends its device time: 3 steps under
jax.profiler, summed by kernel and by kind (matmuls, elementwise fusions, reductions,
copies; benchmarks/trace_summary.py).

Each family runs in a process of its own (--no-isolate: in this one), so its peak memory
and compilation are its own. Layers are scanned (SCAN_LAYERS = True) as in the production
experiment files; --gin adds bindings to every family's (--gin 'SCAN_LAYERS = False').

Each measurement is timed and guarded on its own: a failure is recorded in the JSON and
the others go on; an out-of-memory halves the batch (recorded); a deadline (--timeout)
skips what would not finish. The JSON is rewritten after every measurement, so a killed
run leaves what it had.
"""
import importlib.util  # noqa: F401  (gin-config 0.5 gotcha)
import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOLERANCE = 0.05           # bf16 vs f32: largest relative loss difference, last 20% steps
# Dense bf16 peak FLOP/s by device kind (vendor figures, no sparsity); others are measured.
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L4": 121e12,
             "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
             "TPU v6 lite": 918e12}
# SCAN_LAYERS as the production experiment files (contrastive_24l.gin, infoxlm_base.gin):
# unrolled, a base step compiled for 100-315 s on an H200 (docs/performance.md, "On a GPU")
BASE = ["NUM_LAYERS = 12", "EMB_DIM = 768", "NUM_HEADS = 12", "MLP_DIM = 3072",
        "VOCAB_SIZE = 250002", "ACTIVATION_DTYPE = 'bfloat16'", "DROPOUT_RATE = 0.1",
        "SCAN_LAYERS = True"]
# family: (experiment file, its base-size bindings beside BASE, base batch)
FAMILIES = {
    # VMSST's own vocabulary (vmsst_24l.gin: 32,000 pieces) for it and its CONTRASTIVE
    # baseline; the XLM-R-based families keep XLM-R's 250,002
    "contrastive": ("contrastive_tiny.gin", ["MAX_LENGTH = 32", "VOCAB_SIZE = 32000"], 512),
    "vmsst": ("vmsst_tiny.gin", ["MAX_LENGTH = 32", "DECODER_LAYERS = 12",
                                 "VOCAB_SIZE = 32000"], 256),
    "ems": ("ems_tiny.gin", ["MAX_LENGTH = 32"], 512),
    "mpcl": ("mpcl_tiny.gin", ["MAX_LENGTH = 64"], 128),
    "infoxlm": ("infoxlm_tiny.gin", ["MAX_LENGTH = 128", "UNIVERSAL_LAYER = 8",
                                     "SCAN_BOUNDARIES = [8]",
                                     "TransformerEncoder.max_length = 256"], 64),
    # phase 2 with pairs: a step enqueues the text and both sides of the pairs (3 x batch
    # keys), and the queue takes whole steps (emmax_tiny.gin's 256 is for batch 128)
    "emmax": ("emmax_tiny.gin", ["MAX_LENGTH = 32", "QUEUE_SIZE = 3072"], 512),
}
PARTS = ("families", "vmsst_24l", "bf16_vs_f32", "restart", "packing", "attention")
SMOKE = ["NUM_LAYERS = 1", "EMB_DIM = 32", "NUM_HEADS = 2", "MLP_DIM = 64",
         "VOCAB_SIZE = 500", "MAX_LENGTH = 12"]
SMOKE_EXTRA = {"vmsst": ["DECODER_LAYERS = 1"], "infoxlm": ["UNIVERSAL_LAYER = 1",
                                                           "QUEUE_SIZE = 16"],
               "emmax": ["QUEUE_SIZE = 48"]}


class Deadline(Exception):
  pass


def out_of_memory(e: BaseException) -> bool:
  text = f"{type(e).__name__}: {e}"
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory",
                                 "OOM"))


def scalar(metric) -> float:
  """A step metric (a clu metric, or an array) as a float."""
  return float(metric.compute() if hasattr(metric, "compute") else metric)


def peak_flops(jax, jnp, dtype) -> tuple[float, str]:
  """(peak FLOP/s, where the figure comes from) of device 0 in `dtype`."""
  kind = jax.devices()[0].device_kind
  for name, peak in PEAK_BF16.items():
    if name in kind and dtype == jnp.bfloat16:
      return peak, f"vendor bf16 peak of {name}"
  n = 4096 if jax.default_backend() != "cpu" else 1024
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best, f"a {n}x{n} {jnp.dtype(dtype).name} matmul timed here"


def synthetic_batch(model, shapes: dict, vocab: int, seed: int):
  """Full-length random token rows, language ids 0 (the model's only language here) and
  normal float features, by the model's feature layouts."""
  import numpy as np
  layouts = model.feature_layout()
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in shapes.items():
    key, _, feat = name.rpartition("/")
    layout = layouts[key] if isinstance(layouts, dict) else layouts
    spec = layout.MODEL_FEATURES[feat]
    if spec.dtype == "float32":
      out[name] = rng.standard_normal(shape).astype(np.float32)
    elif len(shape) == 1:
      out[name] = np.zeros(shape, np.int32)
    else:
      out[name] = rng.integers(3, vocab, shape, dtype=np.int32)
  return out


def encoder_flops(model, shapes: dict) -> float:
  """Analytic training FLOPs of the encoder passes over the batch's token rows: 3 x the
  forward matmuls (projections, MLP, attention scores and values) of every row of every
  token feature. Decoders, heads and embeddings are not counted."""
  enc = getattr(model.module, "encoder", None)
  if enc is None:
    return 0.0
  d, f, depth = enc.emb_dim, enc.mlp_dim, enc.num_layers
  hd = (enc.head_dim or d // enc.num_heads) * enc.num_heads
  total = 0.0
  for name, shape in shapes.items():
    if len(shape) != 2 or name.endswith("teacher"):
      continue
    rows, length = shape
    per_token = 2 * (3 * d * hd + hd * d) + 2 * 2 * d * f + 2 * 2 * length * hd
    total += rows * length * depth * per_token
  return 3.0 * total


class Bench:
  """Builds a family's trainer at a size and measures its step."""

  def __init__(self, args, jax, jnp, np):
    self.args, self.jax, self.jnp, self.np = args, jax, jnp, np
    self.t_end = time.time() + args.timeout

  def left(self) -> float:
    return self.t_end - time.time()

  def parts(self, gin_file: str, bindings: list, batch: int):
    """(model, optimizer, partitioner, dataset config of full-length rows, shapes)."""
    from vmx import experiment
    from vmx.data import pipeline
    from vmx.training import partitioning
    from vmx.data.inputs import TokenCacheInput
    import gin
    gin.clear_config()
    model, tx, _, length, _ = experiment.build_experiment(
        [gin_file], [*bindings, f"BATCH_SIZE = {batch}"])
    cfg = pipeline.uniform_config(model.feature_layout(), batch, length)
    shapes = TokenCacheInput(cfg).batch_shapes(model)
    return model, tx, partitioning.Partitioner(), cfg, shapes

  def build(self, gin_file: str, bindings: list, batch: int):
    from vmx.training.step import TrainStep
    model, tx, part, _, shapes = self.parts(gin_file, bindings, batch)
    trainer = TrainStep(model, tx, part, shapes)
    # the trainer's start-up check against the batch (a bad size: one line, not XLA's)
    model.validate_data({k: None for k in trainer.batch_sizes}, trainer.batch_sizes)
    return model, trainer, shapes

  def measure(self, gin_file: str, bindings: list, batch: int, steps: int,
              vocab: int, label: str = "step") -> dict:
    jax, np = self.jax, self.np
    t0 = time.time()
    model, trainer, shapes = self.build(gin_file, bindings, batch)
    state = trainer.create_state(0)
    batches = [synthetic_batch(model, shapes, vocab, s) for s in range(2)]
    placed = trainer.place(batches[0])
    with trainer.partitioner.context():
      compiled = trainer.train_step.lower(state, placed).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float((cost or {}).get("flops", 0.0))
    mem = compiled.memory_analysis()
    estimate = None if mem is None else int(mem.argument_size_in_bytes
                                            + mem.output_size_in_bytes
                                            + mem.temp_size_in_bytes
                                            - mem.alias_size_in_bytes)
    compile_s = time.time() - t0
    def run(state, batch):                  # the compiled step itself (compiled once)
      with trainer.partitioner.context():
        state, metrics, _ = compiled(state, batch)
      return state, metrics
    for _ in range(2):                      # warm-up
      state, _ = run(state, placed)
    jax.block_until_ready(state)
    # timed steps, the batches placed by a prefetching thread (as the trainer's)
    q = queue.Queue(maxsize=2)

    def produce():
      for i in range(steps):
        q.put(trainer.place(batches[i % 2]))
    threading.Thread(target=produce, daemon=True).start()
    wait = 0.0
    t = time.perf_counter()
    for _ in range(steps):
      w = time.perf_counter()
      b = q.get()
      wait += time.perf_counter() - w
      state, metrics = run(state, b)
    jax.block_until_ready(state)
    step_s = (time.perf_counter() - t) / steps
    stats = jax.devices()[0].memory_stats() or {}
    tokens = sum(int(np.prod(s)) for n, s in shapes.items()
                 if len(s) == 2 and not n.endswith("teacher"))
    analytic = encoder_flops(model, shapes)
    out = {"batch": batch, "max_length": max(s[-1] for s in shapes.values() if len(s) == 2),
           "steps_per_s": 1.0 / step_s, "examples_per_s": sum(
               trainer.batch_sizes.values()) / step_s,
           "tokens_per_s": tokens / step_s, "xla_flops_per_step": xla_flops,
           "analytic_encoder_flops_per_step": analytic,
           "xla_over_analytic": xla_flops / analytic if analytic else None,
           # model FLOPs utilization from the analytic count (encoder passes only, so a
           # lower bound): XLA's own count on a GPU missed 9/10 of CONTRASTIVE's matmuls
           "mfu": analytic / step_s / self.peak,
           "xla_mfu": xla_flops / step_s / self.peak,
           "peak_bytes": stats.get("peak_bytes_in_use"),
           "estimated_peak_bytes": estimate,
           "input_wait_fraction": wait / (step_s * steps),
           "compile_s": round(compile_s, 1),
           "loss": scalar(metrics["loss"]) if "loss" in metrics else None}
    if out["peak_bytes"] and estimate:
      out["peak_over_estimate"] = out["peak_bytes"] / estimate
    if self.args.profile:                   # where the step's device time goes
      from benchmarks import trace_summary
      holder = [state]

      def one():
        holder[0], _ = run(holder[0], placed)
        jax.block_until_ready(holder[0])
      out_dir = os.environ.get("OUT")
      try:                                  # a profiler failure loses only the profile
        out["profile"] = trace_summary.profile(
            one, 3, keep=out_dir and os.path.join(out_dir, f"trace_{label}.json.gz"))
      except Exception as e:  # noqa: BLE001
        out["profile"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out

  def guarded(self, name: str, fn, batch: int, min_batch: int = 1) -> dict:
    """fn(batch), halving the batch on out-of-memory; failures recorded, not raised."""
    halved = 0
    while True:
      if self.left() < 20:
        return {"skipped": f"deadline ({self.args.timeout} s) reached"}
      try:
        r = fn(batch)
        if halved:
          r["batch_halved"] = halved
        return r
      except Exception as e:  # noqa: BLE001  (one family's failure is its own record)
        if out_of_memory(e) and batch // 2 >= min_batch:
          print(f"[accelerator] {name}: out of memory at batch {batch}; halving", flush=True)
          batch, halved = batch // 2, halved + 1
          self.jax.clear_caches()
          continue
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "trace": traceback.format_exc().splitlines()[-3:]}


def bf16_vs_f32(bench, smoke: bool) -> dict:
  """The tiny CONTRASTIVE model trained on the same seeded batches in f32 and in bf16."""
  steps = 20 if smoke else 200
  base = ["NUM_LAYERS = 2", "EMB_DIM = 128", "NUM_HEADS = 4", "MLP_DIM = 512",
          "VOCAB_SIZE = 8000", "MAX_LENGTH = 32", "DROPOUT_RATE = 0.0"]
  losses = {}
  for dtype in ("float32", "bfloat16"):
    model, trainer, shapes = bench.build("contrastive_tiny.gin",
                                         [*base, f"ACTIVATION_DTYPE = '{dtype}'"], 64)
    state = trainer.create_state(0)
    out = []
    for s in range(steps):
      state, m = trainer.step(state, synthetic_batch(model, shapes, 8000, 1000 + s % 50))
      out.append(scalar(m["loss"]))
    losses[dtype] = out
  tail = max(1, steps // 5)
  rel = max(abs(a - b) / max(abs(a), 1e-6)
            for a, b in zip(losses["float32"][-tail:], losses["bfloat16"][-tail:]))
  return {"steps": steps, "loss_f32_last": losses["float32"][-1],
          "loss_bf16_last": losses["bfloat16"][-1], "max_rel_diff_last_steps": rel,
          "tolerance": TOLERANCE, "within_tolerance": rel <= TOLERANCE,
          "loss_f32_first": losses["float32"][0], "loss_bf16_first": losses["bfloat16"][0]}


def restart(bench, smoke: bool) -> dict:
  """k steps, save, restore, m more steps against k + m uninterrupted: bitwise? The
  uninterrupted run is repeated: where two of them differ (a GPU's atomics order its
  reductions differently run to run), the restart cannot be bitwise either."""
  from vmx.modeldir.checkpoints import Checkpointer, CheckpointConfig
  jax, np = bench.jax, bench.np
  k, m = (3, 3) if smoke else (20, 20)
  bindings = SMOKE if smoke else [*BASE[:5], "MAX_LENGTH = 32"]
  model, trainer, shapes = bench.build("contrastive_tiny.gin", bindings, 32 if smoke else 128)
  data = [synthetic_batch(model, shapes, 500 if smoke else 250002, s) for s in range(k + m)]
  def uninterrupted():
    state = trainer.create_state(0)
    for b in data:
      state, _ = trainer.step(state, b)
    return jax.device_get(state.params)

  def compare(x, y):
    pairs = list(zip(jax.tree.leaves(x), jax.tree.leaves(y)))
    return (all(np.array_equal(a, b) for a, b in pairs),
            max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in pairs))
  straight = uninterrupted()
  repeat_same, repeat_diff = compare(straight, uninterrupted())
  with tempfile.TemporaryDirectory() as d:
    ck = Checkpointer(d, CheckpointConfig(period=1, keep=2))
    state = trainer.create_state(0)
    for b in data[:k]:
      state, _ = trainer.step(state, b)
    ck.save(k, state, {"step": k}, force=True)
    del state
    state, _ = ck.restore(k, trainer.abstract_state)
    ck.close()
  for b in data[k:]:
    state, _ = trainer.step(state, b)
  same, diff = compare(straight, jax.device_get(state.params))
  return {"steps_before": k, "steps_after": m, "bitwise_equal": bool(same),
          "max_abs_diff": diff, "uninterrupted_repeat_bitwise_equal": bool(repeat_same),
          "uninterrupted_repeat_max_abs_diff": repeat_diff}


def packing(bench, smoke: bool) -> dict:
  """CONTRASTIVE (base size) on batches whose sentences fill the rows as the one-hour
  recipe's do (lengths log-normal around 0.4 of the row: ~0.45 of the positions hold a
  token, 0.46 measured there), unpacked and packed by the trainer's own layout
  (vmx/data/packing.py: every row count met compiles once, before the timing)."""
  import dataclasses
  from vmx.data import pipeline
  from vmx.training.step import TrainStep
  jax, np = bench.jax, bench.np
  batch, vocab, steps = (8, 500, 4) if smoke else (512, 250002, 20)
  bindings = SMOKE if smoke else [*BASE, "MAX_LENGTH = 32"]
  model, tx, part, cfg, shapes = bench.parts("contrastive_tiny.gin", bindings, batch)
  length = shapes["left_tokens"][1]

  def batch_of(seed):
    b = synthetic_batch(model, shapes, vocab, seed)
    r = np.random.default_rng(seed)
    for name in ("left_tokens", "right_tokens"):
      n = np.clip(np.round(r.lognormal(np.log(0.4 * length), 0.5, batch)), 2, length)
      b[name][np.arange(length)[None] >= n[:, None]] = 0
    return b
  data = [batch_of(s) for s in range(8)]
  out = {}
  for mode in ("unpacked", "packed"):
    c = dataclasses.replace(cfg, pack=mode == "packed")
    trainer = TrainStep(model, tx, part, shapes, packed=pipeline.packed_features(c, model, shapes),
                      token_features=pipeline.token_features(c, model.feature_layout()))
    state = trainer.create_state(0)
    for b in data:                  # every row count these batches need, compiled
      state, m = trainer.step(state, b)
    jax.block_until_ready(state)
    t = time.perf_counter()
    for i in range(steps):
      state, m = trainer.step(state, data[i % len(data)])
    jax.block_until_ready(state)
    step_s = (time.perf_counter() - t) / steps
    out[mode] = {"examples_per_s": batch / step_s,
                 "useful_token_fraction": scalar(m["useful_token_fraction"]),
                 "row_counts": sorted(trainer.row_counts)}
  out["speedup"] = out["packed"]["examples_per_s"] / out["unpacked"]["examples_per_s"]
  return out


def attention(bench, smoke: bool) -> dict:
  """dot_product_attention against vmx's einsum attention, padding + segment masks."""
  jax, jnp = bench.jax, bench.jnp
  from vmx import layers
  B, L, H, D = (4, 16, 2, 8) if smoke else (256, 128, 12, 64)
  dtype = jnp.float32 if smoke else jnp.bfloat16
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(x, (B, L, H, D), dtype) for x in ks)
  lengths = jax.random.randint(jax.random.PRNGKey(1), (B,), L // 4, L + 1)
  pos = jnp.arange(L)[None]
  segments = jnp.where(pos < lengths[:, None], 1 + (pos >= lengths[:, None] // 2), 0)
  mask = layers.make_attention_mask(segments > 0, segments > 0, segment_ids_BxL=segments)

  def einsum(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(D).astype(
        jnp.float32)
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(v.dtype), v)

  def library(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, mask=mask)

  out = {"shape": [B, L, H, D], "dtype": jnp.dtype(dtype).name}
  results = {}
  for name, fn in (("einsum", einsum), ("dot_product_attention", library)):
    f = jax.jit(fn)
    try:
      y = f(q, k, v).block_until_ready()
    except Exception as e:  # noqa: BLE001
      out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
      continue
    t = time.perf_counter()
    n = 5 if smoke else 50
    for _ in range(n):
      y = f(q, k, v)
    y.block_until_ready()
    out[name] = {"ms": (time.perf_counter() - t) / n * 1e3}
    results[name] = y
  if len(results) == 2:
    valid = (segments > 0)[:, :, None, None]
    a, b = (jnp.where(valid, r.astype(jnp.float32), 0) for r in results.values())
    out["max_abs_diff"] = float(jnp.max(jnp.abs(a - b)))
  return out


def isolated(name: str, args, left: float) -> dict:
  """One family measured in a child process of its own: the device's peak memory is a
  process-wide high-water mark, and a family's compiled steps and buffers would stay on
  the device beside the next one's."""
  cmd = [sys.executable, os.path.abspath(__file__), "--child", "--families", name,
         "--parts", "families", "--timeout", str(int(left))]
  cmd += ["--smoke"] if args.smoke else []
  cmd += ["--steps", str(args.steps)] if args.steps else []
  cmd += ["--batch", str(args.batch)] if args.batch else []
  cmd += ["--profile"] if args.profile else []
  for b in args.gin:
    cmd += ["--gin", b]
  env = {k: v for k, v in os.environ.items() if k != "OUT"}
  try:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env,
                          timeout=left + 60)
  except subprocess.TimeoutExpired:
    return {"error": f"the child process ran past {int(left) + 60} s"}
  lines = proc.stdout.strip().splitlines()
  for line in lines[:-1]:
    if "halving" in line:
      print(line, flush=True)
  try:
    return json.loads(lines[-1])["families"][name]
  except (IndexError, ValueError, KeyError):
    return {"error": f"the child process exited {proc.returncode} without a result",
            "trace": lines[-3:]}


def main(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (CI)")
  p.add_argument("--timeout", type=float, default=None,
                 help="seconds for everything (default 420; smoke 240)")
  p.add_argument("--families", default=",".join(FAMILIES))
  p.add_argument("--steps", type=int, default=None, help="timed steps per family")
  p.add_argument("--batch", type=int, default=None,
                 help="every family's batch (default: each family's own)")
  p.add_argument("--parts", default=",".join(PARTS),
                 help=f"what to run, of {','.join(PARTS)}")
  p.add_argument("--gin", action="append", default=[],
                 help="a binding for every family, after the base size's; repeatable "
                      "(--gin 'SCAN_LAYERS = False')")
  p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                 help="each family in a process of its own (default: on unless --smoke)")
  p.add_argument("--profile", action="store_true",
                 help="also 3 steps of each family under jax.profiler: device time by kernel "
                      "and kind in the JSON (benchmarks/trace_summary.py); with --no-isolate "
                      "the trace itself into $OUT when under 15 MiB")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.isolate is None:
    args.isolate = not args.smoke and not args.child
  parts = [x for x in args.parts.split(",") if x]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    p.error(f"--parts: unknown {unknown}; known: {', '.join(PARTS)}")
  args.timeout = args.timeout or (240 if args.smoke else 420)
  if args.smoke:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import jax.numpy as jnp
  import numpy as np
  t_start = time.time()
  result = {"command": "benchmarks/accelerator.py" + (" --smoke" if args.smoke else ""),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind, "devices": jax.device_count()}
  from vmx import cli
  cli.warn_untested_versions()
  out_dir = os.environ.get("OUT")

  def save():
    result["wall_s"] = round(time.time() - t_start, 1)
    if out_dir:
      with open(os.path.join(out_dir, "accelerator.json"), "w") as f:
        json.dump(result, f, indent=1)

  bench = Bench(args, jax, jnp, np)
  dtype = jnp.bfloat16
  try:
    (jnp.ones((8, 8), dtype) @ jnp.ones((8, 8), dtype)).block_until_ready()
  except Exception:  # noqa: BLE001  (a device without bf16)
    dtype = jnp.float32
    result["bf16"] = "unsupported: f32 activations"
  bench.peak, result["peak_flops_source"] = peak_flops(jax, jnp, dtype)
  result["peak_flops"] = bench.peak
  steps = args.steps or (3 if args.smoke else 20)
  result["families"] = {}
  for name in [f for f in args.families.split(",") if f and "families" in parts]:
    gin_file, extra, batch = FAMILIES[name]
    if args.smoke:
      bindings, batch, vocab = [*SMOKE, *SMOKE_EXTRA.get(name, [])], 8, 500
    else:
      bindings = [*BASE, *extra]
      vocab = int(next(b for b in reversed(bindings) if b.startswith("VOCAB_SIZE"))
                  .split("=")[1])
      if dtype == jnp.float32:
        bindings.append("ACTIVATION_DTYPE = 'float32'")
    bindings = [*bindings, *args.gin]
    batch = args.batch or batch
    print(f"[accelerator] {name} ...", flush=True)
    if args.isolate:
      result["families"][name] = (isolated(name, args, bench.left()) if bench.left() >= 20
                                  else {"skipped": f"deadline ({args.timeout} s) reached"})
    else:
      result["families"][name] = bench.guarded(
          name, lambda b, g=gin_file, x=bindings, v=vocab, n=name: bench.measure(
              g, x, b, steps, v, label=n),
          batch)
    print(f"[accelerator] {name}: {json.dumps(result['families'][name])}", flush=True)
    save()
  for key, fn in (("bf16_vs_f32", bf16_vs_f32), ("restart", restart),
                  ("packing", packing), ("attention", attention)):
    if key not in parts:
      continue
    print(f"[accelerator] {key} ...", flush=True)
    result[key] = bench.guarded(key, lambda _, f=fn: f(bench, args.smoke), 1)
    print(f"[accelerator] {key}: {json.dumps(result[key])}", flush=True)
    save()
  if not args.smoke and "vmsst_24l" in parts:   # last: its halving may take compilations
    result["vmsst_24l"] = bench.guarded(
        "vmsst_24l", lambda b: bench.measure("vmsst_24l.gin", [
            "NUM_PARTITIONS = 1", "ACTIVATION_DTYPE = 'bfloat16'"], b, 10, 32000), 512)
    save()
  save()
  print(json.dumps(result))
  failed = [k for k, v in result["families"].items() if "error" in v]
  skipped = [k for k, v in [*result["families"].items(), *result.items()]
             if isinstance(v, dict) and "skipped" in v]
  if args.smoke and skipped:   # a check that skipped parts checked nothing there
    print(f"[accelerator] --smoke: the deadline ({args.timeout:.0f} s) skipped {skipped}; "
          f"give a larger --timeout", file=sys.stderr)
  return 1 if (failed or skipped) and args.smoke else 0


if __name__ == "__main__":
  from vmx import cli
  cli.run_main(main)
