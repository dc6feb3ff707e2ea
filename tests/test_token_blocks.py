"""MMLM's blocks of text (vmx/data/token_blocks.py): consecutive sentences of a token cache
joined up to a block length, against a loop-by-loop reference and through the index
reader and a training run."""
import jax
import numpy as np
import pytest

from conftest import toy_train
from vmx.data import token_blocks


class _Rows:
  """A token cache table's interface over an array of zero-padded rows."""

  def __init__(self, tokens):
    self.tokens = tokens

  def __len__(self):
    return len(self.tokens)

  def take(self, indices):
    return {"tokens": self.tokens[np.asarray(indices)]}


def _reference_blocks(rows, length):
  """The blocks as lists of token lists, joined one row at a time."""
  blocks, cur = [], []
  for r in rows:
    toks = [t for t in r.tolist() if t]
    if cur and len(cur) + len(toks) > length:
      blocks.append(cur)
      cur = []
    cur = cur + toks
  blocks.append(cur)
  return blocks


def test_blocks_equal_the_loop_they_replace():
  rng = np.random.default_rng(0)
  n, width, length = 500, 12, 30
  lengths = rng.integers(0, width + 1, n)
  lengths[rng.random(n) < 0.1] = width            # some full rows
  rows = np.zeros((n, width), np.int32)
  for i, k in enumerate(lengths):
    rows[i, :k] = rng.integers(3, 100, k)
  blocks = token_blocks.TokenBlocks(_Rows(rows), "tokens", length)
  want = _reference_blocks(rows, length)
  assert len(blocks) == len(want)
  order = rng.permutation(len(want))              # any order, as the stream asks
  got = blocks.take(order)["tokens"]
  assert got.shape == (len(want), length)
  for row, i in zip(got, order):
    assert row.tolist() == want[i] + [0] * (length - len(want[i]))
  assert sum(map(len, want)) == lengths.sum()     # every token once an epoch
  starts = blocks.starts
  assert starts[0] == 0 and starts[-1] == n and (np.diff(starts) > 0).all()
  # a block never ends where the next row would still fit
  for b in range(len(want) - 1):
    assert len(want[b]) + lengths[starts[b + 1]] > length
  assert blocks.take(np.array([], np.int64))["tokens"].shape == (0, length)


def _config(vp, name, block_length=None):
  from conftest import toy_text_task
  from vmx.data import pipeline
  return pipeline.MultiTaskConfig({
      "mmlm": pipeline.DatasetConfig(toy_text_task(vp), {"inputs": 8}, batch_size=8,
                                     block_length=block_length),
      "tlm": pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8),
      "xlco": pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8)})


def test_infoxlm_mmlm_reads_blocks_of_consecutive_sentences(toy_task, tmp_path):
  """With block_length, MMLM's rows are the text's consecutive sentences joined whole
  (InfoXLM App. A's 512-token blocks, at toy scale 16), the stream's description says
  so (a resume with other blocks is refused), and a run resumes bitwise."""
  from vmx.data import feature_converters as fcs, inputs, pipeline, vocab
  from vmx.errors import ConfigError
  name, vp, _, _ = toy_task
  cfg = _config(vp, name, block_length=16)
  converters = {"mmlm": fcs.MonolingualFeatureConverter, "tlm": fcs.PairFeatureConverter,
                "xlco": fcs.PairFeatureConverter}
  shapes = pipeline.model_feature_shapes(cfg, converters)
  assert shapes["mmlm/tokens"] == (8, 16) and shapes["tlm/left_tokens"] == (8, 8)
  it = pipeline.train_iterator(cfg, converters, seed=3)
  blocks = it.streams["mmlm"].tables[0]
  assert isinstance(blocks, token_blocks.TokenBlocks) and blocks.separator == vocab.EOS_ID
  cached = blocks.table.take(np.arange(len(blocks.table)))["tokens"]   # the cache, in order
  with_eos = np.zeros((len(cached), cached.shape[1] + 1), cached.dtype)
  for i, row in enumerate(cached):                 # each sentence then its </s>
    toks = [t for t in row.tolist() if t] + [vocab.EOS_ID]
    with_eos[i, :len(toks)] = toks
  want = {tuple(b + [0] * (16 - len(b))) for b in _reference_blocks(with_eos, 16)}
  joined = 0
  for _ in range(4):
    batch = next(it)
    assert batch["mmlm/tokens"].shape == (8, 16)
    for row in batch["mmlm/tokens"].tolist():
      assert tuple(row) in want                    # consecutive sentences of the cache
      joined += row.count(vocab.EOS_ID) > 1
  assert joined > 16                                  # most blocks hold several sentences
  described = pipeline.described_config(cfg, 3)
  assert described["mmlm"]["block_length"] == 16 and "block_length" not in described["tlm"]
  state = it.state()
  plain = inputs.TokenCacheInput(_config(vp, name))
  assert any("block_length 16 -> None" in c for c in plain.changes(state, 3))
  with pytest.raises(ConfigError, match=r"block_length = 8: expected None, or a number of "
                                        r"tokens > the sentences' length 8"):
    pipeline.DatasetConfig(toy_text_task_name(vp), {"inputs": 8}, batch_size=8, block_length=8)
  with pytest.raises(ConfigError, match=r"blocks of text are for single sentences"):
    pipeline.model_feature_shapes(pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8},
                                                         batch_size=8, block_length=16),
                                  fcs.PairFeatureConverter)
  with pytest.raises(ConfigError, match=r"blocks of text are for single sentences"):
    pipeline.model_feature_shapes(pipeline.DatasetConfig(name, {"views": 8}, batch_size=8,
                                                         block_length=16),
                                  fcs.MultiViewFeatureConverter)
  full = _Rows(np.array([[3, 4, 5, 6], [7, 0, 0, 0]]))    # a full row, then its </s>
  with pytest.raises(ConfigError, match=r"block_length=4: a sentence of the cache fills 5 "
                                        r"tokens with its separator"):
    token_blocks.TokenBlocks(full, "tokens", 4, separator=1)
  assert token_blocks.TokenBlocks(full, "tokens", 5, separator=1).take([0, 1])[
      "tokens"].tolist() == [[3, 4, 5, 6, 1], [7, 1, 0, 0, 0]]

  data = inputs.TokenCacheInput(cfg)
  full = toy_train(tmp_path / "full", name, vp, kind="infoxlm", total_steps=4, data=data)
  toy_train(tmp_path / "split", name, vp, kind="infoxlm", total_steps=4, stop_at_step=2,
            data=inputs.TokenCacheInput(_config(vp, name, block_length=16)))
  resumed = toy_train(tmp_path / "split", name, vp, kind="infoxlm", total_steps=4,
                      data=inputs.TokenCacheInput(_config(vp, name, block_length=16)))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full.params, resumed.params)


def toy_text_task_name(vp):
  from conftest import toy_text_task
  return toy_text_task(vp)
