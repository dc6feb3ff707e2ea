"""An experiment's gin config: every configurable registered, files and bindings parsed
and checked (`parse_gin`), and what a train step needs built without data
(`build_experiment`, for benchmarks and tests), and what it trains on
(`training_inputs`, for the cache builder and the input benchmark).

This is the one module that imports every configurable (vmx/configurables.py: the
models, the trainer, the data pipeline and the top-level `tasks` package), so it sits
above all of them; the static checks it runs are vmx/gin_utils.py's.
"""
from __future__ import annotations

import ast
import re
from typing import Sequence

import gin

import vmx.configurables  # noqa: F401  (registers every configurable with gin)
from vmx import storage
from vmx.data.inputs import TokenCacheInput
from vmx.errors import ConfigError
from vmx.gin_utils import parse_gin_files, unset_required_macros
from vmx.modeldir.run import parse_bindings


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str], search_paths_flag: str = ""):
  """Parses files and bindings (errors -> ConfigError), with vmx's configurables known."""
  parse_gin_files(gin_files, bindings, search_paths_flag)


# Bindings that name inputs which must exist before any long work starts (their names end
# so); outputs (MODEL_DIR, cache roots) are created, a vocabulary path may be built.
_INPUT_NAME = re.compile(r"(_file|_files|data_dir|_checkpoint_path|_sts17_dir|xnli_mt_dir)$",
                         re.IGNORECASE)


def check_paths():
  """ConfigError naming the binding for the first input path of the parsed config that
  does not exist (files, directories, an initial checkpoint without vmx_model.json)."""
  for binding, text in parse_bindings(gin.config_str()).items():
    if not _INPUT_NAME.search(binding.rpartition(".")[2] or binding):
      continue
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):   # a reference (%MACRO, @fn()): checked where it is bound
      continue
    paths = [value] if isinstance(value, str) else (
        [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else [])
    for p in paths:
      if p and not storage.path(p).exists():
        raise ConfigError(f"{binding} = {p!r}: no such file or directory")
      if p and binding.lower().endswith("checkpoint_path") and not (
          storage.path(p) / "vmx_model.json").exists():
        raise ConfigError(f"{binding} = {p!r}: not a vmx model directory (no vmx_model.json; "
                          f"launch/import_checkpoint.py makes one from a Hugging Face "
                          f"checkpoint)")


@gin.configurable
def experiment_objects(model=gin.REQUIRED, optimizer=gin.REQUIRED, batch_size=gin.REQUIRED,
                       max_length=gin.REQUIRED, partitioner=None):
  """What a train step needs, without data: see `build_experiment`."""
  return model, optimizer, batch_size, max_length, partitioner


def parse_experiment(gin_files: Sequence[str], bindings: Sequence[str] = (),
                     search_paths_flag: str = ""):
  """parse_gin for tools that inspect an experiment without running it (benchmarks,
  tests): MODEL_DIR may stay unset, and INITIAL_CHECKPOINT_PATH where the files leave it
  required (None then). A path the files set is kept: it may be the vocabulary too
  (VOCAB_PATH = %INITIAL_CHECKPOINT_PATH, an imported tokenizer)."""
  base = ["MODEL_DIR = '/tmp/unused'"]
  try:
    parse_gin(gin_files, [*base, *bindings], search_paths_flag)
  except ConfigError:
    if "INITIAL_CHECKPOINT_PATH" not in unset_required_macros():
      raise
    gin.clear_config()
    parse_gin(gin_files, [*base, "INITIAL_CHECKPOINT_PATH = None", *bindings],
              search_paths_flag)


def build_experiment(gin_files: Sequence[str], bindings: Sequence[str] = (),
                     search_paths_flag: str = ""):
  """(model, optimizer, batch_size, max_length, partitioner) of an experiment file,
  without reading data, a vocabulary or an initial checkpoint (benchmarks, tests)."""
  parse_experiment(gin_files, [*bindings,
                               "experiment_objects.model = %MODEL",
                               "experiment_objects.batch_size = %BATCH_SIZE",
                               "experiment_objects.max_length = %MAX_LENGTH",
                               "experiment_objects.partitioner = @Partitioner()"],
                   search_paths_flag)
  # The run's optimizer binding (create_optimizer, or multi_optimizer over subsets).
  gin.bind_parameter("experiment_objects.optimizer", gin.query_parameter("train.optimizer"))
  return experiment_objects()


@gin.configurable
def input_objects(model=gin.REQUIRED, train_dataset_cfg=None, phases=None, random_seed=0):
  """What the run trains on: see `training_inputs`."""
  return model, train_dataset_cfg, phases, random_seed


def training_inputs(gin_files: Sequence[str], bindings: Sequence[str] = (),
                    search_paths_flag: str = "") -> list:
  """[(phase name, model, dataset config, data seed)] of an experiment file, one per
  phase (one, named `train`, without phases), the seeds as the trainer derives them."""
  parse_experiment(gin_files, [*bindings, "input_objects.model = %MODEL"], search_paths_flag)
  for name in ("train_dataset_cfg", "phases", "random_seed"):
    try:
      gin.bind_parameter(f"input_objects.{name}", gin.query_parameter(f"train.{name}"))
    except ValueError:   # not bound in this experiment
      pass
  model, cfg, phases, seed = input_objects()
  if cfg is not None:
    return [("train", model, cfg, seed)]
  if not phases:
    raise ConfigError("the experiment sets neither train.train_dataset_cfg nor train.phases")
  # the phases that read dataset configs (a phase may hold another Input)
  return [(ph.name, ph.model or model, ph.input.cfg, seed + 1000 * i)
          for i, ph in enumerate(phases) if isinstance(ph.input, TokenCacheInput)]
