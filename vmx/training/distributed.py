"""Multi-process start-up: which cluster this is, `jax.distributed.initialize`, and a line
per process saying what it sees (what `launch/train.py --multihost` runs).

Cluster detection is JAX's own (the environments `jax.distributed.initialize()` reads):
Cloud TPU VMs (GCE or GKE), SLURM (one process per GPU: `srun` tasks), Open MPI
(`mpirun`) and Kubernetes (JobSet / indexed jobs). Explicit flags (coordinator address,
process count, process id) override it, for any other cluster or for local processes.
"""
from __future__ import annotations

import socket
from typing import Optional

import jax
import numpy as np

from vmx.errors import ConfigError
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def detect_cluster() -> Optional[str]:
  """Name of the cluster environment JAX would initialize from ('slurm', 'ompi',
  'gce_tpu', ...), or None on a plain machine."""
  try:   # JAX's registry of cluster environments (private, so guarded)
    from jax._src import clusters  # lazy: jax's private cluster detection, only when asked
    types = clusters.ClusterEnv._cluster_types
  except (ImportError, AttributeError):   # pragma: no cover  (a future JAX)
    return None
  for env in types:
    if getattr(env, "opt_in_only_method", False):
      continue
    try:
      if env.is_env_present():
        return getattr(env, "name", env.__name__)
    except Exception:  # noqa: BLE001  a probe that cannot run means "not this cluster"
      continue
  return None


def initialize(coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> str:
  """Starts JAX's multi-process runtime; returns how the cluster was found.

  The three explicit arguments go together; without them the cluster must be one JAX
  detects (ConfigError otherwise, before anything waits on a coordinator)."""
  explicit = (coordinator_address, num_processes, process_id)
  if any(x is not None for x in explicit):
    if any(x is None for x in explicit):
      raise ConfigError("--coordinator_address, --num_processes and --process_id go "
                        "together")
    if not 0 <= process_id < num_processes:
      raise ConfigError(f"--process_id={process_id} is not in [0, --num_processes="
                        f"{num_processes})")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return f"coordinator {coordinator_address}"
  cluster = detect_cluster()
  if cluster is None:
    raise ConfigError(
        "--multihost: no cluster detected (Cloud TPU VM, SLURM srun, Open MPI mpirun or "
        "Kubernetes); elsewhere pass --coordinator_address=HOST:PORT --num_processes=N "
        "--process_id=I to every process, or leave out --multihost on one machine "
        "(all local devices are used)")
  jax.distributed.initialize()
  return cluster


def layout(cluster: str = "single process") -> str:
  """One line describing this process: index, host, cluster, local and global devices."""
  local = jax.local_devices()
  kinds = sorted({d.device_kind for d in local})
  return (f"[vmx] process {jax.process_index()} of {jax.process_count()} on "
          f"{socket.gethostname()} ({cluster}): {len(local)} local / {jax.device_count()} "
          f"devices, {jax.default_backend()} {', '.join(kinds)}")


def check_all_reduce() -> float:
  """Sums a value from every device of every process through one jitted collective and
  returns the sum (it must equal the device count): the check that the processes reach
  each other before a long run is started."""
  mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
  sharding = NamedSharding(mesh, P("data"))
  local = np.ones((jax.local_device_count(),), np.float32)
  x = jax.make_array_from_process_local_data(sharding, local, (jax.device_count(),))
  total = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, P()))(x)
  return float(np.asarray(total.addressable_data(0)))

