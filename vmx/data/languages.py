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


def iso3(code: str) -> str:
  """ISO 639-3 for a code listed in ISO3; other codes are returned unchanged."""
  return ISO3.get(code, code)
