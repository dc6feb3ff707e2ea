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
