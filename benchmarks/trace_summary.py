"""Where a compiled step's device time goes: a few steps under `jax.profiler.trace`, its
Perfetto trace read back and summed by kernel name and by kind of kernel.

  from benchmarks import trace_summary
  summary = trace_summary.profile(lambda: run_one_step(), steps=3, keep="/out/x.json.gz")

The kinds are read from the kernel names XLA and its libraries give (cuBLAS / CUTLASS
GEMMs, cuDNN, XLA's own fusions, copies, collectives); a name no rule knows is "other".
On a CPU the device process is the host's, so the same summary shows XLA:CPU's thunks.
Used by benchmarks/accelerator.py --profile; figures: docs/performance.md, "On a GPU".
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import shutil
import tempfile
from typing import Callable, Optional

# (kind, substrings of a kernel's name, lower case), first match wins
KINDS = (
    ("attention", ("flash", "fmha", "cudnn")),     # (before matmul: cuDNN's use wgmma too)
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "dot", "wgmma",
                "ynn_fusion")),
    ("collective", ("nccl", "all-reduce", "all_reduce", "all-gather", "reduce-scatter")),
    ("copy", ("memcpy", "memset", "copy", "transpose")),
    ("reduction", ("reduce", "reduction")),
    ("fusion", ("fusion", "loop_", "input_", "convert", "broadcast", "select", "scatter",
                "gather", "dynamic")),
)


def kind_of(name: str) -> str:
  low = name.lower()
  for kind, keys in KINDS:
    if any(k in low for k in keys):
      return kind
  return "other"


def summarize(trace_path: str, steps: int, top: int = 20) -> dict:
  """Device busy time per step, its share by kind, and the `top` kernels, from a Perfetto
  JSON trace (.json.gz). Device processes are those named /device:*; without one (CPU),
  the host's XLA events are read instead, where enclosing events (an executor's) and
  their thunks are both summed: a CPU's shares are indicative only. Busy time sums the
  lines read, so overlapping streams count twice."""
  with gzip.open(trace_path, "rt") as f:
    t = json.load(f)
  events = t["traceEvents"] if isinstance(t, dict) else t
  names = {e["pid"]: e.get("args", {}).get("name", "")
           for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "")
             for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
  device = {p for p, n in names.items() if n.startswith("/device:")}
  # a GPU's kernels are on its "Stream #..." lines; its "XLA Ops" / "XLA Modules" lines
  # (where the profiler adds them) repeat the same time at another level. Without Stream
  # lines (a TPU) the "XLA Ops" line is read.
  streams = {k for k, n in threads.items() if k[0] in device and n.startswith("Stream")}
  streams = streams or {k for k, n in threads.items() if k[0] in device and n == "XLA Ops"}
  per_thread = collections.Counter()
  by_name = collections.Counter()
  count = collections.Counter()
  for e in events:
    if e.get("ph") != "X":
      continue
    pid, key = e.get("pid"), (e.get("pid"), e.get("tid"))
    if device:
      if pid not in device:
        continue
      per_thread[f"{names[pid]} {threads.get(key, key[1])}"] += float(e.get("dur", 0.0))
      if streams and key not in streams:
        continue
    elif not names.get(pid, "").startswith("/host") or e["name"].startswith("$"):
      continue                          # (CPU: XLA's thunks, not the Python frames)
    by_name[e["name"]] += float(e.get("dur", 0.0))
    count[e["name"]] += 1
  total = sum(by_name.values())
  kinds = collections.Counter()
  for n, us in by_name.items():
    kinds[kind_of(n)] += us
  return {"device_processes": sorted(names[p] for p in device) or ["(host)"],
          "steps": steps,
          "busy_ms_per_step": round(total / 1e3 / steps, 3),
          "ms_per_step_by_line": {k: round(v / 1e3 / steps, 3)
                                  for k, v in per_thread.most_common(12)},
          "share_by_kind": {k: round(v / total, 4) for k, v in kinds.most_common()} if total
          else {},
          "top_kernels": [{"name": n[:160], "kind": kind_of(n), "calls": count[n] // steps,
                           "ms_per_step": round(us / 1e3 / steps, 3),
                           "share": round(us / total, 4)}
                          for n, us in by_name.most_common(top)]}


KEEP_LIMIT = 15 << 20     # a trace bigger than this is not kept (the device tool's 16 MiB)


def profile(step: Callable[[], None], steps: int = 3, keep: Optional[str] = None) -> dict:
  """Runs `step` (which blocks until its work is done) `steps` times under the profiler
  and summarizes the trace; `keep` copies the trace there when under KEEP_LIMIT bytes."""
  import jax
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(steps):
        step()
    found = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
    if not found:
      return {"error": f"no perfetto_trace.json.gz under the profiler's {d}"}
    out = summarize(found[0], steps)
    if keep and os.path.getsize(found[0]) <= KEEP_LIMIT:
      shutil.copyfile(found[0], keep)
      out["trace"] = os.path.basename(keep)
  return out
