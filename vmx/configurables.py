"""Registers vmx's classes with gin (import this before parsing gin files).

Names are the class/function names (`TransformerEncoder.num_layers = 6`); the
module path disambiguates if needed (`vmx.encoders.TransformerEncoder`).
"""
import gin
import numpy as np

from vmx import decoders, encoders
from vmx.errors import ConfigError
from vmx.data import pipeline, vocab  # noqa: F401  (vocab registers vocabulary_path)
from vmx.models import distill, dual_encoder, emmax, ems, infoxlm, mpcl, vmsst
from vmx.evaluation import periodic  # noqa: F401  (TatoebaEvalConfig, HarnessEvalConfig)
from vmx.modeldir import checkpoints  # noqa: F401  (CheckpointConfig)
from vmx.training import optimizers, partitioning, phases, trainer  # noqa: F401
import tasks  # noqa: F401  (registers tasks.parallel_mixture, moses_task, tsv_task)

gin.external_configurable(encoders.TransformerEncoder, module="vmx.encoders")
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
