"""Registers vmx's classes with gin (import this before parsing gin files).

Names are the class/function names (`TransformerEncoder.num_layers = 6`); the
module path disambiguates if needed (`vmx.encoders.TransformerEncoder`).
"""
import math
from fractions import Fraction

import gin
import jax
import numpy as np

from vmx import decoders, encoders, static_encoder
from vmx.errors import ConfigError
from vmx.gin_utils import check_range
from vmx.data import pipeline, vocab  # noqa: F401  (vocab registers vocabulary_path)
from vmx.models import distill, dual_encoder, emmax, ems, infoxlm, mpcl, vmsst
from vmx.evaluation import periodic  # noqa: F401  (TatoebaEvalConfig, HarnessEvalConfig)
from vmx.modeldir import checkpoints  # noqa: F401  (CheckpointConfig)
from vmx.training import optimizers, partitioning, phases, trainer  # noqa: F401
import tasks  # noqa: F401  (registers tasks.parallel_mixture, moses_task, tsv_task)

gin.external_configurable(encoders.TransformerEncoder, module="vmx.encoders")
gin.external_configurable(static_encoder.StaticEncoder, module="vmx.static_encoder")
gin.external_configurable(decoders.ConditionedDecoder, module="vmx.decoders")
gin.external_configurable(dual_encoder.DualEncoder, module="vmx.models")
gin.external_configurable(dual_encoder.DualEncoderModel, module="vmx.models")
gin.external_configurable(distill.DistillationModel, module="vmx.models")
gin.external_configurable(pipeline.DatasetConfig, module="vmx.data")
gin.external_configurable(pipeline.MultiTaskConfig, module="vmx.data")
gin.external_configurable(vmsst.VMSST, module="vmx.models")
gin.external_configurable(vmsst.VMSSTModel, module="vmx.models")
gin.external_configurable(ems.EMS, module="vmx.models")
gin.external_configurable(ems.EMSModel, module="vmx.models")
gin.external_configurable(mpcl.MPCLModel, module="vmx.models")
gin.external_configurable(infoxlm.InfoXLM, module="vmx.models")
gin.external_configurable(infoxlm.InfoXLMModel, module="vmx.models")
gin.external_configurable(emmax.EmmaX, module="vmx.models")
gin.external_configurable(emmax.EmmaXModel, module="vmx.models")


@gin.configurable
def num_languages(languages=gin.REQUIRED) -> int:
  """len(languages), for bindings such as `VMSST.num_languages = @num_languages()`."""
  return len(languages)


@gin.configurable
def random_language_assignment(languages=gin.REQUIRED, num_groups: int = gin.REQUIRED,
                               seed: int = 0) -> list:
  """A seeded random assignment of the languages (by id) to `num_groups` groups, as even
  as it can be: a permutation of the ids dealt round-robin. VMSST Table 4 "4 enc."
  (A.1: "We allocate the languages randomly to the different encoders")."""
  if not isinstance(num_groups, int) or not 1 <= num_groups <= len(languages):
    raise ConfigError(f"random_language_assignment.num_groups={num_groups!r}: expected 1 .. "
                      f"{len(languages)} (the number of languages)")
  order = np.random.default_rng(seed).permutation(len(languages))
  out = [0] * len(languages)
  for rank, lang_id in enumerate(order.tolist()):
    out[lang_id] = rank % num_groups
  return out


_EPOCH_STEPS_SHOWN = set()


@gin.configurable
def steps_for_epochs(epochs: float = gin.REQUIRED, dataset_cfg=gin.REQUIRED,
                     warmup_steps: int = 0, warmup_hint: str = "") -> int:
  """A run's length in epochs of its training data, as steps: ceil(epochs x the training
  examples of `dataset_cfg`'s mixture or task / its global batch size), e.g.

    TRAIN_STEPS = @steps_for_epochs()
    steps_for_epochs.epochs = 3
    steps_for_epochs.dataset_cfg = @train/DatasetConfig()

  The examples are the tasks' `train` split sizes (their sources count them once and
  cache the counts by the files' stamps), so a resumed run on the same data gets the
  same number, and another mixture gets its own. A mixture's epoch is as many examples
  as its tasks hold together: with temperature sampling (ALPHA < 1) small tasks are seen
  more often than `epochs` times, large ones less. `warmup_steps` (e.g. %WARMUP_STEPS):
  a warning, with `warmup_hint` after it, when the warm-up is longer than the run.
  Needs the registered tasks (so the vocabulary); tools that build a step without data
  bind TRAIN_STEPS to a number instead.
  """
  check_range(isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs > 0,
              "steps_for_epochs", "epochs", epochs, "a positive number of epochs")
  if not isinstance(dataset_cfg, pipeline.DatasetConfig):
    check_range(False, "steps_for_epochs", "dataset_cfg", type(dataset_cfg).__name__,
                "one DatasetConfig (e.g. @train/DatasetConfig()): the epochs of one "
                "mixture or task")
  if dataset_cfg.block_length:
    raise ConfigError(f"steps_for_epochs: {dataset_cfg.mixture_or_task_name} is read in blocks "
                      f"(DatasetConfig.block_length={dataset_cfg.block_length}), whose number "
                      f"is known only once the stream counts them; set TRAIN_STEPS")
  examples = pipeline.num_examples(dataset_cfg)[None]
  if not examples:
    raise ConfigError(f"steps_for_epochs: {dataset_cfg.mixture_or_task_name} does not say how "
                      f"many {dataset_cfg.split} examples it has ({examples}); set TRAIN_STEPS")
  steps = math.ceil(Fraction(str(epochs)) * examples / dataset_cfg.batch_size)
  key = (dataset_cfg.mixture_or_task_name, examples, dataset_cfg.batch_size, epochs,
         warmup_steps)
  if key not in _EPOCH_STEPS_SHOWN and jax.process_index() == 0:
    _EPOCH_STEPS_SHOWN.add(key)
    print(f"[vmx] {epochs:g} epochs of {examples:,} {dataset_cfg.split} examples "
          f"({dataset_cfg.mixture_or_task_name}) at batch {dataset_cfg.batch_size}: "
          f"{steps:,} steps", flush=True)
    if warmup_steps and warmup_steps >= steps:
      print(f"[vmx] warning: the warm-up ({warmup_steps:,} steps) is longer than the whole "
            f"run ({steps:,} steps): the learning rate never reaches its peak (it ends at "
            f"{steps / warmup_steps:.0%} of it). {warmup_hint}".rstrip(), flush=True)
  return steps
