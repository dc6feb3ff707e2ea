"""Pre-tokenization by language before SentencePiece (EMS §4.2), with no TensorFlow.

EMS tokenizes Chinese with jieba, Japanese with Juman++ and every other language with
the Moses tokenizer, lowercases, and only then trains and applies SentencePiece (§4.2).
vmx keeps that normalization with the vocabulary, so that the tasks (vmx/data/registration.py,
and so the index reader's cache), the vocabulary builder and `vmx.inference.Encoder`
apply the same one:

* lowercasing is SentencePiece's own `nmt_nfkc_cf` rule (NFKC + case folding), compiled
  into the `.model` (`vocab.train_sentencepiece(lowercase=True)`): every reader of the
  model applies it, after the pre-tokenization as in §4.2;
* pre-tokenization is a `Pretokenizer`, recorded in the vocabulary's `vmx_tokenizer.json`
  (`kind: sentencepiece`, vmx/data/vocab.py) next to its `.model`.

The language picks the segmenter (`segmenter`): jieba for Chinese (zh, zho, cmn, yue,
wuu: the authors' code's set), Juman++ for Japanese (ja, jpn), Moses with the language's
rules otherwise (its ISO 639-1 code for the languages sacremoses has data for; other
codes get Moses's generic rules and English non-breaking prefixes). A script suffix is
ignored (`cmn_Hans` is Chinese). With no language (an `Encoder.encode` call without
`lang=`), text gets Moses's generic rules: Chinese and Japanese are then not segmented
as in training, so pass `lang=`.

Juman++ is a C++ program (github.com/ku-nlp/jumanpp), not a Python package: the `jumanpp`
binary must be on PATH when Japanese text is pre-tokenized with it. `japanese='none'`
records instead that Japanese is left to SentencePiece (no pre-tokenization; another
vocabulary than the paper's). `check(languages)` raises a ConfigError up front when a
needed package or the binary is missing. The optional packages are the `ems` extra:
`pip install 'vmx[ems]'` (sacremoses, jieba).
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
from typing import Optional, Sequence, Union

from vmx.errors import ConfigError, DataError

METHODS = ("moses",)
JAPANESE_MODES = ("jumanpp", "none")
CHINESE = frozenset({"zh", "zho", "chi", "cmn", "yue", "wuu"})
JAPANESE = frozenset({"ja", "jpn"})
JUMANPP = "jumanpp"
EXTRA = "pip install 'vmx[ems]'"
# ISO 639-3 (and macrolanguage) codes -> the ISO 639-1 code under which sacremoses has
# non-breaking prefixes or language rules (its `NonbreakingPrefixes().available_langs`).
# Not derived from languages.ISO3 (that maps evaluation file codes to training codes, and
# its inverse would switch on rules, Korean's, that recorded vocabularies never used).
# Frozen: a recorded vocabulary's segmentation depends on it; extend it only together
# with a new `pretokenize` method name.
MOSES_LANGUAGES = {
    "asm": "as", "ben": "bn", "cat": "ca", "ces": "cs", "deu": "de", "ell": "el",
    "eng": "en", "spa": "es", "est": "et", "ekk": "et", "fin": "fi", "fra": "fr",
    "gle": "ga", "guj": "gu", "hin": "hi", "hun": "hu", "isl": "is", "ita": "it",
    "kan": "kn", "lit": "lt", "lav": "lv", "lvs": "lv", "mal": "ml",
    "mar": "mr", "nld": "nl", "ori": "or", "ory": "or", "pan": "pa", "pol": "pl",
    "por": "pt", "ron": "ro", "rus": "ru", "slk": "sk", "slv": "sl", "swe": "sv",
    "tam": "ta", "tel": "te", "tet": "tdt",
}
NO_LANGUAGE = "und"   # Moses's generic rules (sacremoses: English non-breaking prefixes)


def base_language(lang: Optional[str]) -> Optional[str]:
  """'cmn_Hans' -> 'cmn', 'zh-TW' -> 'zh'; None stays None."""
  if lang is None:
    return None
  return re.split(r"[_-]", str(lang).strip(), maxsplit=1)[0].lower() or None


def segmenter(lang: Optional[str], japanese: str = "jumanpp") -> str:
  """'jieba', 'jumanpp', 'none' (left to SentencePiece) or 'moses:<code>' for text in `lang`."""
  base = base_language(lang)
  if base in CHINESE:
    return "jieba"
  if base in JAPANESE:
    return "jumanpp" if japanese == "jumanpp" else "none"
  return "moses:" + MOSES_LANGUAGES.get(base, base or NO_LANGUAGE)


def _import(name: str, what: str, where: str):
  try:
    if name == "sacremoses":
      import sacremoses  # lazy: optional (the ems extra), only for Moses pre-tokenization
      return sacremoses
    import jieba  # lazy: optional (the ems extra), only for Chinese pre-tokenization
    jieba.setLogLevel(logging.WARNING)
    return jieba
  except ImportError:
    raise ConfigError(f"{where}: {what} needs the Python package {name}, which is not "
                      f"installed: {EXTRA}") from None


class Jumanpp:
  """One `jumanpp` process (Juman++ v2, default output format) for the life of the object:
  a line in, its morphemes out up to `EOS`; the surface forms joined by spaces. Guarded by
  a lock (tf.data calls in parallel)."""

  def __init__(self, binary: str):
    self.binary = binary
    self._proc = None
    self._lock = threading.Lock()

  def _start(self):
    try:
      self._proc = subprocess.Popen([self.binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
                                    bufsize=1)
    except OSError as e:
      raise DataError(f"could not start Juman++ ({self.binary}): {e}") from None

  def segment(self, texts: Sequence[str]) -> list[str]:
    out = []
    with self._lock:
      for text in texts:
        # Juman++ reads one sentence a line, and a line starting '# ' is a comment: any
        # whitespace run becomes one ideographic space (a token of its own, dropped below).
        line = re.sub(r"\s+", "\u3000", text.strip())
        if not line:
          out.append("")
          continue
        if self._proc is None or self._proc.poll() is not None:
          self._start()
        try:
          self._proc.stdin.write(line + "\n")
          self._proc.stdin.flush()
          words = []
          while True:
            row = self._proc.stdout.readline()
            if not row:
              raise DataError(f"Juman++ ({self.binary}) stopped while segmenting {text[:40]!r}")
            row = row.rstrip("\n")
            if row == "EOS":
              break
            if row.startswith("@ ") or not row:   # an alternative analysis
              continue
            surface = row.split(" ", 1)[0]
            if surface.strip():
              words.append(surface)
        except (BrokenPipeError, OSError) as e:
          self._proc = None
          raise DataError(f"Juman++ ({self.binary}) failed on {text[:40]!r}: {e}") from None
        out.append(" ".join(words))
    return out

  def close(self):
    if self._proc is not None and self._proc.poll() is None:
      self._proc.stdin.close()
      self._proc.wait(timeout=10)
    self._proc = None

  def __del__(self):
    try:
      self.close()
    except Exception:  # noqa: BLE001  (interpreter shutdown)
      pass


class Pretokenizer:
  """Text -> space-separated words, by language (see the module docstring).

  `method`: 'moses' (EMS §4.2: Moses, jieba for Chinese, Juman++ for Japanese).
  `japanese`: 'jumanpp' (the paper) or 'none' (Japanese text is left to SentencePiece).
  `where`: what set these (named in errors; `switch`: how to set japanese='none' there);
  `recorded`: they come from a vocabulary's `vmx_tokenizer.json` (a built vocabulary:
  they cannot be switched, only honoured).
  """

  def __init__(self, method: str = "moses", japanese: str = "jumanpp",
               where: str = "vocabulary_path", recorded: bool = False,
               switch: Optional[str] = None):
    if method not in METHODS:
      raise ConfigError(f"{where}.pretokenize = {method!r}: expected one of {METHODS} "
                        f"or None (no pre-tokenization)")
    if japanese not in JAPANESE_MODES:
      raise ConfigError(f"{where}.japanese = {japanese!r}: expected one of {JAPANESE_MODES}")
    self.method, self.japanese, self.where, self.recorded = method, japanese, where, recorded
    self.switch = switch or f"{where}.japanese = 'none'"
    self._moses = {}
    self._jumanpp = None
    self._lock = threading.Lock()

  @property
  def settings(self) -> dict:
    """What the vocabulary records (vmx_tokenizer.json) and its fingerprint hashes."""
    return {"pretokenize": self.method, "japanese": self.japanese}

  @classmethod
  def from_settings(cls, settings: dict, where: str, recorded: bool = True) -> "Pretokenizer":
    return cls(settings.get("pretokenize"), settings.get("japanese", "jumanpp"), where,
               recorded)

  def __eq__(self, other):
    return isinstance(other, Pretokenizer) and other.settings == self.settings

  def __hash__(self):
    return hash(tuple(sorted(self.settings.items())))

  def __repr__(self):
    return f"Pretokenizer(method={self.method!r}, japanese={self.japanese!r})"

  def check(self, languages: Sequence[Optional[str]], what: str = ""):
    """ConfigError now if text in any of `languages` could not be pre-tokenized here (a
    package or the Juman++ binary missing)."""
    kinds = {segmenter(l, self.japanese).split(":")[0] for l in languages} or {"moses"}
    about = f" ({what})" if what else ""
    if "moses" in kinds:
      _import("sacremoses", f"Moses pre-tokenization{about}", self.where)
    if "jieba" in kinds:
      _import("jieba", f"Chinese pre-tokenization{about}", self.where)
    if "jumanpp" in kinds and shutil.which(JUMANPP) is None:
      japanese = sorted({str(l) for l in languages if segmenter(l, self.japanese) == "jumanpp"})
      install = ("install Juman++ v2 (github.com/ku-nlp/jumanpp; a C++ program, not on PyPI) "
                 "and put `jumanpp` on PATH")
      if self.recorded:
        raise ConfigError(
            f"{self.where} records Japanese pre-tokenized with Juman++ (EMS §4.2) and "
            f"Japanese ({', '.join(japanese)}) is to be encoded{about}, but no `{JUMANPP}` "
            f"binary is on PATH: {install}")
      raise ConfigError(
          f"{self.where}.japanese = 'jumanpp': Japanese ({', '.join(japanese)}) is "
          f"pre-tokenized with Juman++ (EMS §4.2){about}, but no `{JUMANPP}` binary is on "
          f"PATH: {install}, or set {self.switch} to leave Japanese to SentencePiece (a "
          f"vocabulary of its own)")

  def _moses_tokenizer(self, code: str):
    with self._lock:
      if code not in self._moses:
        sacremoses = _import("sacremoses", "Moses pre-tokenization", self.where)
        self._moses[code] = sacremoses.MosesTokenizer(lang=code)
      return self._moses[code]

  def _juman(self) -> Jumanpp:
    with self._lock:
      if self._jumanpp is None:
        self.check(["jpn"], "this vocabulary's Japanese")
        self._jumanpp = Jumanpp(shutil.which(JUMANPP))
      return self._jumanpp

  def segment(self, texts: Sequence[str], kind: str) -> list[str]:
    """Texts of one segmenter (`segmenter()`'s value)."""
    if kind == "none":
      return list(texts)
    if kind == "jieba":
      jieba = _import("jieba", "Chinese pre-tokenization", self.where)
      return [" ".join(w for w in jieba.lcut(t) if w.strip()) for t in texts]
    if kind == "jumanpp":
      return self._juman().segment(texts)
    tok = self._moses_tokenizer(kind.split(":", 1)[1])
    # escape=False: the authors' inference code's setting; no &amp; &apos; entities.
    return [tok.tokenize(t, escape=False, return_str=True) for t in texts]

  def __call__(self, texts: Sequence[str],
               lang: Union[None, str, Sequence[Optional[str]]] = None) -> list[str]:
    """The texts pre-tokenized; `lang` one code for all, one per text, or None."""
    texts = list(texts)
    langs = [lang] * len(texts) if lang is None or isinstance(lang, str) else list(lang)
    if len(langs) != len(texts):
      raise DataError(f"pre-tokenization: {len(langs)} languages for {len(texts)} texts")
    groups = {}
    for i, l in enumerate(langs):
      groups.setdefault(segmenter(l, self.japanese), []).append(i)
    out = [""] * len(texts)
    for kind, idx in groups.items():
      for i, t in zip(idx, self.segment([texts[i] for i in idx], kind)):
        out[i] = t
    return out


def file_language(path: str) -> Optional[str]:
  """The language a training file's name gives, Moses-style (`train.deu.gz`, `corpus.en`,
  `x.cmn_Hans.txt`): the last dot-separated part, after `.gz` / `.txt`, when it looks like
  a language code (2-3 letters, optionally `_Script`); None otherwise."""
  parts = str(path).replace("\\", "/").rsplit("/", 1)[-1].split(".")
  while len(parts) > 1 and parts[-1] in ("gz", "txt"):
    parts.pop()
  if len(parts) < 2:
    return None
  code = parts[-1]
  return code if re.fullmatch(r"[a-z]{2,3}(_[A-Z][a-z]{3})?", code) else None
