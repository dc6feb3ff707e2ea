"""Mesh and logical-axis partitioning (t5x's PjitPartitioner, on `jax.jit`).

Parameters carry logical axis names (vmx.layers); `logical_axis_rules` map them
to the mesh axes 'data' and 'model'. The batch is split over 'data'; with
`num_partitions > 1` the model dimensions (vocab, mlp, heads) are split over
'model'. The same code runs on 1 CPU device, 8 simulated ones, GPUs and TPU pods.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import flax
import gin
import jax
import numpy as np
from flax.linen import partitioning as nnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from vmx.gin_utils import check_range, positive_int


STANDARD_LOGICAL_AXIS_RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("embed", None),
    ("kv", None),
    ("length", None),
    ("layers", None),
    ("languages", None),
    ("relpos_buckets", None),
    ("ranks", None),
    ("token_types", None),
)


@gin.configurable
class Partitioner:
  """Builds the ('data', 'model') mesh and turns logical axes into shardings."""

  def __init__(self, num_partitions: int = 1, logical_axis_rules: Optional[Sequence] = None,
               num_devices: Optional[int] = None):
    devices = jax.devices()
    if num_devices is not None:
      check_range(positive_int(num_devices) and num_devices <= len(devices), "Partitioner",
                  "num_devices", num_devices, f"1 to the {len(devices)} visible devices")
      devices = devices[:num_devices]
    check_range(positive_int(num_partitions) and len(devices) % num_partitions == 0,
                "Partitioner", "num_partitions", num_partitions,
                f"a divisor of the {len(devices)} devices")
    self.mesh = jax.make_mesh((len(devices) // num_partitions, num_partitions),
                              ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto),
                              devices=devices)
    self.logical_axis_rules = tuple(logical_axis_rules or STANDARD_LOGICAL_AXIS_RULES)

  @property
  def data_parallel_size(self) -> int:
    return self.mesh.shape["data"]

  @contextlib.contextmanager
  def context(self):
    """Mesh + axis rules for tracing and running sharded code."""
    with jax.set_mesh(self.mesh), nnp.axis_rules(self.logical_axis_rules):
      yield

  def sharding(self, logical_axes: Sequence[Optional[str]]) -> NamedSharding:
    spec = nnp.logical_to_mesh_axes(logical_axes, self.logical_axis_rules)
    return NamedSharding(self.mesh, spec)

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  @staticmethod
  def params_logical_axes(params_axes) -> Any:
    """Tree of logical-axis PartitionSpecs from the `params_axes` collection."""
    return flax.core.unfreeze(nnp.get_axis_names(params_axes))

  def shardings_of(self, logical_axes) -> Any:
    """Tree of NamedShardings from a tree of logical axes (PartitionSpecs or tuples)."""
    return jax.tree.map(lambda s: self.sharding(tuple(s)), logical_axes,
                        is_leaf=lambda x: isinstance(x, (P, tuple)))

  def params_shardings(self, params_axes) -> Any:
    """Tree of NamedShardings from the `params_axes` collection (param_with_axes)."""
    return self.shardings_of(self.params_logical_axes(params_axes))

  def batch_sharding(self, batch_shapes) -> Any:
    """Leading (batch) dimension over 'data', the rest replicated."""
    return jax.tree.map(lambda s: self.sharding(("batch",) + (None,) * (len(s.shape) - 1)),
                        batch_shapes)

  def global_batch(self, batch, shardings):
    """Global jax.Arrays from the GLOBAL numpy batch that every process holds: each
    process places the rows of its own devices (any process/device layout)."""
    return jax.tree.map(
        lambda x, s: jax.make_array_from_callback(np.shape(x), s,
                                                  lambda idx, x=x: np.asarray(x[idx])),
        dict(batch), shardings)
