"""Hard to break: non-finite training, damaged checkpoints, metrics rows after resumes,
bad corpora, bad configs and bad encode() input all end in one clear vmx error."""
import json
import os
import subprocess
import sys
import warnings

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import REPO, toy_train, write_lines
from vmx import experiment
from vmx.data import readers
from vmx.errors import CheckpointError, ConfigError, DataError, InputError, NonFiniteError
from vmx.inference import Encoder
from vmx.modeldir import checkpoints
from vmx.training.metrics import read_rows


def _nan_after(n_good: int):
  """An optimizer that is plain SGD for `n_good` updates, then returns NaN updates."""
  def update(updates, count, params=None):
    del params
    bad = count >= n_good
    return jax.tree.map(lambda u: jnp.where(bad, jnp.nan, -1e-2 * u), updates), count + 1
  return optax.GradientTransformation(lambda p: jnp.zeros((), jnp.int32), update)


def _params(model_dir, step):
  import orbax.checkpoint as ocp
  with ocp.StandardCheckpointer() as c:
    return c.restore(checkpoints.step_dir(model_dir, step).absolute() / "params")


# --- non-finite values -------------------------------------------------------------------

def test_nonfinite_update_stops_keeps_good_checkpoints(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  with pytest.raises(NonFiniteError) as e:
    toy_train(tmp_path, name, vp, total_steps=12, period=2, keep=2, optimizer=_nan_after(5))
  msg = str(e.value)
  # Update 6 writes NaN parameters: found at step 6 (the check before its log/save).
  assert "step 6" in msg and "parameters" in msg and "checkpoint_4" in msg, msg
  steps = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("checkpoint_*"))
  assert steps == [2, 4]  # nothing non-finite written; the good ones not rotated out
  for s in steps:
    assert checkpoints.verify(checkpoints.step_dir(tmp_path, s)) is None
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(tmp_path, s)))
  rows = read_rows(tmp_path / "metrics.jsonl")
  assert rows and all(np.isfinite(v) for r in rows for k, v in r.items() if k != "time")


def test_nonfinite_loss_names_the_terms(tmp_path, toy_task, monkeypatch):
  """A loss that is NaN from the first step: step 1 is reported with the terms."""
  import vmx.models

  class NanLoss(vmx.models.DualEncoderModel):
    def compute_loss(self, params, batch, dropout_rng, flax_mutables=None):
      loss, metrics, mutables = super().compute_loss(params, batch, dropout_rng, flax_mutables)
      return loss * jnp.nan, metrics, mutables

  # toy_train builds its model through vmx.models: swap in the NaN variant.
  monkeypatch.setattr(vmx.models, "DualEncoderModel", NanLoss)
  name, vp, _, _ = toy_task
  with pytest.raises(NonFiniteError, match=r"step 1: .*gradients") as e:
    toy_train(tmp_path, name, vp, total_steps=4, period=2)
  assert "no checkpoint was written" in str(e.value)
  assert not list(tmp_path.glob("checkpoint_*"))


def test_encoder_refuses_nonfinite_checkpoint(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  toy_train(tmp_path, name, vp, total_steps=2, period=2)
  Encoder.from_checkpoint(tmp_path)  # finite: fine
  enc = Encoder.from_checkpoint(tmp_path)
  enc.params = jax.tree.map(lambda x: x * jnp.nan, enc.params)
  with pytest.raises(NonFiniteError, match=r"sentences\[0\]"):
    enc.encode(["alpha beta"], lang="xx")


def test_nonfinite_checkpoint_is_refused_by_encoder_and_eval_cli(tmp_path, toy_task):
  """A checkpoint with NaN parameters (e.g. written by another tool): from_checkpoint and
  launch/eval.py refuse it (exit 3), naming the arrays."""
  import orbax.checkpoint as ocp
  name, vp, _, _ = toy_task
  toy_train(tmp_path, name, vp, total_steps=2, period=2)
  params = _params(tmp_path, 2)
  d = checkpoints.step_dir(tmp_path, 2).absolute()
  import shutil
  shutil.rmtree(d / "params")
  with ocp.StandardCheckpointer() as c:
    c.save(d / "params", jax.tree.map(lambda x: x * np.nan, params))
  checkpoints.write_manifest(d)
  with pytest.raises(NonFiniteError, match=r"checkpoint_2 has non-finite parameters"):
    Encoder.from_checkpoint(tmp_path)
  proc = subprocess.run([sys.executable, str(REPO / "launch" / "eval.py"),
                         f"--checkpoint_dir={tmp_path}", "--tasks=stsb", "--no_progress"],
                        capture_output=True, text=True, cwd=REPO, timeout=300,
                        env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
  assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "non-finite parameters" in proc.stderr


# --- damaged checkpoints -----------------------------------------------------------------

def _largest_file(d):
  files = [p for p in d.rglob("*") if p.is_file() and p.name != checkpoints.MANIFEST]
  return max(files, key=lambda p: p.stat().st_size)


def test_damaged_latest_checkpoint_falls_back_and_resumes_exactly(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  ref = toy_train(tmp_path / "ref", name, vp, total_steps=6, period=2, keep=3)
  run = tmp_path / "run"
  toy_train(run, name, vp, total_steps=6, stop_at_step=4, period=2, keep=3)
  victim = _largest_file(run / "checkpoint_4")
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0x10  # one flipped bit
  victim.write_bytes(bytes(data))
  assert "checksum mismatch" in checkpoints.verify(run / "checkpoint_4")
  # Inference: reported, the previous intact checkpoint is used; an explicit step is an error.
  enc = Encoder.from_checkpoint(run)
  assert enc.revision == "checkpoint_2"
  with pytest.raises(CheckpointError, match="checkpoint_4 is damaged"):
    Encoder.from_checkpoint(run, step=4)
  # Training: the damaged one is moved aside (kept), the run resumes from step 2.
  resumed = toy_train(run, name, vp, total_steps=6, period=2, keep=3)
  assert (run / "damaged" / "checkpoint_4").is_dir()
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               ref.params, resumed.params)


def test_truncated_checkpoint_and_none_intact(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  toy_train(tmp_path, name, vp, total_steps=4, period=2, keep=2)
  for s in (2, 4):
    victim = _largest_file(tmp_path / f"checkpoint_{s}")
    victim.write_bytes(victim.read_bytes()[:10])
  with pytest.raises(CheckpointError, match=r"no intact checkpoint .*checkpoint_4: .*bytes"):
    Encoder.from_checkpoint(tmp_path)


def test_checkpoint_without_manifest_is_restored_unverified(tmp_path, toy_task, capfd):
  """Without a live trainer the checkpoint's own trainer stopped before its manifest:
  restored unverified, saying so. With a live one holding the run, it is being committed:
  the load waits for the manifest and restores verified."""
  import json
  import socket
  import threading
  name, vp, _, _ = toy_task
  toy_train(tmp_path, name, vp, total_steps=2, period=2)
  manifest = tmp_path / "checkpoint_2" / checkpoints.MANIFEST
  saved = manifest.read_bytes()
  manifest.unlink()
  assert Encoder.from_checkpoint(tmp_path).revision == "checkpoint_2"
  err = capfd.readouterr().err
  assert "its trainer stopped between the commit and the manifest" in err
  assert "restoring unverified" in err
  (tmp_path / "vmx.lock").write_text(json.dumps(
      {"host": socket.gethostname(), "pid": os.getpid(), "refreshed": 0}))
  threading.Timer(1.0, manifest.write_bytes, [saved]).start()
  assert Encoder.from_checkpoint(tmp_path).revision == "checkpoint_2"
  err = capfd.readouterr().err
  assert "being committed by a live trainer" in err and "unverified" not in err


# --- metrics.jsonl after resumes ---------------------------------------------------------

def test_metrics_rows_unique_after_resumes(tmp_path, toy_task):
  name, vp, _, _ = toy_task
  toy_train(tmp_path, name, vp, total_steps=8, stop_at_step=4, period=2)
  # A run killed after checkpoint 4 had already logged step 6: that row is redone.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 6, "train/loss": 1.0}) + "\n" + '{"step": 8, "tr')  # torn line
  toy_train(tmp_path, name, vp, total_steps=8, stop_at_step=6, period=2)
  toy_train(tmp_path, name, vp, total_steps=8, period=2)
  rows = read_rows(tmp_path / "metrics.jsonl")
  steps = [r["step"] for r in rows if "train/loss" in r]
  assert steps == [2, 4, 6, 8], steps
  assert all(r["train/loss"] != 1.0 for r in rows)


# --- corpora -----------------------------------------------------------------------------

def test_empty_corpus_is_an_error_not_a_silent_drop(tmp_path):
  src = write_lines(tmp_path / "e.de", [])
  tgt = write_lines(tmp_path / "e.en", [])
  with pytest.raises(DataError, match=r"e\.de / .*e\.en is empty"):
    readers.validate_parallel(src, tgt)
  src2 = write_lines(tmp_path / "f.de", ["", " "])
  tgt2 = write_lines(tmp_path / "f.en", ["x", "y"])
  with pytest.raises(DataError, match="has no pair"):
    readers.validate_parallel(src2, tgt2, empty_lines="skip")


def test_truncated_gzip_names_file_and_line(tmp_path):
  src = write_lines(tmp_path / "g.de.gz", [f"satz {i}" for i in range(5000)], gz=True)
  tgt = write_lines(tmp_path / "g.en.gz", [f"sentence {i}" for i in range(5000)], gz=True)
  raw = open(src, "rb").read()
  open(src, "wb").write(raw[:len(raw) // 2])
  with pytest.raises(DataError, match=r"g\.de\.gz:\d+: truncated or corrupt gzip"):
    readers.validate_parallel(src, tgt)


def test_missing_corpus_file_is_a_data_error(tmp_path):
  tgt = write_lines(tmp_path / "h.en", ["x"])
  with pytest.raises(DataError, match=r"h\.de: no such file"):
    readers.validate_parallel(tmp_path / "h.de", tgt)


def test_mixture_with_an_empty_corpus_fails(tmp_path, toy_task):
  import tasks
  _, vp, _, _ = toy_task
  src = write_lines(tmp_path / "empty.xx", [])
  tgt = write_lines(tmp_path / "empty.en", [])
  with pytest.raises(DataError, match="empty"):
    tasks.moses_task("empty_xx_en", src, tgt, "xx", "en", vp, ["xx", "en"])


# --- configuration -----------------------------------------------------------------------

@pytest.mark.parametrize("binding,expected", [
    ("TRAIN_STEP = 5", "--gin.TRAIN_STEP is set but no binding uses it; did you mean TRAIN_STEPS?"),
    ("BATCH_SIZE = 'abc'", "BATCH_SIZE = 'abc' (reaches train/DatasetConfig.batch_size): "
                           "expected an integer"),
    ("TRAIN_LANGUAGES = 'deu'", "TRAIN_LANGUAGES = 'deu' (reaches parallel_mixture.languages)"),
    ("train.total_steps = %TRAIN_STPES", "macro %TRAIN_STPES is used but never set"),
    ("TransformerEncoder.num_layerz = 3", "did you mean num_layers?"),
    ("TransformerEncodr.num_layers = 3", "did you mean TransformerEncoder?"),
])
def test_config_mistakes_are_caught_at_parse_time(binding, expected):
  gin.clear_config()
  try:
    with pytest.raises(ConfigError) as e:
      experiment.parse_gin(["contrastive_tiny.gin"], ["MODEL_DIR = '/tmp/x'", binding])
    assert expected in str(e.value)
  finally:
    gin.clear_config()


@pytest.mark.parametrize("binding,expected", [
    ("CHECKPOINT_PERIOD = 0", "CHECKPOINT_PERIOD (CheckpointConfig.period) = 0: expected a "
                              "positive number of steps"),
    ("CHECKPOINTS_TO_KEEP = -1", "CHECKPOINTS_TO_KEEP (CheckpointConfig.keep) = -1"),
])
def test_out_of_range_values_name_the_macro(binding, expected):
  gin.clear_config()
  try:
    experiment.parse_gin(["contrastive_tiny.gin"], ["MODEL_DIR = '/tmp/x'", binding])
    with pytest.raises(ConfigError) as e:
      checkpoints.CheckpointConfig()
    assert expected in str(e.value)
  finally:
    gin.clear_config()


@pytest.mark.parametrize("binding,expected", [
    ("NUM_HEADS = 0", "NUM_HEADS (TransformerEncoder.num_heads) = 0: expected a positive integer"),
    ("NUM_LAYERS = -1", "NUM_LAYERS (TransformerEncoder.num_layers) = -1"),
    ("DROPOUT_RATE = 1.5", "DROPOUT_RATE (TransformerEncoder.dropout_rate) = 1.5"),
    ("NUM_HEADS = 3", "emb_dim 128 is not divisible by num_heads 3"),
])
def test_model_size_mistakes_are_config_errors(binding, expected):
  gin.clear_config()
  try:
    model, *_ = experiment.build_experiment(["contrastive_tiny.gin"], [binding])
    with pytest.raises(ConfigError) as e:
      jax.eval_shape(lambda: model.get_initial_variables(
          jax.random.PRNGKey(0), {"left_tokens": (2, 32), "right_tokens": (2, 32)}))
    assert expected in str(e.value)
  finally:
    gin.clear_config()


@pytest.mark.parametrize("kwargs,expected", [
    (dict(total_steps=0), "train.total_steps = 0: expected a positive number of steps"),
    (dict(log_period=0), "train.log_period = 0"),
])
def test_train_arguments_are_checked_before_building(kwargs, expected):
  from vmx.training import trainer
  args = dict(total_steps=10, log_period=5, eval_period=0, stop_at_step=None)
  args.update(kwargs)
  with pytest.raises(ConfigError) as e:
    trainer.check_train_args(**args)
  assert expected in str(e.value)


def test_an_input_checks_its_batch_against_the_devices_before_building():
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput
  one = TokenCacheInput(pipeline.DatasetConfig("unset", {"inputs": 8}, 6))
  with pytest.raises(ConfigError, match="DatasetConfig.batch_size = 6: expected a multiple "
                                        "of the 4"):
    one.check(None, 4)
  multi = TokenCacheInput(pipeline.MultiTaskConfig({"mlm": pipeline.DatasetConfig(
      "unset", {"inputs": 8}, 8), "tlm": pipeline.DatasetConfig("unset", {"inputs": 8}, 6)}))
  with pytest.raises(ConfigError, match=r"MultiTaskConfig.tasks\['tlm'\] DatasetConfig"):
    multi.check(None, 4)


def _cli(*args, env=None):
  e = dict(os.environ, **(env or {}))
  e.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), *args],
                        capture_output=True, text=True, env=e, cwd=REPO, timeout=300)


def test_cli_errors_are_one_line_and_verbose_adds_the_traceback(tmp_path):
  args = ["--gin_file=contrastive_tiny.gin", f"--gin.MODEL_DIR={tmp_path}", "--gin.TRAIN_STEP=5"]
  proc = _cli(*args)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
      "error: --gin.TRAIN_STEP is set but no binding uses it; did you mean TRAIN_STEPS?"]
  verbose = _cli(*args, "--verbose")
  assert verbose.returncode == 2 and "Traceback" in verbose.stderr
  assert not any(tmp_path.iterdir())  # nothing written before the config was checked


@pytest.mark.parametrize("launcher,args,needle", [
    ("eval.py", ["--checkpoint_dir={model_dir}", "--tasks=nosuch"],
     "unknown task(s) ['nosuch']"),
    ("train.py", ["--nosuch"], "unrecognized arguments: --nosuch"),
    ("cache_tasks.py", [], "give --gin_file"),
])
def test_a_launchers_flag_errors_are_one_line(launcher, args, needle, tmp_path):
  """argparse printed its whole usage (26 lines for launch/eval.py) before the message:
  every launcher's flag error is now one line, exit 2."""
  (tmp_path / "vmx_model.json").write_text("{}")
  args = [a.format(model_dir=tmp_path) for a in args]
  proc = subprocess.run([sys.executable, str(REPO / "launch" / launcher), *args],
                        capture_output=True, text=True, cwd=REPO, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and needle in lines[0] and "--help lists the flags" in lines[0], lines


# --- encode() input ----------------------------------------------------------------------

@pytest.mark.parametrize("sentences,batch_size,match", [
    (["ok", ""], None, r"sentences\[1\] is empty"),
    (["ok", "  \t"], None, r"sentences\[1\] is empty"),
    (["ok", 3], None, r"sentences\[1\] is int"),
    (["ok", None], None, r"sentences\[1\] is NoneType"),
    ([b"bytes"], None, r"sentences\[0\] is bytes"),
    (["ok"], 0, "batch_size=0"),
    (["ok"], -1, "batch_size=-1"),
    (["ok"], 2.5, "batch_size=2.5"),
])
def test_encode_rejects_bad_input_naming_the_index(toy_encoder, sentences, batch_size, match):
  with pytest.raises(InputError, match=match):
    toy_encoder.encode(sentences, lang="xx", batch_size=batch_size)


def test_evaluation_tasks_call_a_vmx_encoder_directly(toy_encoder):
  """vmx's Encoder is an EncodeFn as it is: the tasks get its bound method (no wrapper
  between the task and the encoder), so its own input checks are what bad input meets."""
  from vmx.evaluation import common
  assert common.as_encode_fn(toy_encoder) == toy_encoder.encode
  quiet = common.as_encode_fn(toy_encoder, progress=False)
  np.testing.assert_array_equal(quiet(["alpha beta", "gamma"], "xx"),
                                toy_encoder.encode(["alpha beta", "gamma"], lang="xx"))
  with pytest.raises(InputError, match=r"sentences\[1\] is empty"):
    quiet(["alpha", ""], "xx")


def test_encode_takes_sentence_transformers_keywords(toy_encoder):
  """Code written for sentence-transformers (and MTEB) calls encode() with its keywords."""
  sents = ["alpha beta", "gamma", "alpha gamma beta"]
  ref = toy_encoder.encode(sents, lang="xx")
  got = toy_encoder.encode(sents, lang="xx", batch_size=2, show_progress_bar=False,
                           convert_to_numpy=True, normalize_embeddings=True,
                           task_name="STSBenchmark", prompt_type="query")
  np.testing.assert_allclose(got, ref, atol=1e-6)
  one = toy_encoder.encode("gamma", lang="xx")
  assert one.shape == (ref.shape[1],)
  np.testing.assert_allclose(one, ref[1], atol=1e-6)
  rows = toy_encoder.encode(sents, lang="xx", convert_to_numpy=False)
  assert isinstance(rows, list) and len(rows) == 3
  np.testing.assert_allclose(np.stack(rows), ref, atol=1e-6)
  # A prompt is put before every sentence, by text or by name.
  toy_encoder.prompts = {"query": "alpha "}
  try:
    by_name = toy_encoder.encode(["gamma"], lang="xx", prompt_name="query")
    by_text = toy_encoder.encode(["gamma"], lang="xx", prompt="alpha ")
    by_type = toy_encoder.encode(["gamma"], lang="xx", prompt_type="query")
    plain = toy_encoder.encode(["alpha gamma"], lang="xx")
    for v in (by_name, by_text, by_type):
      np.testing.assert_allclose(v, plain, atol=1e-6)
    with pytest.raises(InputError, match="prompt_name='doc' is not one of"):
      toy_encoder.encode(["gamma"], lang="xx", prompt_name="doc")
  finally:
    toy_encoder.prompts = {}
  with pytest.raises(InputError, match="precision='uint4'"):
    toy_encoder.encode(sents, lang="xx", precision="uint4")
  with pytest.raises(InputError, match="int8 vectors need the model's calibration"):
    toy_encoder.encode(sents, lang="xx", precision="int8")   # (tests/test_small_vectors.py)
  torch = pytest.importorskip("torch")
  t = toy_encoder.encode(sents, lang="xx", convert_to_tensor=True)
  assert isinstance(t, torch.Tensor) and tuple(t.shape) == ref.shape
  # similarity: cosine, as sentence-transformers' default.
  sim = toy_encoder.similarity(ref, ref[:2])
  assert sim.shape == (3, 2)
  np.testing.assert_allclose(sim, ref @ ref[:2].T, atol=1e-5)
  np.testing.assert_allclose(toy_encoder.similarity_pairwise(ref, ref), 1.0, atol=1e-5)
  assert toy_encoder.similarity_fn_name == "cosine"
  assert toy_encoder.get_sentence_embedding_dimension() == ref.shape[1]
  assert toy_encoder.max_seq_length == toy_encoder.max_length


def test_language_ids_take_a_language_under_its_other_iso_639_3_code():
  from vmx.data.languages import resolve
  known = ["fas", "msa", "cmn_Hans", "cmn_Hant", "bos_Latn", "hbs", "eng"]
  assert [resolve(c, known) for c in ("pes", "zsm", "cmn", "bos", "srp", "eng", "arz", "wuu")
          ] == ["fas", "msa", "cmn_Hans", "bos_Latn", "hbs", "eng", None, None]
  assert resolve("fas", ["pes"]) == "pes" and resolve("zho", ["cmn"]) == "cmn"

  class ReadsIds:
    uses_languages = True
  enc = Encoder(ReadsIds(), None, None, ["fas", "cmn_Hans", "eng"], max_length=8)
  np.testing.assert_array_equal(enc._lang_ids(["pes", "fas", "cmn", "eng"], 4), [0, 0, 1, 2])
  np.testing.assert_array_equal(enc._lang_ids("pes", 2), [0, 0])
  with pytest.raises(InputError, match=r"languages \['arz'\] are not among the model's 3"):
    enc._lang_ids(["pes", "arz"], 2)


def test_encode_counts_truncation(toy_encoder):
  long = " ".join(["alpha beta gamma"] * 20)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    v = toy_encoder.encode([long, "alpha", long], lang="xx", batch_size=2)
  assert v.shape == (3, 16) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
  assert [str(x.message) for x in w] == [
      "2 of 3 sentences are longer than the model's max_length=8 tokens and were truncated"]
  # encode_counting: the same vectors and the count, without the warning
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    v2, cut = toy_encoder.encode_counting([long, "alpha", long], lang="xx", batch_size=2)
  assert cut == 2
  np.testing.assert_array_equal(v2, v)
  assert toy_encoder.encode([], lang="xx").shape == (0, 0)


def test_an_untested_jax_version_is_one_warning_line(monkeypatch, capsys):
  import jax
  from vmx import cli
  cli.warn_untested_versions()
  assert capsys.readouterr().out == ""          # this suite's jax is a tested one
  monkeypatch.setattr(jax, "__version__", "0.99.0")
  cli.warn_untested_versions()
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1 and "jax 0.99.0" in out[0] and "not a tested version" in out[0]


def test_the_token_cache_dirs_earlier_name_still_works_with_one_warning(capsys):
  from vmx.data import pipeline
  cfg = pipeline.DatasetConfig("unset", {"inputs": 8}, 8, array_cache_dir="/tmp/cache")
  assert cfg.token_cache_dir == "/tmp/cache" and cfg.array_cache_dir is None
  pipeline.DatasetConfig("unset", {"inputs": 8}, 8, array_cache_dir="/tmp/cache")
  assert capsys.readouterr().err.count("DatasetConfig.array_cache_dir is deprecated") == 1
  with pytest.raises(ConfigError, match="both set, to different directories"):
    pipeline.DatasetConfig("unset", {"inputs": 8}, 8, token_cache_dir="/a", array_cache_dir="/b")


def test_sentences_of_unknown_pieces_only_are_one_warning(toy_encoder):
  """A sentence whose every piece is the unknown one (or the bare word boundary) gets the
  vector every such sentence gets: one warning naming the count and the first; a sentence
  with one known piece beside an unknown one is not counted."""
  sentences = ["alpha", "\u2603", "\u2603 alpha", "\u2604"]
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    v = toy_encoder.encode(sentences, lang="xx")
  assert [str(x.message) for x in w] == [
      "2 of 4 sentences have no token the vocabulary knows (only its unknown piece, e.g. "
      "sentences[1]): they all get the same vector"]
  np.testing.assert_allclose(v[1], v[3], atol=1e-6)


def test_the_error_line_stays_last_after_the_repeated_warnings_count():
  """A launcher's repeated warnings are counted, and the count is printed before its
  `error:` line (it was printed at exit, after it): the one line stays the last on stderr."""
  script = f"""
import sys, warnings
sys.path.insert(0, {str(REPO)!r})
from vmx import cli
from vmx.errors import ConfigError
def main(argv):
  for i in range(3):                  # one place, three messages: one kind, counted
    warnings.warn(f"the same thing, {{i}}")
  raise ConfigError("the bad binding")
cli.run_main(main, [])
"""
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert out.returncode == 2, out.stderr
  assert lines[-1] == "error: the bad binding", lines
  assert 'the warning "the same thing, 0" (UserWarning) came 3 times' in lines[-2], lines
