"""Where data files come from: a local data dir, or a checked download cache.

Resolution order for a registry path such as `eval/tatoeba/v1/tatoeba.deu-eng.deu`:
 1. an explicit `data_dir` (gin macro DATA_DIR), else the `VMX_DATA_DIR` variable:
    the file must be there (layout of `../shared/data`);
 2. otherwise the cache (`VMX_CACHE_DIR`, default ~/.cache/vmx/data): a file already
    downloaded and verified; else it is downloaded from the mirrors named by
    `VMX_DATA_URL` (comma-separated base URLs, `BASE/PATH`) and then from its upstream
    URL, written to a temporary file, checked against the registry's size and sha256,
    and only then moved into place.
No TensorFlow here.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from vmx import storage
from vmx.errors import DataError
from vmx.storage import cache_dir

REGISTRY = Path(__file__).with_name("registry.tsv")


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, tuple[int, str, str]]:
  """path -> (bytes, sha256, upstream url or '')."""
  with open(REGISTRY, encoding="utf-8") as f:
    lines = [l for l in f if not l.startswith("#")]
  return {r["path"]: (int(r["bytes"]), r["sha256"], r["url"])
          for r in csv.DictReader(lines, delimiter="\t")}


def configured_data_dir(data_dir: Optional[str] = None) -> Optional[Path]:
  """The data dir from the argument/gin macro, else $VMX_DATA_DIR, else None."""
  d = data_dir or os.environ.get("VMX_DATA_DIR")
  if not d:
    return None
  p = Path(d).expanduser()
  if not p.is_dir():
    src = "data_dir" if data_dir else "VMX_DATA_DIR"
    raise DataError(f"{src}={d!r} is not a directory (expected the layout of shared/data: "
                    f"train/, eval/)")
  return p


def file_names(folder: str, data_dir: Optional[str] = None) -> list[str]:
  """Names of the files directly in registry-relative `folder` (e.g. `eval/tatoeba/v1`):
  the data dir's, else the download registry's, sorted."""
  root = configured_data_dir(data_dir)
  if root is not None:
    return sorted(p.name for p in (root / folder).glob("*") if p.is_file())
  prefix = folder.rstrip("/") + "/"
  return sorted(r[len(prefix):] for r in registry()
                if r.startswith(prefix) and "/" not in r[len(prefix):])


def available(rel: str, data_dir: Optional[str] = None) -> bool:
  """Whether `resolve(rel)` can succeed: the file is in the data dir, or (without one)
  in the registry (cached or downloadable)."""
  root = configured_data_dir(data_dir)
  return (root / rel).exists() if root is not None else rel in registry()


def sha256sum(path: Path) -> str:
  return storage.sha256(path)


def _urls(rel: str) -> list[str]:
  bases = [b.strip().rstrip("/") for b in os.environ.get("VMX_DATA_URL", "").split(",")
           if b.strip()]
  urls = [f"{b}/{rel}" for b in bases]
  upstream = registry().get(rel, (0, "", ""))[2]
  return urls + ([upstream] if upstream else [])


def download(rel: str, dest: Path, timeout: float = 60.0) -> Path:
  """Download registry file `rel` to `dest`, verifying size and sha256."""
  if rel not in registry():
    raise DataError(f"{rel}: not in the data registry {REGISTRY}")
  size, sha, _ = registry()[rel]
  urls = _urls(rel)
  if not urls:
    raise DataError(f"{rel}: no data dir and no download location: this file is built "
                    f"from upstream data (see shared/data/README.md); set VMX_DATA_DIR to a "
                    f"copy of the data or VMX_DATA_URL to a mirror")
  dest.parent.mkdir(parents=True, exist_ok=True)
  errors = []
  for url in urls:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
      with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
        h, n = hashlib.sha256(), 0
        for chunk in iter(lambda: resp.read(1 << 20), b""):
          out.write(chunk)
          h.update(chunk)
          n += len(chunk)
      if n != size or h.hexdigest() != sha:
        errors.append(f"{url}: got {n} bytes sha256 {h.hexdigest()[:12]}…, expected {size} "
                      f"bytes sha256 {sha[:12]}…")
        continue
      os.replace(tmp, dest)
      return dest
    except (urllib.error.URLError, OSError) as e:
      errors.append(f"{url}: {e}")
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  raise DataError(f"{rel}: download failed: " + "; ".join(errors))


def resolve(rel: str, data_dir: Optional[str] = None) -> Path:
  """Local path of registry-relative file `rel`, downloading it if needed."""
  root = configured_data_dir(data_dir)
  if root is not None:
    p = root / rel
    if not p.exists():
      raise DataError(f"{p}: no such file in data dir {root}")
    return p
  p = cache_dir() / rel
  if p.exists():
    return p
  return download(rel, p)
