"""Test setup: 8 simulated CPU devices, data dir from $VMX_DATA_DIR or ../shared/data."""
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pytest  # noqa: E402

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


def build_and_step(gin_file, bindings, make_batch):
  """Builds an experiment file's model and optimizer (no data read) and takes one train
  step on `make_batch(batch_size)`; returns (model, state, metrics)."""
  import gin
  import jax
  from vmx import gin_utils
  from vmx.training import partitioning
  from vmx.training.trainer import Trainer
  gin.clear_config()
  try:
    model, tx, b, _, _ = gin_utils.build_experiment([gin_file], bindings)
  finally:
    gin.clear_config()
  batch = make_batch(model, b)
  trainer = Trainer(model, tx, partitioning.Partitioner(num_devices=1),
                    {k: v.shape for k, v in batch.items()})
  state, metrics = trainer.step(trainer.create_state(0), batch)
  return model, jax.device_get(state), metrics


def assert_same_loss_and_grads_on_1_and_8_devices(model, batch, loss_of):
  """`loss_of(params, batch)` (and its gradients) on 1 device == on 8 (4 data x 2 model)."""
  import jax
  import numpy as np
  from vmx.training import optimizers, partitioning
  from vmx.training.trainer import Trainer
  out = []
  for n, parts in ((1, 1), (8, 2)):
    part = partitioning.Partitioner(num_partitions=parts, num_devices=n)
    tr = Trainer(model, optimizers.create_optimizer("adam", 1e-3), part,
                 {k: v.shape for k, v in batch.items()})
    state = tr.create_state(0)
    gb = part.host_local_to_global(jax.tree.map(np.asarray, batch), tr.batch_shardings)
    fn = jax.jit(jax.value_and_grad(loss_of))
    with part.context():
      loss, grads = fn(state.params, gb)
    out.append((float(loss), jax.tree.map(np.asarray, grads)))
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
  jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=5e-4, atol=1e-5),
               out[0][1], out[1][1])
