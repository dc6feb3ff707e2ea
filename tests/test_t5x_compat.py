"""vmx models under t5x's trainer (vmx/t5x_compat.py).

Without t5x (it is not on PyPI): every logical axis of every method's parameters and
flax_mutables has a t5x axis rule and an Adafactor factor rule, and every parameter of rank
above 2 gets a complete factorization; `T5XModel` adds the `<collection>_axes` t5x shards
flax_mutables by, refuses the models t5x's trainer cannot train, and writes what
`Encoder.from_checkpoint` needs; t5x checkpoints in both of t5x's layouts (Orbax
`checkpoint_<step>/state/`, legacy msgpack + TensorStore) open in `Encoder.from_checkpoint`
with the exact parameters, and a mismatching one is an error naming the parameter.

With t5x importable (`PYTHONPATH=/path/to/t5x python -m pytest tests/test_t5x_compat.py`):
`python -m t5x.train` trains gin_configs/t5x/contrastive_tiny.gin on real data, and
`Encoder.from_checkpoint` encodes with its checkpoint.
"""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import DATA_DIR, REPO, needs_data

TINY = ["NUM_LAYERS = 2", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32", "VOCAB_SIZE = 64",
        "MAX_LENGTH = 8", "BATCH_SIZE = 8", "NUM_PARTITIONS = 1"]
# One experiment per method family and encoder family (vmx, bert, t5, xlmr; scanned layers).
EXPERIMENTS = ["contrastive_tiny.gin", "contrastive_minilm.gin", "contrastive_24l_mt5.gin",
               "vmsst_tiny.gin", "vmsst_24l.gin", "ems_tiny.gin", "mpcl_tiny.gin",
               "mpcl_xlmr.gin", "infoxlm_tiny.gin", "emmax_tiny.gin"]


def _variables(name):
  import gin
  from vmx import experiment
  from vmx.data import pipeline
  from vmx.data.inputs import TokenCacheInput
  gin.clear_config()
  try:
    model, _, b, length, _ = experiment.build_experiment([name], TINY)
  finally:
    gin.clear_config()
  uniform = pipeline.uniform_config(model.FEATURE_CONVERTER_CLS, b, length)
  shapes = TokenCacheInput(uniform).batch_shapes(model)
  return model, jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0),
                                                                   shapes))


def _axes(tree):
  from flax import traverse_util
  from flax.linen import partitioning as nnp
  return {"/".join(k): tuple(v)
          for k, v in traverse_util.flatten_dict(nnp.get_axis_names(tree)).items()}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_axis_has_t5x_rules_and_3d_params_factor(name):
  from flax import traverse_util
  from vmx import t5x_compat
  from vmx.training.partitioning import STANDARD_LOGICAL_AXIS_RULES
  model, variables = _variables(name)
  params_axes = _axes(variables["params_axes"])
  mutables = {k: v for k, v in variables.items() if k != "params" and not k.endswith("_axes")}
  mut_axes = model.flax_mutables_axes(
      traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in params_axes.items()}),
      mutables) if mutables else None
  names = {a for axes in params_axes.values() for a in axes}
  if mut_axes:
    names |= {a for axes in jax.tree.leaves(mut_axes, is_leaf=lambda x: isinstance(x, tuple))
              for a in axes}
  names.discard(None)
  t5x_axis_names = t5x_compat.T5X_AXIS_RULE_NAMES | {k for k, _ in t5x_compat.VMX_AXIS_RULES}
  assert names <= t5x_axis_names, f"{name}: no t5x axis rule for {names - t5x_axis_names}"
  assert names <= {k for k, _ in STANDARD_LOGICAL_AXIS_RULES}   # vmx's own mesh rules too
  factor = {**t5x_compat.T5X_FACTOR_RULES, **t5x_compat.VMX_FACTOR_RULES}
  param_names = {a for axes in params_axes.values() for a in axes}
  assert None not in param_names, f"{name}: a parameter axis without a name"
  assert param_names <= set(factor), f"{name}: no factor rule for {param_names - set(factor)}"
  for path, axes in params_axes.items():
    if len(axes) <= 2:
      continue                  # t5x's heuristic factorization, whatever the rules
    dims = [factor[a] for a in axes]
    # t5x: ROW and COLUMN together factor; with a NONE beside them it is an error.
    if "row" in dims and "col" in dims:
      assert "none" not in dims, f"{name}: {path} {axes} -> {dims}: incomplete for t5x"
  # A scanned model's layer axis is t5x's batch dimension.
  if name == "vmsst_24l.gin":
    assert any(axes[0] == "layers" for axes in params_axes.values())


def test_t5x_model_adds_mutables_axes_and_refuses_what_t5x_cannot_train(tmp_path):
  import flax
  from flax import traverse_util
  from vmx import t5x_compat
  from vmx.errors import ConfigError
  model, variables = _variables("vmsst_tiny.gin")
  mutables = {k for k in variables if k != "params" and not k.endswith("_axes")}
  assert mutables, "vmsst keeps its KL-annealing state in flax_mutables"
  wrapped = t5x_compat.T5XModel(model, optimizer_def=None)
  b = 4
  shapes = {"left_tokens": (b, 8), "right_tokens": (b, 8), "left_lang": (b,),
            "right_lang": (b,)}
  out = jax.eval_shape(lambda: wrapped.get_initial_variables(jax.random.PRNGKey(0), shapes))
  for coll in mutables:
    axes = _axes(out[f"{coll}_axes"])
    leaves = {"/".join(k): v for k, v in traverse_util.flatten_dict(
        flax.core.unfreeze(out[coll])).items()}
    assert set(axes) == set(leaves)                      # what t5x's train_state checks
    assert all(len(axes[k]) == np.ndim(leaves[k]) for k in leaves)
  assert wrapped.FEATURE_CONVERTER_CLS is model.FEATURE_CONVERTER_CLS

  infoxlm, _ = _variables("infoxlm_tiny.gin")
  with pytest.raises(ConfigError, match=r"after_update.*launch/train.py"):
    t5x_compat.T5XModel(infoxlm, optimizer_def=None)
  with pytest.raises(ConfigError, match=r"also bind T5XModel.vocabulary"):
    t5x_compat.T5XModel(model, optimizer_def=None, model_dir=str(tmp_path / "m"))


def _toy_model_dir(tmp_path):
  """A vmx model_dir (vmx_model.json + vocabulary) of a tiny CONTRASTIVE model, and its
  parameters at random."""
  import flax
  from vmx.data import vocab
  from vmx import encoders, t5x_compat
  from vmx.models import DualEncoder, DualEncoderModel
  words = "alpha beta gamma delta epsilon zeta eta theta".split()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(" ".join(words[i:] + words[:i]) + "\n" for i in range(8)) * 20)
  vp = vocab.train_sentencepiece([str(corpus)], str(tmp_path / "toy.model"), 40)
  enc = encoders.TransformerEncoder(vocab_size=64, num_layers=1, emb_dim=16, num_heads=2,
                                    mlp_dim=32, max_length=8)
  model = DualEncoderModel(DualEncoder(enc), temperature=0.1)
  d = tmp_path / "t5x_run"
  t5x_compat.T5XModel(model, optimizer_def=None, model_dir=str(d), vocabulary=vp,
                      languages=["xx", "en"], max_length=8)
  assert json.loads((d / "vmx_model.json").read_text())["max_length"] == 8
  assert (d / "vocab.model").exists()
  shapes = {"left_tokens": (1, 8), "right_tokens": (1, 8)}
  params = jax.tree.map(np.asarray, model.get_initial_variables(jax.random.PRNGKey(3),
                                                                shapes)["params"])
  return d, model, flax.core.unfreeze(params)


def _write_legacy(step_dir, params):
  """A checkpoint in t5x's legacy layout (t5x/checkpoints.py, Checkpointer.save): msgpack
  {'version', 'optimizer': {'target', 'state'}}, arrays of 2+ dimensions in zarr
  directories named by their path, referenced by their TensorStore spec (relative path)."""
  import tensorstore as ts
  from flax import serialization, traverse_util
  step_dir.mkdir(parents=True)
  flat = traverse_util.flatten_dict(params)
  target = {}
  for k, a in flat.items():
    if a.ndim < 2:
      target[k] = a               # small arrays: inline, as t5x keeps unpartitioned ones
      continue
    rel = "target." + ".".join(k)
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": rel},
            "metadata": {"shape": list(a.shape), "chunks": list(a.shape), "dtype": "<f4",
                         "compressor": {"id": "gzip"}}}
    t = ts.open({**spec, "kvstore": {"driver": "file", "path": str(step_dir / rel)}},
                create=True, open=True).result()
    t.write(a).result()
    target[k] = spec
  state = {"version": 3, "optimizer": {"target": traverse_util.unflatten_dict(target),
                                       "state": {"step": np.int32(7)}}}
  (step_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(state))


def test_t5x_checkpoints_open_in_encoder(tmp_path):
  import orbax.checkpoint as ocp
  from vmx.errors import CheckpointError
  from vmx.inference import Encoder
  d, model, params = _toy_model_dir(tmp_path)
  # t5x's Orbax layout: checkpoint_<step>/state/ = PyTree {'target': params, 'state': ...}.
  with ocp.PyTreeCheckpointer() as ckptr:
    ckptr.save(d / "checkpoint_5" / "state", {"target": params,
                                                "state": {"step": np.int32(5)}})
  enc = Encoder.from_checkpoint(d)
  assert enc.revision == "checkpoint_5"
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, enc.params), params)
  v = enc.encode(["alpha beta", "gamma delta"])
  direct = np.asarray(model.encode_tokens(params, enc.tokenizer.encode(
      ["alpha beta", "gamma delta"], 8), None))
  np.testing.assert_allclose(v, direct, rtol=1e-5, atol=1e-6)

  # The legacy layout: the newest step is read.
  shifted = jax.tree.map(lambda a: a + 1.0, params)
  _write_legacy(d / "checkpoint_7", shifted)
  enc = Encoder.from_checkpoint(d)
  assert enc.revision == "checkpoint_7"
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, enc.params), shifted)
  assert Encoder.from_checkpoint(d, step=5).revision == "checkpoint_5"

  # A checkpoint of another model: the mismatch is named.
  wrong = jax.tree.map(np.copy, params)
  wrong["encoder"]["token_embed"]["embedding"] = np.zeros((65, 16), np.float32)
  _write_legacy(d / "checkpoint_9", wrong)
  with pytest.raises(CheckpointError, match=r"checkpoint_9.*token_embed/embedding has "
                                            r"shape \(65, 16\), the model \(64, 16\)"):
    Encoder.from_checkpoint(d)


T5X = importlib.util.find_spec("t5x") is not None


@needs_data
@pytest.mark.skipif(not T5X, reason="t5x is not importable (not on PyPI): run with "
                                    "PYTHONPATH=/path/to/t5x checkout")
def test_t5x_trainer_trains_a_vmx_model(tmp_path):
  import t5x
  from vmx.inference import Encoder
  t5x_root = os.path.dirname(os.path.dirname(t5x.__file__))
  out = subprocess.run(
      [sys.executable, "-m", "t5x.train", f"--gin_search_paths={t5x_root},{REPO / 'gin_configs'}",
       "--gin_file=t5x/contrastive_tiny.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
       "--gin.TRAIN_STEPS=20", "--gin.BATCH_SIZE=16", "--gin.TRAIN_LANGUAGES=['deu']",
       "--gin.LANGUAGES=['deu', 'eng']", "--gin.VOCAB_SIZE=2000",
       "--gin.utils.SaveCheckpointConfig.period=10", "--gin.train/utils.DatasetConfig.seed=0",
       "--gin.RANDOM_SEED=0"],
      cwd=REPO, env={**os.environ, "XLA_FLAGS": "", "VMX_DATA_DIR": DATA_DIR},
      capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-4000:]
  losses = [float(line.split("loss=")[1].split(",")[0]) for line in out.stderr.splitlines()
            if "collection=train" in line and "loss=" in line]
  # In-batch InfoNCE over 16 pairs starts at ln 16 = 2.77 (chance); 20 steps learn.
  assert len(losses) >= 2 and losses[-1] < np.log(16) - 0.3, losses
  enc = Encoder.from_checkpoint(tmp_path / "run")
  assert enc.revision == "checkpoint_20"
  # The factorization reference of the pieces test is t5x's own, and vmx's rules extend it.
  from t5x import adafactor
  from vmx import t5x_compat
  assert {k: ("col" if v.name == "COLUMN" else v.name.lower())
          for k, v in adafactor.standard_logical_factor_rules().items()} == \
      t5x_compat.T5X_FACTOR_RULES
  assert set(t5x_compat.logical_factor_rules()) == (set(t5x_compat.T5X_FACTOR_RULES)
                                                    | set(t5x_compat.VMX_FACTOR_RULES))
  v = enc.encode(["Hallo Welt", "Guten Morgen"])
  assert v.shape == (2, 128) and np.isfinite(v).all()
