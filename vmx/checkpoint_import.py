"""The old import path of `vmx.modeldir.hf_import` (MODEL_DIR is owned by vmx/modeldir/): this
name is that module itself, so code written against the old path keeps working."""
import sys

from vmx.modeldir import hf_import

sys.modules[__name__] = hf_import
