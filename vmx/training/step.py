"""The jitted train step and its sharded state (what `train()` loops over).

State: `TrainState(step, params, opt_state, flax_mutables, rng)`, sharded over a
('data', 'model') mesh by logical axis rules; one jitted step does forward,
backward, the optax update and the model's `after_update` hook (flax_mutables that
follow the new parameters: momentum encoders). The model's hooks also shard its
flax_mutables (`flax_mutables_axes`) and derive them from starting parameters
(`derive_mutables`); see vmx/models/base.py. The loss is the model's `compute_loss`
(one contract for every model: `(params, batch, dropout_rng, flax_mutables) -> (loss,
{name: scalar}, new flax_mutables)`), computed on the global batch (the sharding of
every input and parameter is explicit, XLA inserts the collectives). Each step also
returns one non-finite flag per loss term, the gradients and the new parameters.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics
from jax.experimental import multihost_utils

from vmx.data import packing
from vmx.models.base import BaseModel, averaged
from vmx.training import grad_cache, partitioning


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  flax_mutables: Any
  rng: jax.Array  # raw uint32 key data; dropout rng of step s = fold_in(rng, s)


class TrainStep:
  """Builds the sharded state and the jitted step for `model` on `partitioner`'s mesh.

  `shapes`: the global batch's example shapes ({feature: [B, ...]}); `packed`: {task key:
  [packing.Feature]} of the token features packed into rows (vmx/data/packing.py), whose
  row count varies by step (each row count compiles the step once); `token_features`: the
  batch's token features, whose non-pad share is logged (`useful_token_fraction`)."""

  def __init__(self, model: BaseModel, optimizer: optax.GradientTransformation,
               partitioner: partitioning.Partitioner, shapes: Mapping[str, tuple],
               learning_rate: Optional[Callable] = None, grad_cache_chunks: int = 1,
               packed: Optional[Mapping[Any, Sequence[packing.Feature]]] = None,
               token_features: Sequence[str] = ()):
    self.model, self.tx, self.partitioner = model, optimizer, partitioner
    self.shapes = dict(shapes)
    self.learning_rate = learning_rate
    self.packed = {k: list(v) for k, v in (packed or {}).items() if v}
    grad_cache.check(model, grad_cache_chunks, self.shapes, partitioner.data_parallel_size)
    self.grad_cache_chunks = grad_cache_chunks
    # (a packed group's rows stand for its features)
    group_of = {f.name: f.group or f.name for fs in self.packed.values() for f in fs}
    self.token_features = tuple(dict.fromkeys(group_of.get(n, n) for n in token_features))
    self.example_shardings = partitioner.batch_sharding(
        {k: jax.ShapeDtypeStruct(s, jnp.int32) for k, s in self.shapes.items()})
    # What the step reads: the example features, the packed ones replaced by their rows.
    self.step_shapes = packing.step_shapes(self.shapes, self.packed)
    self.batch_shardings = partitioner.batch_sharding(
        {k: jax.ShapeDtypeStruct(s, jnp.int32) for k, s in self.step_shapes.items()})
    self._placers = 0
    # packed row counts of the steps run -> [steps, seconds of the first (its compilation),
    # the first's number among this invocation's steps]
    self.row_counts: dict[tuple, list] = {}
    self.steps_run = 0

    def init(rng):
      init_rng, dropout_rng = jax.random.split(rng)
      variables = dict(model.get_initial_variables(init_rng, self.shapes))
      params = variables.pop("params")
      variables.pop("params_axes", None)
      mutables = {k: v for k, v in variables.items() if not k.endswith("_axes")}
      return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                        opt_state=self.tx.init(params), flax_mutables=mutables,
                        rng=jax.random.key_data(dropout_rng))

    self._init = init
    with partitioner.context():
      variables_shape = jax.eval_shape(
          lambda: model.get_initial_variables(jax.random.PRNGKey(0), self.shapes))
      abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
    params_axes = partitioner.params_logical_axes(variables_shape["params_axes"])
    params_sh = partitioner.shardings_of(params_axes)
    repl = partitioner.replicated()

    opt_sh = opt_state_shardings(abstract.opt_state, abstract.params, params_sh, repl)
    # State not trained by gradients: sharded by the model's logical axes (a queue along
    # 'data', a momentum encoder like its parameters), else replicated.
    mutables_axes = model.flax_mutables_axes(params_axes, abstract.flax_mutables)
    mutables_sh = (jax.tree.map(lambda _: repl, abstract.flax_mutables)
                   if mutables_axes is None else partitioner.shardings_of(mutables_axes))
    self.state_shardings = TrainState(
        step=repl, params=params_sh, opt_state=opt_sh, flax_mutables=mutables_sh, rng=repl)
    self.abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract,
        self.state_shardings)
    self.init_state = jax.jit(init, out_shardings=self.state_shardings)
    self.train_step = jax.jit(self._train_step, in_shardings=(self.state_shardings,
                                                              self.batch_shardings),
                              out_shardings=(self.state_shardings, repl, repl),
                              donate_argnums=(0,))
    self.prefill_step = jax.jit(
        lambda state, batch: state.replace(flax_mutables=model.prefill(
            state.params, batch, state.flax_mutables)),
        in_shardings=(self.state_shardings, self.batch_shardings),
        out_shardings=self.state_shardings, donate_argnums=(0,))
    self.nonfinite_names: list[str] = []  # what each flag of `nonfinite` checks (set at trace)
    self.nonfinite = None                 # [n] bool flags of the last step (device array)

  def _loss_and_grads(self, state: TrainState, batch, dropout_rng):
    model = self.model
    if self.grad_cache_chunks > 1:
      (examples,) = set(self.batch_sizes.values())   # (check() allows one task key)
      loss, metrics, grads, mutables = grad_cache.loss_and_grads(
          model, state.params, batch, dropout_rng, self.grad_cache_chunks, state.flax_mutables,
          num_examples=examples)
      return loss, averaged(metrics), grads, mutables

    def fn(p):
      loss, metrics, mutables = model.compute_loss(p, batch, dropout_rng, state.flax_mutables)
      return loss, (averaged(metrics), mutables)
    (loss, (metrics, mutables)), grads = jax.value_and_grad(fn, has_aux=True)(state.params)
    return loss, metrics, grads, mutables

  def _train_step(self, state: TrainState, batch):
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, metrics, grads, mutables = self._loss_and_grads(state, batch, dropout_rng)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The model's post-update hook sees the NEW parameters (e.g. a momentum encoder).
    mutables = self.model.after_update(params, mutables, state.step + 1)
    metrics = dict(metrics)
    metrics["grad_norm"] = clu_metrics.Average.from_model_output(optax.tree.norm(grads))
    if self.learning_rate is not None:
      metrics["learning_rate"] = clu_metrics.LastValue.from_model_output(
          jnp.asarray(self.learning_rate(state.step)))
    if self.token_features:   # non-pad token positions over all the step computes
      used = sum(jnp.sum(batch[n] > 0, dtype=jnp.float32) for n in self.token_features)
      total = sum(float(np.prod(batch[n].shape)) for n in self.token_features)
      metrics["useful_token_fraction"] = clu_metrics.Average.from_model_output(used / total)
    # One flag per loss term / metric, the gradients and the updated parameters.
    names = sorted(metrics)
    flags = [~jnp.all(jnp.isfinite(metrics[k].compute())) for k in names]
    flags.append(~jnp.all(jnp.stack([jnp.all(jnp.isfinite(p))
                                     for p in jax.tree.leaves(params)])))
    self.nonfinite_names = ["gradients" if k == "grad_norm" else k for k in names] + \
        ["parameters (after the update)"]
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         flax_mutables=mutables), metrics, jnp.stack(flags)

  def prefill(self, state: TrainState, batches) -> TrainState:
    """A new run's forward-only fill of the model state before step 1: the model's
    `prefill` on its `prefill_batches` next batches (numpy, or already placed)."""
    for _ in range(self.model.prefill_batches(state.flax_mutables)):
      batch = next(batches)
      if not self.placed(batch):
        batch = self.place(batch)
      with self.partitioner.context():
        state = self.prefill_step(state, batch)
    return state

  def create_state(self, seed: int) -> TrainState:
    with self.partitioner.context():
      return self.init_state(jax.random.PRNGKey(seed))

  def replace_params(self, state: TrainState, params) -> TrainState:
    """`state` with new parameters, the optimizer state initialized for them and the
    model state derived from them (`derive_mutables`: a momentum encoder's copy)."""
    with self.partitioner.context():
      opt_state = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)(params)
      mutables = jax.jit(self.model.derive_mutables,
                         out_shardings=self.state_shardings.flax_mutables)(
                             params, state.flax_mutables)
    return state.replace(params=params, opt_state=opt_state, flax_mutables=mutables)

  @property
  def batch_sizes(self) -> dict:
    """{task key (None for one task): its global batch size}."""
    return {(n.split("/", 1)[0] if "/" in n else None): s[0] for n, s in self.shapes.items()}

  def local_rows(self) -> dict:
    """{task key (None for one task): the global batch rows this process's devices hold,
    sorted}: what the index reader reads on this process."""
    out = {}
    for name, shape in self.shapes.items():
      key = name.split("/", 1)[0] if "/" in name else None
      if key in out:
        continue
      index_map = self.example_shardings[name].addressable_devices_indices_map(shape)
      rows = np.arange(shape[0])
      out[key] = np.unique(np.concatenate([rows[idx[0]] for idx in index_map.values()]))
    return out

  def placed(self, batch) -> bool:
    return all(isinstance(batch.get(k), jax.Array) for k in self.batch_shardings)

  def packers(self, rows=None) -> dict:
    """{task key: packing.Packer} of this process's shards (`rows`: its example rows per
    task key, None: every shard, a GLOBAL batch); several processes agree on each step's
    row count through the coordination service."""
    p, n = self.partitioner.data_parallel_size, self.grad_cache_chunks
    self._placers += 1
    out = {}
    for key, features in self.packed.items():
      b = self.batch_sizes[key]
      shards = (range(p) if rows is None else packing.shard_of_rows(rows[key], b, p))
      agree = (packing.CoordinationAgreement(f"{self._placers}.{key}")
               if rows is not None and jax.process_count() > 1 else None)
      out[key] = packing.Packer(features, b, p, n, shards, agree=agree)
    return out

  def place(self, batch) -> dict:
    """The GLOBAL numpy batch (identical on every process) as sharded jax.Arrays: each
    process puts its own devices' rows (what the prefetch thread calls ahead of the step)."""
    for packer in self.packers().values():
      batch = packer(batch)
    return self.partitioner.global_batch({k: batch[k] for k in self.step_shapes},
                                         self.batch_shardings)

  def placer(self, rows=None) -> Callable[[dict], dict]:
    """What places a reader's batches: `place` for global batches (`rows` None), else a
    function placing this process's rows `rows` ({task key: global rows}, `local_rows()`)
    into the global arrays (packing them first, for a packed run)."""
    if rows is None:
      return self.place
    where = {}   # task key -> [global batch] position of each global row among `rows`
    for key, r in rows.items():
      where[key] = np.full(self.batch_sizes[key], -1, np.int64)
      where[key][np.asarray(r)] = np.arange(len(r))
    packers = self.packers(rows)
    # a packed group's row features -> the group (placed by row, not by example)
    row_of = {name: g for fs in self.packed.values() for g in packing.groups_of(fs)
              for name in packing.row_features(g)}

    def make(name, x, row_lookup):
      lookup = (row_lookup[row_of[name]] if name in row_of
                else where[name.split("/", 1)[0] if "/" in name else None])
      return jax.make_array_from_callback(
          (len(lookup), *x.shape[1:]), self.batch_shardings[name],
          lambda idx: np.asarray(x[lookup[idx[0]]][(slice(None),) + tuple(idx[1:])]))

    def place(batch):
      row_lookup = {}
      for key, packer in packers.items():
        batch = packer(batch)
        for g in packer.groups:
          row_lookup[g] = packer.row_lookup(len(batch[g]))   # global -> local rows
      return {name: make(name, batch[name], row_lookup) for name in self.step_shapes}
    return place

  def step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One update on the GLOBAL batch (numpy, or already `place`d); the step's non-finite
    flags are left in `self.nonfinite` (see `check_finite`)."""
    if not self.placed(batch):
      batch = self.place(batch)
    rows = tuple(batch[g].shape[0] for fs in self.packed.values()
                 for g in packing.groups_of(fs))
    first = bool(rows) and rows not in self.row_counts
    t0 = time.perf_counter()
    with self.partitioner.context():
      state, metrics, self.nonfinite = self.train_step(state, batch)
    self.steps_run += 1
    if first:   # a new shape: the step compiles (timed to its end)
      jax.block_until_ready(state.step)
      self.row_counts[rows] = [0, time.perf_counter() - t0, self.steps_run]
    if rows:
      self.row_counts[rows][0] += 1
    return state, metrics

  def packing_report(self) -> Optional[str]:
    """How often each packed shape ran and what its first step (compilation) took."""
    if not self.row_counts:
      return None
    names = [g for fs in self.packed.values() for g in packing.groups_of(fs)]
    return "; ".join(f"{'/'.join(map(str, rows))} rows: {n} steps (first: step {at} of this "
                     f"run, {sec:.1f} s)"
                     for rows, (n, sec, at) in sorted(self.row_counts.items())) + \
        f" ({', '.join(names)})"

  def nonfinite_terms(self, flags) -> list[str]:
    """Names of the non-finite terms in a step's flags ([] if all are finite)."""
    flags = np.asarray(local_value(flags))
    return [n for n, f in zip(self.nonfinite_names, flags) if f]


def opt_state_shardings(opt_state, params, params_sh, repl):
  """Each optimizer-state leaf sharded like the parameter it belongs to (same shape),
  else replicated: a leaf belongs to the parameter whose dict path ends its own path
  (optax states keep the parameter tree inside: `mu['encoder']['layers_0']...`), which
  also covers `multi_optimizer`'s per-subset states."""
  def keys(path):
    return tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)
  by_path = {keys(p): (x.shape, sh) for (p, x), sh in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(params_sh))}
  longest = max((len(k) for k in by_path), default=0)

  def leaf_sharding(path, leaf):
    path = keys(path)
    for n in range(min(longest, len(path)), 0, -1):
      hit = by_path.get(path[-n:])
      if hit is not None:
        return hit[1] if hit[0] == leaf.shape else repl
    return repl
  return jax.tree_util.tree_map_with_path(leaf_sharding, opt_state)


def local_value(x):
  """This process's copy of a replicated (possibly multi-process) array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)
  return x


def host_params(params):
  """Parameters usable by single-process code (evaluation): gathered across processes."""
  if jax.process_count() == 1:
    return params
  return multihost_utils.process_allgather(params, tiled=True)


def merge_metrics(acc: Optional[dict], new: dict) -> dict:
  if acc is None:
    return new
  return {k: acc[k].merge(v) for k, v in new.items()}


def compute_metrics(acc: dict) -> dict:
  return {f"train/{k}": float(jax.device_get(v.compute())) for k, v in acc.items()}


