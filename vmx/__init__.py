"""vmx: multilingual sentence embeddings in JAX/Flax (VMSST, EMS, InfoXLM, EMMA-X, MPCL)."""
from vmx import quiet as _quiet

__version__ = "0.1.0"
_quiet.quiet_tensorflow()   # TensorFlow's C++ start-up lines, if vmx imports it (vmx/quiet.py)
