"""SeqIO tasks over real files, validation errors, downloads from a local HTTP server."""
import functools
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA_DIR, needs_data, write_lines
from vmx.data import download, readers, vocab
from vmx.errors import DataError


# --- validation errors name the file and the line --------------------------------------

def test_moses_files_with_different_line_counts(tmp_path):
  src = write_lines(tmp_path / "a.de", ["eins", "zwei", "drei"])
  tgt = write_lines(tmp_path / "a.en", ["one", "two"], gz=False)
  with pytest.raises(DataError, match=r"a\.en has 2 lines but .*a\.de has more \(line 3"):
    readers.validate_parallel(src, tgt)


def test_empty_line_is_an_error_naming_file_and_line(tmp_path):
  src = write_lines(tmp_path / "b.de.gz", ["eins", "", "drei"], gz=True)
  tgt = write_lines(tmp_path / "b.en.gz", ["one", "two", "three"], gz=True)
  with pytest.raises(DataError, match=r"b\.de\.gz:2: empty line"):
    readers.validate_parallel(src, tgt)
  assert readers.validate_parallel(src, tgt, empty_lines="skip") == 2


def test_invalid_utf8_names_file_and_line(tmp_path):
  src = tmp_path / "c.de"
  src.write_bytes(b"gut\nschl\xfcssel\n")
  tgt = write_lines(tmp_path / "c.en", ["good", "key"])
  with pytest.raises(DataError, match=r"c\.de:2: invalid UTF-8"):
    readers.validate_parallel(src, tgt)


def test_tsv_missing_column(tmp_path):
  p = write_lines(tmp_path / "d.tsv", ["a\tb", "only-one"])
  with pytest.raises(DataError, match=r"d\.tsv:2: 1 tab-separated field"):
    readers.validate_tsv(p)


def test_missing_data_dir_is_a_clear_error(tmp_path):
  with pytest.raises(DataError, match="is not a directory"):
    download.resolve("eval/tatoeba/v1/tatoeba.deu-eng.deu", str(tmp_path / "nope"))


def test_missing_file_in_data_dir(tmp_path):
  with pytest.raises(DataError, match=r"no such file in data dir"):
    download.resolve("eval/tatoeba/v1/tatoeba.deu-eng.deu", str(tmp_path))


# --- downloads: local HTTP server, sha256 check, nothing half-written -----------------

@pytest.fixture
def http_mirror(tmp_path):
  root = tmp_path / "mirror"
  handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
  handler.log_message = lambda *a: None
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  yield root, f"http://127.0.0.1:{srv.server_address[1]}"
  srv.shutdown()


def test_download_verifies_sha256(tmp_path, http_mirror, monkeypatch):
  root, url = http_mirror
  rel = "eval/tatoeba/v1/tatoeba.afr-eng.afr"
  size, sha, upstream = download.registry()[rel]
  assert upstream.startswith("https://") and upstream.endswith("tatoeba.afr-eng.afr")
  monkeypatch.delenv("VMX_DATA_DIR", raising=False)
  monkeypatch.setenv("VMX_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setenv("VMX_DATA_URL", url)
  # 1. the mirror serves wrong bytes: error names the file and the checksum; no file left.
  write_lines(root / rel, ["not the real file"])
  with pytest.raises(DataError, match=r"tatoeba\.afr-eng\.afr: download failed.*sha256"):
    download.resolve(rel)
  assert not (tmp_path / "cache" / rel).exists()
  assert not list((tmp_path / "cache").rglob("*.part"))
  # 2. the mirror serves the real bytes (the registry's checksum decides).
  if DATA_DIR:
    (root / rel).write_bytes(Path(DATA_DIR, rel).read_bytes())
    got = download.resolve(rel)
    assert hashlib.sha256(got.read_bytes()).hexdigest() == sha and got.stat().st_size == size
    # 3. cached: served even when the mirror is gone.
    (root / rel).unlink()
    assert download.resolve(rel) == got


def test_built_files_need_a_mirror(tmp_path, monkeypatch):
  monkeypatch.delenv("VMX_DATA_DIR", raising=False)
  monkeypatch.delenv("VMX_DATA_URL", raising=False)
  monkeypatch.setenv("VMX_CACHE_DIR", str(tmp_path / "cache"))
  with pytest.raises(DataError, match="VMX_DATA_URL"):
    download.resolve("train/tatoeba-challenge/deu-eng/train.deu.gz")


# --- SeqIO task on real files yields the expected token ids ---------------------------

@needs_data
def test_seqio_task_over_real_files_yields_expected_ids(tmp_path):
  import tasks
  from vmx.data import feature_converters, pipeline, seqio_reader
  src = Path(DATA_DIR, "train/tatoeba-challenge/nld-eng/train.nld.gz")
  eng = Path(DATA_DIR, "train/tatoeba-challenge/nld-eng/train.eng.gz")
  vp = vocab.train_sentencepiece([str(src), str(eng)], str(tmp_path / "v.model"), 1000,
                                 ["nld", "eng"])
  name = tasks.moses_task("test_nld_eng", str(src), str(eng), "nld", "eng", vp,
                          ["eng", "nld"])
  cfg = pipeline.DatasetConfig(name, {"inputs": 16, "targets": 16}, batch_size=4,
                               shuffle=False)
  ds = seqio_reader.get_dataset(cfg, feature_converters.PairFeatureConverter(pack=False),
                            num_epochs=1)
  batch = next(ds.as_numpy_iterator())
  first = [l for _, l in zip(range(4), readers.read_parallel(src, eng))]
  tok = vocab.Tokenizer(vp)
  np.testing.assert_array_equal(batch["left_tokens"], tok.encode([s for s, _ in first], 16))
  np.testing.assert_array_equal(batch["right_tokens"], tok.encode([t for _, t in first], 16))
  assert batch["left_lang"].tolist() == [1] * 4 and batch["right_lang"].tolist() == [0] * 4
  assert tok.piece_id("<2nld>") > 2  # language tags are single pieces


@needs_data
def test_mixture_is_deterministic_and_resumable(tmp_path):
  import tasks
  from vmx.data import feature_converters, pipeline, seqio_reader
  langs = ["deu", "fra"]
  files = tasks.corpus_text_files("tatoeba-challenge", langs)
  vp = vocab.train_sentencepiece(files, str(tmp_path / "v.model"), 1000, langs + ["eng"])
  name = tasks.parallel_mixture(corpus="tatoeba-challenge", languages=langs, vocabulary=vp,
                                model_languages=langs + ["eng"], alpha=0.5)
  fc = feature_converters.PairFeatureConverter
  for reader in pipeline.READERS:
    cfg = pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8, seed=3,
                                 reader=reader)
    a = [next(it) for it in [pipeline.train_iterator(cfg, fc, 0)] for _ in range(5)]
    it = pipeline.train_iterator(cfg, fc, 0)
    it.restore(it.state_at(3))
    for i in (3, 4):
      np.testing.assert_array_equal(next(it)["left_tokens"], a[i]["left_tokens"])
    assert it.state() == it.state_at(5) and it.position == 5
    langs_seen = set(np.concatenate([b["left_lang"] for b in a]).tolist())
    assert langs_seen == {0, 1}, reader


def test_temperature_rates():
  from vmx.data.registration import temperature_rates
  np.testing.assert_allclose(temperature_rates([100, 400], 1.0), [0.2, 0.8])
  np.testing.assert_allclose(temperature_rates([100, 400], 0.0), [0.5, 0.5])
  np.testing.assert_allclose(temperature_rates([100, 400], 0.5), [1 / 3, 2 / 3])


def test_a_source_its_hold_out_empties_is_an_error_naming_file_and_filter(tmp_path):
  """A language whose every pair a hold-out removes would drop out of its mixture unseen
  (a task of rate 0): one DataError naming the files, the filter and the switch; with the
  switch ('warn') one warning and an empty task; a partial removal is no error."""
  import warnings
  from vmx.data import devsets, sources

  class HeldOut(devsets.HeldOut):
    def __init__(self, sentences, name="tatoeba"):   # (its name keys the cached counts)
      self.names, self.data_dir, self._sentences = [name], None, set(sentences)

  src = write_lines(tmp_path / "train.fra", ["bonjour", "merci"])
  tgt = write_lines(tmp_path / "train.eng", ["hello", "thanks"])
  every = HeldOut({"bonjour", "thanks"})
  with pytest.raises(DataError, match=r"train\.fra .*the hold-out of tatoeba removed every "
                     r"one of its 2 examples.*tasks\.parallel_mixture\.emptied='warn'"):
    sources.moses_source(src, tgt, holdout=every, validation_percent=0,
                         switch="tasks.parallel_mixture.emptied").counts()
  with pytest.warns(UserWarning, match="removed every one of its 2 examples"):
    counts = sources.moses_source(src, tgt, holdout=every, validation_percent=0,
                                  emptied="warn").counts()
  assert counts == {"train": 0}
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert sources.moses_source(src, tgt, holdout=HeldOut({"merci"}, "newstest2013"),
                                validation_percent=0).counts() == {"train": 1}
  with pytest.raises(DataError, match=r"emptied='skip'; expected one of \('error', 'warn'\)"):
    sources.moses_source(src, tgt, emptied="skip")


def test_an_nway_source_its_hold_out_empties_names_the_hold_out():
  """N-way groups (MPCL): every group removed by the hold-out is an error that says so."""
  from vmx.data import devsets
  from vmx.data.nway import NwaySource

  class HeldOut(devsets.HeldOut):
    def __init__(self, sentences):
      self.names, self.data_dir, self._sentences = ["newstest2013"], None, set(sentences)

  rows = [["guten tag", "good day", "bonjour"], ["danke", "thanks", "merci"]]
  assert NwaySource(["de", "en", "fr"], rows, 2, 0, HeldOut({"merci"})).num_input_examples(
      "train") == 1
  with pytest.raises(DataError, match=r"no N-way group has 2 languages \(of \['de', 'en', "
                     r"'fr'\]\) after the hold-out of newstest2013 removed 2 of its 2 groups"):
    NwaySource(["de", "en", "fr"], rows, 2, 0, HeldOut({"good day", "danke"}))
