"""Test setup: 8 simulated CPU devices, data dir from $VMX_DATA_DIR or ../shared/data."""
import os
import sys
from pathlib import Path

# 8 simulated CPU devices; LLVM's optimization passes off: most tests are bound by XLA's
# compile time (the programs are tiny), which this cuts by about a fifth. Every equality
# test compares programs compiled alike; tests that need the real CLI drop XLA_FLAGS.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
# JAX's persistent compilation cache, shared by the tests, their subprocesses (launch/*.py)
# and the xdist workers: the many identical small train steps compile once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".jax_cache"))
sys.path.insert(0, str(REPO))

import pytest  # noqa: E402

from benchmarks.common import free_port  # noqa: E402,F401  (tests import it from here)

_shared = REPO.parent / "shared" / "data"
if "VMX_DATA_DIR" not in os.environ and _shared.is_dir():
  os.environ["VMX_DATA_DIR"] = str(_shared)
DATA_DIR = os.environ.get("VMX_DATA_DIR")


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
  """Downloads/validation caches of the tests never touch the user's ~/.cache."""
  if "VMX_CACHE_DIR" not in os.environ:
    os.environ["VMX_CACHE_DIR"] = str(tmp_path_factory.mktemp("vmx_cache") / "data")
  yield


def pytest_addoption(parser):
  parser.addoption("--run-slow", action="store_true",
                   help="also run the slow tier (long real-data training campaigns)")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long campaign; runs only with --run-slow")


def pytest_collection_modifyitems(config, items):
  """Two tiers: the fast one always (CI), the slow one with --run-slow (README, "Tests")."""
  if config.getoption("--run-slow"):
    return
  skip = pytest.mark.skip(reason="slow tier: run with --run-slow")
  for item in items:
    if "slow" in item.keywords:
      item.add_marker(skip)


needs_data = pytest.mark.skipif(
    not DATA_DIR or not Path(DATA_DIR, "train").is_dir(),
    reason="real data not found: set VMX_DATA_DIR to a copy of shared/data "
           "(train/, eval/ of its README)")


def write_lines(path, lines, gz=False):
  import gzip
  data = "".join(l + "\n" for l in lines).encode("utf-8")
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if gz:
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    path.write_bytes(data)
  return str(path)


TOY_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def toy_pairs(seed: int, n: int, longest: int = 6) -> tuple[list[str], list[str]]:
  """n toy pairs of 2..longest words: 'xx' lower-case words, 'en' the same upper-case."""
  import numpy as np
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for _ in range(n):
    ws = list(rng.choice(TOY_WORDS, size=rng.integers(2, longest + 1)))
    src.append(" ".join(ws))
    tgt.append(" ".join(w.upper() for w in ws))
  return src, tgt


@pytest.fixture(scope="session")
def toy_task(tmp_path_factory):
  """(task name, vocabulary path, source file, target file) of a registered 300-pair toy
  task: 'xx' = lower-case words, 'en' = the same words upper-case."""
  import tasks
  from vmx.data import vocab
  d = tmp_path_factory.mktemp("toy")
  src, tgt = toy_pairs(0, 300)
  s = write_lines(d / "toy.xx", src)
  t = write_lines(d / "toy.en", tgt)
  TOY_FILES.update(xx=s, en=t)
  vp = vocab.train_sentencepiece([s, t], str(d / "toy.model"), 60, ["xx", "en"])
  name = tasks.moses_task("toy_xx_en", s, t, "xx", "en", vp, ["xx", "en"])
  return name, vp, s, t


@pytest.fixture(scope="module")
def toy_encoder(tmp_path_factory, toy_task):
  """An `Encoder` of a 2-step toy run (one per test module)."""
  from vmx.inference import Encoder
  name, vp, _, _ = toy_task
  d = tmp_path_factory.mktemp("enc")
  toy_train(d, name, vp, total_steps=2, period=2)
  return Encoder.from_checkpoint(d)


def toy_train(model_dir, name, vp, *, kind="contrastive", total_steps=6, stop_at_step=None,
              optimizer=None, period=3, keep=2, num_devices=2, reader="index", data=None,
              **train_kw):
  """train() on the toy task with a 1-layer model (dropout on); returns the final state.
  `reader`: the DatasetConfig's; `data`: an `Input` to train on instead of the task.
  `train_kw` go to train() (e.g. eval_cfg, eval_period, best_metric)."""
  import gin
  from vmx import decoders, encoders
  from vmx.data import pipeline
  from vmx.models import VMSST, DualEncoder, DualEncoderModel, VMSSTModel
  from vmx.modeldir import checkpoints
  from vmx.training import optimizers, partitioning
  from vmx.training.trainer import train
  gin.clear_config()
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8, dropout_rate=0.1)
  cfg = pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8}, batch_size=8, reader=reader)
  if kind == "contrastive":
    model = DualEncoderModel(DualEncoder(enc), temperature=0.1)
  elif kind == "infoxlm":  # three tasks a step, momentum encoder + queue in flax_mutables
    from vmx.models.infoxlm import InfoXLM, InfoXLMModel
    model = InfoXLMModel(InfoXLM(enc.clone(max_length=16), universal_layer=1), mask_id=1,
                         random_low=3, queue_size=16, momentum=0.9, temperature=0.1,
                         normalize=True)
    cfg = pipeline.MultiTaskConfig({
        "mmlm": pipeline.DatasetConfig(toy_text_task(vp), {"inputs": 8}, batch_size=8),
        "tlm": cfg, "xlco": pipeline.DatasetConfig(name, {"inputs": 8, "targets": 8},
                                                   batch_size=8)})
  else:  # VMSST: sampled latents + KL annealing state in flax_mutables
    dec = decoders.ConditionedDecoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                      mlp_dim=32, max_length=8, dropout_rate=0.1)
    model = VMSSTModel(VMSST(enc, dec, num_languages=2), kl_anneal_steps=10)
  lr = optimizers.learning_rate_schedule("linear", 1e-2, 2, total_steps=total_steps)
  state, _ = train(model=model,
                   train_dataset_cfg=cfg if data is None else data,
                   optimizer=optimizer or optimizers.create_optimizer("adamw", lr,
                                                                      weight_decay=0.01),
                   learning_rate=lr, model_dir=str(model_dir), total_steps=total_steps,
                   vocabulary=vp, languages=["xx", "en"],
                   partitioner=partitioning.Partitioner(num_devices=num_devices),
                   checkpoint_cfg=checkpoints.CheckpointConfig(period=period, keep=keep),
                   log_period=2, random_seed=1, progress=False, stop_at_step=stop_at_step,
                   **train_kw)
  return state


def toy_text_task(vp):
  """A monolingual task over the toy task's source file (registered once)."""
  import seqio
  from vmx.data import registration, sources
  name = "toy_xx_mono"
  if name not in seqio.TaskRegistry.names():
    registration.register_text_task(name, sources.text_source([TOY_FILES["xx"]]), vp)
  return name


TOY_FILES = {}


def initial_variables(model, shapes, seed=0, types=None):
  """model.get_initial_variables(PRNGKey(seed), shapes, types) under jit, as the trainer
  calls it: eagerly, Flax's init compiles every primitive on its own (measured: 11.6 s for
  test_vmsst's model in a fresh process, 3.9 s jitted)."""
  import jax
  return jax.jit(lambda rng: model.get_initial_variables(rng, shapes, types))(
      jax.random.PRNGKey(seed))


def save_model_dir(path, model, languages, max_length, vocab_path, seed=0):
  """A vmx model directory of `model` at random init (checkpoint 0 and the inference
  files), as a run or an import leaves one; returns `path`."""
  from vmx.modeldir import checkpoints, layout
  params = initial_variables(model, model.inference_shapes(max_length), seed)["params"]
  checkpoints.save_params(str(path), 0, params)
  layout.write_inference_files(str(path), model, list(languages), max_length, str(vocab_path))
  return path


def build_and_step(gin_file, bindings, make_batch):
  """Builds an experiment file's model and optimizer (no data read) and takes one train
  step on `make_batch(batch_size)`; returns (model, state, metrics)."""
  import gin
  import jax
  from vmx import experiment
  from vmx.training import partitioning
  from vmx.training.step import TrainStep
  gin.clear_config()
  try:
    model, tx, b, _, _ = experiment.build_experiment([gin_file], bindings)
  finally:
    gin.clear_config()
  batch = make_batch(model, b)
  trainer = TrainStep(model, tx, partitioning.Partitioner(num_devices=1),
                    {k: v.shape for k, v in batch.items()})
  state, metrics = trainer.step(trainer.create_state(0), batch)
  return model, jax.device_get(state), metrics


def assert_same_loss_and_grads_on_1_and_8_devices(model, batch, loss_of):
  """`loss_of(params, batch)` (and its gradients) on 1 device == on 8 (4 data x 2 model)."""
  import jax
  import numpy as np
  from vmx.training import optimizers, partitioning
  from vmx.training.step import TrainStep
  out = []
  for n, parts in ((1, 1), (8, 2)):
    part = partitioning.Partitioner(num_partitions=parts, num_devices=n)
    tr = TrainStep(model, optimizers.create_optimizer("adam", 1e-3), part,
                 {k: v.shape for k, v in batch.items()})
    state = tr.create_state(0)
    gb = part.global_batch(jax.tree.map(np.asarray, batch), tr.batch_shardings)
    fn = jax.jit(jax.value_and_grad(loss_of))
    with part.context():
      loss, grads = fn(state.params, gb)
    out.append((float(loss), jax.tree.map(np.asarray, grads)))
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
  jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=5e-4, atol=1e-5),
               out[0][1], out[1][1])


# Property-based campaigns (tests/test_fuzz.py): a budgeted sample in CI, the full
# campaign with HYPOTHESIS_PROFILE=campaign (>= 1000 generated cases in all).
try:
  from hypothesis import HealthCheck, settings
  _common = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
  settings.register_profile("ci", max_examples=60, **_common)
  settings.register_profile("campaign", max_examples=400, **_common)
  settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test extra; test_fuzz.py skips without it
  pass


GCS_BUCKET = "vmx-test"


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
  """An in-memory GCS emulator with one bucket: (its URL, the variables that point clients
  at it)."""
  pytest.importorskip("gcsfs", reason="gcsfs (test extra) is not installed")
  pytest.importorskip("gcp_storage_emulator",
                      reason="gcp-storage-emulator (test extra) is not installed")
  from benchmarks.common import start_gcs_emulator
  log = open(tmp_path_factory.mktemp("gcs") / "emulator.log", "w")
  try:
    proc, url, env = start_gcs_emulator(GCS_BUCKET, log=log)
  except RuntimeError as e:
    pytest.fail(f"{e} (see {log.name})")
  yield url, env
  proc.kill()
  proc.wait()
  log.close()
