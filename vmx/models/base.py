"""The model contract: what vmx's trainer, inference, export and import ask a model, and
(de)serialization of model configs.

A vmx model wraps a Flax linen module. vmx's trainer (vmx/training/step.py) calls one
contract for every model:
  get_initial_variables(rng, input_shapes, input_types=None) -> variables
  compute_loss(params, batch, dropout_rng, flax_mutables)
      -> (loss, {name: scalar}, new_flax_mutables)
  feature_converter()   what shapes the model's batches: a converter's name;
                        `feature_layout()` is its features (vmx.data.features, no
                        SeqIO: what the trainer reads), `FEATURE_CONVERTER_CLS` the SeqIO
                        converter (imported on use: importing a model never imports
                        seqio/TensorFlow)
State not trained by gradients (momentum encoders, queues of past embeddings, step
counters) lives in those `flax_mutables` of the train state: such models put it in
`get_initial_variables` and return its new value; the others return what they were
given. Trainer hooks, all optional:
  flax_mutables_axes(params_axes, flax_mutables)  logical axes of that state (default:
      replicated), so a queue is split along 'data' and a momentum encoder like the
      parameters it follows;
  after_update(params, flax_mutables, step)  runs inside the jitted step right after
      the optimizer update, with the NEW parameters (a momentum update `k = m k +
      (1 - m) q`: the next step's keys come from it, no one-step lag);
  derive_mutables(params, flax_mutables)  state that follows from the starting
      parameters (`get_initial_variables` already makes it for fresh ones), redone when
      a run starts from an initial checkpoint (the momentum encoder copies the import);
  prefill_batches / prefill  model state filled before step 1 (InfoXLM's queue);
  validate_data(examples, batch_sizes)  the model's demands on its data (a queue larger
      than the corpus) before anything is compiled.
A contrastive model whose loss is a function of per-example embeddings opts into
GradCache (Gao et al. 2021; `train.grad_cache_chunks`, vmx/training/grad_cache.py) with
  grad_cache_embed(params, batch, dropout_rng) -> pytree of [b, ...] per-example arrays
  grad_cache_loss(embeddings, batch, flax_mutables) -> (loss, {name: scalar},
                                                      new_flax_mutables)
so that compute_loss == grad_cache_loss(grad_cache_embed(...)) on the whole batch (a
model with flax_mutables takes and updates them in the loss only; the others return
them unchanged). A chunk's batch also holds `batch[GRAD_CACHE_ROW]` [b], each example's
row in the global batch, for an embedding that depends on it (VMSST alternates a choice
by row). A model that reads packed rows (several sentences a row, vmx/packing.py) lists its token
features in `packed_features()`; its loss must then read them through vmx.packing (the
same vectors, in the same order, as from unpacked rows).
A model whose steps read several tasks at once returns {task: converter} from
`feature_converter()`; its batch features are then named `task/feature`
(vmx.data.pipeline.MultiTaskConfig).

What inference, export and import ask a model (so that they hard-code neither feature
names nor model classes): `inference_shapes(max_length)` / `abstract_params(max_length)`
(how it is initialised without data), `encode_tokens(params, tokens_BxL, lang_B)` (the
retrieval vectors; `token_sum_table(params)` where they are a bag of tokens),
`vocab_size` (the size of its token table), `sentence_vector()` (which vector that is and
where its encoder's parameters are) and `pooled_encoder()` (what a sentence-transformers
export writes).

`SentenceEncoderModel` is the base of every vmx method: a method is its linen module,
`embed` (the sentence vector used for retrieval) and `compute_loss` (its objective as a
dict of scalars). t5x's own `BaseModel` interface (`loss_fn`, `eval_fn`, `score_batch`,
`predict_batch_with_aux`, clu metrics, its flax_mutables arity) is the t5x adapter's
(vmx/t5x_compat.py `T5XModel`), built on this contract.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from flax import linen as nn

from vmx.data import features
from vmx.errors import ConfigError
from vmx.losses import l2_normalize, matryoshka, token_row_key
from vmx.static_encoder import StaticEncoder


GRAD_CACHE_ROW = "grad_cache/row"   # see the module docstring (GradCache)


class BaseModel(abc.ABC):
  # The feature converter of the model's batches (see `feature_converter`).
  FEATURE_CONVERTER = "PairFeatureConverter"
  # Whether the model reads language ids (then inference must be told the language).
  uses_languages = False
  # (regex, replacement) rules naming, for each parameter path of this model, the path
  # to load it from in an initial checkpoint (a dual encoder's `encoder/...`, e.g. an
  # imported Hugging Face checkpoint); see vmx/training/initial_checkpoint.py.
  INITIAL_CHECKPOINT_ASSIGNMENT: tuple = ()

  def __init__(self, module: nn.Module):
    self.module = module

  # --- the trainer's contract (see the module docstring) ---

  @abc.abstractmethod
  def get_initial_variables(self, rng, input_shapes: Mapping[str, tuple],
                            input_types: Mapping[str, Any] | None = None):
    ...

  @abc.abstractmethod
  def compute_loss(self, params, batch: Mapping[str, jax.Array], dropout_rng, flax_mutables):
    """(loss, {name: scalar}, new flax_mutables): what vmx's trainer calls."""

  def feature_converter(self):
    """What shapes the model's batches: a converter's name in vmx.data.feature_converters,
    or (name, {keyword arguments}); a model reading several tasks a step: {task: either}.
    Default: the class's FEATURE_CONVERTER."""
    return self.FEATURE_CONVERTER

  def feature_layout(self):
    """The features of `feature_converter()` (vmx.data.features.Layout, or {task: Layout}):
    what the trainer and the token-cache reader need, without SeqIO."""
    return features.layouts(self.feature_converter())

  @property
  def FEATURE_CONVERTER_CLS(self):  # noqa: N802  (t5x's name; resolved on use)
    """The converter class(es) of `feature_converter()`, imported now (seqio)."""
    layouts = self.feature_layout()
    if isinstance(layouts, Mapping):
      return {k: v.converter_cls() for k, v in layouts.items()}
    return layouts.converter_cls()

  def get_config(self) -> dict:
    """JSON-serializable description that `model_from_config` rebuilds."""
    return to_config(self)

  # --- what inference, export and import ask the model (see the module docstring) ---

  def inference_shapes(self, max_length: int) -> dict:
    """Input shapes that `get_initial_variables` builds the full parameter tree from when
    there is no training data (inference, conversion)."""
    raise NotImplementedError(f"{type(self).__name__} does not say how it is initialised "
                              "for inference")

  def abstract_params(self, max_length: int):
    """The parameter tree (jax.ShapeDtypeStruct leaves) of a model for `max_length`."""
    return jax.eval_shape(lambda: self.get_initial_variables(
        jax.random.PRNGKey(0), self.inference_shapes(max_length)))["params"]

  @property
  def vocab_size(self) -> Optional[int]:
    """The size of the model's token table (token ids must stay below it), or None."""
    return None

  def sentence_vector(self) -> SentenceVector:
    """The model's sentence vector and where its encoder is (`SentenceVector`);
    ConfigError for a model without a sentence encoder."""
    raise ConfigError(f"{type(self).__name__} has no sentence encoder (sentence_vector())")

  def pooled_encoder(self):
    """(the TransformerEncoder, its pooling) whose pooled, L2-normalized output is this
    model's retrieval vector, for export to sentence-transformers; ConfigError saying why
    for a model whose vector is something else."""
    raise ConfigError(f"{type(self).__name__} cannot be exported to sentence-transformers: "
                      f"its retrieval vector is not a pooled encoder")

  # --- trainer hooks for state not trained by gradients (see the module docstring) ---

  def flax_mutables_axes(self, params_axes, flax_mutables):
    """Logical axis names (a tuple per array, e.g. (None, 'batch', 'embed')) of the
    flax_mutables; `params_axes` are the parameters' (tuples). None: all replicated."""
    del params_axes, flax_mutables
    return None

  def after_update(self, params, flax_mutables, step: jax.Array):
    """flax_mutables after optimizer update number `step` (1, 2, ...) gave `params`."""
    del params, step
    return flax_mutables

  def derive_mutables(self, params, flax_mutables):
    """flax_mutables for a run that starts from `params` (an initial checkpoint's)."""
    del params
    return flax_mutables

  def prefill_batches(self, flax_mutables) -> int:
    """Training batches a new run reads forward-only before step 1 to fill its model state
    (`prefill`, e.g. InfoXLM's queue, §4.1); 0: none."""
    del flax_mutables
    return 0

  def prefill(self, params, batch, flax_mutables):
    """flax_mutables after reading one batch forward-only (no parameter update)."""
    del params, batch
    return flax_mutables

  def packed_features(self) -> Optional[Mapping[str, int]]:
    """The token features this model reads packed when its DatasetConfig packs
    (vmx/data/packing.py, vmx/packing.py): {feature: slots to keep free after each sentence
    (a decoder's EOS)}, or None: the model reads rows of one sentence only (packing is
    refused)."""
    return None

  def packed_groups(self) -> Mapping[str, tuple]:
    """{group: its token features} packed into the same rows (a pair's two sides, which the
    model reads with one encoder: one row count, full rows); a feature in no group has rows
    of its own, named after it (vmx/data/packing.py)."""
    return {}

  def sentences_per_example(self, feature: str) -> int:
    """Sentences an example holds in a packed token feature (an N-way example's views)."""
    del feature
    return 1

  # GradCache split (see the module docstring); None: the model does not support it.
  grad_cache_embed = None
  grad_cache_loss = None

  def validate_data(self, examples: Mapping[Any, Any], batch_sizes: Mapping[Any, int]):
    """Raises ConfigError if the data cannot feed this model: `examples` {task key: number
    of training examples, or None if unknown}, `batch_sizes` {task key: global batch}
    (key None for a single DatasetConfig)."""
    del examples, batch_sizes


def row_key(batch, name: str):
  """[B] (or [B, V]) `losses.token_row_key` of each sentence of token feature `name`: of its
  rows, or the key vmx/data/packing.py computed before packing them (`<name>_key`)."""
  if name + "_key" in batch:
    return batch[name + "_key"].astype(jnp.uint32)
  return token_row_key(batch[name])


@dataclasses.dataclass(frozen=True)
class SentenceVector:
  """Which vector a model embeds a sentence with (`sentence_vector()`), and where its
  encoder is: what evaluation names in every result (vmx/evaluation/vectors.py),
  per-layer evaluation reads (vmx/evaluation/layerwise.py) and fine-tuning starts from
  (vmx/finetune/run.py)."""
  encoder: Any                 # the TransformerEncoder module
  pooling: str                 # 'first' (CLS), 'mean' or 'pooler'
  layer: int                   # the pooled layer, 1 .. encoder.num_layers
  then: str = ""               # what follows the pooling (a projection head, VMSST's mean)
  params: str = "encoder"      # the encoder's parameters: the model's params[params]
  token_table: Optional[str] = None   # params[token_table]: its token table, kept outside


def averaged(metrics: Mapping[str, Any]) -> dict:
  """Scalars -> clu Average metrics (averaged over the steps of a log period)."""
  return {k: clu_metrics.Average.from_model_output(v) for k, v in metrics.items()}


class SentenceEncoderModel(BaseModel):
  """Base of vmx's methods: a module, its sentence vectors and its objective.

  Subclasses implement
    embed(params, tokens_BxL, lang_B, side) -> [B, D]   sentence vectors (not normalized)
    compute_loss(params, batch, dropout_rng, flax_mutables)
        -> (loss, {name: scalar}, new_flax_mutables)
        (dropout_rng None: evaluation; flax_mutables None: evaluation without train state)
    get_initial_variables(...)
  Every method's module holds its TransformerEncoder as `encoder` (VMSST's decoder and
  EMS's XTR head share its token table): `vocab_size` is its table's.
  """

  @abc.abstractmethod
  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    ...

  @abc.abstractmethod
  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    ...

  @property
  def vocab_size(self) -> int:
    return self.module.encoder.vocab_size

  def sentence_vector(self) -> SentenceVector:
    """The module's `encoder` at its top layer pooled by its `pooling` (methods whose
    vector is another say so by overriding this)."""
    return SentenceVector(self.module.encoder, self.module.pooling, self.module.encoder.depth)

  # Whether in-batch negatives leave out copies of a pair's own sentences (false
  # negatives: the same translation in another row); a model's switch, default on.
  mask_duplicates: bool = True

  # The prefix sizes trained as embeddings of their own (Matryoshka, `losses.matryoshka`;
  # MATRYOSHKA_DIMS): the Encoder serves `dim=N` only for models that have them.
  matryoshka_dims: tuple = ()

  def set_matryoshka_dims(self, dims):
    """Checks and keeps MATRYOSHKA_DIMS (positive integers, sorted, once each)."""
    dims = tuple(dims or ())
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
      raise ConfigError(f"{type(self).__name__}.matryoshka_dims={dims!r}: expected positive "
                        "integers (MATRYOSHKA_DIMS)")
    self.matryoshka_dims = tuple(sorted(set(dims)))

  def matryoshka_loss(self, loss_fn, *embeddings_xD):
    """loss_fn(*embeddings_xD) -> (loss, metrics); with `matryoshka_dims`, its sum over the
    prefixes and the whole (`losses.matryoshka`)."""
    if not self.matryoshka_dims:
      return loss_fn(*embeddings_xD)
    width = embeddings_xD[0].shape[-1]
    if self.matryoshka_dims[-1] > width:
      raise ConfigError(f"{type(self).__name__}.matryoshka_dims={list(self.matryoshka_dims)} "
                        f"has a size above the sentence vector's {width}")
    return matryoshka(loss_fn, self.matryoshka_dims, *embeddings_xD)

  def duplicate_keys(self, batch) -> dict:
    """{"left_key_B", "right_key_B"}: each pair's sentences' `losses.token_row_key`, for a
    loss that leaves out false negatives; {} when the model does not (or the batch has no
    pairs)."""
    if not self.mask_duplicates or not all(f in batch or f + "_key" in batch
                                           for f in ("left_tokens", "right_tokens")):
      return {}
    return {"left_key_B": row_key(batch, "left_tokens"),
            "right_key_B": row_key(batch, "right_tokens")}

  def inference_shapes(self, max_length: int) -> dict:
    L = int(max_length)
    return {"left_tokens": (1, L), "right_tokens": (1, L), "left_lang": (1,),
            "right_lang": (1,)}

  def encode_tokens(self, params, tokens_BxL, lang_B):
    """L2-normalized sentence vectors [B, D] of token ids (what `Encoder` jits)."""
    return l2_normalize(self.embed(params, tokens_BxL, lang_B, "left"))

  def token_sum_table(self, params) -> Optional[np.ndarray]:
    """[V, D] rows whose sum over a sentence's tokens, L2-normalized, is `encode_tokens`'
    vector, for a model whose vector is a (weighted) bag of tokens: a static encoder
    pooled without a projection head (vmx/static_encoder.py). `Encoder` then encodes on
    the host with one sparse product, and the export writes this table. None for every
    other model (attention makes a vector more than a sum of rows)."""
    try:
      enc, _ = self.pooled_encoder()
    except ConfigError:
      return None
    if not isinstance(enc, StaticEncoder):
      return None
    return enc.token_sum_table(params[self.sentence_vector().params])


# ----------------------------------------------------------------------------
# Config (de)serialization: objects whose constructor arguments are their
# dataclass fields (linen modules) or listed in CONFIG_FIELDS (model classes).

_SKIP_FIELDS = ("parent", "name")


def _qualname(obj) -> str:
  cls = type(obj)
  return f"{cls.__module__}:{cls.__qualname__}"


def to_config(obj):
  if isinstance(obj, (str, int, float, bool)) or obj is None:
    return obj
  if isinstance(obj, (list, tuple)):
    return [to_config(x) for x in obj]
  if isinstance(obj, dict):
    return {k: to_config(v) for k, v in obj.items()}
  if isinstance(obj, type):  # jnp.float32, jnp.bfloat16, ...
    return {"__dtype__": jnp.dtype(obj).name}
  if hasattr(obj, "CONFIG_FIELDS"):
    fields = {f: getattr(obj, f) for f in obj.CONFIG_FIELDS}
  elif dataclasses.is_dataclass(obj):
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
              if f.name not in _SKIP_FIELDS and f.init}
  else:
    raise TypeError(f"cannot serialize {obj!r} into a model config")
  return {"__class__": _qualname(obj), **{k: to_config(v) for k, v in fields.items()}}


def model_from_config(cfg):
  if isinstance(cfg, list):
    return tuple(model_from_config(x) for x in cfg)
  if not isinstance(cfg, dict):
    return cfg
  if "__dtype__" in cfg:
    return jnp.dtype(cfg["__dtype__"]).type
  if "__class__" not in cfg:
    return {k: model_from_config(v) for k, v in cfg.items()}
  mod, name = cfg["__class__"].split(":")
  cls = getattr(importlib.import_module(mod), name)
  kwargs = {k: model_from_config(v) for k, v in cfg.items() if k != "__class__"}
  return cls(**kwargs)
