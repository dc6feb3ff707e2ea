"""Bitext mining as a job (vmx/bitext.py, launch/mine.py): the pairs and scores of a job
run in shards equal a brute-force NumPy reference from the same encoder's vectors, for
every margin and retrieval; a job killed in any stage continues and writes the same
bytes; a rerun re-scores without encoding; bad input is one error naming the file."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, save_model_dir, write_lines

WORDS = ("sun moon star tree river stone house road cloud rain wind fire snow bird fish "
         "dog cat horse apple bread water light night day green red blue old new big").split()


def _sentences(seed: int, n: int) -> list:
  r = np.random.default_rng(seed)
  return [" ".join(r.choice(WORDS, r.integers(3, 9))) + f" {i}" for i in range(n)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  """A 1-layer dual encoder (initialized, not trained) as a vmx model directory."""
  from vmx import encoders
  from vmx.data import vocab
  from vmx.models import DualEncoder, DualEncoderModel
  root = tmp_path_factory.mktemp("mine")
  text = write_lines(root / "text.txt", _sentences(0, 400))
  vp = vocab.train_sentencepiece([str(text)], str(root / "v.model"), 80)
  enc = encoders.TransformerEncoder(vocab_size=80, num_layers=1, emb_dim=32, num_heads=2,
                                    mlp_dim=64, max_length=32)
  model = DualEncoderModel(DualEncoder(enc))
  return save_model_dir(root / "ckpt", model, ["eng", "deu"], 32, vp)


@pytest.fixture(scope="module")
def encoder(ckpt):
  from vmx.inference import Encoder
  return Encoder.from_checkpoint(str(ckpt))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  """57 source and 43 target sentences, with empty and blank lines among them; 30 of the
  targets are copies of sources with a word changed (something to mine)."""
  root = tmp_path_factory.mktemp("corpora")
  src = _sentences(1, 57)
  tgt = [s.replace(" ", " the ", 1) for s in src[:30]] + _sentences(2, 13)
  np.random.default_rng(3).shuffle(tgt)
  src_lines = src[:10] + [""] + src[10:40] + ["   "] + src[40:]
  return (write_lines(root / "src.txt", src_lines), write_lines(root / "tgt.txt", tgt + [""]),
          src, tgt)


def _reference(encoder, src, tgt, k, margin, retrieval):
  """Every pair's score from the whole similarity matrix in NumPy."""
  from vmx.evaluation import knn, mining
  x, y = encoder.encode(src), encoder.encode(tgt)
  s = x.astype(np.float64) @ y.astype(np.float64).T
  x_mean = np.sort(s, axis=1)[:, ::-1][:, :k].mean(1)
  y_mean = np.sort(s.T, axis=1)[:, ::-1][:, :k].mean(1)
  nn = knn.dense_topk(x, y, k)
  sc = mining.score_candidates(nn, {"cosine": "absolute"}.get(margin, margin))
  a, b, score = mining.best_pairs(sc, retrieval)
  den = (x_mean[a] + y_mean[b]) / 2
  exact = {"ratio": s[a, b] / den, "distance": s[a, b] - den, "cosine": s[a, b]}[margin]
  np.testing.assert_allclose(score, exact, rtol=1e-5, atol=1e-6)   # the margin itself
  return [(src[i], tgt[j]) for i, j in zip(a, b)], exact


def _read(path):
  rows = [l.split("\t") for l in Path(path).read_text(encoding="utf-8").splitlines()]
  return [(r[1], r[2]) for r in rows], np.array([float(r[0]) for r in rows])


@pytest.mark.parametrize("margin,retrieval", [("ratio", "max"), ("ratio", "forward"),
                                              ("distance", "intersect"),
                                              ("cosine", "backward")])
def test_job_in_shards_equals_numpy_reference(encoder, ckpt, corpora, tmp_path, margin,
                                              retrieval):
  from vmx import bitext
  src_file, tgt_file, src, tgt = corpora
  s = bitext.mine(encoder, str(ckpt), str(src_file), str(tgt_file), str(tmp_path / "out.tsv"),
                  str(tmp_path / "work"),
                  bitext.Settings(k=4, margin=margin, retrieval=retrieval, shard_size=10))
  pairs, scores = _read(tmp_path / "out.tsv")
  ref_pairs, ref_scores = _reference(encoder, src, tgt, 4, margin, retrieval)
  assert pairs == ref_pairs
  np.testing.assert_allclose(scores, ref_scores, atol=2e-6)
  assert list(scores) == sorted(scores, reverse=True)
  assert s["source_sentences"] == 57 and s["source_empty_lines_skipped"] == 2
  assert s["target_sentences"] == 43 and s["target_empty_lines_skipped"] == 1
  if retrieval == "forward":       # every source sentence, its best target
    assert sorted(p[0] for p in pairs) == sorted(src)
  assert json.loads((tmp_path / "out.tsv.json").read_text())["pairs"] == len(pairs)


def test_threshold_top_n_and_rescoring_reuse_the_work(encoder, ckpt, corpora, tmp_path,
                                                      monkeypatch):
  from vmx import bitext
  src_file, tgt_file, *_ = corpora
  run = lambda out, **kw: bitext.mine(encoder, str(ckpt), str(src_file), str(tgt_file),
                                      str(tmp_path / out), str(tmp_path / "work"),
                                      bitext.Settings(shard_size=16, **kw))
  run("all.tsv")
  _, all_scores = _read(tmp_path / "all.tsv")
  # a rerun on the same work dir encodes nothing and finds no neighbour again
  monkeypatch.setattr(encoder, "encode_counting", lambda *a, **k: pytest.fail("encoded"))
  monkeypatch.setattr(bitext, "_tile_topk", lambda *a: pytest.fail("searched"))
  t = float(np.median(all_scores))
  run("thr.tsv", threshold=t)
  _, thr = _read(tmp_path / "thr.tsv")
  assert len(thr) == int((all_scores >= t).sum()) and thr.min() >= t
  run("top.tsv", top_n=5)
  assert (tmp_path / "top.tsv").read_text().splitlines() == \
      (tmp_path / "all.tsv").read_text().splitlines()[:5]


class Kill(BaseException):
  pass


@pytest.mark.parametrize("stage,after", [("embed", 2), ("embed", 7), ("knn", 1),
                                         ("knn", 11)])
def test_killed_job_continues_to_the_same_bytes(encoder, ckpt, corpora, tmp_path,
                                                monkeypatch, stage, after):
  """Killed after `after` shard encodings / tile searches, then rerun: the same output,
  byte for byte, as an uninterrupted job; finished shards are not redone."""
  from vmx import bitext
  src_file, tgt_file, *_ = corpora
  run = lambda out, work: bitext.mine(encoder, str(ckpt), str(src_file), str(tgt_file),
                                      str(tmp_path / out), str(tmp_path / work),
                                      bitext.Settings(shard_size=10))
  run("straight.tsv", "w1")
  calls = []
  real = {"embed": encoder.encode_counting, "knn": bitext._tile_topk}[stage]

  def dying(*a, **k):
    calls.append(1)
    if len(calls) > after:
      raise Kill()
    return real(*a, **k)
  if stage == "embed":
    monkeypatch.setattr(encoder, "encode_counting", dying)
  else:
    monkeypatch.setattr(bitext, "_tile_topk", dying)
  with pytest.raises(Kill):
    run("resumed.tsv", "w2")
  assert not (tmp_path / "resumed.tsv").exists()
  assert not [p for p in (tmp_path / "w2").rglob("*") if ".tmp-" in p.name]
  monkeypatch.undo()
  calls.clear()
  counting = lambda *a, **k: calls.append(1) or real(*a, **k)
  if stage == "embed":
    monkeypatch.setattr(encoder, "encode_counting", counting)
  else:
    monkeypatch.setattr(bitext, "_tile_topk", counting)
  run("resumed.tsv", "w2")
  if stage == "embed":          # 6 source shards, then 5 target shards
    assert len(calls) == 6 + 5 - after
  else:                         # 6 x 5 tiles; a source shard's tiles are kept whole
    assert len(calls) == 6 * 5 - (after // 5) * 5
  assert (tmp_path / "resumed.tsv").read_bytes() == (tmp_path / "straight.tsv").read_bytes()


def test_bad_input_is_one_error_naming_the_file(encoder, ckpt, corpora, tmp_path):
  from vmx import bitext
  from vmx.errors import DataError, InputError
  src_file, tgt_file, *_ = corpora
  run = lambda src=src_file, tgt=tgt_file, out="o.tsv", work="w", **kw: bitext.mine(
      encoder, str(ckpt), str(src), str(tgt), str(tmp_path / out), str(tmp_path / work),
      bitext.Settings(shard_size=10, **kw))
  with pytest.raises(DataError, match="nowhere.txt: no such file"):
    run(src=tmp_path / "nowhere.txt")
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"one fine line\nanother\n\xff\xfe broken\n")
  with pytest.raises(DataError, match=r"bad.txt:3: invalid UTF-8"):
    run(tgt=bad)
  blank = write_lines(tmp_path / "blank.txt", ["", "  "])
  with pytest.raises(DataError, match="blank.txt: no sentence to mine"):
    run(src=blank)
  with pytest.raises(InputError, match="k=50 is more than the 43 sentences"):
    run(k=50)
  run()
  with pytest.raises(InputError, match="o.tsv exists: pass --overwrite"):
    run()
  with pytest.raises(InputError, match=r"holds another mining job \(k: 4 there, 5 now\)"):
    run(out="o2.tsv", k=5)
  # the same work dir, a corpus changed in place: the shard is refused, naming it
  changed = write_lines(tmp_path / "c.txt", Path(src_file).read_text().splitlines())
  run(src=changed, out="c1.tsv", work="wc")
  lines = Path(changed).read_text().splitlines()
  write_lines(changed, lines[:3] + ["a changed line"] + lines[4:])
  with pytest.raises(InputError, match=r"source/00000.npy holds other sentences than shard 0"):
    run(src=changed, out="c2.tsv", work="wc")


def test_launcher_flags_and_summary(ckpt, corpora, tmp_path):
  src_file, tgt_file, *_ = corpora
  cmd = [sys.executable, str(REPO / "launch" / "mine.py"), f"--checkpoint_dir={ckpt}",
         f"--source={src_file}", f"--target={tgt_file}", f"--output={tmp_path / 'm.tsv'}",
         "--retrieval=forward", "--shard_size=20"]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert "mined 57 pairs from 57 x 43 sentences (ratio margin, k=4, forward)" in r.stdout
  assert "[mine] source:" in r.stdout and "2 empty line(s) skipped" in r.stdout
  assert len((tmp_path / "m.tsv").read_text().splitlines()) == 57
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      f"error: {tmp_path / 'm.tsv'} exists: pass --overwrite to replace it"]
  r = subprocess.run(cmd + ["--margin=cos"], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_sigterm_exits_75_and_the_rerun_writes_the_same_bytes(ckpt, tmp_path):
  """The signal contract (vmx/signals.py): SIGTERM mid-job is one `preempted:` line and
  exit 75, nothing partial is left, and the same command continues to the bytes of an
  uninterrupted job."""
  import signal
  src = write_lines(tmp_path / "s.txt", _sentences(4, 1500))
  tgt = write_lines(tmp_path / "t.txt", _sentences(5, 1200))
  cmd = lambda out: [sys.executable, str(REPO / "launch" / "mine.py"), f"--checkpoint_dir={ckpt}",
                     f"--source={src}", f"--target={tgt}", f"--output={tmp_path / out}",
                     "--shard_size=100", "--batch_size=1"]
  assert subprocess.run(cmd("straight.tsv"), capture_output=True, timeout=600).returncode == 0
  p = subprocess.Popen(cmd("killed.tsv"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  for line in p.stdout:                 # a few shards in: then the signal
    if "embedded source shard 3/" in line:
      p.send_signal(signal.SIGTERM)
      break
  rest, err = p.communicate(timeout=300)
  assert p.returncode == 75, err
  assert err.strip().splitlines()[-1].startswith("preempted: SIGTERM while embedding")
  assert len(err.strip().splitlines()) == 1, err
  assert "finished shards and neighbour lists are kept" in err
  assert not (tmp_path / "killed.tsv").exists()
  assert not [q for q in (tmp_path / "killed.tsv.work").rglob("*") if ".tmp-" in q.name]
  r = subprocess.run(cmd("killed.tsv"), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr
  assert "embedded source shard 1/" not in r.stdout     # the finished shards were kept
  assert (tmp_path / "killed.tsv").read_bytes() == (tmp_path / "straight.tsv").read_bytes()


def test_two_processes_share_the_shards_and_write_the_same_bytes(ckpt, corpora, tmp_path):
  """Two local processes (jax.distributed on localhost): each embeds and searches its own
  shards, process 0 scores; the output equals one process's, byte for byte."""
  import os
  from conftest import free_port
  src_file, tgt_file, *_ = corpora
  cmd = lambda out, *extra: [sys.executable, str(REPO / "launch" / "mine.py"),
                             f"--checkpoint_dir={ckpt}", f"--source={src_file}",
                             f"--target={tgt_file}", f"--output={tmp_path / out}",
                             "--shard_size=10", *extra]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             VMX_HOST_MALLOC="off")
  r = subprocess.run(cmd("one.tsv"), capture_output=True, text=True, env=env, timeout=300)
  assert r.returncode == 0, r.stderr
  port = free_port()
  procs = [subprocess.Popen(cmd("two.tsv", f"--coordinator_address=127.0.0.1:{port}",
                                "--num_processes=2", f"--process_id={i}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  # shard i is process i % 2's: 6 source and 5 target shards
  assert outs[0][0].count("[mine] embedded") == 3 + 3 and outs[1][0].count("[mine] embedded") == 3 + 2
  assert outs[0][0].count("[mine] knn: source shard") == 3 == outs[1][0].count("[mine] knn:")
  assert "mined " in outs[0][0] and "mined " not in outs[1][0]
  assert (tmp_path / "two.tsv").read_bytes() == (tmp_path / "one.tsv").read_bytes()


@pytest.mark.slow   # ~90 s: Beam's worker processes start jax (the token cache's Beam tests too)
def test_beam_workers_write_the_local_jobs_bytes_and_a_rerun_does_only_what_is_missing(
    ckpt, corpora, tmp_path):
  """--beam_runner=DirectRunner with 2 worker processes (vmx/bitext_beam.py): the workers
  embed and search the shards, the driver merges and scores; OUTPUT equals one local
  process's byte for byte. A rerun after losing a target shard's vectors, a source
  shard's forward lists and the merged backward lists redoes just those."""
  pytest.importorskip("apache_beam", reason="apache-beam (the beam extra) is not installed")
  src_file, tgt_file, *_ = corpora
  cmd = lambda out, *extra: [sys.executable, str(REPO / "launch" / "mine.py"),
                             f"--checkpoint_dir={ckpt}", f"--source={src_file}",
                             f"--target={tgt_file}", f"--output={tmp_path / out}",
                             "--shard_size=10", *extra]
  r = subprocess.run(cmd("one.tsv"), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  beam = ("--beam_runner=DirectRunner", "--beam_workers=2")
  r = subprocess.run(cmd("beam.tsv", *beam), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "[mine] 11 shard(s) to embed on Beam (DirectRunner, 2 workers)" in r.stdout
  assert "[mine] 6 shard(s) to search on Beam" in r.stdout
  assert (tmp_path / "beam.tsv").read_bytes() == (tmp_path / "one.tsv").read_bytes()
  work = tmp_path / "beam.tsv.work"
  assert not list((work / "knn" / "beam").iterdir())     # merged into bwd_0_of_1.npz
  for f in ("target/00002.npy", "knn/fwd_00003.npz", "knn/bwd_0_of_1.npz"):
    (work / f).unlink()
  r = subprocess.run(cmd("beam.tsv", *beam, "--overwrite"), capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "[mine] 1 shard(s) to embed on Beam" in r.stdout
  assert "[mine] 6 shard(s) to search on Beam" in r.stdout   # (the lists were merged away)
  assert (tmp_path / "beam.tsv").read_bytes() == (tmp_path / "one.tsv").read_bytes()
  r = subprocess.run(cmd("x.tsv", *beam, "--multihost"), capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 2 and "--beam_runner: Beam's workers share the shards" in r.stderr
  r = subprocess.run(cmd("x.tsv", "--beam_runner=DataflowRunner"), capture_output=True,
                     text=True, timeout=120)        # workers elsewhere: local paths refused
  assert r.returncode != 0 and r.stderr.strip().splitlines() == [
      f"error: --beam_runner=DataflowRunner: its workers run on other machines, so the "
      f"checkpoint, the corpora, --work_dir and --output must be on storage they all read "
      f"(gs://...); local: {ckpt}"], r.stderr
  assert not (tmp_path / "x.tsv.work").exists()


# --- hard negatives mined by the model (vmx/negatives.py, launch/mine_negatives.py) ---

def test_negative_filter_holds_for_negative_scores():
  """The relative margin on [0, 1]-shifted cosines drops a candidate more similar than
  the positive whatever the signs; a ratio of raw cosines keeps -0.1 against a positive
  of -0.2 (-0.1 / -0.2 = 0.5 <= 0.95: sentence-transformers #3819)."""
  from vmx import negatives
  from vmx.errors import InputError
  f = negatives.Filter(relative_margin=0.05)
  pos = np.array([-0.2, -0.2, 0.6, 0.6, 0.0])
  cand = np.array([[-0.1], [-0.5], [0.59], [0.5], [-0.02]])
  keep = negatives.keep_mask(pos, cand, f)[:, 0]
  # -0.1 is more similar than -0.2: dropped (a raw ratio -0.1 / -0.2 = 0.5 <= 0.95 keeps it)
  # (0.0 vs -0.02: 0.49 > 0.95 x 0.5 on the shifted scale: within the 5 % margin, dropped)
  assert keep.tolist() == [False, True, False, True, False]
  assert (-0.1 / -0.2) <= 0.95          # the raw-ratio rule would have kept it
  strict = negatives.keep_mask(pos, cand, negatives.Filter(absolute_margin=0.15,
                                                           relative_margin=0.0))[:, 0]
  assert strict.tolist() == [False, True, False, False, False]
  for bad in (dict(negatives=0), dict(negatives=5, candidates=3), dict(relative_margin=1.0),
              dict(absolute_margin=-0.1)):
    with pytest.raises(InputError, match="expected"):
      negatives.Filter(**bad).check()


def _np_negatives(sources, targets, x, y, n, cands, rel, ab):
  s = x.astype(np.float64) @ y.astype(np.float64).T
  pos = np.diag(s)
  fold = lambda t: " ".join(t.split()).casefold()
  out = []
  for i in range(len(sources)):
    order = np.argsort(-s[i], kind="stable")[:cands]
    got = []
    for j in order:
      same = j == i or fold(targets[j]) == fold(targets[i])
      dup = any(fold(sources[m]) == fold(sources[i]) and fold(targets[m]) == fold(targets[j])
                for m in range(len(sources)))
      ok = s[i, j] <= pos[i] - ab and (1 + s[i, j]) / 2 <= (1 - rel) * (1 + pos[i]) / 2
      if not same and not dup and ok:
        got.append(int(j))
      if len(got) == n:
        break
    out.append(got if len(got) == n else None)
  return out


def test_mined_negatives_equal_a_numpy_reference_and_skip_false_negatives(encoder, ckpt,
                                                                         tmp_path):
  from vmx import negatives
  src, tgt = _sentences(7, 40), _sentences(8, 40)
  tgt[5] = tgt[6].upper()               # the same text (case folded) as another's positive
  src[9], tgt[9] = src[10], "another translation " + tgt[10]   # one source, two translations
  pairs = write_lines(tmp_path / "p.tsv", [f"{a}\t{b}" for a, b in zip(src, tgt)] + [""])
  x, y = encoder.encode(src), encoder.encode(tgt)
  for n, rel, ab in ((1, 0.05, 0.0), (3, 0.0, 0.05)):
    out = tmp_path / f"hard{n}.tsv"
    s = negatives.mine(encoder, pairs, str(out), negatives.Filter(n, 10, ab, rel))
    ref = _np_negatives(src, tgt, x, y, n, 10, rel, ab)
    want = [[src[i], tgt[i], *(tgt[j] for j in r)] for i, r in enumerate(ref) if r]
    got = [l.split("\t") for l in out.read_text().splitlines()]
    assert got == want and s["written"] == len(want) and s["left_out"] == 40 - len(want)
    for row in got:
      assert row[1] not in row[2:] and all(r.casefold() != row[1].casefold() for r in row[2:])
      if row[0] == src[9]:              # never the other translation of its own source
        assert tgt[9] not in row[2:] and tgt[10] not in row[2:]


def test_mine_negatives_launcher_and_its_task(ckpt, tmp_path):
  """The command's one-line errors, and the MPCL task reads what it writes."""
  bad = write_lines(tmp_path / "bad.tsv", ["only one column"])
  cmd = [sys.executable, str(REPO / "launch" / "mine_negatives.py"), f"--checkpoint_dir={ckpt}",
         f"--output={tmp_path / 'h.tsv'}"]
  r = subprocess.run(cmd + [f"--pairs={bad}"], capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      f"error: {bad}:1: expected 'source<TAB>target', got 'only one column'"]
  pairs = write_lines(tmp_path / "p.tsv", [f"{a}\t{b}" for a, b in
                                           zip(_sentences(9, 30), _sentences(10, 30))]
                      + ["\tan empty source"])
  r = subprocess.run(cmd + [f"--pairs={pairs}", "--negatives=2"], capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      f"error: {pairs}:31: expected 'source<TAB>target', got '\\tan empty source'"]
  r = subprocess.run(cmd + [f"--pairs={pairs}", "--negatives=2", "--empty_sides=skip"],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert " of 30 pairs with 2 hard negative(s)" in r.stdout
  assert ", 1 with an empty side;" in r.stdout
  assert all(len(l.split("\t")) == 4 for l in (tmp_path / "h.tsv").read_text().splitlines())


def test_a_directory_of_pair_files_is_mined_once_each_and_trains_contrastive(encoder, ckpt,
                                                                            tmp_path, capsys):
  """--pairs=DIR: each <source>-<target>.tsv mined as a file of its own would be (a file
  already mined is kept: a killed run resumes; a 1-pair file, as the one-hour recipe's
  nor-eng, mines to nothing and the mixture leaves it out); tasks.mined_negatives_mixture
  over the output, read by CONTRASTIVE's hard-negative variant: each example's two views are one
  mined row's pair (either order) and its negative that row's."""
  from tasks.mined import mined_negatives_mixture
  from vmx import encoders, negatives
  from vmx.data import pipeline, vocab
  from vmx.errors import DataError, InputError
  from vmx.models import DualEncoder, DualEncoderModel
  pairs = tmp_path / "pairs"
  pairs.mkdir()
  for name, seed in (("deu-eng", 11), ("fra-eng", 13)):
    write_lines(pairs / f"{name}.tsv", [f"{a}\t{b}" for a, b in
                                        zip(_sentences(seed, 30), _sentences(seed + 1, 30))])
  write_lines(pairs / "nor-eng.tsv", ["en setning\ta sentence"])
  with pytest.raises(DataError, match=r"none.tsv: no 'source<TAB>target' pair"):
    negatives.read_pairs(write_lines(tmp_path / "none.tsv", ["", " "]))
  f = negatives.Filter(1, 10, 0.0, 0.0)
  logged = []
  s = negatives.mine_directory(encoder, str(pairs), str(tmp_path / "out"), f, log=logged.append)
  for name in ("deu-eng", "fra-eng"):
    negatives.mine(encoder, str(pairs / f"{name}.tsv"), str(tmp_path / f"{name}.one"), f)
    assert (tmp_path / "out" / f"{name}.tsv").read_text() == (
        tmp_path / f"{name}.one").read_text()
  assert s["files"] == 3 and s["kept"] == 0 and s["written"] > 0
  assert (tmp_path / "out" / "nor-eng.tsv").read_text() == ""
  assert s["per_file"]["nor-eng.tsv"] == {"pairs": 1, "written": 0, "left_out": 1,
                                          "skipped_empty": 0}
  (tmp_path / "out" / "fra-eng.tsv").unlink()             # as if killed before that file
  before = (tmp_path / "out" / "deu-eng.tsv").stat().st_mtime_ns
  again = negatives.mine_directory(encoder, str(pairs), str(tmp_path / "out"), f,
                                   log=logged.append)
  assert again["kept"] == 2 and list(again["per_file"]) == ["fra-eng.tsv"]
  assert (tmp_path / "out" / "deu-eng.tsv").stat().st_mtime_ns == before
  assert (tmp_path / "out" / "fra-eng.tsv").read_text() == (tmp_path / "fra-eng.one").read_text()
  other = negatives.Filter(1, 10, 0.0, 0.05)                # other settings: refused, naming both
  with pytest.raises(InputError, match=r"mine_negatives.json holds files mined with .*"
                                       r"\"relative_margin\": 0.0.*, not .*\"relative_margin\": 0.05"):
    negatives.mine_directory(encoder, str(pairs), str(tmp_path / "out"), other)
  assert negatives.mine_directory(encoder, str(pairs), str(tmp_path / "out"), other,
                                  overwrite=True, log=logged.append)["kept"] == 0
  write_lines(pairs / "nolanguages.tsv", ["a\tb"])
  with pytest.raises(InputError, match=r"nolanguages.tsv: expected a file named "
                                       r"<source>-<target>.tsv"):
    negatives.pair_files(str(pairs))
  (pairs / "nolanguages.tsv").unlink()
  (tmp_path / "empty").mkdir()
  with pytest.raises(InputError, match="empty: no <source>-<target>.tsv file"):
    mined_negatives_mixture(str(tmp_path / "empty"), "unused.model")

  rows = {}
  for p in (tmp_path / "out").glob("*.tsv"):
    for line in p.read_text().splitlines():
      a, b, n = line.split("\t")
      rows[frozenset((a, b))] = n
  vp = str(ckpt.parent / "v.model")
  capsys.readouterr()
  name = mined_negatives_mixture(str(tmp_path / "out"), vp, alpha=0.5, validation_percent=0)
  assert "hold no mined pair, left out: nor-eng.tsv" in capsys.readouterr().out
  enc = encoders.TransformerEncoder(vocab_size=80, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=32)
  model = DualEncoderModel(DualEncoder(enc), hard_negatives=True)
  it = pipeline.train_iterator(pipeline.DatasetConfig(name, {"views": 32}, batch_size=8),
                               model.FEATURE_CONVERTER_CLS, seed=0, progress=False)
  tok = vocab.Tokenizer(vp)
  text = lambda ids: tok.sp.decode([int(t) for t in ids if t])  # noqa: E731
  batch = next(it)
  for views, neg in zip(batch["views"].reshape(-1, 2, 32), batch["hard_negative"]):
    pair = frozenset(text(v) for v in views)
    assert pair in rows and text(neg) == rows[pair]


def test_mined_negatives_task_refuses_bad_files_naming_them(tmp_path):
  from tasks.mined import mined_negatives_task
  from vmx.errors import ConfigError, DataError
  call = lambda f, langs=("de", "en"): mined_negatives_task(f, langs, "unused.model")
  with pytest.raises(ConfigError, match="MINED_NEGATIVES_FILE"):
    call(None)
  ok = write_lines(tmp_path / "ok.tsv", ["a\tb\tc"])
  with pytest.raises(ConfigError, match=r"languages=\['de'\]: expected the source's"):
    call(ok, ("de",))
  bad = write_lines(tmp_path / "bad.tsv", ["a\tb\tc", "", "a\tb"])
  with pytest.raises(DataError, match=r"bad.tsv:3: expected 'source<TAB>positive<TAB>"):
    call(bad)


def test_output_written_in_pieces_appears_whole_or_not_at_all(tmp_path):
  """storage.open_atomic (the mining job's OUTPUT, a chunk of pairs at a time): an error
  while writing leaves the old file and no temporary one; a finished write replaces it
  and removes what a killed writer left."""
  from vmx import storage
  out = tmp_path / "out.tsv"
  out.write_text("old\n")
  with pytest.raises(RuntimeError, match="killed"):
    with storage.open_atomic(out) as f:
      f.write("new part\n")
      raise RuntimeError("killed while writing")
  assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["out.tsv"]
  killed = tmp_path / f"out.tsv{storage.TMP_MARK}{socket.gethostname()}-{2**22 + 1}"
  killed.write_text("a writer killed before its rename\n")   # (pid above Linux's max)
  with storage.open_atomic(out) as f:
    f.write("a\n")
    f.write("b\n")
  assert out.read_text() == "a\nb\n" and os.listdir(tmp_path) == ["out.tsv"]


def test_output_written_in_pieces_to_a_bucket(tmp_path, gcs_emulator):
  """The same in a bucket (the GCS emulator): the pieces are staged locally and the
  object appears in one upload, or not at all."""
  url, env = gcs_emulator
  script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from vmx import storage
p = "gs://vmx-test/mined/out.tsv"
storage.write_atomic(p, "old\\n")
try:
  with storage.open_atomic(p) as f:
    f.write("new part\\n")
    raise RuntimeError("killed")
except RuntimeError:
  pass
assert storage.path(p).read_text() == "old\\n"
with storage.open_atomic(p) as f:
  f.write("a\\n")
  f.write("b\\n")
assert storage.path(p).read_text() == "a\\nb\\n"
import os
assert os.listdir(storage.cache_dir().parent / "uploads") == []
print("ok")
"""
  r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                     env={**os.environ, **env, "VMX_CACHE_DIR": str(tmp_path / "data")},
                     timeout=120)
  assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_texts_of_chosen_lines_come_from_one_pass(tmp_path):
  """bitext.Texts: the chosen kept lines (any order, repeats) by kept-line index, blank
  lines not counted, non-ASCII intact, in chunks; none chosen is empty."""
  from vmx import bitext
  path = tmp_path / "c.txt"
  path.write_text("a\n\n  \nb é\nc\nd\n", encoding="utf-8")
  corpus = bitext.Corpus(str(path), 2)
  texts = bitext.Texts(corpus, np.array([3, 0, 3, 1]), str(tmp_path / "spill"))
  assert texts.chunk(0, 4) == ["d", "a", "d", "b é"]
  assert texts.chunk(1, 3) == ["a", "d"]
  texts.close()
  none = bitext.Texts(corpus, np.array([], np.int64), str(tmp_path / "spill2"))
  assert none.chunk(0, 10) == []
  none.close()
