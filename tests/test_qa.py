"""Extractive QA fine-tuning (MLQA, InfoXLM Table 4; vmx/finetune/qa.py, squad.py,
vmx/models/span.py): MLQA's official F1 / exact match on hand-made cases in several
languages; SQuAD files with a misplaced answer refused; passages longer than a window
windowed with nothing dropped; character spans and the pair layout equal to Hugging
Face's; a tiny model fine-tuned on a small SQuAD-format set made here learns it, through
launch/finetune.py, writes per-language F1 and exact match, and a stopped run resumes to the
uninterrupted one bit for bit."""
import json
import subprocess
import sys
import unicodedata

import jax
import numpy as np
import pytest

from conftest import REPO, save_model_dir

CODES = ["zorb", "quix", "blen", "trav", "mork", "plin", "dask", "vung", "kelp", "yarn",
         "fesk", "glom"]
FILL = {"en": "the river runs past an old mill where farmers sell bread and cheese every "
              "morning before noon".split(),
        "de": "der fluss fliesst an einer alten muehle vorbei wo bauern jeden morgen brot "
              "und kaese verkaufen".split()}
FACT = {"en": ("The code is {}.", "What is the code?"),
        "de": ("Der Code ist {}.", "Was ist der Code?")}


def _squad(lang: str, n: int, seed: int) -> dict:
  """A SQuAD v1.1-format set: filler sentences with one fact ("the code is X") at a random
  place, asked for; every fourth passage is long (several windows)."""
  rng = np.random.default_rng(seed)
  paras = []
  for i in range(n):
    k = int(rng.integers(12, 20)) if i % 4 == 0 else int(rng.integers(1, 4))
    sents = [" ".join(rng.choice(FILL[lang], int(rng.integers(4, 8)))).capitalize() + "."
             for _ in range(k)]
    answer = str(rng.choice(CODES))
    fact = FACT[lang][0].format(answer)
    sents.insert(int(rng.integers(0, len(sents) + 1)), fact)
    context = " ".join(sents)
    start = context.index(fact) + fact.index(answer)
    paras.append({"context": context, "qas": [{
        "id": f"{lang}-{seed}-{i}", "question": FACT[lang][1],
        "answers": [{"text": answer, "answer_start": start}]}]})
  return {"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
  """SQUAD_DIR (600 English training questions), MLQA_DIR (dev and test of en and de),
  and a tiny checkpoint (2 layers, d 32, a 300-piece vocabulary of the text)."""
  from vmx import encoders
  from vmx.data import vocab
  from vmx.models import DualEncoder, DualEncoderModel
  root = tmp_path_factory.mktemp("qa")
  squad, mlqa = root / "squad", root / "mlqa"
  squad.mkdir()
  sets = {squad / "train-v1.1.json": _squad("en", 600, 0)}
  for split, seed in (("dev", 1), ("test", 2)):
    for lang in ("en", "de"):
      sets[mlqa / split / f"{split}-context-{lang}-question-{lang}.json"] = _squad(
          lang, 100, seed + 10 * (lang == "de"))
  text = []
  for path, data in sets.items():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    text += [t for p in data["data"][0]["paragraphs"] for t in (p["context"],
                                                                 p["qas"][0]["question"])]
  (root / "text.txt").write_text("\n".join(text) + "\n")
  vp = vocab.train_sentencepiece([str(root / "text.txt")], str(root / "v.model"), 300)
  enc = encoders.TransformerEncoder(vocab_size=300, num_layers=2, emb_dim=32, num_heads=2,
                                    mlp_dim=64, max_length=64)
  model = DualEncoderModel(DualEncoder(enc))
  ckpt = save_model_dir(root / "ckpt", model, ["eng", "deu"], 64, vp)
  return root, ckpt, squad, mlqa


BINDINGS = ["EVAL_LANGUAGES = ['en', 'de']", "MAX_LENGTH = 64", "DOC_STRIDE = 24",
            "MAX_QUERY_LENGTH = 16", "BATCH_SIZE = 16", "TRAIN_STEPS = 200",
            "LEARNING_RATE = 2e-3", "WARMUP_FRACTION = 0.1", "EVAL_PERIOD = 100",
            "CHECKPOINT_PERIOD = 100", "DROPOUT_RATE = 0.0", "LOG_PERIOD = 50"]


def test_mlqa_metric_equals_the_official_formulas():
  """F1 / EM as mlqa_evaluation_v1.py computes them, worked by hand: lowercase, Unicode
  punctuation dropped, each language's articles (Arabic's "ال" anywhere), whitespace
  tokens, Chinese split into characters; the best over the answers; unanswered = 0."""
  from vmx.finetune import squad
  f1, em = squad.f1_score, squad.exact_match_score
  assert squad.normalize_answer("The  Cat's hat!", "en") == "cats hat"
  assert f1("the big cat", "a cat", "en") == pytest.approx(2 / 3)    # P 1/2, R 1
  assert em("An Apple.", "apple", "en") == 1.0 and em("apples", "apple", "en") == 0.0
  assert em("el perro", "Perro", "es") == 1.0 and em("los perros", "perro", "es") == 0.0
  assert em("Der Hund", "hund", "de") == 1.0 and em("Der Hund", "hund", "en") == 0.0
  assert em("của tôi", "tôi", "vi") == 1.0
  assert f1("राम का घर।", "राम घर", "hi") == pytest.approx(0.8)      # danda dropped; 2/3, 1
  assert em("الكتاب", "كتاب", "ar") == 1.0                           # "ال" removed ...
  assert squad.normalize_answer("مالك", "ar") == "م ك"                 # ... wherever it is
  assert squad.normalize_answer("北京大学，2008年", "zh") == "北 京 大 学 2008 年"
  assert f1("北京大学", "北京", "zh") == pytest.approx(2 / 3)          # P 2/4, R 2/2
  assert f1("iPhone 手机", "iphone", "zh") == pytest.approx(0.5)
  assert f1("", "cat", "en") == 0.0 and f1("the", "a", "en") == 0.0
  examples = [squad.QaExample("1", "q", "c", ("a cat", "the big dog")),
              squad.QaExample("2", "q", "c", ("tree",)),
              squad.QaExample("3", "q", "c", ("sky",))]
  got = squad.evaluate(examples, {"1": "big dog", "2": "a tree"}, "en")  # 3 unanswered
  assert got == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3), "n": 3}
  with pytest.raises(ValueError, match="knows"):
    squad.normalize_answer("x", "fr")


def test_a_misplaced_training_answer_is_one_error_naming_file_question_and_strings(tmp_path):
  from vmx.errors import DataError
  from vmx.finetune import squad
  data = _squad("en", 3, 0)
  qa = data["data"][0]["paragraphs"][1]["qas"][0]
  qa["answers"][0]["answer_start"] += 2
  (tmp_path / "t.json").write_text(json.dumps(data))
  with pytest.raises(DataError, match=rf"t\.json: question en-0-1: answer_start "
                                      rf"{qa['answers'][0]['answer_start']} gives '.*', not its "
                                      rf"answer '{qa['answers'][0]['text']}'"):
    squad.read_squad(tmp_path / "t.json", train=True)
  assert len(squad.read_squad(tmp_path / "t.json", train=False)) == 3   # texts only
  (tmp_path / "bad.json").write_text('{"data": [{"paragraphs": [{"qas": []}]}]}')
  with pytest.raises(DataError, match=r"bad\.json: not a SQuAD-format JSON file"):
    squad.read_squad(tmp_path / "bad.json", train=False)


def test_long_passages_are_windowed_and_the_answer_is_where_its_tokens_are(qa_data):
  """Every passage token is in a window (none dropped), windows start doc_stride apart, a
  window holding the answer points at tokens whose characters are the answer, the others
  at position 0; read back through `best_answers`, the targets give the gold answers."""
  from vmx.data.vocab import load_tokenizer
  from vmx.finetune import qa, squad
  root, ckpt, sq, _ = qa_data
  tok = load_tokenizer(str(ckpt / "vocab.model"))
  examples = squad.read_squad(sq / "train-v1.1.json", train=True, limit=40)
  settings = qa.QaSettings(doc_stride=24, max_query_length=16)
  win = qa.windows(tok, examples, 64, settings)
  assert win.tokens.shape[1] == 64 and len(win.tokens) > len(examples)
  for e, ex in enumerate(examples):
    rows = np.flatnonzero(win.example == e)
    ids, spans = tok.encode_spans(ex.context)
    covered, starts = np.zeros(len(ids), bool), []
    for r in rows:
      ctx = np.flatnonzero(win.spans[r, :, 0] >= 0)
      at = spans.index(tuple(win.spans[r, ctx[0]]))
      assert win.tokens[r, ctx].tolist() == ids[at:at + len(ctx)]
      covered[at:at + len(ctx)] = True
      starts.append(at)
      if win.start[r]:
        a, b = win.spans[r, win.start[r], 0], win.spans[r, win.end[r], 1]
        assert ex.context[a:b].strip() == ex.answers[0]
    assert covered.all()                                      # nothing dropped
    assert sum(win.start[rows] > 0) >= 1                      # the answer is in a window
    assert np.diff(starts).tolist() == [24] * (len(rows) - 1)
  bare = qa.windows(tok, examples, 64, settings, with_spans=False)   # training rows
  assert bare.spans.shape == (len(win.tokens), 0, 2)
  for a, b in ((bare.tokens, win.tokens), (bare.start, win.start), (bare.end, win.end)):
    np.testing.assert_array_equal(a, b)
  one_hot = lambda pos: np.where(np.arange(64)[None] == pos[:, None], 10.0, 0.0)  # noqa: E731
  got = qa.best_answers(one_hot(win.start), one_hot(win.end), win, examples, settings)
  assert got == {ex.qid: ex.answers[0] for ex in examples}


@pytest.mark.parametrize("kind", ["tokenizers", "fairseq_spm"])
def test_spans_and_pair_layout_equal_hugging_face(kind, tmp_path):
  """`encode_spans` gives Hugging Face's ids and (fast tokenizer) character offsets, and
  `pair_template` its question-passage layout, on multilingual sentences."""
  import shutil
  import transformers
  from test_hf_import_export import _minilm_dir, _spm, tatoeba_sentences
  from vmx.data.vocab import TOKENIZER_SPEC, HfTokenizer
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  if kind == "tokenizers":
    src = _minilm_dir(tmp_path)
    shutil.copy(src / "tokenizer.json", hf_dir)
    spec, ref = {"kind": kind, "file": "tokenizer.json", "pad_id": 0}, \
        transformers.AutoTokenizer.from_pretrained(src)
  else:
    shutil.copy(_spm(tmp_path, "xlmr"), hf_dir / "sentencepiece.bpe.model")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer"}))
    ref = transformers.AutoTokenizer.from_pretrained(hf_dir, use_fast=False)
    spec = {"kind": kind, "file": "sentencepiece.bpe.model", "pad_id": 1}
  (hf_dir / TOKENIZER_SPEC).write_text(json.dumps(dict(spec, closing_special=True)))
  tok = HfTokenizer(str(hf_dir / TOKENIZER_SPEC))
  opening, middle, closing = tok.pair_template()
  for q, c in zip(tatoeba_sentences(n=40)[::2], tatoeba_sentences(n=40)[1::2]):
    ids, spans = tok.encode_spans(c)
    assert tok.to_vmx_ids(ref(c, add_special_tokens=False)["input_ids"]).tolist() == ids
    if kind == "tokenizers":
      want = ref(c, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
      assert [tuple(o) for o in want] == spans
    else:   # each piece is its characters, NFKC-normalized, without the word-boundary mark
      pieces = ref.convert_ids_to_tokens(ref(c, add_special_tokens=False)["input_ids"])
      norm = [unicodedata.normalize("NFKC", c[a:b]).strip() for a, b in spans]
      assert norm == [p.lstrip("\u2581") if p != "<unk>" else n for p, n in zip(pieces, norm)]
    qids = tok.encode_spans(q)[0]
    assert tok.to_vmx_ids(ref(q, c)["input_ids"]).tolist() == (opening + qids + middle + ids
                                                              + closing)


def test_a_pretokenizing_vocabulary_spans_whole_words(tmp_path):
  """A vmx vocabulary with a language pre-tokenizer (Moses) rewrites the text, so its ids
  span the whitespace-separated word they come from, each word tokenized as `encode`
  tokenizes it alone."""
  from test_normalize import DEU as text, _files
  from vmx.data import vocab
  spec = vocab.vocabulary_path(str(tmp_path / "voc"), _files(tmp_path), 64, ["deu", "cmn"],
                               pretokenize="moses")
  tok = vocab.load_tokenizer(spec)
  ids, spans = tok.encode_spans(text[0], "deu")
  words = text[0].split()
  want = [[int(i) for i in row if i] for row in tok.encode(words, 16, lang="deu")]
  assert ids == [i for row in want for i in row]
  starts = [text[0].index(w) for w in words]
  assert spans == [(a, a + len(w)) for a, w, row in zip(starts, words, want) for _ in row]


def _finetune_whole(qa_data, name):
  """finetune/mlqa.gin on the small set, in this process, into qa_data's root / name."""
  import gin
  from vmx import experiment, finetune
  root = qa_data[0]
  gin.clear_config()
  experiment.parse_gin(["finetune/mlqa.gin"], _data_bindings(qa_data) + BINDINGS + [
      f"MODEL_DIR = '{root / name}'", "finetune.progress = False",
      "finetune.prefetch_batches = 0"], "")
  try:
    return finetune.finetune()
  finally:
    gin.clear_config()


def _data_bindings(qa_data):
  _, ckpt, sq, mlqa = qa_data
  return [f"INITIAL_CHECKPOINT_PATH = '{ckpt}'", f"MLQA_DIR = '{mlqa}'", f"SQUAD_DIR = '{sq}'"]


def test_a_tiny_model_learns_squad(qa_data):
  """InfoXLM's Table 4 protocol on the small set: trained on English, the step of the best
  joint dev F1 kept (EVAL_PERIOD > 0; the paper's files score the last), scored zero-shot
  with MLQA's metric per language; English exact match far above chance (a random span of
  a passage: under 1%)."""
  root = qa_data[0]
  whole = _finetune_whole(qa_data, "learns")
  rows = {r["hf_subset"]: r for r in whole["scores"]["test"]}
  assert rows["en"]["exact_match"] >= 80 and rows["en"]["f1"] >= 80, rows
  assert rows["en"]["windows"] > rows["en"]["n"] == 100 and not rows["en"]["zero_shot"]
  assert whole["n_train_questions"] == 600 and whole["n_train"] > 600
  assert whole["warmup_steps"] == 20
  metrics = [json.loads(l) for l in (root / "learns" / "metrics.jsonl").read_text().splitlines()]
  dev = {m["step"]: m["dev/f1"] for m in metrics if "dev/f1" in m}   # the joint dev F1
  assert sorted(dev) == [0, 100, 200] and whole["selected"].startswith("best/")
  assert whole["step"] == max(dev, key=lambda s: (dev[s], s))


@pytest.mark.slow   # two launcher runs (50 s); fine-tuning's resume: tests/test_finetune.py
def test_the_qa_launcher_stopped_and_rerun_ends_bitwise_with_the_protocol_figures(qa_data):
  """launch/finetune.py stopped at step 100 (as a preempted run saves) and rerun ends with
  the in-process run's parameters bit for bit and its scores; the protocol lists Table 4
  and Table 5 as computed."""
  from vmx.modeldir import checkpoints
  from vmx.modeldir.layout import read_model_info
  from vmx.models.base import model_from_config
  root = qa_data[0]
  whole = _finetune_whole(qa_data, "whole")
  rows = {r["hf_subset"]: r for r in whole["scores"]["test"]}
  cmd = [sys.executable, "launch/finetune.py", "--gin_file=finetune/mlqa.gin",
         *[f"--gin.{b.replace(' = ', '=')}" for b in _data_bindings(qa_data) + BINDINGS],
         f"--gin.MODEL_DIR={root / 'parts'}"]
  first = subprocess.run(cmd + ["--stop_at_step=100"], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  second = subprocess.run(cmd + ["--protocol=infoxlm"], capture_output=True, text=True,
                          cwd=REPO, timeout=600)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "mean f1" in second.stdout and "Table 4, mlqa en exact_match" in second.stdout
  written = json.loads((root / "parts" / "finetune_mlqa.json").read_text())
  assert written["scores"]["test"] == whole["scores"]["test"]
  model = model_from_config(read_model_info(root / "whole")["model"])
  a, sa = checkpoints.restore_params(root / "whole", model, None, 64)
  b, sb = checkpoints.restore_params(root / "parts", model, None, 64)
  assert sa == sb == 200
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  report = json.loads((root / "parts" / "protocol_infoxlm_finetuned.json").read_text())
  figs = {(f["table"], f["column"]): f["value"] for f in report["figures"]}
  assert figs[("Table 4", "mlqa de f1")] == rows["de"]["f1"]
  assert figs[("Tables 4, 7, 10", "mlqa Avg. exact_match")] == pytest.approx(
      (rows["en"]["exact_match"] + rows["de"]["exact_match"]) / 2)
  assert figs[("Table 5", "mlqa transfer gap f1 (en minus the mean of the other languages; "
                          "lower is better)")] == pytest.approx(rows["en"]["f1"] - rows["de"]["f1"])
  assert [m["benchmark"] for m in report["missing"]] == ["xnli (fine-tuned)"]


def test_missing_squad_dir_is_one_line_naming_the_flag_and_the_layout(qa_data):
  root, ckpt, _, mlqa = qa_data
  proc = subprocess.run([sys.executable, "launch/finetune.py", "--gin_file=finetune/mlqa.gin",
                         f"--gin.INITIAL_CHECKPOINT_PATH={ckpt}", f"--gin.MLQA_DIR={mlqa}",
                         "--gin.MAX_LENGTH=64", f"--gin.MODEL_DIR={root / 'none'}"],
                        capture_output=True, text=True, cwd=REPO, timeout=600)
  err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
  assert "SQUAD_DIR is not set: --gin.MLQA_DIR=DIR: DIR/dev/dev-context-<lang>-question-" in err[0]
  assert "DIR/train-v1.1.json (SQuAD v1.1)" in err[0]


@pytest.mark.parametrize("size", ["base", "large"])
def test_the_infoxlm_mlqa_files_bind_app_d(size):
  """Table 12 / 13's MLQA column: batch 32, lr 3e-5 (the grid's middle), 10% warm-up,
  weight decay 0, 3 epochs, the final model; BERT's windows."""
  import gin
  from vmx import experiment, finetune  # noqa: F401  (registers finetune, QaSettings)
  gin.clear_config()
  try:
    experiment.parse_gin([f"finetune/mlqa_infoxlm_{size}.gin"], [
        "INITIAL_CHECKPOINT_PATH = '/x'", "MODEL_DIR = '/y'"], "")
    q = gin.query_parameter
    assert q("%BENCHMARK") == "mlqa" and q("%BATCH_SIZE") == 32
    assert (q("%LEARNING_RATE"), q("%WARMUP_FRACTION"), q("%EPOCHS")) == (3e-5, 0.1, 3)
    assert (q("%WEIGHT_DECAY"), q("%EVAL_PERIOD"), q("%MAX_LENGTH")) == (0.0, 0, 384)
    assert (q("%DOC_STRIDE"), q("%MAX_QUERY_LENGTH"), q("%MAX_ANSWER_LENGTH")) == (128, 64, 30)
  finally:
    gin.clear_config()
