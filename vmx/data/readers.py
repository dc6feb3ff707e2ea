"""Corpus files: plain-Python readers and validators (no TensorFlow).

Parallel corpora come in two layouts:
  * Moses: two aligned files, line i of one is the translation of line i of the
    other (`train.deu.gz` / `train.eng.gz`); `.gz` is read transparently.
  * TSV: one file, `source<TAB>target` (columns configurable).
`validate_parallel` / `validate_tsv` read the files once, count pairs and raise
`DataError` naming the file and line of the first problem: a missing file, a
truncated or corrupt `.gz`, different line counts, an empty line, invalid UTF-8,
a missing column, or no usable pair at all (an empty corpus is never silently
dropped from a mixture: remove it from the languages instead). Results are cached
by (path, size, content hash) so a restart does not validate a large corpus again.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from vmx import storage
from vmx.errors import ConfigError, DataError
from vmx.storage import cache_dir

EMPTY_LINE_POLICIES = ("error", "skip")


def open_text(path) -> BinaryIO:
  """A local or remote (vmx/storage.py) text file, `.gz` decompressed."""
  path = storage.path(path)
  if not path.is_file():
    raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
  if not storage.is_remote(path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
  f = path.open("rb")
  if path.suffix != ".gz":
    return f
  g = gzip.GzipFile(fileobj=f, mode="rb")
  g.myfileobj = f          # closed with the GzipFile, as gzip.open's own file is
  return g


_READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, OSError)


def _read_error(path, lineno: int, e: BaseException) -> DataError:
  """A truncated/corrupt .gz (or an I/O error) while reading line `lineno`."""
  what = ("truncated or corrupt gzip data" if isinstance(e, (EOFError, gzip.BadGzipFile,
                                                              zlib.error)) else "read error")
  return DataError(f"{path}:{lineno}: {what} ({type(e).__name__}: {e}) after "
                   f"{lineno - 1} complete line(s)")


def raw_lines(path) -> Iterator[tuple[int, bytes]]:
  """(1-based line number, raw line) with read errors reported as DataError."""
  with open_text(path) as f:
    i = 0
    while True:
      try:
        raw = f.readline()
      except _READ_ERRORS as e:
        raise _read_error(path, i + 1, e) from None
      if not raw:
        return
      i += 1
      yield i, raw


def decode_line(raw: bytes, path, lineno: int) -> str:
  """One line's bytes as text (newline stripped); invalid UTF-8 is a DataError naming
  path:line."""
  try:
    return raw.decode("utf-8").rstrip("\r\n")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte {e.start} "
                    f"({raw[max(0, e.start - 8):e.start + 8]!r})") from None


def iter_lines(path) -> Iterator[tuple[int, str]]:
  """(1-based line number, decoded line without newline)."""
  for i, raw in raw_lines(path):
    yield i, decode_line(raw, path, i)


def stamp(paths) -> str:
  """The files' paths, sizes and content hashes (remote objects: size and time)."""
  out = []
  for p in paths:
    if not storage.path(p).is_file():
      raise DataError(f"{p}: no such file")
    if storage.is_remote(p):
      st = storage.path(p).stat()
      out.append(f"{p}:{st.length}:{st.mtime}")
    else:   # content, not only size and time: a file changed in place with its mtime kept
      st = os.stat(p)
      out.append(f"{Path(p).resolve()}:{st.st_size}:"
                 f"{_content_hash(os.fspath(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)}")
  return "|".join(out)


@functools.lru_cache(maxsize=4096)
def _content_hash(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
  """BLAKE2b of a file (the 58 MB of shared/data/train in 0.12 s), once per process per
  version of the file (its size, times and inode: a write in place changes the ctime
  even where the mtime is put back)."""
  del size, mtime_ns, ctime_ns, inode   # (the cache key)
  with open(path, "rb") as f:
    return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def remember(kind: str, paths, compute):
  """compute() (JSON-able), remembered under `kind` and the files' paths, sizes and content
  hashes (BLAKE2b, ~1 GB/s; remote objects: size and time) in the cache dir's
  validated.json: a file is validated again only when its bytes changed."""
  key = f"{kind}|{stamp(paths)}"
  store = cache_dir() / "validated.json"
  try:
    known = json.loads(store.read_text())
  except (OSError, ValueError):
    known = {}
  if key in known:
    return known[key]
  value = compute()
  known[key] = value
  try:
    store.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(store, json.dumps(known))
  except OSError:
    pass
  return value


def read_parallel(src_path, tgt_path, empty_lines: str = "error") -> Iterator[tuple[str, str]]:
  """Aligned (source, target) pairs of a Moses-layout corpus, validated as read."""
  if empty_lines not in EMPTY_LINE_POLICIES:
    raise ConfigError(f"empty_lines={empty_lines!r}; expected one of {EMPTY_LINE_POLICIES}")
  src, tgt = raw_lines(src_path), raw_lines(tgt_path)
  i = 0
  while True:
    (_, rs), (_, rt) = next(src, (0, b"")), next(tgt, (0, b""))
    i += 1
    if not rs or not rt:
      if rs or rt:
        short, long_ = (src_path, tgt_path) if not rs else (tgt_path, src_path)
        raise DataError(f"{short} has {i - 1} lines but {long_} has more (line {i} has no "
                        f"translation): Moses files must be aligned line by line")
      return
    s, t = decode_line(rs, src_path, i), decode_line(rt, tgt_path, i)
    if not s.strip() or not t.strip():
      if empty_lines == "skip":
        continue
      bad = src_path if not s.strip() else tgt_path
      raise DataError(f"{bad}:{i}: empty line (set empty_lines='skip' to drop such pairs)")
    yield s, t


def _nonempty(count: int, what: str, empty_lines: str) -> int:
  if count == 0:
    why = "is empty" if empty_lines == "error" else "has no pair without an empty side"
    raise DataError(f"{what} {why}: an empty corpus is not silently dropped from a mixture; "
                    f"remove it from the task's languages/files")
  return count


def validate_parallel(src_path, tgt_path, empty_lines: str = "error") -> int:
  """Number of usable pairs (> 0); raises DataError on the first bad line."""
  return remember(f"moses:{empty_lines}", [src_path, tgt_path],
                lambda: _nonempty(sum(1 for _ in read_parallel(src_path, tgt_path, empty_lines)),
                                  f"{src_path} / {tgt_path}", empty_lines))


def validate_text(path) -> int:
  """Non-empty lines (> 0) of a monolingual text file (empty lines are skipped when read);
  DataError naming the file and line on invalid UTF-8."""
  def count():
    n = sum(1 for _, line in iter_lines(path) if line.strip())
    if n == 0:
      raise DataError(f"{path} has no non-empty line: an empty corpus is not silently "
                      "dropped from a mixture; remove it from the task's languages/files")
    return n
  return remember("text", [path], count)


def read_tsv(path, columns=(0, 1), empty_lines: str = "error") -> Iterator[tuple[str, ...]]:
  """Selected columns of each TSV line, validated as read."""
  need = max(columns) + 1
  for i, line in iter_lines(path):
    fields = line.split("\t")
    if len(fields) < need:
      raise DataError(f"{path}:{i}: {len(fields)} tab-separated field(s), need at least {need}")
    row = tuple(fields[c] for c in columns)
    if any(not x.strip() for x in row):
      if empty_lines == "skip":
        continue
      raise DataError(f"{path}:{i}: empty field (set empty_lines='skip' to drop such rows)")
    yield row


def validate_tsv(path, columns=(0, 1), empty_lines: str = "error") -> int:
  """Number of usable rows (> 0); raises DataError on the first bad line."""
  return remember(f"tsv:{tuple(columns)}:{empty_lines}", [path],
                lambda: _nonempty(sum(1 for _ in read_tsv(path, columns, empty_lines)),
                                  str(path), empty_lines))


def read_nway_lines(paths: dict) -> tuple[list[str], list[list[str]]]:
  """N-way parallel line files {lang: path} (line i = the same sentence in every file).

  Returns (languages, rows): rows[i][j] is line i in languages[j], "" where that line
  is empty (the language is missing from that group). Files of different lengths are
  an error naming both.
  """
  langs = list(paths)
  columns = [[line.strip() for _, line in iter_lines(paths[l])] for l in langs]
  n = {l: len(c) for l, c in zip(langs, columns)}
  empty = [str(paths[l]) for l in langs if n[l] == 0]
  if empty:
    raise DataError(f"{empty[0]} is empty: remove it from the N-way files")
  if len(set(n.values())) > 1:
    a, b = min(n, key=n.get), max(n, key=n.get)
    raise DataError(f"N-way files must be aligned line by line: {paths[a]} has {n[a]} lines, "
                    f"{paths[b]} has {n[b]}")
  return langs, [list(r) for r in zip(*columns)]


def read_nway_tsv(path, languages=None, lang_col: int = 1, group_col: int = 2,
                  text_col: int = 3, header: bool = False) -> tuple[list[str], list[list[str]]]:
  """Groups of a `..., lang, group_id, text` TSV (e.g. Bible verses keyed by verse id).

  The first text of a (group, language) is kept (a language with several versions
  contributes one). Languages default to all, in order of appearance. `header`: the
  first line names the columns and is skipped.
  """
  groups, seen_langs = {}, {}
  for i, line in iter_lines(path):
    if header and i == 1:
      continue
    f = line.split("\t")
    if len(f) <= max(lang_col, group_col, text_col):
      raise DataError(f"{path}:{i}: expected at least {max(lang_col, group_col, text_col) + 1} "
                      f"tab-separated fields, got {len(f)}")
    lang, gid, text = f[lang_col], f[group_col], f[text_col].strip()
    if languages is not None and lang not in languages:
      continue
    seen_langs.setdefault(lang, None)
    if text:
      groups.setdefault(gid, {}).setdefault(lang, text)
  langs = list(languages) if languages is not None else list(seen_langs)
  missing = [l for l in langs if l not in seen_langs]
  if missing:
    raise DataError(f"{path}: no lines for languages {missing}")
  return langs, [[g.get(l, "") for l in langs] for g in groups.values()]
