"""Language codes: the ISO 639-1 codes (and regional variants) of evaluation and dev-set
files -> the ISO 639-3 codes vmx models are trained with (those of tatoeba-challenge and
Tatoeba, XTREME's mapping, where they have the language)."""
from __future__ import annotations

ISO3 = {
    "af": "afr", "am": "amh", "ar": "ara", "bg": "bul", "bn": "ben", "cs": "ces",
    "de": "deu", "el": "ell", "en": "eng", "es": "spa", "es_LA": "spa", "et": "est",
    "eu": "eus", "fa": "pes", "fi": "fin", "fr": "fra", "ha": "hau", "he": "heb",
    "hi": "hin", "hu": "hun", "id": "ind", "it": "ita", "ja": "jpn", "jv": "jav",
    "ka": "kat", "kk": "kaz", "km": "khm", "ko": "kor", "kr": "kau", "ku": "kur",
    "lg": "lug", "ln": "lin", "lt": "lit", "lv": "lav", "ml": "mal", "mr": "mar",
    "ms": "zsm", "my": "mya", "ne": "nep", "nl": "nld", "om": "orm", "pl": "pol",
    "ps": "pus", "pt": "por", "pt_BR": "por", "ro": "ron", "ru": "rus", "rw": "kin",
    "so": "som", "sw": "swh", "ta": "tam", "te": "tel", "th": "tha", "ti": "tir",
    "ti_ER": "tir", "ti_ET": "tir", "tl": "tgl", "tr": "tur", "ur": "urd", "vi": "vie",
    "zh": "cmn", "zu": "zul",
}


# XNLI's 15 languages (XNLI 1.0 and XNLI-MT 1.0's file names), the one list of them.
XNLI = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi",
        "zh")


def iso3(code: str) -> str:
  """ISO 639-3 for a code listed in ISO3; other codes are returned unchanged."""
  return ISO3.get(code, code)


# One language under two ISO 639-3 codes: an evaluation set's individual-language code ->
# the macrolanguage code a training corpus (tatoeba-challenge, wmt) files it under, where
# the individual language is the macrolanguage's standard form (Iranian Persian is what
# `fas` corpora hold). Dialects and distinct languages of a macrolanguage (arz, wuu, yue)
# are not listed: they are other languages to a model.
MACROLANGUAGE = {
    "arb": "ara", "azj": "aze", "bos": "hbs", "cmn": "zho", "ekk": "est", "gaz": "orm",
    "hrv": "hbs", "khk": "mon", "kmr": "kur", "lvs": "lav", "npi": "nep", "ory": "ori",
    "pes": "fas", "plt": "mlg", "quy": "que", "srp": "hbs", "swh": "swa", "uzn": "uzb",
    "ydd": "yid", "zsm": "msa",
}


def resolve(code: str, known) -> "str | None":
  """The code among `known` (a model's or a corpus' languages) that names the language
  `code` names: `code` itself; else a script variant of it (`cmn` -> `cmn_Hans`, the
  first in sorted order); else its macrolanguage (`pes` -> `fas`, MACROLANGUAGE) or a
  script variant of that; else, for a macrolanguage code, its standard individual
  language (`fas` -> `pes`). None when `known` has none of these."""
  known = set(known)
  reverse = [i for i, m in MACROLANGUAGE.items() if m == code]
  for c in [code, MACROLANGUAGE.get(code)] + reverse:
    if c is None:
      continue
    if c in known:
      return c
    variants = sorted(k for k in known if k.startswith(c + "_"))
    if variants:
      return variants[0]
  return None
