"""Model classes: one module per method family, all with vmx's model contract
(vmx/models/base.py `BaseModel`, shaped like t5x's; vmx/t5x_compat.py runs them in t5x)."""
from vmx.models.base import BaseModel, SentenceEncoderModel, model_from_config
from vmx.models.distill import DistillationModel
from vmx.models.dual_encoder import DualEncoder, DualEncoderModel
from vmx.models.emmax import EmmaX, EmmaXModel
from vmx.models.ems import EMS, EMSModel
from vmx.models.infoxlm import InfoXLM, InfoXLMModel
from vmx.models.mpcl import MPCLModel
from vmx.models.vmsst import VMSST, VMSSTModel
