"""The static encoder (vmx/static_encoder.py, issue 58): its sentence vector against a NumPy
reference (plain, learned-weight and fixed frequency-weight means), `Encoder`'s host path
(a sparse sum of token rows) equal to the jitted one, CONTRASTIVE over it packed equal to
unpacked on 1 and 8 devices and in GradCache chunks, its table sharded over the model axis,
the gin files, a trained directory that opens as an `Encoder` and exports (sentence-
transformers, Model2Vec), and Model2Vec's distillation against NumPy."""
import jax
import numpy as np
import pytest

from conftest import initial_variables, save_model_dir
from test_packing import LAYOUTS, V, _assert_equal, _pairs
from vmx.errors import ConfigError
from vmx.models import DualEncoder, DualEncoderModel
from vmx.static_encoder import StaticEncoder


def _model(weighting="learned", length=12, dim=16):
  return DualEncoderModel(DualEncoder(StaticEncoder(V, dim, length, weighting)),
                          temperature=0.1)


@pytest.mark.parametrize("weighting", ["none", "learned"])
def test_sentence_vectors_equal_a_numpy_weighted_mean(weighting):
  model = _model(weighting)
  params = model.get_initial_variables(jax.random.PRNGKey(0), model.inference_shapes(12))[
      "params"]
  rng = np.random.default_rng(0)
  if weighting == "learned":     # weights away from their start (all 1)
    params["encoder"]["token_weight"]["embedding"] = rng.normal(size=(V, 1)).astype(np.float32)
  tokens = _pairs()["left_tokens"]
  table = np.asarray(params["encoder"]["token_embed"]["embedding"])
  w = (np.exp(np.asarray(params["encoder"]["token_weight"]["embedding"]))[:, 0]
       if weighting == "learned" else np.ones(V))
  want = np.stack([(w[r[r > 0], None] * table[r[r > 0]]).sum(0) / w[r[r > 0]].sum()
                   for r in tokens])
  np.testing.assert_allclose(np.asarray(model.embed(params, tokens)), want, rtol=1e-5,
                             atol=1e-6)
  assert model.sentence_vector().layer == 0
  from vmx.evaluation import vectors
  assert vectors.of_model(model) == "mean of the static token vectors"


def _vocabulary(tmp_path):
  """A tiny SentencePiece vocabulary of V pieces at tmp_path/v.model; returns its path."""
  import sentencepiece as spm
  text = tmp_path / "t.txt"
  text.write_text("".join(f"der hund {i} die katze {i % 7} the dog\n" for i in range(300)))
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "v"),
                                 vocab_size=V, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 minloglevel=2)
  return tmp_path / "v.model"


class _RowsTokenizer:
  """A tokenizer whose sentence "s<i>" is row i of `rows`."""

  def __init__(self, rows):
    self.rows = rows

  def encode_ragged(self, texts, max_length, lang=None):
    from vmx.data.token_rows import ragged_rows
    padded = self.rows[[int(t[1:]) for t in texts], :max_length]
    return ragged_rows([row[row != 0].tolist() for row in padded], max_length)

  def unknown_only(self, ragged):
    return np.zeros(len(ragged.lengths), bool)


@pytest.mark.parametrize("kind", ["none", "learned", "mpcl", "projection"])
def test_the_host_sum_of_token_rows_is_the_jitted_vector(kind):
  """`Encoder` encodes a bag-of-tokens model on the host (the sparse product of token counts
  and `token_sum_table`): the same unit vectors as the jitted `encode_tokens`, Matryoshka
  prefixes and rows of every length included; new parameters set on the encoder replace
  the table; a model with a projection head has no table (it takes the jitted path), and a
  non-finite table is refused by name."""
  from vmx.errors import NonFiniteError
  from vmx.inference import Encoder
  from vmx.models import MPCLModel
  enc = StaticEncoder(V, 16, 12, "none" if kind == "none" else "learned")
  if kind == "mpcl":
    model = MPCLModel(DualEncoder(enc), num_views=3, matryoshka_dims=(4, 8))
  else:
    model = DualEncoderModel(DualEncoder(enc, projection_dims=(8,) if kind == "projection"
                                         else ()), temperature=0.1, matryoshka_dims=(4, 8))
  params = jax.tree.map(np.array, initial_variables(model, model.inference_shapes(12))["params"])
  if kind != "none":
    params["encoder"]["token_weight"]["embedding"] = np.random.default_rng(1).normal(
        size=(V, 1)).astype(np.float32)
  table = model.token_sum_table(params)
  if kind == "projection":
    assert table is None
    return
  assert table.shape == (V, 16)
  tokens = np.random.default_rng(2).integers(1, V, size=(40, 12)).astype(np.int32)
  tokens[np.arange(12) >= np.arange(40)[:, None] % 12 + 1] = 0       # 1..12 tokens a row
  want = np.asarray(model.encode_tokens(params, tokens, np.zeros((40,), np.int32)))
  encoder = Encoder(model, params, _RowsTokenizer(tokens), [], 12)
  got = encoder.encode([f"s{i}" for i in range(40)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(encoder.encode([f"s{i}" for i in range(40)], dim=4),
                             want[:, :4] / np.linalg.norm(want[:, :4], axis=1, keepdims=True),
                             rtol=1e-5, atol=1e-6)
  # new parameters (as training's periodic evaluation sets them) give their own vectors
  params = jax.tree.map(np.copy, params)
  params["encoder"]["token_embed"]["embedding"][7] = np.nan
  encoder.params = params
  with pytest.raises(NonFiniteError, match=r"sentences\[\d+\]"):
    encoder.encode([f"s{i}" for i in range(40)])


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_contrastive_packed_equals_unpacked_on_1_and_8_devices_and_in_chunks():
  _assert_equal(_model(), _pairs(), LAYOUTS)


def test_mpcl_with_hard_negatives_trains_over_it_packed_as_unpacked():
  """The other contrastive losses take it too: MPCL's multi-positive loss over N-way
  groups with a hard negative."""
  from test_packing import _rows
  from vmx.models import MPCLModel
  rng = np.random.default_rng(4)
  batch = {"views": _rows(rng, 16 * 3, 10).reshape(16, 30),
           "hard_negative": _rows(rng, 16, 10)}
  model = MPCLModel(DualEncoder(StaticEncoder(V, 16, 10, "learned")), num_views=3,
                    hard_negatives=True)
  _assert_equal(model, batch)


def test_the_table_is_sharded_over_the_model_axis_and_bad_settings_name_the_binding():
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  model = _model(dim=16)
  if jax.device_count() >= 2:
    part = partitioning.Partitioner(num_partitions=2, num_devices=2)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part,
                   {"left_tokens": (4, 12), "right_tokens": (4, 12)})
    spec = tr.create_state(0).params["encoder"]["token_embed"]["embedding"].sharding.spec
    assert spec[0] == "model", spec                  # vocabulary rows split over the model axis
  with pytest.raises(ConfigError, match=r"StaticEncoder\.weighting='idf'"):
    _model("idf").get_initial_variables(jax.random.PRNGKey(0), model.inference_shapes(12))
  with pytest.raises(ConfigError, match=r"StaticEncoder.*emb_dim"):
    _model(dim=0).get_initial_variables(jax.random.PRNGKey(0), model.inference_shapes(12))
  with pytest.raises(ConfigError, match="pools by the mean"):
    m = DualEncoderModel(DualEncoder(StaticEncoder(V, 8, 12), pooling="first"))
    m.get_initial_variables(jax.random.PRNGKey(0), m.inference_shapes(12))


@pytest.mark.parametrize("name", ["static_tiny.gin", "static_1h.gin"])
def test_the_gin_files_build_a_static_dual_encoder(name):
  import gin
  from vmx import experiment
  gin.clear_config()
  try:
    experiment.parse_gin([name], ["MODEL_DIR = '/tmp/unused'"], "")
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
    assert isinstance(model.module.encoder, StaticEncoder)
    assert model.module.encoder.weighting == "learned"
  finally:
    gin.clear_config()


def test_a_static_model_directory_opens_as_an_encoder_and_exports_as_static_embedding(
    tmp_path):
  """What a run leaves (vmx_model.json, the vocabulary, a checkpoint) serves
  `Encoder.from_checkpoint` (the model's own vectors, normalized), and exports as a
  sentence-transformers `StaticEmbedding` folder giving the same vectors (learned weights
  folded into the rows, the SentencePiece vocabulary as a `tokenizers` Unigram), and as a
  Model2Vec folder (the same vectors, its Matryoshka prefix too); a Transformer is refused
  as Model2Vec by one line."""
  from vmx.inference import Encoder
  from vmx.modeldir import checkpoints, layout
  from vmx import encoders
  from vmx.modeldir.hf_export import export_model2vec, export_sentence_transformers
  _vocabulary(tmp_path)
  model = DualEncoderModel(DualEncoder(StaticEncoder(V, 16, 16, "learned")),
                           temperature=0.1, matryoshka_dims=(8,))
  params = model.get_initial_variables(jax.random.PRNGKey(1), model.inference_shapes(16))
  params["params"]["encoder"]["token_weight"]["embedding"] = np.random.default_rng(2).normal(
      size=(V, 1)).astype(np.float32)     # weights that matter
  checkpoints.save_params(str(tmp_path / "m"), 0, params["params"])
  layout.write_inference_files(str(tmp_path / "m"), model, ["deu"], 16,
                               str(tmp_path / "v.model"))
  enc = Encoder.from_checkpoint(tmp_path / "m")
  got = enc.encode(["der hund", "die katze the dog"], lang="deu")
  tokens = enc.tokenizer.encode(["der hund", "die katze the dog"], 16)
  want = np.array(model.embed(params["params"], tokens))
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  summary = export_sentence_transformers(tmp_path / "m", tmp_path / "st")
  assert summary["architecture"] == "StaticEmbedding"
  texts = ["der hund", "die katze the dog", "the dog 5 der hund 3"]
  vmx_vectors = enc.encode(texts, lang="deu")
  st = pytest.importorskip("sentence_transformers").SentenceTransformer(
      str(tmp_path / "st"), device="cpu")
  cos = np.sum(st.encode(texts) * vmx_vectors, axis=1)
  assert cos.min() >= 0.9999, cos
  # Model2Vec's layout: the same vectors, and a Matryoshka prefix by its `dimensionality`
  summary = export_model2vec(tmp_path / "m", tmp_path / "m2v")
  assert summary["architecture"] == "Model2Vec StaticModel" and summary["dim"] == 16
  assert "library_name: model2vec" in (tmp_path / "m2v" / "README.md").read_text()
  m2v = pytest.importorskip("model2vec").StaticModel
  cos = np.sum(m2v.from_pretrained(str(tmp_path / "m2v")).encode(texts) * vmx_vectors, axis=1)
  assert cos.min() >= 0.9999, cos
  small = m2v.from_pretrained(str(tmp_path / "m2v"), dimensionality=8).encode(texts)
  want = vmx_vectors[:, :8] / np.linalg.norm(vmx_vectors[:, :8], axis=1, keepdims=True)
  assert np.sum(small * want, axis=1).min() >= 0.9999
  transformer = DualEncoderModel(DualEncoder(encoders.TransformerEncoder(
      vocab_size=V, num_layers=1, emb_dim=8, num_heads=2, mlp_dim=16, max_length=16)))
  save_model_dir(tmp_path / "t", transformer, ["deu"], 16, tmp_path / "v.model")
  with pytest.raises(ConfigError, match="model2vec writes static encoders"):
    export_model2vec(tmp_path / "t", tmp_path / "no")
  assert not (tmp_path / "no").exists()


def test_distillation_is_model2vec_s_recipe_against_numpy(tmp_path):
  """launch/distill_static.py's table: each token's teacher vector alone, centred PCA to
  `dim`, times SIF's a / (a + p) with p the SentencePiece unigram probabilities; the output
  directory is an encoder; a non-empty output directory is refused."""
  import sentencepiece as spm
  from vmx import encoders, static_distill
  from vmx.inference import Encoder
  from vmx.modeldir import checkpoints, layout
  _vocabulary(tmp_path)
  teacher = DualEncoderModel(DualEncoder(encoders.TransformerEncoder(
      vocab_size=V, num_layers=1, emb_dim=16, num_heads=2, mlp_dim=32, max_length=16)))
  params = teacher.get_initial_variables(jax.random.PRNGKey(3), teacher.inference_shapes(16))
  checkpoints.save_params(str(tmp_path / "t"), 0, params["params"])
  layout.write_inference_files(str(tmp_path / "t"), teacher, ["deu"], 16,
                               str(tmp_path / "v.model"))
  summary = static_distill.distill(tmp_path / "t", tmp_path / "s", dim=8, sif=1e-3)
  assert summary["tokens"] == V - 1 and summary["dim"] == 8
  ids = np.arange(1, V)
  vec = np.asarray(teacher.embed(params["params"], ids[:, None].astype(np.int32)))
  centred = vec - vec.mean(0)
  _, _, vt = np.linalg.svd(centred, full_matrices=False)
  sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "v.model"))
  score = np.array([sp.get_score(int(i)) for i in ids])
  p = np.where(score < 0, np.exp(score), 0.0)     # special pieces (score 0): p = 0
  want = centred @ vt[:8].T * (1e-3 / (1e-3 + p / p.sum()))[:, None]
  student = Encoder.from_checkpoint(tmp_path / "s")
  got = np.asarray(student.params["encoder"]["token_embed"]["embedding"])
  signs = np.sign(np.sum(got[1:] * want, axis=0))        # an SVD's axes may flip sign
  np.testing.assert_allclose(got[1:] * signs, want, rtol=1e-3, atol=1e-5)
  assert student.encode(["der hund"], lang="deu").shape == (1, 8)
  with pytest.raises(ConfigError, match="exists and is not empty"):
    static_distill.distill(tmp_path / "t", tmp_path / "s")


def test_frequency_weights_are_sif_s_from_the_vocabulary_and_never_trained(tmp_path):
  """TOKEN_WEIGHTING='frequency': token_weight starts at log a / (a + p(t)) with p the
  SentencePiece unigram probabilities (padding at 0; the special pieces, which a unigram
  model scores 0, at p = 0: not a probability of 1), the sentence vector is that weighted
  mean, no gradient reaches the weights (the table's does), an abstract init (inference's)
  reads no vocabulary, and a missing vocabulary binding is one ConfigError."""
  import sentencepiece as spm
  _vocabulary(tmp_path)

  def model(vocabulary):
    return DualEncoderModel(DualEncoder(StaticEncoder(
        V, 16, 12, "frequency", vocabulary=vocabulary, sif_a=1e-3)), temperature=0.1)

  m = model(str(tmp_path / "v.model"))
  params = initial_variables(m, m.inference_shapes(12))["params"]
  sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "v.model"))
  score = np.array([sp.get_score(i) for i in range(1, V)])
  p = np.where(score < 0, np.exp(score), 0.0)     # special pieces (score 0): p = 0
  assert (score == 0).sum() >= 2                  # eos and unk are among them
  want = np.concatenate([[0.0], np.log(1e-3 / (1e-3 + p / p.sum()))])
  got = np.asarray(params["encoder"]["token_weight"]["embedding"])[:, 0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  tokens = _pairs()["left_tokens"]
  table = np.asarray(params["encoder"]["token_embed"]["embedding"])
  w = np.exp(want)
  mean = np.stack([(w[r[r > 0], None] * table[r[r > 0]]).sum(0) / w[r[r > 0]].sum()
                   for r in tokens])
  np.testing.assert_allclose(np.asarray(m.embed(params, tokens)), mean, rtol=1e-5, atol=1e-6)
  batch = _pairs()
  grads = jax.jit(jax.grad(lambda p: m.compute_loss(p, batch, None, None)[0]))(params)
  assert not np.any(np.asarray(grads["encoder"]["token_weight"]["embedding"]))
  assert np.any(np.asarray(grads["encoder"]["token_embed"]["embedding"]))
  assert model("/nonexistent/v.model").abstract_params(12)["encoder"]["token_weight"][
      "embedding"].shape == (V, 1)
  with pytest.raises(ConfigError, match=r"weighting='frequency' needs StaticEncoder\.vocabulary"):
    initial_variables(model(None), m.inference_shapes(12))


def test_frequency_weights_read_a_vocabularys_unigram_scores_else_zipf(tmp_path):
  """`probabilities`: vmx's SentencePiece vocabulary gives its unigram probabilities (the
  special pieces p = 0), an imported tokenizer none, so Zipf's law from the id's rank."""
  import json
  import sentencepiece as spm
  from vmx.data.hf_tokenizer import HfTokenizer
  from vmx.data.vocab import Tokenizer
  from vmx.static_encoder import probabilities
  path = _vocabulary(tmp_path)
  ids = np.arange(1, V, dtype=np.int32)
  p, source = probabilities(Tokenizer(str(path)), ids)
  sp = spm.SentencePieceProcessor(model_file=str(path))
  scores = np.array([sp.get_score(int(i)) for i in ids])
  want = np.where(scores < 0, np.exp(np.minimum(scores, 0)), 0.0)
  assert source == "the SentencePiece model's unigram probabilities"
  np.testing.assert_allclose(p, want / want.sum(), rtol=1e-12)
  assert p[0] == 0 and p[1] == 0          # eos (1) and unk (2): not in the distribution
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "der",
                                                  "hund"]) + "\n")
  (tmp_path / "vmx_tokenizer.json").write_text(json.dumps(
      {"kind": "wordpiece", "file": "vocab.txt", "pad_id": 0, "closing_special": True}))
  p, source = probabilities(HfTokenizer(str(tmp_path / "vmx_tokenizer.json")), ids[:5])
  assert source == "Zipf's law from the id's rank"
  np.testing.assert_allclose(p, (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum())
