"""Deprecated: the old import path of `vmx.modeldir.hf_export` (every name there is
reached from here, with one DeprecationWarning per process). Import
`vmx.modeldir.hf_export` instead."""
from vmx import _deprecated

__getattr__ = _deprecated.forward(__name__, "vmx.modeldir.hf_export")
