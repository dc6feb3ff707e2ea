"""Registers vmx's classes with gin (import this before parsing gin files).

Names are the class/function names (`TransformerEncoder.num_layers = 6`); the
module path disambiguates if needed (`vmx.encoders.TransformerEncoder`).
"""
import gin

from vmx import decoders, encoders
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
