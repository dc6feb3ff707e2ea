"""Settings that the task functions (`tasks`) and the SeqIO layer (registration, sources)
share, here so that a gin run can name its tasks without importing SeqIO
(vmx/data/deferred.py)."""

# The share of a corpus held out as its `validation` split, by content (vmx/data/sources.py).
VALIDATION_PERCENT = 1
# SeqIO's shuffle buffer of a registered task (the `seqio` reader only).
DEFAULT_SHUFFLE_BUFFER = 20_000
