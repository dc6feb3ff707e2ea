"""vmx: multilingual sentence embeddings in JAX/Flax (VMSST, EMS, InfoXLM, EMMA-X, MPCL)."""
__version__ = "0.1.0"
