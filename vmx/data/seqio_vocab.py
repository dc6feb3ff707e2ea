"""The vocabulary as SeqIO sees it: one home for vmx's seqio vocabularies.

`seqio_vocabulary(path)` opens what VOCAB_PATH names as a `seqio.Vocabulary`:
- a SentencePiece `.model`: `seqio.SentencePieceVocabulary`;
- a `vmx_tokenizer.json` of kind `sentencepiece` (vmx/data/vocab.py): vmx's own model plus
  a `Pretokenizer` (EMS §4.2, vmx/data/normalize.py), `PretokenizingVocabulary`, which
  tokenizes like the model's SentencePieceVocabulary after pre-tokenizing the text in
  Python (`tf.numpy_function`); the language comes from the task
  (vmx/data/preprocessors.py, `tokenize_step`), its language-free `encode_tf` uses
  Moses's generic rules, as `Tokenizer.encode` does without `lang`;
- an imported checkpoint's `vmx_tokenizer.json`: `HfVocabulary`, its own tokenizer
  (vmx.data.hf_tokenizer.HfTokenizer), special tokens included.

`fingerprint(vocabulary)` is what the caches key on (the token cache, SeqIO's offline
cache): the SentencePiece proto, or the spec bytes (which hold the model's sha256 and the
pre-tokenization settings), so another vocabulary or normalization never opens an old
cache. The TF-free side of vocabularies (training one, `Tokenizer`, `HfTokenizer`) is
vmx/data/vocab.py.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Optional

import numpy as np
import seqio
import tensorflow as tf

from vmx import storage
from vmx.data import vocab as vocab_lib
from vmx.data.vocab import SENTENCEPIECE_KIND, TOKENIZER_SPEC, HfTokenizer, spec_kind


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


class HfVocabulary(seqio.Vocabulary):
  """An imported checkpoint's own tokenizer (vmx.data.hf_tokenizer.HfTokenizer) as a seqio
  vocabulary: vmx ids, special tokens included, tokenized in tf.data via numpy."""

  def __init__(self, spec_path: str):
    self.tokenizer = HfTokenizer(spec_path)
    self.spec_path = str(spec_path)
    # what the vocabulary is, kept with it: the file may move once it is loaded
    self.spec_bytes = storage.path(spec_path).read_bytes()
    super().__init__(extra_ids=0)

  @property
  def eos_id(self):
    return None   # the tokenizer adds its own closing token

  @property
  def unk_id(self):
    return None

  @property
  def _base_vocab_size(self):
    return self.tokenizer.vocab_size

  def _encode(self, s):
    return [int(i) for i in self.tokenizer.to_vmx_ids(self.tokenizer.hf_ids([s])[0])]

  def _decode(self, ids):
    return self.tokenizer.decode(ids)

  def _encode_tf(self, s):
    def encode(texts):   # one tokenizer call for every text of `s`
      rows = self.tokenizer.hf_ids([t.decode("utf-8") for t in np.atleast_1d(texts)])
      return (self.tokenizer.to_vmx_ids([i for r in rows for i in r]).astype(np.int32),
              np.array([len(r) for r in rows], np.int64))
    flat, lengths = tf.numpy_function(encode, [s], (tf.int32, tf.int64), stateful=False)
    flat.set_shape([None])
    if s.shape.rank == 0:
      return flat
    return tf.RaggedTensor.from_row_lengths(flat, tf.reshape(lengths, [-1]))

  def _decode_tf(self, ids):
    return tf.numpy_function(lambda x: np.array(self._decode(x), object), [ids], tf.string)

  def __eq__(self, other):
    return isinstance(other, HfVocabulary) and other.spec_path == self.spec_path


def seqio_vocabulary(vocab_path: str) -> seqio.Vocabulary:
  """seqio vocabulary of a SentencePiece `.model` or a `vmx_tokenizer.json` (imported, or
  vmx's own model with its pre-tokenization: PretokenizingVocabulary). One object per
  file version, shared by the tasks of a mixture (one tokenizer load, one Juman++
  process, not one per task)."""
  stamp = None
  if not storage.is_remote(vocab_path):
    st = os.stat(vocab_path)
    stamp = (st.st_size, st.st_mtime_ns)
  return _seqio_vocabulary(str(vocab_path), stamp)


@functools.lru_cache(maxsize=16)
def _seqio_vocabulary(vocab_path: str, stamp) -> seqio.Vocabulary:
  del stamp   # the file's size and time: a rewritten file is another vocabulary
  if Path(vocab_path).name == TOKENIZER_SPEC:
    if spec_kind(vocab_path) == SENTENCEPIECE_KIND:
      return PretokenizingVocabulary(vocab_path)
    return HfVocabulary(vocab_path)
  return seqio.SentencePieceVocabulary(str(vocab_path))


def fingerprint(vocabulary: seqio.Vocabulary) -> str:
  """sha256 of the vocabulary's model (SentencePiece proto, or the spec of an imported
  tokenizer or of a pre-tokenizing vocabulary: its model's sha256 and its settings)."""
  if isinstance(vocabulary, (HfVocabulary, PretokenizingVocabulary)):
    data = vocabulary.spec_bytes
  elif isinstance(vocabulary, seqio.SentencePieceVocabulary):
    data = vocabulary.sp_model
  else:
    data = repr(vocabulary).encode()
  return hashlib.sha256(data).hexdigest()


def task_vocabulary(task: seqio.Task) -> Optional[seqio.Vocabulary]:
  """The vocabulary of the task's first tokenized feature (None: none is tokenized)."""
  for feature in task.output_features.values():
    if not isinstance(feature.vocabulary, seqio.PassThroughVocabulary):
      return feature.vocabulary
  return None
