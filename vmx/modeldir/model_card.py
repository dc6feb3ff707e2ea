"""The model card (README.md) of an exported model: how it was trained and how it scored,
read from the run's own MODEL_DIR, nothing typed by hand.

- **Training**: config.gin's first lines (the experiment files, bindings and the
  experiment file's header: command, hardware, time, result; written by the trainer,
  `gin_utils.experiment_header`), the model class and its main settings from the same
  operative config, the languages (vmx_model.json), the checkpoint's step, and the
  Matryoshka sizes and int8 calibration when there are any.
- **Evaluation**: the figures of that checkpoint only: the in-training evaluation rows of
  metrics.jsonl at its step, and every result file of `launch/eval.py` under
  MODEL_DIR/eval/checkpoint_<step>*/ (task, main score, the vector it scored, its
  dataset revision), with each protocol report's figures (table, column, metric).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from vmx import quantize
from vmx.modeldir import layout
from vmx.modeldir.run import parse_bindings

SETTINGS = ("MODEL", "NUM_LAYERS", "EMB_DIM", "NUM_HEADS", "MLP_DIM", "VOCAB_SIZE",
            "MAX_LENGTH", "BATCH_SIZE", "TRAIN_STEPS", "OPTIMIZER", "LEARNING_RATE",
            "TEMPERATURE", "MATRYOSHKA_DIMS")


def _config(model_dir: Path) -> tuple[list, dict]:
  """(config.gin's leading comment lines, its bindings)."""
  path = model_dir / layout.CONFIG_FILE
  if not path.exists():
    return [], {}
  text = path.read_text(encoding="utf-8")
  head = []
  for line in text.splitlines():
    if not line.startswith("#") or line.startswith("# Macros:") or line.startswith("# ==="):
      break
    head.append(line[2:] if line.startswith("# ") else line[1:])
  return head, parse_bindings(text, str(path))


def _in_training(model_dir: Path, step: int) -> dict:
  path = model_dir / "metrics.jsonl"
  out = {}
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if row.get("step") == step:
        out.update({k: v for k, v in row.items() if isinstance(v, (int, float)) and
                    not k.startswith(("train/", "eval/")) and k not in ("step", "time")})
  return out


def _evaluations(model_dir: Path, step: int):
  """[(variant, [task rows]), ...], [(variant, protocol, figure rows)] of eval/."""
  tasks, protocols = [], []
  base = f"{layout.CHECKPOINT_PREFIX}_{step}"
  root = model_dir / "eval"
  if not root.is_dir():
    return tasks, protocols
  for d in sorted(p for p in root.iterdir() if p.is_dir() and
                  (p.name == base or p.name.startswith(base + "_"))):
    variant = d.name[len(base) + 1:] or "float32, all dimensions"
    rows = []
    for f in sorted(d.glob("*.json")):
      try:
        r = json.loads(f.read_text())
      except ValueError:
        continue
      if f.name.startswith("protocol_"):
        protocols.append((variant, r.get("paper") or f.stem[len("protocol_"):],
                          r.get("figures", [])))
      elif "main_score" in r:
        rows.append(r)
    if rows:
      tasks.append((variant, rows))
  return tasks, protocols


def _number(v) -> str:
  return "undefined" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


# How each library an export targets loads a folder and cuts a Matryoshka prefix
_USAGE = {
    "sentence-transformers": (["from sentence_transformers import SentenceTransformer",
                               "model = SentenceTransformer('{name}')"],
                              "`model.encode(..., truncate_dim=N)`"),
    "model2vec": (["from model2vec import StaticModel",
                   "model = StaticModel.from_pretrained('{name}')"],
                  "`StaticModel.from_pretrained(..., dimensionality=N)`"),
}


def render(model_dir, step: int, info: dict, name: Optional[str] = None,
           quantization_sizes=(), library: str = "sentence-transformers") -> str:
  """The model card's markdown, for a folder `library` ('sentence-transformers' or
  'model2vec') opens."""
  load, truncate = _USAGE[library]
  model_dir = Path(model_dir)
  name = name or model_dir.name
  head, bindings = _config(model_dir)
  model_cls = info["model"].get("__class__", "?").rpartition(":")[2]
  langs = info["languages"]
  out = ["---", f"library_name: {library}", "pipeline_tag: sentence-similarity",
         "tags:", f"- {library}", "- sentence-similarity", "- feature-extraction",
         "- vmx", "language:", *[f"- {l}" for l in langs], "---", "",
         f"# {name}", "",
         f"A multilingual sentence encoder trained with vmx ({model_cls}), exported at "
         f"checkpoint step {step}. Its vectors are unit length: compare them by cosine "
         f"(inner product). Everything below is read from the run's own files.", "",
         "## Usage", "", "```python", *[line.format(name=name) for line in load],
         "vectors = model.encode(['Where is the station?', 'Wo ist der Bahnhof?'])",
         "vectors @ vectors.T    # cosine similarities", "```", "",
         "## Training", ""]
  if head:
    out += ["The run's experiment (config.gin's header):", "", "```", *head, "```", ""]
  rows = [(k, bindings[k]) for k in SETTINGS if k in bindings]
  if rows:
    out += ["| setting | value |", "|---|---|", *[f"| `{k}` | `{v}` |" for k, v in rows], ""]
  out += [f"Languages ({len(langs)}, ISO 639-3): {', '.join(langs)}.",
          f"Maximum length: {info['max_length']} tokens. The whole operative configuration is "
          f"`vmx_config.gin` in this folder.", ""]
  dims = info["model"].get("matryoshka_dims") or []
  if dims:
    out += [f"Trained with Matryoshka dimensions {list(dims)}: the first N values of a "
            f"vector, renormalized, are an embedding of their own "
            f"({truncate}).", ""]
  if quantization_sizes:
    out += [f"int8 calibration (vmx/quantize.py) for vector sizes "
            f"{sorted(quantization_sizes)}: `vmx_quantization.json` in this folder.", ""]
  out += ["## Evaluation", ""]
  during = _in_training(model_dir, step)
  tasks, protocols = _evaluations(model_dir, step)
  if not during and not tasks:
    out += [f"No evaluation of checkpoint {step} was found in the run's directory "
            "(run `launch/eval.py` before exporting to have it here).", ""]
  if during:
    out += [f"During training, at step {step} (the run's own evaluation, metrics.jsonl):", "",
            "| metric | value |", "|---|---|",
            *[f"| {k} | {_number(v)} |" for k, v in sorted(during.items())], ""]
  for variant, rows in tasks:
    out += [f"`launch/eval.py` on checkpoint {step} ({variant}):", "",
            "| task | main score | vector scored | dataset revision |", "|---|---|---|---|",
            *[f"| {r['task_name']} | {_number(r['main_score'])} | {r.get('vector', '')} | "
              f"{r.get('dataset_revision', '')} |" for r in rows], ""]
  for variant, paper, figures in protocols:
    out += [f"The protocol of {paper} ({variant}):", "",
            "| table | column | value | metric | vector |", "|---|---|---|---|---|",
            *[f"| {f.get('table')} | {f.get('column')} | {_number(f.get('value'))} | "
              f"{f.get('metric')} | {f.get('vector')} |" for f in figures], ""]
  return "\n".join(out)


def write_with_card(model_dir, folder, step: int, info: dict, name: str,
                    library: str = "sentence-transformers"):
  """Puts beside an exported model what its card points to (the run's config.gin as
  `vmx_config.gin`, its int8 calibration as `vmx_quantization.json`) and the card,
  README.md."""
  model_dir, folder = Path(model_dir), Path(folder)
  for src, dst in ((layout.CONFIG_FILE, "vmx_config.gin"),
                   (quantize.FILE, "vmx_quantization.json")):
    if (model_dir / src).exists():
      shutil.copyfile(model_dir / src, folder / dst)
  (folder / "README.md").write_text(render(
      model_dir, step, info, name, quantization_sizes=quantize.load(model_dir).keys(),
      library=library), encoding="utf-8")
