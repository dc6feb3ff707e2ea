"""Fuzz campaigns (hypothesis): corpus files, gin bindings and encode() inputs.

Every generated case ends in success or a vmx error (`VmxError`), never an unhandled
exception and never a silent truncation: a corpus that validates has exactly the pairs
an independent reference count finds, and encode() returns one unit row per input.
CI runs the "ci" profile (60 cases each); the full campaign (400 each, 1200 in all):
  HYPOTHESIS_PROFILE=campaign python -m pytest -q tests/test_fuzz.py
"""
import gzip
import itertools
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from vmx.errors import VmxError  # noqa: E402

_counter = itertools.count()

# --- corpus files ------------------------------------------------------------------------

_line = st.one_of(st.text(max_size=30).map(lambda t: t.replace("\n", " ").replace("\r", " ")
                                           .encode("utf-8")),
                  st.binary(max_size=20).map(lambda b: b.replace(b"\n", b" ")),
                  st.just(b""), st.just(b"   "))
_corpus = st.fixed_dictionaries({
    "src": st.lists(_line, max_size=12), "tgt": st.lists(_line, max_size=12),
    "gz": st.booleans(), "truncate": st.sampled_from([None, 0.3, 0.9]),
    "final_newline": st.booleans(), "empty_lines": st.sampled_from(["error", "skip"])})


def _write(path, lines, gz, truncate, final_newline):
  data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
  if gz:
    data = gzip.compress(data)
    if truncate:
      data = data[:int(len(data) * truncate)]
  path.write_bytes(data)


def _reference_pairs(c):
  """Independent count of usable pairs, or None where the input must be rejected."""
  if c["gz"] and c["truncate"]:
    return None
  src, tgt = c["src"], c["tgt"]
  if len(src) != len(tgt):
    return None
  n = 0
  for s, t in zip(src, tgt):
    try:
      s, t = s.decode("utf-8"), t.decode("utf-8")
    except UnicodeDecodeError:
      return None
    if not s.strip() or not t.strip():
      if c["empty_lines"] == "error":
        return None
      continue
    n += 1
  return n or None


@given(_corpus)
def test_fuzz_corpus_files(tmp_path_factory, c):
  from vmx.data import readers
  d = tmp_path_factory.mktemp(f"fuzz_corpus_{next(_counter)}")
  ext = ".gz" if c["gz"] else ""
  src, tgt = d / f"c.xx{ext}", d / f"c.en{ext}"
  _write(src, c["src"], c["gz"], c["truncate"], c["final_newline"])
  _write(tgt, c["tgt"], c["gz"], c["truncate"], c["final_newline"])
  expected = _reference_pairs(c)
  try:
    n = readers.validate_parallel(src, tgt, c["empty_lines"])
  except VmxError as e:
    # Only inputs the reference rejects may fail, and the error names a file.
    assert expected is None, (e, c)
    assert "c.xx" in str(e) or "c.en" in str(e), e
    return
  assert n == expected, (n, expected, c)  # no silent drop or truncation
  assert sum(1 for _ in readers.read_parallel(src, tgt, c["empty_lines"])) == n


# --- gin bindings ------------------------------------------------------------------------

_MACROS = ["TRAIN_STEPS", "BATCH_SIZE", "NUM_LAYERS", "EMB_DIM", "NUM_HEADS", "MLP_DIM",
           "VOCAB_SIZE", "MAX_LENGTH", "LEARNING_RATE", "WARMUP_STEPS", "OPTIMIZER",
           "LR_SCHEDULE", "CHECKPOINT_PERIOD", "CHECKPOINTS_TO_KEEP", "NUM_PARTITIONS",
           "EVAL_PERIOD", "LOG_PERIOD", "TRAIN_LANGUAGES", "ALPHA", "CLIP_GRAD_NORM",
           "WEIGHT_DECAY", "RANDOM_SEED", "DATA_DIR"]
_key = st.one_of(st.sampled_from(_MACROS),
                 st.sampled_from(_MACROS).map(lambda m: m[:-1]),          # misspelt
                 st.sampled_from(["TransformerEncoder.num_layers", "train.log_period",
                                  "CheckpointConfig.period", "Partitioner.num_partitions",
                                  "TransformerEncoder.num_layerz", "Nope.x"]),
                 st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,12}", fullmatch=True))
_value = st.one_of(st.integers(-3, 10 ** 7).map(str), st.floats(allow_nan=True).map(repr),
                   st.booleans().map(str), st.just("None"),
                   st.text(max_size=12), st.lists(st.sampled_from(["deu", "fra", 1]),
                                                  max_size=3).map(repr),
                   st.sampled_from(["'adam'", "'nope'", "'linear'", "[", "%TRAIN_STEPS",
                                    "@Partitioner()", "{'a': 1}", "1e-3", "-1", "0"]))


@given(st.lists(st.tuples(_key, _value), min_size=1, max_size=3))
def test_fuzz_gin_bindings(bindings):
  import gin
  from vmx import experiment, gin_utils
  from vmx.modeldir import checkpoints
  argv = [f"--gin.{k}={v}" for k, v in bindings]
  gin.clear_config()
  try:
    parsed, _ = gin_utils.split_gin_bindings(argv)
    experiment.build_experiment(["contrastive_tiny.gin"], parsed)
    checkpoints.CheckpointConfig()
  except VmxError:
    pass
  finally:
    gin.clear_config()


# --- encode() inputs ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def random_encoder(toy_task):
  import jax
  from vmx import encoders
  from vmx.data.vocab import Tokenizer
  from vmx.inference import Encoder
  from vmx.models import DualEncoder, DualEncoderModel
  _, vp, _, _ = toy_task
  model = DualEncoderModel(DualEncoder(encoders.TransformerEncoder(
      vocab_size=64, num_layers=1, emb_dim=16, num_heads=2, mlp_dim=32, max_length=8)))
  shapes = {"left_tokens": (1, 8), "right_tokens": (1, 8)}
  params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
  return Encoder(model, params, Tokenizer(vp), ["xx", "en"], 8, batch_size=4)


_item = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\t\n", "alpha beta"]),
                  st.integers(), st.none(), st.binary(max_size=4), st.floats())
_batch = st.sampled_from([None, 1, 3, 4, 0, -1, 2.5, "2", True])


@given(st.lists(_item, max_size=9), _batch)
def test_fuzz_encode_inputs(random_encoder, items, batch_size):
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      v = random_encoder.encode(items, batch_size=batch_size)
  except VmxError:
    return
  assert v.shape == ((len(items), 16) if items else (0, 0))  # one row per input, none dropped
  if items:
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)


@given(st.lists(st.lists(st.integers(1, 2**31 - 1), max_size=12), max_size=9),
       st.integers(1, 8))
def test_fuzz_padded_and_ragged_rows_are_the_loop_they_replaced(rows, max_length):
  """vmx.data.token_rows (vectorized) against the per-row loop: each row's first
  max_length ids then zeros, and the count of rows cut; the ragged ids (what a static model
  sums) are the same ids end to end, each with its row."""
  from vmx.data.token_rows import in_chunks, ragged_rows
  want = np.zeros((len(rows), max_length), np.int32)
  for i, row in enumerate(rows):
    want[i, :min(len(row), max_length)] = row[:max_length]
  ragged = ragged_rows(rows, max_length)
  got, cut = ragged.padded(max_length), ragged.truncated
  np.testing.assert_array_equal(got, want)
  assert cut == sum(len(r) > max_length for r in rows)
  np.testing.assert_array_equal(ragged.ids, want[want != 0])
  np.testing.assert_array_equal(ragged.row_of_each_id(), np.nonzero(want)[0])
  np.testing.assert_array_equal(np.diff(ragged.offsets()), (want != 0).sum(axis=1))
  for chunk in (1, 2, 4):               # in chunks (what tokenizers do): the same rows
    parts = in_chunks(rows, lambda c: ragged_rows(c, max_length), chunk)
    np.testing.assert_array_equal(parts.ids, ragged.ids)
    np.testing.assert_array_equal(parts.lengths, ragged.lengths)
    assert parts.truncated == ragged.truncated
