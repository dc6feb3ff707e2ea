"""t5x-style command-line handling of gin files and bindings.

  --gin_file=NAME.gin        (repeatable) resolved against --gin_search_paths,
                             default: the repository's gin_configs/
  --gin.KEY=VALUE            (repeatable) a binding; VALUE is a gin literal, or a
                             plain string when it is not one (--gin.MODEL_DIR=/tmp/run)
  --gin_search_paths=A,B     extra directories for gin files and their includes
Errors (missing file, unknown configurable or binding, missing required value)
are reported as one line naming the file, line or binding.
"""
from __future__ import annotations

import importlib.util  # noqa: F401  gin 0.5 needs it imported before missing-path handling
import argparse
import logging
import re
import sys
from pathlib import Path
from typing import Sequence

import gin

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SEARCH_PATHS = (REPO_ROOT / "gin_configs",)


class ConfigError(Exception):
  """A user-facing configuration error (printed as one line, exit status 2)."""


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


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str], search_paths_flag: str = ""):
  """Imports vmx's configurables, then parses files and bindings (errors -> ConfigError)."""
  import vmx.configurables  # noqa: F401
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
    raise ConfigError(one_line(e)) from None
  unset = unset_required_macros()
  if unset:
    raise ConfigError(f"required macro(s) {', '.join(unset)} not set: pass e.g. "
                      f"--gin.{unset[0]}=VALUE")


def unset_required_macros() -> list[str]:
  """Macros still bound to %gin.REQUIRED (gin itself would pass the marker on)."""
  from gin import config as gin_config
  out = []
  for (scope, selector), params in gin_config._CONFIG.items():
    if selector == "gin.macro" and str(params.get("value")) == "%gin.REQUIRED":
      out.append(scope)
  return sorted(out)


def one_line(e: BaseException) -> str:
  """Gin errors are multi-line ('... In file "x.gin", line 3'); fold them."""
  text = str(e.args[0]) if getattr(e, "args", None) else str(e)
  text = " ".join(part.strip() for part in text.splitlines() if part.strip())
  return text.replace("  ", " ")


def run_main(main, argv=None):
  """Runs main(argv) printing configuration and data errors as one line (exit 2).

  Every launcher enters here before it imports jax, so this is where the host
  allocator is set up (vmx/host_memory.py: it must precede the runtime's threads).
  """
  from vmx import host_memory
  from vmx.data.download import DataError
  try:
    try:
      host_memory.configure()
    except ValueError as e:  # a bad VMX_HOST_MALLOC
      raise ConfigError(str(e)) from None
    return main(sys.argv[1:] if argv is None else argv)
  except (ConfigError, DataError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (ValueError, TypeError) as e:
    msg = one_line(e)
    if any(p in msg for p in _GIN_ERRORS):
      print(f"error: {msg}", file=sys.stderr)
      sys.exit(2)
    raise


# Messages of gin's own configuration errors (raised when a configurable is called).
_GIN_ERRORS = ("No configurable matching", "Required bindings", "not provided in config",
               "Unbound macro", "No binding for macro", "unknown parameter",
               "Configurable", "is not a parameter")


@gin.configurable
def experiment_objects(model=gin.REQUIRED, optimizer=gin.REQUIRED, batch_size=gin.REQUIRED,
                       max_length=gin.REQUIRED, partitioner=None):
  """What a train step needs, without data: see `build_experiment`."""
  return model, optimizer, batch_size, max_length, partitioner


def build_experiment(gin_files: Sequence[str], bindings: Sequence[str] = (),
                     search_paths_flag: str = ""):
  """(model, optimizer, batch_size, max_length, partitioner) of an experiment file,
  without reading data or a vocabulary (benchmarks, tests). MODEL_DIR may stay unset."""
  parse_gin(gin_files, ["MODEL_DIR = '/tmp/unused'", *bindings,
                        "experiment_objects.model = %MODEL",
                        "experiment_objects.optimizer = @create_optimizer()",
                        "experiment_objects.batch_size = %BATCH_SIZE",
                        "experiment_objects.max_length = %MAX_LENGTH",
                        "experiment_objects.partitioner = @Partitioner()"], search_paths_flag)
  return experiment_objects()
