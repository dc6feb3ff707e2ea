"""SeqIO side of vocabularies that pre-tokenize by language (EMS §4.2, vmx/data/normalize.py).

A `vmx_tokenizer.json` of kind `sentencepiece` (vmx/data/vocab.py) is vmx's own
SentencePiece model plus a `Pretokenizer`. As a seqio vocabulary
(`PretokenizingVocabulary`) it tokenizes like the model's `seqio.SentencePieceVocabulary`
after pre-tokenizing the text in Python (`tf.numpy_function`). The language comes from
the task: `tokenize_step` gives a task the tokenizing preprocessor for its features and
their languages (`tokenize_by_language` for such a vocabulary, which keeps the raw text
as `<feature>_pretokenized` as seqio's own does; `seqio.preprocessors.tokenize`
otherwise). Its language-free `encode_tf` uses Moses's generic rules, as
`Tokenizer.encode` does without `lang`.

What the caches key on: the vocabulary's spec bytes are its fingerprint
(vmx/data/cache.py; the spec holds the model's sha256 and the pre-tokenization settings), and the preprocessor's arguments (the languages) are part of the index
reader's fingerprint (vmx/data/arrays.py): another normalization never opens an old cache.
"""
from __future__ import annotations

import functools
from typing import Mapping, Optional

import numpy as np
import seqio
import tensorflow as tf

from vmx import storage
from vmx.data import vocab as vocab_lib
from vmx.errors import ConfigError


class PretokenizingVocabulary(seqio.Vocabulary):
  """vmx's SentencePiece model with its recorded pre-tokenization (pad 0, eos 1, unk 2)."""

  def __init__(self, spec_path: str):
    self.spec_path = str(spec_path)
    self.spec_bytes = storage.path(spec_path).read_bytes()
    self.tokenizer = vocab_lib.load_tokenizer(self.spec_path)
    self.pretokenizer = self.tokenizer.pretokenizer
    spec = vocab_lib.read_spec(self.spec_path)
    model = storage.path(self.spec_path).parent / spec["file"]
    self._sp = seqio.SentencePieceVocabulary(str(model))
    super().__init__(extra_ids=0)

  @property
  def eos_id(self):
    return self._sp.eos_id

  @property
  def unk_id(self):
    return self._sp.unk_id

  @property
  def _base_vocab_size(self):
    return self._sp.vocab_size

  def pretokenize_tf(self, s: tf.Tensor, lang: Optional[str]) -> tf.Tensor:
    """String tensor (any shape) -> the same shape, pre-tokenized in `lang`."""
    def run(texts):
      arr = np.asarray(texts, dtype=object)
      flat = [t.decode("utf-8") for t in arr.reshape(-1)]
      out = self.pretokenizer(flat, lang)
      return np.array([t.encode("utf-8") for t in out], dtype=object).reshape(arr.shape)
    out = tf.numpy_function(run, [s], tf.string, stateful=False)
    out.set_shape(s.shape)
    return out

  def encode_tf_in(self, s: tf.Tensor, lang: Optional[str]) -> tf.Tensor:
    return self._sp.encode_tf(self.pretokenize_tf(s, lang))

  def _encode(self, s):
    return self._sp.encode(self.pretokenizer([s], None)[0])

  def _encode_tf(self, s):
    return self.encode_tf_in(s, None)

  def _decode(self, ids):
    return self._sp.decode(ids)

  def _decode_tf(self, ids):
    return self._sp.decode_tf(ids)

  def __eq__(self, other):
    return isinstance(other, PretokenizingVocabulary) and other.spec_bytes == self.spec_bytes

  def __hash__(self):
    return hash(self.spec_bytes)

  def __repr__(self):
    return f"PretokenizingVocabulary({self.spec_path!r}, {self.pretokenizer!r})"


def tokenize_by_language(dataset: tf.data.Dataset, output_features,
                         languages: Mapping[str, str]) -> tf.data.Dataset:
  """seqio.preprocessors.tokenize for a pre-tokenizing vocabulary: feature k's text is in
  language `languages[k]`; the raw text is kept as `k_pretokenized`."""
  def tokenize(ex):
    ex = dict(ex)
    for k, lang in languages.items():
      ex[f"{k}_pretokenized"] = ex[k]
      ex[k] = output_features[k].vocabulary.encode_tf_in(ex[k], lang)
    return ex
  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


def tokenize_step(vocabulary: seqio.Vocabulary, languages: Mapping[str, Optional[str]],
                  task: str):
  """The tokenizing preprocessor of a task whose features `languages` ({feature:
  language}) use `vocabulary`. A pre-tokenizing vocabulary needs every language, and
  what it needs to segment them (checked now: ConfigError)."""
  if not isinstance(vocabulary, PretokenizingVocabulary):
    return seqio.preprocessors.tokenize
  missing = sorted(k for k, l in languages.items() if not l)
  if missing:
    raise ConfigError(f"task {task}: its vocabulary ({vocabulary.spec_path}) pre-tokenizes by "
                      f"language and feature(s) {missing} name no language")
  vocabulary.pretokenizer.check(list(languages.values()), f"task {task}")
  return functools.partial(tokenize_by_language, languages=dict(languages))
