"""Keep freed host memory inside the process (glibc malloc), for XLA:CPU runs.

XLA:CPU allocates the temporaries of a jitted step when the step starts and frees
them when it ends. glibc hands big blocks back to the kernel on free (blocks above
the mmap threshold are munmap'ed, the heap top is trimmed, an emptied per-thread
heap is unmapped), so the next step page-faults every one of them in again. On
the benchmark config (4 layers, d 256, batch 64, 2 cores) that is ~120,000 minor
faults and ~0.3 s of kernel time per 0.85 s train step. With `configure()` it is 0
faults; the benchmark step is ~6% shorter and the real `contrastive_tiny.gin` run makes
~30% more steps per second (docs/performance.md).

`configure()` sets, via mallopt(3):
  M_MMAP_MAX = 0          no mmap'ed blocks, big blocks come from the heap;
  M_TRIM_THRESHOLD = 2 GiB the heap top is not given back;
  M_ARENA_MAX = 1          no per-thread heaps (glibc unmaps those when they empty).
It must run before threads that allocate start (i.e. before importing jax or
TensorFlow): every launcher calls it from `cli.run_main`, before main() imports
jax; a notebook calls it in its first cell. The price is that the process keeps
its peak host memory until it exits.

Policy (environment variable VMX_HOST_MALLOC):
  auto (default)  configure when this host runs JAX on ONE CPU device: JAX_PLATFORMS
                  is unset or 'cpu', XLA_FLAGS does not simulate several host devices
                  and no GPU/TPU device node (/dev/nvidia0, /dev/accel0, /dev/vfio)
                  exists. With 8 simulated devices one arena serializes their threads
                  (the test suite ran 14% slower, 3x the kernel time), and accelerator
                  hosts keep the per-thread arenas their tf.data threads use;
  on              always; off: never.
Nothing happens outside glibc or when LD_PRELOAD installs another allocator
(tcmalloc and jemalloc do not have this problem).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
_ACCELERATOR_NODES = ("/dev/nvidia0", "/dev/accel0", "/dev/vfio")

_state: str | None = None  # what configure() did: "tuned", or why not


def _wants_tuning(policy: str) -> bool:
  if policy == "on":
    return True
  if policy == "off":
    return False
  if policy != "auto":
    raise ValueError(f"VMX_HOST_MALLOC={policy!r}; expected auto, on or off")
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms and platforms.split(",")[0].strip() != "cpu":
    return False
  if simulated_host_devices() > 1:
    return False
  return not any(os.path.exists(p) for p in _ACCELERATOR_NODES)


def simulated_host_devices() -> int:
  """N of --xla_force_host_platform_device_count=N in XLA_FLAGS (1 if absent)."""
  m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
  return int(m.group(1)) if m else 1


def configure(policy: str | None = None) -> str:
  """Applies the settings above (once per process); returns "tuned" or why not."""
  global _state
  if _state is not None:
    return _state
  policy = (policy or os.environ.get("VMX_HOST_MALLOC", "auto")).strip().lower()
  if not _wants_tuning(policy):
    _state = f"default (VMX_HOST_MALLOC={policy})"
  elif not sys.platform.startswith("linux"):
    _state = "default (not Linux)"
  elif any(a in os.environ.get("LD_PRELOAD", "") for a in ("tcmalloc", "jemalloc", "mimalloc")):
    _state = "default (LD_PRELOAD allocator)"
  else:
    try:
      libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
      mallopt = libc.mallopt
    except (OSError, AttributeError):
      _state = "default (no glibc mallopt)"
    else:
      mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
      ok = all(mallopt(param, value) == 1 for param, value in (
          (M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _TRIM_THRESHOLD)))
      _state = "tuned" if ok else "default (mallopt refused)"
  return _state
