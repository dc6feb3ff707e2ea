"""Local and cloud paths in one place: MODEL_DIR, vocabularies, evaluation outputs and
corpora may be local or `gs://...` (any scheme `etils.epath` knows).

`path(p)` is an `etils.epath.Path` (local paths made absolute). epath picks the backend:
the OS for local paths; for `gs://`, TensorFlow's GCS filesystem when TensorFlow is
installed (the training install), else gcsfs (the inference install). `EPATH_USE_TF=false`
makes it use gcsfs always; gcsfs honours `STORAGE_EMULATOR_HOST`, TensorFlow's GCS
filesystem has no endpoint override, so a GCS emulator needs that setting. Orbax writes
its checkpoints through the same epath and tensorstore (`TENSORSTORE_GCS_HTTP_URL`).

Object stores have neither rename nor append. `write_atomic` writes a local file through a
temporary sibling and a rename, and a remote object in one upload (an object appears whole
or not at all); `open_atomic` does the same for a file written in pieces; `move_tree`
copies and then deletes. `local_copy` gives libraries that read only local files
(sentencepiece, tokenizers' WordPiece) a cached local copy.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import posixpath
import shutil
import socket
import time
from pathlib import Path as LocalPath
from typing import Optional, Union

from etils import epath

PathLike = Union[str, os.PathLike]


def cache_dir() -> LocalPath:
  """vmx's local data cache: `VMX_CACHE_DIR`, default ~/.cache/vmx/data. Downloads live in
  it; derived caches (remote copies, vocabularies, teacher vectors) in its parent."""
  return LocalPath(os.environ.get("VMX_CACHE_DIR", LocalPath.home() / ".cache" / "vmx" / "data"))


def is_remote(p: PathLike) -> bool:
  """True for a URI (`gs://bucket/dir`, `s3://...`), False for a local path."""
  return "://" in os.fspath(p)


def path(p: PathLike) -> epath.Path:
  """An epath.Path of `p`: a URI as is, a local path absolute with `~` expanded."""
  s = os.fspath(p)
  return epath.Path(s if is_remote(s) else os.path.abspath(os.path.expanduser(s)))


TMP_MARK = ".tmp-"   # <final name>.tmp-<host>-<pid>: a file being written by that process
STALE_AFTER_S = 3600.0


def tmp_name(p: PathLike) -> str:
  """The temporary sibling a local write goes through before its rename."""
  return f"{os.fspath(p)}{TMP_MARK}{socket.gethostname()}-{os.getpid()}"


def pid_alive(pid: int) -> bool:
  """Whether process `pid` of this host runs; a zombie (ended, not yet reaped by its parent,
  as a killed Beam worker can stay when its parent was killed too) does not."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  fields = process_stat(pid)
  if fields is None:   # gone since, or no /proc to ask (then kill's answer stands)
    return not os.path.isdir("/proc/self")
  return not fields or fields[0] not in ("Z", "X")


def process_stat(pid) -> Optional[list]:
  """The fields of /proc/<pid>/stat after the command name (state, parent pid, ...); None
  if there is no such process (or no /proc), [] if it cannot be read."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()
  except FileNotFoundError:
    return None
  except (OSError, IndexError):
    return []


def writer_gone(host: str, pid, last_seen: float, stale_after: float = STALE_AFTER_S
                ) -> Optional[str]:
  """Why the writer of a lock or a temporary file is gone (None: it may still run): on
  this host, its pid no longer runs; on another host, nothing it wrote for `stale_after`
  seconds (the rule of the run lock, vmx/modeldir/run.py, and of the token cache's
  leftovers)."""
  if host == socket.gethostname():
    if not isinstance(pid, int) or not pid_alive(pid):
      return f"process {pid} on this host no longer runs"
    return None
  age = time.time() - float(last_seen or 0)
  if age > stale_after:
    return f"not refreshed for {age / 60:.0f} min"
  return None


def disk_full(directory: PathLike, error: BaseException) -> bool:
  """Whether `error` (from writing under a local `directory`) means the disk is full:
  ENOSPC / EDQUOT, or a library's own error while the filesystem has no room left."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
    return True
  if "no space left" in str(error).lower():
    return True
  try:
    return shutil.disk_usage(os.fspath(directory)).free < (1 << 20)
  except OSError:
    return False


def remove_leftovers(directory: PathLike, prefix: str = "") -> list[str]:
  """Removes the temporary files and directories (`tmp_name`) in a local `directory`
  whose writer is gone (`writer_gone`, by their host, pid and time), of the names that
  start with `prefix`; returns their names."""
  d = os.fspath(path(directory))
  if is_remote(d) or not os.path.isdir(d):
    return []
  gone = []
  for entry in os.scandir(d):
    if TMP_MARK not in entry.name or not entry.name.startswith(prefix):
      continue
    host, _, pid = entry.name.rsplit(TMP_MARK, 1)[1].rpartition("-")
    try:
      mtime = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
      continue
    if writer_gone(host, int(pid) if pid.isdigit() else None, mtime):
      try:
        if entry.is_dir(follow_symlinks=False):
          shutil.rmtree(entry.path)
        else:
          os.remove(entry.path)
        gone.append(entry.name)
      except OSError:
        pass
  return gone


def write_atomic(p: PathLike, data: Union[str, bytes]) -> epath.Path:
  """Writes `data` so that readers see the old content or the new, never a part."""
  p = path(p)
  mode = "w" if isinstance(data, str) else "wb"
  kw = {"encoding": "utf-8"} if isinstance(data, str) else {}
  if is_remote(p):                       # one upload: the object appears whole
    with p.open(mode) as f:
      f.write(data)
    return p
  tmp = tmp_name(p)
  try:
    with open(tmp, mode, **kw) as f:
      f.write(data)
    os.replace(tmp, os.fspath(p))
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return p


@contextlib.contextmanager
def open_atomic(p: PathLike):
  """A text file to write `p` through in pieces, with `write_atomic`'s promise: readers
  see the old content or the new, never a part, and an error leaves `p` as it was. Local:
  a temporary sibling renamed at the end; remote: a local temporary file (under
  VMX_CACHE_DIR's `uploads/`) streamed to one object at the end. What a writer killed
  before that left behind (`tmp_name`) is removed by the next `open_atomic` of `p`."""
  p = path(p)
  if is_remote(p):
    staging = cache_dir().parent / "uploads"
    staging.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(staging / p.name)
  else:
    tmp = tmp_name(p)
  remove_leftovers(os.path.dirname(tmp), prefix=p.name + TMP_MARK)
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      yield f
    if is_remote(p):     # one upload, committed when it is closed whole
      with open(tmp, "rb") as src, p.open("wb") as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    else:
      os.replace(tmp, os.fspath(p))
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@functools.lru_cache(maxsize=None)
def _filesystem(protocol: str):
  import fsspec  # lazy: remote ranged reads only (gcsfs for gs://: the gcs and train extras)
  return fsspec.filesystem(protocol)


def read_range(p: PathLike, start: int, length: int) -> bytes:
  """`length` bytes of `p` from byte `start` (fewer at its end): a local pread, or ONE
  ranged request to the object store (fsspec; gcsfs for gs://, which honours
  STORAGE_EMULATOR_HOST). A missing file is FileNotFoundError."""
  s = os.fspath(p)
  if not is_remote(s):
    with open(s, "rb") as f:
      return os.pread(f.fileno(), length, start)
  fs = _filesystem(s.split("://", 1)[0])
  if length <= 0:
    return b""
  return fs.cat_file(s, start=start, end=start + length)


def remote_size(p: PathLike) -> int:
  """The size of a remote object (FileNotFoundError when it is missing)."""
  s = os.fspath(p)
  return int(_filesystem(s.split("://", 1)[0]).size(s))


def sha256(p: PathLike) -> str:
  h = hashlib.sha256()
  with path(p).open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def files_under(directory: PathLike):
  """(relative posix name, path) of every file under `directory`, sorted."""
  base = os.fspath(path(directory))
  scheme = base.split("://")[0] + "://" if is_remote(base) else ""
  out = []
  for root, _, names in path(base).walk():
    root = os.fspath(root)
    if scheme and not is_remote(root):   # gcsfs walks `bucket/dir`, without the scheme
      root = scheme + root
    for name in names:
      out.append((posixpath.relpath(f"{root}/{name}", base), path(f"{root}/{name}")))
  return sorted(out, key=lambda x: x[0])


def move_tree(src: PathLike, dst: PathLike):
  """Moves a directory (a local rename; remote: copy every object, then delete)."""
  src, dst = path(src), path(dst)
  if not (is_remote(src) or is_remote(dst)):
    shutil.move(os.fspath(src), os.fspath(dst))
    return
  for rel, f in files_under(src):
    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
    f.copy(dst / rel, overwrite=True)
  src.rmtree()


def copy_file(src: PathLike, dst: PathLike):
  """Copies one file, atomically at the destination (see `write_atomic`)."""
  write_atomic(dst, path(src).read_bytes())


def local_copy(p: PathLike) -> str:
  """A local filename with the content of `p`: `p` itself when local, else a copy cached
  under VMX_CACHE_DIR's `remote/` keyed by the URI and the object's size and time."""
  if not is_remote(p):
    return os.fspath(path(p))
  src = path(p)
  st = src.stat()
  key = hashlib.sha256(f"{src}|{st.length}|{st.mtime}".encode()).hexdigest()[:16]
  dest = cache_dir().parent / "remote" / key / src.name
  if not dest.exists():
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, src.read_bytes())
  return str(dest)
