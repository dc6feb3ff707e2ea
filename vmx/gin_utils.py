"""t5x-style command-line handling of gin files and bindings.

  --gin_file=NAME.gin        (repeatable) resolved against --gin_search_paths,
                             default: the repository's gin_configs/
  --gin.KEY=VALUE            (repeatable) a binding; VALUE is a gin literal, or a
                             plain string when it is not one (--gin.MODEL_DIR=/tmp/run)
  --gin_search_paths=A,B     extra directories for gin files and their includes
  --verbose                  print the traceback of a vmx error too (vmx/cli.py)
Errors are reported as one line naming the file, line or binding, before anything
is built or compiled: a missing file, an unknown configurable or parameter, a macro
that is set but used by nothing (a misspelt `--gin.TRAIN_STEP=5`) or used but never
set, a literal of the wrong type for the parameter it reaches (`--gin.BATCH_SIZE=abc`);
each with the closest valid name. Range checks (`check_range`) name the binding and
the macro it came through.

This module imports no configurable: everything may use `check_range`. Parsing an
experiment (which registers every configurable first) is `vmx/experiment.py`; a
launcher's error handling is `vmx/cli.py`.
"""
from __future__ import annotations

import importlib.util  # noqa: F401  gin 0.5 needs it imported before missing-path handling
import argparse
import collections.abc
import difflib
import inspect
import logging
import re
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

import gin
from gin import config as gin_config

from vmx.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SEARCH_PATHS = (REPO_ROOT / "gin_configs",)


def add_gin_flags(parser: argparse.ArgumentParser):
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin file (name in gin_configs/ or a path); repeatable")
  parser.add_argument("--gin_search_paths", default="",
                      help="comma-separated directories searched for gin files")


def split_gin_bindings(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--gin.KEY=VALUE` flags from the rest of argv."""
  bindings, rest = [], []
  i = 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--gin."):
      key_value = a[len("--gin."):]
      if "=" not in key_value:
        if i + 1 >= len(argv):
          raise ConfigError(f"{a}: expected --gin.KEY=VALUE")
        key_value = f"{key_value}={argv[i + 1]}"
        i += 1
      key, value = key_value.split("=", 1)
      bindings.append(f"{key} = {_gin_value(value)}")
    else:
      rest.append(a)
    i += 1
  return bindings, rest


_GIN_VALUE = re.compile(r"""^\s*(['"\[\(\{@%]|-?\d|True\b|False\b|None\b)""")


def _gin_value(value: str) -> str:
  """A gin literal/reference as is; anything else becomes a quoted string."""
  if _GIN_VALUE.match(value):
    return value
  return repr(value)


def resolve_gin_file(name: str, search_paths: Sequence[Path]) -> str:
  p = Path(name)
  if p.is_file():
    return str(p)
  for d in search_paths:
    if (Path(d) / name).is_file():
      return str(Path(d) / name)
  raise ConfigError(f"gin file {name!r} not found (searched: "
                    f"{', '.join(str(d) for d in search_paths)})")


class _QuietSearch(logging.Filter):
  """gin logs an ERROR for every search-path miss while resolving an include."""

  def filter(self, record):
    return not str(record.msg).startswith("Path not found")


# What the last parse_gin_files read (for the run's record: `experiment_header`).
PARSED: dict = {}


def experiment_header() -> str:
  """Comment lines naming the experiment files and bindings last parsed, and the first
  file's own header (its command, hardware, time and result): config.gin's first lines,
  what a model card quotes (vmx/modeldir/model_card.py). Comments: no parser reads them."""
  if not PARSED:
    return ""
  files, bindings = PARSED["gin_files"], PARSED["bindings"]
  lines = [f"# vmx experiment: {', '.join(Path(f).name for f in files)}"]
  lines += [f"# binding: {b}" for b in bindings]
  header = []
  for line in Path(files[0]).read_text(encoding="utf-8").splitlines():
    if not line.startswith("#"):
      break
    header.append(line)
  if header:
    lines += [f"# header of {Path(files[0]).name}:"] + [
        f"#   {h[2:] if h.startswith('# ') else h[1:]}".rstrip() for h in header]
  return "\n".join(lines) + "\n\n"


def parse_gin_files(gin_files: Sequence[str], bindings: Sequence[str],
                    search_paths_flag: str = ""):
  """Parses files and bindings into gin's config and checks it (errors -> ConfigError).
  The configurables must be registered first: `vmx.experiment.parse_gin` does both."""
  logging.getLogger().addFilter(_QuietSearch())
  search = [Path(p) for p in search_paths_flag.split(",") if p] + list(DEFAULT_SEARCH_PATHS)
  for d in search:
    if d.is_dir():
      gin.add_config_file_search_path(str(d))
  if not gin_files:
    raise ConfigError("no --gin_file given (e.g. --gin_file=contrastive_tiny.gin)")
  files = [resolve_gin_file(f, search) for f in gin_files]
  try:
    gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
  except (ValueError, KeyError, SyntaxError, IOError, TypeError) as e:
    raise ConfigError(with_suggestion(one_line(e))) from None
  unset = unset_required_macros()
  if unset:
    raise ConfigError(f"required macro(s) {', '.join(unset)} not set: pass e.g. "
                      f"--gin.{unset[0]}=VALUE")
  check_config(bindings)
  PARSED.clear()
  PARSED.update(gin_files=[str(f) for f in files], bindings=list(bindings))


# ----------------------------------------------------------------------------
# Static checks of the parsed config (nothing is called, built or compiled).

def _closest(name: str, candidates) -> str:
  match = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
  if not match:
    match = [c for c in sorted(set(candidates)) if c.lower() == name.lower()]
  return f"; did you mean {match[0]}?" if match else ""


def _configurable_names() -> list[str]:
  out = []
  for selector, _ in gin_config._REGISTRY.items():
    out += [selector, selector.split(".")[-1]]
  return out


def with_suggestion(msg: str) -> str:
  """Adds the closest valid name to gin's 'no configurable' / 'no parameter' errors."""
  m = re.search(r"No configurable matching (?:reference )?'@?([\w.]+)", msg)
  if m:
    return msg + _closest(m.group(1), _configurable_names())
  m = re.search(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'", msg)
  if m:
    try:
      fn = gin_config._REGISTRY.get_match(m.group(1)).wrapped
      params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
      return msg + _closest(m.group(2), params)
    except (KeyError, TypeError, ValueError, AttributeError):
      return msg
  return msg


def _walk(value):
  """Every ConfigurableReference inside a binding value (lists, dicts, tuples)."""
  if isinstance(value, gin_config.ConfigurableReference):
    yield value
  elif isinstance(value, (list, tuple)):
    for v in value:
      yield from _walk(v)
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _walk(k)
      yield from _walk(v)


def _macro_name(ref) -> Optional[str]:
  if isinstance(ref, gin_config.ConfigurableReference) and ref.selector == "gin.macro":
    return ref.scoped_selector.rsplit("/", 1)[0]
  return None


def _macro_values() -> dict:
  return {scope: params.get("value") for (scope, selector), params in gin_config._CONFIG.items()
          if selector == "gin.macro"}


def _resolve(value, macros, chain=()):
  """(literal value, macros it came through); value stays a reference for @calls."""
  name = _macro_name(value)
  if name is None or name not in macros or name in chain or len(chain) > 20:
    return value, chain
  return _resolve(macros[name], macros, chain + (name,))


def _bound_from(bindings: Sequence[str]) -> set:
  return {b.split("=", 1)[0].strip() for b in bindings if "=" in b}


def check_config(bindings: Sequence[str] = ()):
  """Static checks after parsing; raises ConfigError naming the binding.

  - a macro that is set but referenced by nothing (`--gin.TRAIN_STEP=5` for TRAIN_STEPS);
  - a macro that is referenced (`%X`) but set nowhere;
  - a literal that reaches a parameter annotated int/float/str/bool/sequence/mapping
    (directly or through macros) with the wrong type.
  """
  macros = _macro_values()
  referenced = set()
  for (scope, selector), params in gin_config._CONFIG.items():
    for value in params.values():
      for ref in _walk(value):
        if _macro_name(ref) is not None:
          referenced.add(_macro_name(ref))
  from_cli = _bound_from(bindings)
  unused = sorted(set(macros) - referenced)
  if unused:
    name = unused[0]
    where = f"--gin.{name}" if name in from_cli else f"macro {name} (set in a gin file)"
    raise ConfigError(f"{where} is set but no binding uses it{_closest(name, referenced)}")
  undefined = sorted(referenced - set(macros))
  if undefined:
    name = undefined[0]
    raise ConfigError(f"macro %{name} is used but never set (pass --gin.{name}=VALUE or set "
                      f"it in a gin file){_closest(name, macros)}")
  for (scope, selector), params in gin_config._CONFIG.items():
    if selector == "gin.macro":
      continue
    hints = _type_hints(selector)
    for param, value in params.items():
      if param not in hints:
        continue
      literal, chain = _resolve(value, macros)
      if isinstance(literal, gin_config.ConfigurableReference):
        continue
      problem = _type_problem(literal, hints[param])
      if problem and problem != "?":
        target = f"{scope + '/' if scope else ''}{selector.split('.')[-1]}.{param}"
        src = f"{chain[-1]} = {literal!r} (reaches {target})" if chain else \
            f"{target} = {literal!r}"
        raise ConfigError(f"{src}: expected {problem}")


def _type_hints(selector: str) -> dict:
  try:
    fn = gin_config._REGISTRY.get_match(selector).wrapped
    return typing.get_type_hints(fn.__init__ if isinstance(fn, type) and
                                 not hasattr(fn, "__dataclass_fields__") else fn)
  except Exception:  # noqa: BLE001  (unresolvable annotations: no check)
    return {}


def _type_problem(value, hint) -> Optional[str]:
  """None if `value` fits `hint` (only plain types are checked), else what was expected."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union or type(hint).__name__ == "UnionType":
    if value is None and type(None) in args:
      return None
    plain = [a for a in args if a is not type(None)]
    problems = [_type_problem(value, a) for a in plain]
    if any(p is None for p in problems):
      return None
    known = [p for p in problems if p != "?"]
    return " or ".join(known + (["None"] if type(None) in args else [])) if \
        len(known) == len(problems) else None
  if isinstance(value, gin_config.ConfigurableReference) or value is gin.REQUIRED:
    return None
  if hint is bool:
    return None if isinstance(value, bool) else "True or False"
  if hint is int:
    return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
  if hint is float:
    return None if isinstance(value, (int, float)) and not isinstance(value, bool) else \
        "a number"
  if hint is str:
    return None if isinstance(value, str) else "a string"
  container = origin or hint
  if container in (list, tuple, collections.abc.Sequence):
    return None if isinstance(value, (list, tuple)) else "a list, e.g. ['a', 'b']"
  if container in (dict, collections.abc.Mapping):
    return None if isinstance(value, dict) else "a dict, e.g. {'a': 1}"
  return "?"  # not checked statically


def binding_source(configurable: str, param: str) -> str:
  """How `configurable.param` got its value: 'MACRO (scope/configurable.param)' when it
  is bound through a macro, 'configurable.param' otherwise."""
  macros = _macro_values()
  for (scope, selector), params in gin_config._CONFIG.items():
    if selector.split(".")[-1] == configurable and param in params:
      _, chain = _resolve(params[param], macros)
      target = f"{scope + '/' if scope else ''}{configurable}.{param}"
      return f"{chain[-1]} ({target})" if chain else target
  return f"{configurable}.{param}"


def check_range(ok: bool, configurable: str, param: str, value: Any, expected: str):
  """Raises a ConfigError naming the binding (and macro) unless `ok`."""
  if not ok:
    raise ConfigError(f"{binding_source(configurable, param)} = {value!r}: expected {expected}")


def positive_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def unset_required_macros() -> list[str]:
  """Macros still bound to %gin.REQUIRED (gin itself would pass the marker on)."""
  out = []
  for (scope, selector), params in gin_config._CONFIG.items():
    if selector == "gin.macro" and str(params.get("value")) == "%gin.REQUIRED":
      out.append(scope)
  return sorted(out)


def one_line(e: BaseException) -> str:
  """Gin errors are multi-line ('... In file "x.gin", line 3'); fold them."""
  text = str(e.args[0]) if getattr(e, "args", None) else str(e)
  # gin appends "In call to configurable 'train' (<function ...>)" to errors raised inside
  # a configurable: the message itself already names what is wrong.
  text = re.sub(r"\s*In call to configurable '[^']*' \([^)]*\)", "", text)
  text = " ".join(part.strip() for part in text.splitlines() if part.strip())
  return text.replace("  ", " ")


# Messages of gin's own configuration errors (raised when a configurable is called).
GIN_ERRORS = ("No configurable matching", "Required bindings", "not provided in config",
              "Unbound macro", "No binding for macro", "unknown parameter",
              "Configurable", "is not a parameter")
