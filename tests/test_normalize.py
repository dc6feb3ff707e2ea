"""EMS §4.2 text normalization (vmx/data/normalize.py): Moses / jieba / Juman++ by language,
lowercasing in the SentencePiece model, recorded with the vocabulary so that the tasks,
the caches and the Encoder see the same text."""
import os
import shutil
import stat
import sys

import numpy as np
import pytest

from conftest import toy_train, write_lines
from vmx.data import normalize, vocab
from vmx.errors import CheckpointError, ConfigError

pytest.importorskip("sacremoses")
pytest.importorskip("jieba")

DEU = ["Der Hund, der die Katze jagt!", "Die Katze schläft.", "Ein Hund und eine Katze.",
       "Herr Müller's Hund (alt) bellt: laut!"]
CMN = ["我爱北京天安门。", "猫在睡觉。", "狗和猫。", "我们喜欢北京的猫。"]
JPN = ["日本語の文です。", "猫が寝ている。"]


def test_pretokenizer_segments_by_language():
  p = normalize.Pretokenizer()
  assert p(["Hello, World! It's Mr. Smith's dog."], "eng") == [
      "Hello , World ! It 's Mr. Smith 's dog ."]
  assert p(["C'est l'homme."], "fra") == ["C' est l' homme ."]        # Moses's French rule
  assert p(["C'est l'homme."], None) == ["C ' est l ' homme ."]       # no language: generic
  assert p(["我爱北京天安门。"], "cmn_Hans") == ["我 爱 北京 天安门 。"]   # jieba
  assert p(["我爱北京天安门。"], "zh") == p(["我爱北京天安门。"], "cmn")
  assert p(["Tom & Jerry <3"], "eng") == ["Tom & Jerry < 3"]          # no XML escapes
  # one language per text, in order
  assert p(["a,b", "猫在睡觉。"], ["deu", "cmn"]) == ["a , b", "猫 在 睡觉 。"]
  none = normalize.Pretokenizer(japanese="none")
  assert none(JPN, "jpn") == JPN                                      # left to SentencePiece
  assert normalize.segmenter("cmn_Hant") == "jieba"
  assert normalize.segmenter("yue") == "jieba"
  assert normalize.segmenter("jpn") == "jumanpp"
  assert normalize.segmenter("deu") == "moses:de"
  assert normalize.segmenter("xal") == "moses:xal"
  assert normalize.segmenter(None) == "moses:und"
  assert normalize.file_language("/d/deu-eng/train.deu.gz") == "deu"
  assert normalize.file_language("corpus.cmn_Hans.txt") == "cmn_Hans"
  assert normalize.file_language("bible-verses.3f2a9c1d0e4b.txt") is None


FAKE_JUMANPP = r'''#!{python}
import sys
for line in sys.stdin:
    line = line.rstrip("\n")
    for ch in line:        # one morpheme per character, Juman format, then EOS
        print(f"{{ch}} {{ch}} {{ch}} 名詞 6 普通名詞 1 * 0 * 0 NIL")
        if ch == "の":
            print(f"@ {{ch}} {{ch}} {{ch}} 助詞 9 格助詞 1 * 0 * 0 NIL")
    print("EOS", flush=True)
'''


@pytest.fixture
def fake_jumanpp(tmp_path, monkeypatch):
  """A `jumanpp` on PATH that answers in Juman++'s format (the real one is a C++ program
  that CI does not have): one morpheme per character."""
  d = tmp_path / "bin"
  d.mkdir()
  exe = d / "jumanpp"
  exe.write_text(FAKE_JUMANPP.format(python=sys.executable))
  exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
  monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
  return exe


def test_jumanpp_is_fed_line_by_line(fake_jumanpp):
  p = normalize.Pretokenizer()
  p.check(["jpn"])
  assert p(["日本の猫", "# 猫", "", "猫  が"], "jpn") == ["日 本 の 猫", "# 猫", "", "猫 が"]
  assert p(["猫"] * 3 + ["a,b"], ["jpn"] * 3 + ["eng"]) == ["猫"] * 3 + ["a , b"]


def test_missing_jumanpp_is_a_config_error_naming_the_switch(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(ConfigError, match=r"vocabulary_path\.japanese = 'jumanpp'.*jumanpp.*"
                                        r"vocabulary_path\.japanese = 'none'"):
    normalize.Pretokenizer().check(["deu", "jpn"])
  normalize.Pretokenizer().check(["deu", "cmn"])                    # no Japanese: fine
  normalize.Pretokenizer(japanese="none").check(["jpn"])
  d = tmp_path / "files"
  files = [write_lines(d / "train.deu", DEU * 10), write_lines(d / "train.jpn", JPN * 10)]
  with pytest.raises(ConfigError, match="Juman"):
    vocab.vocabulary_path(str(tmp_path / "v"), files, 40, ["deu", "jpn"],
                          pretokenize="moses")
  assert not (tmp_path / "v").exists()                               # refused before building


def _files(d):
  return [write_lines(d / "train.deu", DEU * 20), write_lines(d / "train.cmn", CMN * 20)]


def test_lowercasing_is_in_the_model(tmp_path):
  files = _files(tmp_path)
  low = vocab.load_tokenizer(vocab.train_sentencepiece(files, str(tmp_path / "l.model"), 64,
                                                       lowercase=True))
  cased = vocab.load_tokenizer(vocab.train_sentencepiece(files, str(tmp_path / "c.model"), 64))
  assert low.lowercases and not cased.lowercases
  np.testing.assert_array_equal(low.encode(["DER HUND"], 8), low.encode(["der hund"], 8))
  assert not np.array_equal(cased.encode(["DER HUND"], 8), cased.encode(["der hund"], 8))


def test_training_and_inference_give_the_same_ids(tmp_path):
  """The tokens of the SeqIO task (what training and the index reader's cache read) are
  the Tokenizer's for the same text and language, and a trained MODEL_DIR carries the
  normalization to Encoder.from_checkpoint."""
  import seqio

  import tasks
  from vmx.inference import Encoder
  src, tgt = _files(tmp_path)
  spec = vocab.vocabulary_path(str(tmp_path / "voc"), [src, tgt], 64, ["deu", "cmn"],
                               lowercase=True, pretokenize="moses")
  assert spec.endswith(vocab.TOKENIZER_SPEC)
  assert vocab.vocabulary_path(str(tmp_path / "voc"), lowercase=True,
                               pretokenize="moses") == spec          # opened again as is
  tok = vocab.load_tokenizer(spec)
  assert tok.lowercases and tok.pretokenizer == normalize.Pretokenizer("moses", "jumanpp")
  name = tasks.moses_task("norm_deu_cmn", src, tgt, "deu", "cmn", spec, ["deu", "cmn"],
                          validation_percent=0)
  ds = seqio.get_mixture_or_task(name).get_dataset({"inputs": 32, "targets": 32},
                                                   split="train", shuffle=False)
  rows = list(ds.take(len(DEU)).as_numpy_iterator())
  for ex, de, zh in zip(rows, DEU, CMN):
    assert ex["inputs_pretokenized"].decode() == de                   # raw text kept
    np.testing.assert_array_equal(ex["inputs"], tok.encode([de], 32, lang="deu")[0][
        :len(ex["inputs"])])
    np.testing.assert_array_equal(ex["targets"], tok.encode([zh], 32, lang="cmn")[0][
        :len(ex["targets"])])
  # Pre-tokenization and lowercasing did happen: Moses split "Hund," and jieba "北京".
  pieces = tok.sp.encode(tok.pretokenize([DEU[0]], "deu"), out_type=str)[0]
  assert "," in "".join(pieces).replace("\u2581", " ").split()
  assert tok.pretokenize([CMN[0]], "cmn") == ["我 爱 北京 天安门 。"]
  # A 2-step run: MODEL_DIR holds the spec and its model; the Encoder applies both.
  model_dir = tmp_path / "run"
  toy_train(model_dir, name, spec, total_steps=2, period=2)
  assert (model_dir / vocab.TOKENIZER_SPEC).is_file() and (model_dir / "vocab.model").is_file()
  enc = Encoder.from_checkpoint(model_dir)
  assert enc.tokenizer.pretokenizer == tok.pretokenizer and enc.tokenizer.lowercases
  np.testing.assert_array_equal(enc.tokenizer.encode(DEU + CMN, 8, lang=["deu"] * 4 + ["cmn"] * 4),
                                tok.encode(DEU + CMN, 8, lang=["deu"] * 4 + ["cmn"] * 4))
  a = enc.encode(["Hund.", "HUND ."], lang="deu")
  np.testing.assert_allclose(a[0], a[1], atol=1e-6)                   # lowercased, split "."
  with pytest.warns(UserWarning, match="no lang= was given"):
    enc.encode(["Hund."])


def _copy_model(model, d, pretokenizer=None):
  d.mkdir(parents=True)
  shutil.copy(model, d / "vocab.model")
  if pretokenizer is None:
    return str(d / "vocab.model")
  return vocab.write_sentencepiece_spec(str(d / "vocab.model"), pretokenizer)


def test_cache_fingerprint_follows_the_normalization(tmp_path):
  """The same SentencePiece model with no / Moses+Juman++ / Moses-without-Juman++
  pre-tokenization: three vocabulary fingerprints, three index-reader caches."""
  import seqio

  import tasks
  from vmx.data import seqio_vocab
  from vmx.data.token_cache import fingerprint as fp
  from vmx.data.feature_converters import PairFeatureConverter
  src, tgt = _files(tmp_path)
  model = vocab.train_sentencepiece([src, tgt], str(tmp_path / "m.model"), 64)
  paths = [_copy_model(model, tmp_path / "plain"),
           _copy_model(model, tmp_path / "juman", normalize.Pretokenizer("moses", "jumanpp")),
           _copy_model(model, tmp_path / "none", normalize.Pretokenizer("moses", "none"))]
  vocab_fps, digests = set(), set()
  for p in paths:
    name = tasks.moses_task("norm_fp_deu_cmn", src, tgt, "deu", "cmn", p, ["deu", "cmn"])
    task = seqio.get_mixture_or_task(name)
    vocab_fps.add(seqio_vocab.fingerprint(task.output_features["inputs"].vocabulary))
    parts = fp.parts(task, "train", {"inputs": 8, "targets": 8}, PairFeatureConverter())
    digests.add(fp.digest(parts))
  assert len(vocab_fps) == 3 and len(digests) == 3


def test_bad_settings_are_clear_errors(tmp_path):
  files = _files(tmp_path)
  with pytest.raises(ConfigError, match=r"vocabulary_path\.pretokenize = 'spacy'"):
    vocab.vocabulary_path(None, files, 64, pretokenize="spacy")
  with pytest.raises(ConfigError, match=r"vocabulary_path\.japanese = 'mecab'"):
    vocab.vocabulary_path(None, files, 64, pretokenize="moses", japanese="mecab")
  with pytest.raises(ConfigError, match=r"vocabulary_path\.lowercase = 'yes'"):
    vocab.vocabulary_path(None, files, 64, lowercase="yes")
  with pytest.raises(ConfigError, match="is built as a local directory"):
    vocab.vocabulary_path(str(tmp_path / "x.model"), files, 64, pretokenize="moses")
  cased = vocab.train_sentencepiece(files, str(tmp_path / "c.model"), 64)
  with pytest.raises(ConfigError, match=r"lowercase = True, but the vocabulary .* does not"):
    vocab.vocabulary_path(cased, lowercase=True)
  with pytest.raises(ConfigError, match="records no pre-tokenization"):
    vocab.vocabulary_path(cased, pretokenize="moses")
  spec = _copy_model(cased, tmp_path / "s", normalize.Pretokenizer("moses", "none"))
  with pytest.raises(ConfigError, match="records .*'japanese': 'none'"):
    vocab.vocabulary_path(spec, pretokenize="moses")                 # asks for Juman++
  assert vocab.vocabulary_path(spec) == spec                          # its own: fine
  # A task side without a language cannot be pre-tokenized; nor can N-way views.
  from vmx.data import registration, sources
  with pytest.raises(ConfigError, match=r"feature\(s\) \['inputs'\] name no language"):
    registration.register_text_task("norm_mono", sources.text_source([files[0]]), spec)
  with pytest.raises(ConfigError, match=r"\['views'\] name no language"):
    registration.register_nway_task("norm_nway", ["deu", "cmn"], [[DEU[0], CMN[0]]] * 4, spec, 2)
  # The spec and its model travel together.
  (tmp_path / "s" / "vocab.model").write_bytes(open(cased, "rb").read()[:-1] + b"x")
  with pytest.raises(CheckpointError, match="sha256 differs"):
    vocab.load_tokenizer(spec)


def test_a_missing_package_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "sacremoses", None)      # import sacremoses -> ImportError
  with pytest.raises(ConfigError, match=r"sacremoses, which is not installed: pip install "
                                        r"'vmx\[ems\]'"):
    normalize.Pretokenizer().check(["deu"])
  normalize.Pretokenizer().check(["cmn"])                   # jieba only
