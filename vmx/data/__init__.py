"""Data: file readers, downloads, vocabularies (no TensorFlow), and SeqIO tasks,
preprocessors, feature converters and the input pipeline (these import seqio)."""
