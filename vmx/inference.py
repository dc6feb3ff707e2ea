"""Sentence embeddings from a trained vmx model, without TensorFlow.

  enc = Encoder.from_checkpoint("/path/to/model_dir")
  vecs = enc.encode(["Hello world", "Hallo Welt"], lang=["eng", "deu"])  # [2, D], rows L2-normalized

A model_dir holds `vmx_model.json` (model config, languages, max length),
its vocabulary (`vocab.model`, SentencePiece, or an imported checkpoint's own tokenizer,
`vmx_tokenizer.json`: vmx/data/vocab.py) and orbax checkpoints `checkpoint_<step>/`, each
verified against its checksum manifest before use: vmx/modeldir/ reads and writes it.
The model says how it is initialised and how token ids become sentence vectors
(`abstract_params`, `encode_tokens`: vmx/models/base.py); this module asks it.
"""
from __future__ import annotations

import copy
import functools
import warnings
from typing import Optional, Sequence, Union

import jax
import numpy as np
from tqdm.auto import tqdm

from vmx import quantize, storage
from vmx.data.languages import resolve as resolve_language
from vmx.data.token_rows import RaggedIds
from vmx.data.vocab import Tokenizer, load_tokenizer
from vmx.errors import CheckpointError, InputError, NonFiniteError
from vmx.models.base import model_from_config
from vmx.modeldir.checkpoints import restore_params
from vmx.modeldir.layout import (BEST_BY, BEST_DIR, BEST_STEP, CHECKPOINT_PREFIX, find_best_dir,
                                 read_model_info)


def _unit(x: np.ndarray) -> np.ndarray:
  norm = np.sqrt(np.einsum("...d,...d->...", x, x))[..., None]  # (linalg.norm: 2x slower)
  return x / np.maximum(norm, 1e-12)


def _non_finite(row: int) -> NonFiniteError:
  return NonFiniteError(f"the model produced a non-finite embedding (sentences[{row}]); its "
                        f"parameters are probably non-finite (a diverged run)")


class Encoder:
  """encode(list of str) -> L2-normalized float32 rows, in jitted batches of similar
  length (sorted by token count, padded to a power of two: few compilations, little
  padding; the rows come back in input order).

  Inputs are checked: every item must be a non-empty string (an empty or
  whitespace-only string, or one that the tokenizer normalizes to nothing, has no
  tokens and so no embedding: `InputError` naming its index), `batch_size` a positive
  integer. Sentences longer than the model's `max_length` tokens are
  truncated to their first `max_length` tokens (an imported tokenizer keeps its closing
  special token), as in training; a warning says how many
  were cut.
  """

  def __init__(self, model, params, tokenizer: Tokenizer, languages: Sequence[str],
               max_length: int, batch_size: int = 128, dim: Optional[int] = None,
               quantization: Optional[dict] = None, quantized: Optional[str] = None):
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.languages = list(languages)
    self.max_length = int(max_length)
    self.batch_size = batch_size
    self.dim = self._check_dim(dim)   # the default prefix size (Matryoshka), None: all
    # int8 calibration by vector size (MODEL_DIR/quantization.json, vmx/quantize.py), and
    # the geometry float vectors have: None, or 'int8' / 'binary' quantized and mapped back
    self.quantization = dict(quantization or {})
    if quantized not in (None, "int8", "binary"):
      raise InputError(f"quantized={quantized!r}: expected None, 'int8' or 'binary'")
    self.quantized = quantized
    self.name, self.revision = type(model).__name__, None   # set by from_checkpoint
    self.prompts: dict = {}      # sentence-transformers' prompts: {name: text put before}
    self._predict = jax.jit(lambda p, t, l: model.encode_tokens(p, t, l))

  @property
  def params(self):
    return self._params

  @params.setter
  def params(self, value):
    """New parameters (the training loop's periodic evaluation sets them) drop what was
    derived from the old ones."""
    self._params = value
    self.__dict__.pop("_token_sums", None)

  @functools.cached_property
  def _token_sums(self) -> Optional[np.ndarray]:
    """A bag-of-tokens model's (a static encoder's) table: it is encoded on the host, one
    sparse product of token counts and this table for all sentences
    (vmx/models/base.py token_sum_table); None for the others."""
    return self.model.token_sum_table(self.params)

  @classmethod
  def from_checkpoint(cls, model_dir, step: Union[None, int, str] = None,
                      batch_size: int = 128, dim: Optional[int] = None,
                      quantized: Optional[str] = None):
    """The encoder of a vmx model directory at checkpoint `step` (default: the newest
    intact one; 'best': the best evaluated step kept in MODEL_DIR/best/ by
    train.best_metric; 'best:<metric>': the best step by that one of its metrics).
    `model_dir` may be local or remote (`gs://...`: vmx/storage.py).
    `dim`: every vector's first `dim` values, renormalized (models trained with
    Matryoshka dimensions only). `quantized` ('int8', 'binary'): the float vectors `encode`
    gives are the quantized ones mapped back (vmx/quantize.py: scores on what an int8 or
    binary index holds); int8 needs MODEL_DIR/quantization.json (launch/calibrate.py)."""
    info = read_model_info(model_dir)
    model = model_from_config(info["model"])
    L = info["max_length"]
    ckpt_dir, prefix = model_dir, ""
    if step == BEST_STEP:
      ckpt_dir, prefix, step = storage.path(model_dir) / BEST_DIR, f"{BEST_DIR}/", None
      if not ckpt_dir.is_dir():
        raise CheckpointError(f"{model_dir} has no {BEST_DIR}/ checkpoint: it is written by "
                              "runs with train.best_metric (BEST_METRIC) set")
    elif isinstance(step, str) and step.startswith(BEST_STEP + BEST_BY):
      metric = step[len(BEST_STEP + BEST_BY):]
      ckpt_dir = find_best_dir(model_dir, metric)
      if ckpt_dir is None:
        raise CheckpointError(f"{model_dir} keeps no best checkpoint by {metric!r}: it is "
                              f"written by runs whose train.best_metric (BEST_METRIC) names it")
      prefix, step = f"{ckpt_dir.name}/", None
    elif step is not None and (isinstance(step, bool) or not isinstance(step, int)):
      raise InputError(f"step={step!r}: expected a step number, {BEST_STEP!r}, "
                       f"'{BEST_STEP}{BEST_BY}<metric>' or None (latest)")
    params, step = restore_params(ckpt_dir, model, step, L)
    enc = cls(model, params, load_tokenizer(str(storage.path(model_dir) / info["vocabulary"])),
              info["languages"], L, batch_size, dim, quantize.load(model_dir), quantized)
    enc.name = storage.path(model_dir).name
    enc.revision = f"{prefix}{CHECKPOINT_PREFIX}_{step}"
    return enc

  def _lang_ids(self, lang, n: int) -> np.ndarray:
    """Language ids for models that read them; others ignore `lang`."""
    if not self.model.uses_languages:
      return np.zeros((n,), np.int32)
    if lang is None:
      raise InputError("this model reads language ids: pass lang= (one code, or one per "
                       f"sentence, of {', '.join(self.languages[:12])}…)")
    langs = [lang] * n if isinstance(lang, str) else list(lang)
    if len(langs) != n:
      raise InputError(f"lang has {len(langs)} entries for {n} sentences")
    # One language under another code (pes for a model trained on fas, cmn for cmn_Hans):
    # vmx.data.languages.resolve.
    named = {l: resolve_language(l, self.languages) for l in set(langs)}
    unknown = sorted(l for l, r in named.items() if r is None)
    if unknown:
      raise InputError(f"languages {unknown} are not among the model's {len(self.languages)} "
                       f"languages ({', '.join(self.languages[:12])}…)")
    index = {l: i for i, l in enumerate(self.languages)}
    return np.array([index[named[l]] for l in langs], np.int32)

  @staticmethod
  def check_sentences(sentences) -> list[str]:
    """The sentences as a list; InputError naming the first bad item's index."""
    if isinstance(sentences, (str, bytes)):
      raise InputError("encode() takes a list of sentences, not one string")
    try:
      sentences = list(sentences)
    except TypeError:
      raise InputError(f"encode() takes a list of strings, got {type(sentences).__name__}"
                       ) from None
    # The common case in C loops (a Python loop per sentence cost 10% of a static model's
    # encoding); the loop below names the first bad item.
    if (set(map(type, sentences)) <= {str} and all(sentences)
        and not any(map(str.isspace, sentences))):
      try:
        "".join(sentences).encode("utf-8")
        return sentences
      except UnicodeEncodeError:
        pass
    for i, s in enumerate(sentences):
      if not isinstance(s, str):
        raise InputError(f"sentences[{i}] is {type(s).__name__} ({s!r:.40}), not a string")
      if not s.strip():
        raise InputError(f"sentences[{i}] is empty or whitespace only: it has no tokens and "
                         f"so no embedding; drop it or replace it before encoding")
      try:
        s.encode("utf-8")
      except UnicodeEncodeError as e:
        raise InputError(f"sentences[{i}] ({s!r:.40}) is not valid Unicode text ({e.reason} "
                         f"at character {e.start}: a lone surrogate, e.g. from text decoded "
                         f"with errors='surrogateescape'); fix or drop it") from None
    return sentences

  # sentence-transformers / MTEB compatibility: what their callers read or pass.
  similarity_fn_name = "cosine"
  PRECISIONS = quantize.PRECISIONS

  @property
  def max_seq_length(self) -> int:
    return self.max_length

  def get_sentence_embedding_dimension(self) -> int:
    return int(self.encode(["a"], lang=self.languages[0] if self.languages else None).shape[1])

  def encode(self, sentences: Union[str, Sequence[str]],
             lang: Union[None, str, Sequence[str]] = None, batch_size: Optional[int] = None,
             progress: Optional[bool] = None, *, show_progress_bar: Optional[bool] = None,
             convert_to_numpy: bool = True, convert_to_tensor: bool = False,
             normalize_embeddings: bool = True, precision: str = "float32",
             prompt_name: Optional[str] = None, prompt: Optional[str] = None,
             task_name: Optional[str] = None, prompt_type: Optional[str] = None,
             dim: Optional[int] = None, truncate_dim: Optional[int] = None):
    """[len(sentences), D] float32, rows L2-normalized (0 rows -> shape [0, 0]); one string
    gives one [D] vector.

    `dim` (sentence-transformers' `truncate_dim`): the first `dim` values of each vector,
    renormalized, for models trained with Matryoshka dimensions (MATRYOSHKA_DIMS; others
    refuse it); default the encoder's own `dim` (`from_checkpoint(..., dim=)`), else all.

    `lang`: one ISO 639-3 code or one per sentence, needed by models that read language
    ids, and by vocabularies that pre-tokenize by language (EMS's: Moses, jieba, Juman++;
    without it Moses's generic rules are used, with a warning). Raises InputError for bad
    input and NonFiniteError if the model produces NaN/Inf (a diverged checkpoint).

    The keywords of sentence-transformers' `encode` work as there, so vmx encoders drop
    into code written for it (and MTEB): `show_progress_bar` (= `progress`),
    `convert_to_numpy=False` (a list of [D] arrays), `convert_to_tensor=True` (a torch
    tensor; needs torch), `prompt` (a string put before every sentence) or `prompt_name`
    (a key of `self.prompts`), `precision` ('float32'; 'int8': [N, D] int8 with the model's
    calibration; 'ubinary' / 'binary': [N, D/8] packed signs, uint8 / int8 minus 128, as
    sentence-transformers; vmx/quantize.py). vmx vectors are unit length by
    construction (the cosine geometry the models train), so `normalize_embeddings` changes
    nothing either way. MTEB's `task_name` / `prompt_type` pick a prompt from
    `self.prompts` when one is registered under that name; vmx models are trained without
    prompts, so `self.prompts` is empty unless you fill it.
    """
    del normalize_embeddings       # always unit rows (see above)
    if precision not in quantize.PRECISIONS:
      raise InputError(f"precision={precision!r}: vmx encoders give {quantize.PRECISIONS} "
                       "only")
    single = isinstance(sentences, str)
    if single:
      sentences = [sentences]
    sentences = self.check_sentences(sentences)
    prompt = self._prompt(prompt, prompt_name, task_name, prompt_type)
    if prompt:
      sentences = [prompt + s for s in sentences]
    if show_progress_bar is not None:
      progress = show_progress_bar
    if dim is not None and truncate_dim is not None and dim != truncate_dim:
      raise InputError(f"dim={dim} and truncate_dim={truncate_dim}: pass one")
    out, truncated, unknown = self._encode(sentences, lang, batch_size, progress,
                                           dim if dim is not None else truncate_dim)
    out = self._finish(out, precision)
    if truncated:
      warnings.warn(f"{truncated} of {len(sentences)} sentences are longer than the model's "
                    f"max_length={self.max_length} tokens and were truncated", stacklevel=2)
    if unknown:
      warnings.warn(f"{len(unknown)} of {len(sentences)} sentences have no token the "
                    f"vocabulary knows (only its unknown piece, e.g. sentences[{unknown[0]}]): "
                    f"they all get the same vector", stacklevel=2)
    if single:
      out = out[0]
    if convert_to_tensor:
      try:
        import torch  # lazy: torch (optional: convert_to_tensor=True)
      except ImportError:
        raise InputError("convert_to_tensor=True needs torch; use the default numpy output"
                         ) from None
      return torch.from_numpy(out)
    return out if convert_to_numpy or single else list(out)

  def encode_counting(self, sentences: Sequence[str], lang=None,
                      batch_size: Optional[int] = None, progress: Optional[bool] = None,
                      dim: Optional[int] = None):
    """(`encode(sentences, lang, ...)`, the number of sentences truncated to `max_length`),
    without the warning: for callers that encode in chunks and report one total."""
    out, truncated, _ = self._encode(self.check_sentences(sentences), lang, batch_size,
                                     progress, dim)
    return self._finish(out, "float32"), truncated

  def _ranges(self, size: int) -> Optional[dict]:
    return self.quantization.get(size)

  def _finish(self, out: np.ndarray, precision: str) -> np.ndarray:
    """The float vectors as `precision`; float32 in the `quantized` geometry if one is set."""
    if not out.size or precision == "float32":
      return self.to_geometry(out)
    return quantize.quantize(out, precision, self._ranges(out.shape[1]))

  def to_geometry(self, emb_NxD: np.ndarray) -> np.ndarray:
    """Float vectors of this model in the encoder's `quantized` geometry: quantized and
    mapped back (vmx/quantize.py); unchanged when the encoder is not quantized."""
    if self.quantized is None or not emb_NxD.size:
      return emb_NxD
    ranges = self._ranges(emb_NxD.shape[1])
    q = quantize.quantize(emb_NxD, self.quantized, ranges)
    return quantize.dequantize(q, self.quantized, emb_NxD.shape[1], ranges)

  def float_encoder(self) -> "Encoder":
    """A snapshot of this encoder with float vectors (the same model, parameters and
    settings, no `quantized` geometry): what a rescoring step scores its candidates
    with. Parameters set on this encoder later do not reach it."""
    twin = copy.copy(self)
    twin.quantized = None
    return twin

  def _check_dim(self, dim: Optional[int]) -> Optional[int]:
    """`dim` if this model serves prefixes of that size (InputError naming both, else)."""
    if dim is None:
      return None
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
      raise InputError(f"dim={dim!r}: expected a positive integer")
    if not self.model.matryoshka_dims:
      raise InputError(f"dim={dim}: {type(self.model).__name__} was not trained with "
                       "Matryoshka dimensions (MATRYOSHKA_DIMS): a prefix of its vectors is "
                       "not an embedding; leave dim out")
    return dim

  def _prefix(self, out: np.ndarray, dim: Optional[int]) -> np.ndarray:
    if dim is None or not out.size:
      return out
    if dim > out.shape[1]:
      raise InputError(f"dim={dim} is larger than the model's {out.shape[1]} dimensions "
                       f"(trained prefixes: {list(self.model.matryoshka_dims)})")
    return _unit(out[:, :dim])

  def _prompt(self, prompt, prompt_name, task_name, prompt_type) -> str:
    if prompt is not None and prompt_name is not None:
      raise InputError("pass prompt or prompt_name, not both")
    if prompt is not None:
      if not isinstance(prompt, str):
        raise InputError(f"prompt={prompt!r}: expected a string")
      return prompt
    if prompt_name is not None:
      if prompt_name not in self.prompts:
        raise InputError(f"prompt_name={prompt_name!r} is not one of this encoder's prompts "
                         f"{sorted(self.prompts)} (vmx models are trained without prompts)")
      return self.prompts[prompt_name]
    for key in (f"{task_name}-{prompt_type}", task_name, prompt_type):
      if key in self.prompts:
        return self.prompts[key]
    return ""

  def similarity(self, a, b) -> np.ndarray:
    """[n, m] cosine similarities of two sets of embeddings (sentence-transformers'
    `similarity`); one [D] vector counts as one row."""
    a, b = (np.atleast_2d(np.asarray(x, np.float32)) for x in (a, b))
    return _unit(a) @ _unit(b).T

  def similarity_pairwise(self, a, b) -> np.ndarray:
    """[n] cosine similarity of each row of `a` with the same row of `b`."""
    a, b = (np.atleast_2d(np.asarray(x, np.float32)) for x in (a, b))
    if a.shape != b.shape:
      raise InputError(f"similarity_pairwise needs equal shapes, got {a.shape} and {b.shape}")
    return np.sum(_unit(a) * _unit(b), axis=1)

  def _encode(self, sentences: list, lang, batch_size, progress, dim=None):
    """([len(sentences), D] float32, how many sentences were truncated, the indices of those
    made only of unknown pieces). D: `dim` (else `self.dim`), renormalized, or all."""
    dim = self._check_dim(dim) if dim is not None else self.dim
    bs = self.batch_size if batch_size is None else batch_size
    if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
      raise InputError(f"batch_size={bs!r}: expected a positive integer")
    lang_ids = self._lang_ids(lang, len(sentences))
    # `lang` also picks the pre-tokenizer of a vocabulary that has one (vmx/data/normalize.py)
    ragged = self.tokenizer.encode_ragged(sentences, self.max_length, lang=lang)
    truncated, lengths = ragged.truncated, ragged.lengths
    unknown = np.flatnonzero(self.tokenizer.unknown_only(ragged)).tolist()
    no_tokens = np.flatnonzero(lengths == 0)
    if no_tokens.size:
      i = int(no_tokens[0])
      raise InputError(f"sentences[{i}] ({sentences[i]!r:.40}) has no tokens after "
                       f"tokenizer normalization, and so no embedding")
    if self._token_sums is not None:
      return self._prefix(self._sum_rows(ragged), dim), truncated, unknown
    tokens = ragged.padded(self.max_length)
    # Batches of similar length, each padded to a power of two (>= 8, <= max_length), as
    # is the row count of a short last batch: one compilation per shape bucket, and
    # little work on padding.
    order = np.argsort(lengths, kind="stable")
    starts = range(0, len(sentences), bs)
    if progress is None:
      progress = len(sentences) > 20 * bs
    if progress:
      starts = tqdm(starts, desc="encode", unit="batch")
    out = None
    for s in starts:
      rows = order[s:s + bs]
      width = min(self.max_length, max(8, 1 << int(lengths[rows].max() - 1).bit_length()))
      n = min(bs, max(8, 1 << (len(rows) - 1).bit_length()))  # a last, short batch too
      batch = np.zeros((n, width), np.int32)
      batch[:len(rows)] = tokens[rows, :width]
      ids = np.zeros((n,), np.int32)
      ids[:len(rows)] = lang_ids[rows]
      emb = np.asarray(self._predict(self.params, batch, ids)[:len(rows)], np.float32)
      if not np.isfinite(emb).all():
        raise _non_finite(int(rows[np.argwhere(~np.isfinite(emb).all(axis=1))[0, 0]]))
      if out is None:
        out = np.zeros((len(sentences), emb.shape[1]), np.float32)
      out[rows] = emb
    if out is None:
      out = np.zeros((0, 0), np.float32)
    return self._prefix(out, dim), truncated, unknown

  def _sum_rows(self, ragged: RaggedIds) -> np.ndarray:
    """A bag-of-tokens model's unit vectors: the sparse [N, V] token counts times
    `_token_sums` (SciPy's CSR product adds each token's row once, with no [N, L, D]
    gather, and the ragged ids are its CSR layout as they are, no padding), normalized.
    4x the jitted per-batch path on 2 CPU cores (docs/performance.md)."""
    from scipy import sparse
    counts = sparse.csr_matrix(
        (np.ones(ragged.ids.shape, np.float32), ragged.ids, ragged.offsets()),
        shape=(len(ragged.lengths), self._token_sums.shape[0]))
    out = np.asarray(counts @ self._token_sums, np.float32)
    norm = np.sqrt(np.einsum("nd,nd->n", out, out))
    if not np.isfinite(norm).all():
      raise _non_finite(int(np.flatnonzero(~np.isfinite(norm))[0]))
    out /= np.maximum(norm, 1e-12)[:, None]     # in place: the product is ours
    return out
