"""FLORES-200 (EMMA-X Table 3 and Table 4): retrieval into English and the geometry metrics
on the head and long-tail language groups.

FLORES-200 as distributed (`flores200_dataset.tar.gz`, unpacked): `<dir>/<split>/<code>.<split>`
with `<code>` a language and script (`deu_Latn`, `zho_Hans`) and line i of every file the
same sentence; the public splits are `dev` (997 sentences) and `devtest` (1,012). EMMA-X
(App. B) evaluates its 204 languages on "3001 sentences", the sentences of all three of
FLORES' splits (dev + devtest + the hidden test); vmx reads the splits it is given,
concatenated in order (`splits`).

* Retrieval (Table 3): every language's sentences against English's (`eng_Latn`), cosine
  nearest neighbour, top-1 accuracy x100, xx -> En (the paper's direction; en -> xx is
  reported beside it). Groups: EMMA-X's FLORES head, the 68 languages A.1 lists
  (`EMMAX_FLORES_HEAD`; its uzb_Latn is FLORES-200's uzn_Latn), and the long tail, "the
  remaining" languages, English excluded. A model that reads language ids is scored on
  the languages it knows (`model_languages`); the others are listed as skipped.
* Geometry (Table 4): vmx/evaluation/geometry.py's metrics, the equations as printed
  (`*_eq16`, `*_eq17`, `*_eq18`) and vmx's variants, on the head, long-tail and all
  languages (English included in "all"), from the same embeddings. Eq. 16's scatter is
  singular when a language has no more sentences than the embedding has dimensions: NaN.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence


from vmx.data.languages import resolve
from vmx.errors import DataError
from vmx.evaluation import common, geometry, tatoeba

ENGLISH = "eng_Latn"
DEFAULT_SPLITS = ("dev", "devtest")
# EMMA-X A.1 (Appendix, "FLORES-200 ... Head"): 68 languages.
EMMAX_FLORES_HEAD = (
    "bel_Cyrl", "bos_Latn", "hun_Latn", "epo_Latn", "khm_Khmr", "urd_Arab", "srp_Cyrl",
    "jav_Latn", "hye_Armn", "gla_Latn", "por_Latn", "lit_Latn", "bul_Cyrl", "slk_Latn",
    "mal_Mlym", "ita_Latn", "nno_Latn", "mar_Deva", "hrv_Latn", "hin_Deva", "kat_Geor",
    "ben_Beng", "fin_Latn", "cym_Latn", "oci_Latn", "cat_Latn", "fao_Latn", "xho_Latn",
    "spa_Latn", "ron_Latn", "amh_Ethi", "ces_Latn", "swe_Latn", "nld_Latn", "tat_Cyrl",
    "kor_Hang", "glg_Latn", "fra_Latn", "eus_Latn", "ind_Latn", "dan_Latn", "tha_Thai",
    "deu_Latn", "tel_Telu", "afr_Latn", "pol_Latn", "est_Latn", "uig_Arab", "ukr_Cyrl",
    "uzb_Latn", "heb_Hebr", "kaz_Cyrl", "nob_Latn", "rus_Cyrl", "vie_Latn", "arb_Arab",
    "zho_Hans", "tuk_Latn", "khk_Cyrl", "jpn_Jpan", "ell_Grek", "isl_Latn", "tam_Taml",
    "slv_Latn", "tur_Latn", "mkd_Cyrl", "tgl_Latn", "gle_Latn")
# A.1 writes Uzbek as uzb_Latn; FLORES-200 files it as Northern Uzbek, uzn_Latn.
FLORES_CODES = {"uzb_Latn": "uzn_Latn"}
HEAD = tuple(FLORES_CODES.get(c, c) for c in EMMAX_FLORES_HEAD)


def model_language(code: str) -> str:
  """The ISO 639-3 code a vmx model knows a FLORES language by (`deu_Latn` -> `deu`)."""
  return code.split("_", 1)[0]


def read_codes(directory, splits: Sequence[str] = DEFAULT_SPLITS) -> list[str]:
  """The FLORES codes that every split in `splits` has (English among them)."""
  root = Path(directory)
  if not root.is_dir():
    raise DataError(f"task flores: {root} is not a directory (FLORES-200's "
                    f"flores200_dataset/, holding dev/ and devtest/)")
  per_split = []
  for split in splits:
    d = root / split
    codes = sorted(p.name[:-len(split) - 1] for p in d.glob(f"*.{split}")) if d.is_dir() else []
    if not codes:
      raise DataError(f"task flores: no <lang_Script>.{split} files in {d}")
    per_split.append(set(codes))
  common_codes = set.intersection(*per_split)
  if ENGLISH not in common_codes:
    raise DataError(f"task flores: {ENGLISH}.<split> missing in {root} (splits {list(splits)})")
  return sorted(common_codes)


def read(directory, splits: Sequence[str] = DEFAULT_SPLITS,
         languages: Optional[Sequence[str]] = None,
         files: Optional[common.DataFiles] = None) -> dict[str, list[str]]:
  """{FLORES code: sentences of `splits`, concatenated}, English always included; the
  languages must be line-aligned (a DataError names the file that is not)."""
  root = Path(directory)
  common_codes = set(read_codes(root, splits))
  wanted = sorted(common_codes) if languages is None else list(dict.fromkeys(
      [*languages, ENGLISH]))
  missing = [c for c in wanted if c not in common_codes]
  if missing:
    raise DataError(f"task flores: no {', '.join(missing[:5])} in every split of {root}")
  out = {}
  for code in wanted:
    lines = []
    for split in splits:
      path = root / split / f"{code}.{split}"
      lines += common.read_lines(files.path(str(path.absolute())) if files else path, "flores")
    out[code] = lines
  n = len(out[ENGLISH])
  bad = {c: len(v) for c, v in out.items() if len(v) != n}
  if bad:
    c = next(iter(bad))
    raise DataError(f"task flores: {root}/{{{','.join(splits)}}}/{c}: {bad[c]} lines, "
                    f"{ENGLISH} has {n}: the files must be line-aligned")
  return out


def evaluate(encode, directory, splits: Sequence[str] = DEFAULT_SPLITS,
             languages: Optional[Sequence[str]] = None, geometry_metrics: bool = True,
             progress: bool = False, files: Optional[common.DataFiles] = None,
             model_languages: Optional[Sequence[str]] = None) -> dict:
  """Retrieval into English per language with head / long-tail means (Table 3), and the
  geometry metrics per group (Table 4). `languages`: FLORES codes (default: all);
  `model_languages`: the languages of a model that reads language ids."""
  skipped = []
  if model_languages:
    if resolve(model_language(ENGLISH), model_languages) is None:
      raise DataError(f"task flores: the model does not know English ({ENGLISH}), the "
                      f"retrieval target")
    codes = read_codes(directory, splits) if languages is None else list(languages)
    skipped = [c for c in codes if resolve(model_language(c), model_languages) is None]
    languages = [c for c in codes if c not in skipped]
  texts = read(directory, splits, languages, files)
  embs = {c: encode(t, model_language(c))
          for c, t in common.progress_iter(texts.items(), "flores", progress)}
  per = {c: tatoeba.score_language(e, embs[ENGLISH]) for c, e in embs.items() if c != ENGLISH}
  head = [c for c in HEAD if c in per]
  tail = [c for c in per if c not in HEAD]
  out = {"scores": {"test": [
             {"hf_subset": c, "languages": [model_language(c)], "main_score": s["xx2en"],
              "accuracy_xx2en": s["xx2en"], "accuracy_en2xx": s["en2xx"], "n": s["n"]}
             for c, s in per.items()]},
         "main_score": common.mean([s["xx2en"] for s in per.values()]),
         "groups": {"head": tatoeba.group_means(per, head),
                    "long_tail": tatoeba.group_means(per, tail),
                    "all": tatoeba.group_means(per, list(per))},
         "head_missing": sorted(set(HEAD) - set(per)), "languages_skipped": skipped,
         "splits": list(splits), "n_sentences": len(texts[ENGLISH])}
  if geometry_metrics:
    out["geometry"] = {}
    for name, codes in (("head", head), ("long_tail", tail), ("all", list(embs))):
      if len(codes) >= 2:
        out["geometry"][name] = {**geometry.all_metrics({c: embs[c] for c in codes}),
                                 "n_languages": len(codes)}
  return out
