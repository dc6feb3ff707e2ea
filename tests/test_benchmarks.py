"""The matmul-only bound counts exactly the model FLOPs train_throughput reports."""
import json
import os
import subprocess
import sys
import types

import pytest

from benchmarks import gemm_bound, train_throughput
from conftest import DATA_DIR, needs_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("layers,d,heads,d_ff,length,batch",
                         [(4, 256, 4, 1024, 32, 64), (2, 96, 3, 160, 7, 5)])
def test_gemm_bound_flops_equal_model_flops(layers, d, heads, d_ff, length, batch):
  bound, tput = gemm_bound, train_throughput
  total = sum(count * bound.flops(a, b, form)
              for _, count, a, b, form in bound.products(layers, d, heads, d_ff, length, batch))
  enc = types.SimpleNamespace(emb_dim=d, mlp_dim=d_ff, num_heads=heads, head_dim=None, depth=layers)
  assert total == 3 * 2 * tput.encoder_forward_flops(enc, batch, length)


def test_gemm_bound_runs_and_reports_every_kind():
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gemm_bound.py"),
                        "--backend=numpy", "--layers=1", "--d=32", "--heads=2", "--d_ff=64",
                        "--length=4", "--batch=3", "--repeats=2"],
                       capture_output=True, text=True, check=True)
  r = json.loads(out.stdout.strip().splitlines()[-1])
  assert r["gemm_bound_s"] > 0
  assert sum(r[f"{k}_flops_per_step"] for k in ("fwd", "dX", "dW", "attention")) == \
      r["gemm_flops_per_step"]


@pytest.mark.slow      # ~30 s of compiles; the equality itself is tests/test_step.py's
def test_grad_cache_benchmark_runs_and_keeps_the_loss():
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "grad_cache.py"),
                        "--batches=16", "--chunk=8", "--steps=1", "--gin.NUM_LAYERS=1",
                        "--gin.EMB_DIM=16", "--gin.NUM_HEADS=2", "--gin.MLP_DIM=32",
                        "--gin.MAX_LENGTH=8", "--gin.VOCAB_SIZE=100"],
                       capture_output=True, text=True, check=True)
  row = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][0])
  assert row["global_batch"] == 16 and row["time_ratio"] > 0
  assert abs(row["grad_cache_loss"] - row["uncached_loss"]) < 1e-4 * abs(row["uncached_loss"])


@needs_data
@pytest.mark.slow
def test_input_pipeline_benchmark_times_first_batch_stream_and_resume():
  env = dict(os.environ, VMX_DATA_DIR=DATA_DIR)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "input_pipeline.py"),
                        "--gin_file=contrastive_tiny.gin", "--batches=3", "--skip=4"],
                       capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  assert r["first_batch_s"] > 0 and r["batches_per_s"] > 0 and r["skip_batches"] == 4
  assert r["examples_per_s"] == pytest.approx(r["batches_per_s"] * r["batch_size"], rel=0.01)


@needs_data
@pytest.mark.slow
def test_resume_equals_uninterrupted_for_every_family():
  """benchmarks/resume_families.py: stop/restart vs uninterrupted, bitwise, per family."""
  env = dict(os.environ, VMX_DATA_DIR=DATA_DIR)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "resume_families.py")],
                       capture_output=True, text=True, env=env, timeout=3600)
  rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
  assert out.returncode == 0 and rows[-1]["all_equal"], (rows, out.stderr[-2000:])


@pytest.mark.slow   # 70 s here, 250 s on a loaded CI machine; the fast tier keeps the next test
def test_accelerator_benchmark_smoke_reports_every_family(tmp_path):
  """benchmarks/accelerator.py --smoke (what a GPU runs, at tiny sizes on CPU): one JSON
  with every family's figures, bf16 within tolerance, and a bitwise restart. The deadline
  is the test's own (a slow machine must not skip the last parts)."""
  env = dict(os.environ, OUT=str(tmp_path), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "accelerator.py"),
                        "--smoke", "--timeout", "1500"], capture_output=True, text=True,
                       env=env, timeout=1600)
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  r = json.loads((tmp_path / "accelerator.json").read_text())
  assert r == json.loads(out.stdout.strip().splitlines()[-1])
  keys = {"steps_per_s", "examples_per_s", "tokens_per_s", "mfu", "peak_bytes",
          "estimated_peak_bytes", "input_wait_fraction"}
  assert set(r["families"]) == {"contrastive", "vmsst", "ems", "mpcl", "infoxlm", "emmax"}
  for name, fam in r["families"].items():
    assert keys <= set(fam), (name, fam)
    assert fam["steps_per_s"] > 0 and 0 < fam["mfu"] < 1 and fam["estimated_peak_bytes"] > 0
    assert fam["examples_per_s"] == pytest.approx(fam["steps_per_s"] * fam["batch"]
                                                  * {"infoxlm": 3, "emmax": 2}.get(name, 1))
    assert fam["xla_mfu"] > 0 and fam["analytic_encoder_flops_per_step"] > 0
    assert fam["mfu"] == pytest.approx(fam["analytic_encoder_flops_per_step"]
                                       * fam["steps_per_s"] / r["peak_flops"])
  assert r["bf16_vs_f32"]["within_tolerance"], r["bf16_vs_f32"]
  assert r["restart"]["bitwise_equal"], r["restart"]
  assert r["attention"]["max_abs_diff"] < 1e-5
  packed, unpacked = r["packing"]["packed"], r["packing"]["unpacked"]
  assert packed["useful_token_fraction"] > 1.5 * unpacked["useful_token_fraction"]


def test_accelerator_benchmark_isolates_a_family_in_its_own_process(tmp_path):
  """--isolate (the default off --smoke): the family is measured by a child process (its
  peak memory its own) and its figures come back into the parent's JSON; --gin reaches
  the child's bindings."""
  env = dict(os.environ, OUT=str(tmp_path), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "accelerator.py"),
                        "--smoke", "--isolate", "--families=contrastive", "--parts=families",
                        "--gin", "NUM_LAYERS = 2", "--profile"],
                       capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  fam = json.loads(out.stdout.strip().splitlines()[-1])["families"]["contrastive"]
  assert fam["steps_per_s"] > 0, fam
  # two layers: twice the one-layer smoke's encoder FLOPs
  assert fam["analytic_encoder_flops_per_step"] == pytest.approx(2 * 10321920.0)
  prof = fam["profile"]     # --profile reached the child: the host's XLA thunks on CPU
  assert prof["busy_ms_per_step"] > 0 and prof["share_by_kind"].get("matmul", 0) > 0, prof


def test_trace_summary_reads_a_devices_streams_by_kind(tmp_path):
  """benchmarks/trace_summary.py on a Perfetto trace with a GPU's lines: kernels are read
  from its "Stream" lines only (its "XLA Ops" line repeats the same time), summed per
  step, by name and by kind; the host's events are left out."""
  import gzip
  from benchmarks import trace_summary
  meta = lambda pid, name, tid=None: {"ph": "M", "pid": pid, **({"tid": tid} if tid else {}),
                                      "name": "thread_name" if tid else "process_name",
                                      "args": {"name": name}}
  x = lambda pid, tid, name, dur: {"ph": "X", "pid": pid, "tid": tid, "name": name,
                                   "ts": 0, "dur": dur}
  events = [meta(1, "/device:GPU:0"), meta(1, "Stream #14(Compute)", 7),
            meta(1, "XLA Ops", 8), meta(2, "/host:CPU"),
            x(1, 7, "nvjet_sm90_tst_128x128", 600.0), x(1, 7, "loop_add_fusion", 300.0),
            x(1, 7, "memcpy128", 100.0), x(1, 7, "nvjet_sm90_tst_128x128", 600.0),
            x(1, 8, "fusion.3", 1600.0), x(2, 1, "ThunkExecutor::Execute", 5000.0)]
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  r = trace_summary.summarize(str(path), steps=2)
  assert r["device_processes"] == ["/device:GPU:0"]
  assert r["busy_ms_per_step"] == pytest.approx(0.8)          # 1,600 us over 2 steps
  assert r["share_by_kind"] == {"matmul": 0.75, "fusion": 0.1875, "copy": 0.0625}
  top = r["top_kernels"][0]
  assert (top["name"], top["kind"], top["calls"], top["ms_per_step"]) == (
      "nvjet_sm90_tst_128x128", "matmul", 1, 0.6)
