"""vmx models under t5x's own trainer (`t5x/train.py`), and t5x's checkpoints in vmx.

t5x's trainer takes a model with t5x's `BaseModel` interface; vmx models have vmx's
contract (vmx/models/base.py: `compute_loss`, `embed`, `feature_converter`, hooks). This
module is where the one becomes the other (`gin_configs/t5x/contrastive_tiny.gin` wires it):

* `T5XModel(model, optimizer_def, ...)`: t5x's interface on a vmx model: `loss_fn` and
  `eval_fn` (`compute_loss`, metrics as clu Averages; t5x's arity: flax_mutables passed
  and returned for a model that keeps any, `HAS_MUTABLES`), `score_batch` (the cosine of
  each pair's two sentence vectors) and `predict_batch_with_aux` (the L2-normalized
  vectors of `{side}_tokens`), `FEATURE_CONVERTER_CLS`; plus `optimizer_def` (t5x's
  trainer reads the optimizer from the model) and a `<collection>_axes` entry for every
  flax_mutables collection (t5x shards the train state from `get_initial_variables`'
  `*_axes` collections; vmx's own trainer asks the model's `flax_mutables_axes` hook).
  With `model_dir`, process 0 writes `vmx_model.json` and the vocabulary there, so that
  `Encoder.from_checkpoint(model_dir)` opens the run's t5x checkpoints.
* `logical_factor_rules()`: t5x's Adafactor factorizes a parameter by the logical names of
  its axes and raises KeyError on a name it has no rule for; vmx adds `length`
  (position embeddings), `languages`, `ranks` (EMMA-X's GMM) and `token_types` (BERT)
  to t5x's `standard_logical_factor_rules()`: all unfactored. 3-D attention kernels
  (`embed, heads, kv` / `heads, kv, embed`) get t5x's standard ROW / COLUMN rules.
* `additional_axis_rules()`: the logical axes of vmx parameters that t5x's
  `standard_logical_axis_rules()` does not name (replicated), for
  `partitioning.standard_logical_axis_rules.additional_rules`.
t5x's checkpoints (Orbax or legacy layout) are read without t5x by
vmx/modeldir/t5x_format.py, so `Encoder.from_checkpoint` opens a t5x run's directory.

What t5x's trainer does not do: it calls none of vmx's trainer hooks (`after_update`,
`derive_mutables`: InfoXLM's and EMMA-X's momentum encoders) and reads one task a step
(InfoXLM's three), so `T5XModel` refuses those models; they need vmx's trainer. Use t5x's
optimizers (its Adafactor partitions the factored state; optax's factored Adafactor state
is not partitionable by t5x's `OptaxWrapper`).

t5x is not on PyPI; `t5x` is imported only inside the functions that need it.
`tests/test_t5x_compat.py` checks the pieces without t5x, and runs `t5x/train.py` on a vmx
gin file when t5x is importable (`PYTHONPATH=/path/to/t5x python -m pytest
tests/test_t5x_compat.py`).
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from flax.linen import partitioning as nnp
from flax.core import freeze, unfreeze

from vmx.errors import ConfigError
from vmx.losses import l2_normalize
from vmx.models.base import BaseModel, averaged
from vmx.modeldir import layout

# The logical axis names of t5x's standard_logical_axis_rules() (t5x/partitioning.py, with
# its always-appended rules) and the rules of standard_logical_factor_rules()
# (t5x/adafactor.py; 'col' = FactorDim.COLUMN), at t5x's commit cc342d4 (2026-04): what
# tests/test_t5x_compat.py checks vmx's parameters against without t5x (and against t5x's
# own rules with it). At run time the functions below take t5x's rules and add vmx's.
T5X_AXIS_RULE_NAMES = frozenset({
    "batch", "vocab", "embed", "mlp", "heads", "kv", "joined_kv", "relpos_buckets",
    "abspos_buckets", "length", "layers", "stack", "mlp_activations"})
T5X_FACTOR_RULES = {
    "vocab": "col", "embed": "row", "mlp": "col", "heads": "col", "kv": "col",
    "joined_kv": "col", "relpos_buckets": "none", "layers": "batch", "stack": "batch",
    "q_wi_fused": "col", "o_wo_fused": "col", "multiquery_heads": "col", "kv_fused": "col",
    "layer_norm_scale": "none", "mlp_activations": "col"}
# vmx's own axis names: unfactored by Adafactor, replicated on the mesh.
VMX_FACTOR_RULES = {"length": "none", "languages": "none", "ranks": "none",
                    "token_types": "none"}
VMX_AXIS_RULES = (("languages", None), ("ranks", None), ("token_types", None))


@gin.configurable(module="vmx.t5x_compat")
def logical_factor_rules():
  """t5x's standard Adafactor factor rules plus vmx's axis names (for
  `adafactor.Adafactor.logical_factor_rules`)."""
  from t5x import adafactor  # lazy: t5x (optional, not on PyPI)
  rules = unfreeze(adafactor.standard_logical_factor_rules())
  rules.update({k: adafactor.FactorDim.NONE for k in VMX_FACTOR_RULES})
  return freeze(rules)


@gin.configurable(module="vmx.t5x_compat")
def additional_axis_rules():
  """vmx's logical axes that t5x's standard axis rules do not name (for
  `partitioning.standard_logical_axis_rules.additional_rules`)."""
  return list(VMX_AXIS_RULES)


def _overrides(model, name: str) -> bool:
  return getattr(type(model), name) is not getattr(BaseModel, name)


def mutables_axes_collections(model, variables) -> dict:
  """`{collection}_axes` entries (flax AxisMetadata leaves named `<leaf>_axes`, as
  `param_with_axes` makes for `params_axes`) for every non-params collection of
  `variables`, from the model's `flax_mutables_axes` hook (default: replicated)."""
  params_axes = {k: tuple(v) for k, v in traverse_util.flatten_dict(
      nnp.get_axis_names(variables["params_axes"])).items()}
  params_axes = traverse_util.unflatten_dict(params_axes)
  mutables = {k: v for k, v in variables.items()
              if k != "params" and not k.endswith("_axes")}
  axes = model.flax_mutables_axes(params_axes, mutables) if mutables else {}
  out = {}
  for coll, tree in mutables.items():
    flat = traverse_util.flatten_dict(tree)
    coll_axes = axes.get(coll) if axes else None
    flat_axes = (traverse_util.flatten_dict(coll_axes) if coll_axes is not None
                 else {k: (None,) * np.ndim(v) for k, v in flat.items()})
    out[f"{coll}_axes"] = traverse_util.unflatten_dict(
        {k[:-1] + (f"{k[-1]}_axes",): nnp.AxisMetadata(names=tuple(flat_axes[k]))
         for k in flat})
  return out


@gin.configurable(module="vmx.t5x_compat")
class T5XModel:
  """A vmx model as t5x's trainer takes it (see the module docstring).

  model: a vmx model (any whose training needs none of vmx's trainer hooks).
  optimizer_def: a t5x optimizer (e.g. `@adafactor.Adafactor()` with
    `logical_factor_rules = @t5x_compat.logical_factor_rules()`).
  model_dir, vocabulary, languages, max_length: where (process 0) writes the
    `vmx_model.json` and vocabulary that `Encoder.from_checkpoint(model_dir)` reads;
    model_dir None: nothing is written.
  """

  def __init__(self, model, optimizer_def, model_dir: Optional[str] = None,
               vocabulary: Optional[str] = None, languages: Sequence[str] = (),
               max_length: Optional[int] = None):
    hooks = [h for h in ("after_update", "derive_mutables") if _overrides(model, h)]
    if hooks:
      raise ConfigError(f"T5XModel: {type(model).__name__} needs vmx's trainer hook(s) "
                        f"{hooks}, which t5x's trainer does not call: train it with "
                        "launch/train.py")
    if isinstance(model.FEATURE_CONVERTER_CLS, Mapping):
      raise ConfigError(f"T5XModel: {type(model).__name__} reads several tasks a step; "
                        "t5x's trainer reads one: train it with launch/train.py")
    if model_dir is not None and (vocabulary is None or max_length is None):
      raise ConfigError("T5XModel.model_dir is set: also bind T5XModel.vocabulary and "
                        "T5XModel.max_length (what Encoder.from_checkpoint needs)")
    self.model, self.optimizer_def = model, optimizer_def
    self.module = model.module
    # t5x passes flax_mutables to (and wants them back from) a model that keeps any: known
    # once t5x has asked for the initial variables (before its first loss_fn)
    self.HAS_MUTABLES = False
    if model_dir is not None and jax.process_index() == 0:
      layout.write_inference_files(model_dir, model, languages, max_length, vocabulary)

  @property
  def FEATURE_CONVERTER_CLS(self):  # noqa: N802  (t5x's name)
    return self.model.FEATURE_CONVERTER_CLS

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    variables = dict(self.model.get_initial_variables(rng, input_shapes, input_types))
    self.HAS_MUTABLES = any(k != "params" and not k.endswith("_axes") for k in variables)
    variables.update(mutables_axes_collections(self.model, variables))
    return variables

  def loss_fn(self, params, batch, dropout_rng, flax_mutables=None):
    """t5x's loss_fn on `compute_loss`: (loss, metrics), or (loss, (metrics, new
    flax_mutables)) for a model that keeps flax_mutables (t5x's arity)."""
    loss, metrics, new = self.model.compute_loss(params, batch, dropout_rng, flax_mutables)
    if self.HAS_MUTABLES:
      return loss, (averaged(metrics), new)
    return loss, averaged(metrics)

  def eval_fn(self, params, batch, flax_mutables=None):
    del flax_mutables
    loss, metrics, _ = self.model.compute_loss(params, batch, None, None)
    return loss, averaged(metrics)

  def score_batch(self, params, batch, return_intermediates: bool = False):
    """Cosine similarity of each (left, right) pair's sentence vectors: [B]."""
    if "left_tokens" not in batch or "right_tokens" not in batch:
      raise ConfigError(f"T5XModel.score_batch scores pairs (left_tokens, right_tokens); "
                        f"this batch has {sorted(batch)}")
    m = self.model
    left = m.embed(params, batch["left_tokens"], batch.get("left_lang"), "left")
    right = m.embed(params, batch["right_tokens"], batch.get("right_lang"), "right")
    scores = jnp.sum(l2_normalize(left) * l2_normalize(right), axis=-1)
    if return_intermediates:
      return scores, {"left_encodings": left, "right_encodings": right}
    return scores

  def predict_batch_with_aux(self, params, batch, rng=None, side: str = "left", **kwargs):
    """L2-normalized sentence vectors [B, D] of `{side}_tokens`; aux: the raw vectors."""
    del rng, kwargs
    emb = self.model.embed(params, batch[f"{side}_tokens"], batch.get(f"{side}_lang"), side)
    return l2_normalize(emb), {"unnormalized": emb}

  def predict_batch(self, params, batch, rng=None, **kwargs):
    return self.predict_batch_with_aux(params, batch, rng=rng, **kwargs)[0]
