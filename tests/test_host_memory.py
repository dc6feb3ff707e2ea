"""vmx.host_memory: freed host memory stays in the process (no page faults on re-use)."""
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

PROBE = textwrap.dedent("""
    import ctypes, resource, sys
    sys.path.insert(0, {repo!r})
    from vmx import host_memory
    state = host_memory.configure({policy!r})
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    size, faults = 64 << 20, []
    for _ in range(4):  # what a train step does with its temporaries
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      p = libc.malloc(size)
      ctypes.memset(p, 1, size)
      libc.free(p)
      faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(state, max(faults[1:]))
""")


def _probe(policy):
  out = subprocess.run([sys.executable, "-c", PROBE.format(repo=str(REPO), policy=policy)],
                       capture_output=True, text=True, check=True,
                       env={"PATH": "/usr/bin:/bin"}).stdout.split()
  return out[0], int(out[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_tuned_allocator_reuses_freed_blocks_without_page_faults():
  state, faults = _probe("on")
  assert state == "tuned"
  assert faults < 100, f"{faults} page faults re-using a freed 64 MiB block"
  state, faults = _probe("off")  # glibc's default: the block is unmapped and faulted in again
  assert state.startswith("default")
  assert faults > 10_000, faults


def test_bad_policy_names_the_variable():
  from vmx import host_memory
  with pytest.raises(ValueError, match="VMX_HOST_MALLOC='sometimes'"):
    host_memory._wants_tuning("sometimes")


def test_auto_policy_only_tunes_single_device_cpu_hosts(monkeypatch):
  from vmx import host_memory
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert not host_memory._wants_tuning("auto")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setattr(host_memory, "_ACCELERATOR_NODES", ())
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
  assert host_memory._wants_tuning("auto")
  # simulated multi-device meshes (the test suite): one arena would serialize the threads
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false "
                                  "--xla_force_host_platform_device_count=8")
  assert host_memory.simulated_host_devices() == 8
  assert not host_memory._wants_tuning("auto")


@pytest.mark.parametrize("env,expected", [(None, "default (VMX_HOST_MALLOC=off)"),
                                          ("on", "tuned")])
def test_a_launcher_policy_applies_where_the_variable_is_unset(env, expected):
  """run_main(main, host_malloc="off") (the mining launchers: their bar is memory, and the
  tuned allocator keeps a process's peak); VMX_HOST_MALLOC still decides when set."""
  probe = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
           "from vmx import cli, host_memory\n"
           "cli.run_main(lambda argv: print(host_memory.configure()), [], host_malloc='off')\n")
  environ = {"PATH": "/usr/bin:/bin", **({"VMX_HOST_MALLOC": env} if env else {})}
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env=environ).stdout.strip()
  assert out == expected
