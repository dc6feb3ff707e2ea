"""Every VMSST-family gin file (experiments and ablations) builds and takes a train step
at tiny sizes, and each ablation changes the parameter tree as it should. (A file of its
own so that pytest-xdist can run these compile-bound builds beside the other VMSST tests.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO


VARIANTS = sorted(str(p.relative_to(REPO / "gin_configs"))
                  for pat in ("vmsst*.gin", "bitranslation*.gin", "ablations/vmsst_*.gin")
                  for p in (REPO / "gin_configs").glob(pat))
TINY = ["NUM_LAYERS = 1", "EMB_DIM = 16", "NUM_HEADS = 2", "MLP_DIM = 32", "VOCAB_SIZE = 64",
        "MAX_LENGTH = 8", "BATCH_SIZE = 8", "NUM_PARTITIONS = 1"]
# The 6l/24l files set DECODER_LAYERS themselves; keep it small (compile time) except
# in the decoder-depth ablations, whose depth is what they test.
SMALL_DECODER = "DECODER_LAYERS = 2"
DECODER_DEPTH_ABLATIONS = ("ablations/vmsst_decoder_12l.gin", "ablations/vmsst_decoder_1l.gin")
BF16 = "vmsst_tiny.gin+bfloat16"  # the ACTIVATION_DTYPE switch, encoders and decoder
# What each ablation must change in the parameter tree.
STRUCTURE = {
    "ablations/vmsst_factorized_output.gin":
        lambda p: "output_factor" in p["decoder_0"] and "output" not in p["decoder_0"],
    "ablations/vmsst_4_language_encoders.gin":
        lambda p: "language_encoder_3" in p and "language_encoder_4" not in p,
    "ablations/vmsst_decoder_12l.gin":
        lambda p: p["decoder_0"]["layers"]["mlp"]["wi"]["kernel"].shape[0] == 12,
    "ablations/vmsst_decoder_1l.gin":
        lambda p: p["decoder_0"]["layers"]["mlp"]["wi"]["kernel"].shape[0] == 1,
    "ablations/vmsst_one_encoder.gin":
        lambda p: "language_encoder_0" not in p and "language_latent_0" in p,
    "ablations/vmsst_no_encoder_language_embedding.gin":
        lambda p: "language_embed" not in p["language_encoder_0"],
    "ablations/vmsst_no_decoder_language_embedding.gin":
        lambda p: p["decoder_0"]["start_embed"]["embedding"].shape[0] == 1,
    "ablations/vmsst_per_language.gin":   # Table 6: ar, en, es, tr: 4 language encoders and
        lambda p: ("decoder_3" in p and "language_encoder_3" in p     # 4 decoders (+ the
                   and "decoder_4" not in p),                        # semantic encoder)
    "vmsst_tiny.gin": lambda p: "language_encoder_0" in p and
        p["language_encoder_0"]["language_embed"]["embedding"].shape[0] == 9,
    "bitranslation_tiny.gin": lambda p: "language_encoder_0" not in p,
}
# The pretrained files' decoder is mT5's, re-purposed (§6.5): the t5 family, whose output
# keeps the rows for the sentence vector apart (`cond_kernel`) from mT5's lm_head.
for _name in ("vmsst_24l_mt5.gin", "bitranslation_24l_mt5.gin", "vmsst_contrastive_24l_mt5.gin"):
  STRUCTURE[_name] = lambda p: ("relative_attention_bias" in p["decoder_0"]
                                and "position_embed" not in p["decoder_0"]
                                and "cond_kernel" in p["decoder_0"]["output"]
                                and "wi_1" in p["decoder_0"]["layers"]["mlp"])


def _step_batch(b, length):
  rng = np.random.default_rng(0)
  toks = rng.integers(3, 64, size=(2, b, length)).astype(np.int32)
  toks[:, :, length - 2:] = 0
  return {"left_tokens": toks[0], "right_tokens": toks[1],
          "left_lang": np.arange(b, dtype=np.int32) % 3,
          "right_lang": (np.arange(b, dtype=np.int32) + 1) % 3}


# At TINY sizes an mT5-initialized file is vmsst_tiny with the t5 encoder and decoder
# families, which the fast tier steps (test_hf_import_export.py, from an imported mT5): the
# fast tier checks these files' parameter trees and the slow tier steps them. A 6-layer
# file is its 24-layer one (Adafactor, rsqrt) with unscanned encoders (the tiny file's)
# and a rematerialized decoder: their builds are in the slow tier; so are the 24-layer
# VMSST-CONTRASTIVE and BITRANSLATION
# files (their model paths are the tiny files', their scan/remat/Adafactor path
# vmsst_24l's) and the no-KL ablation (a scalar: KL_WEIGHT = 0).
SLOW_VARIANTS = ("vmsst_6l.gin", "vmsst_contrastive_6l.gin",
                 "bitranslation_6l.gin", "vmsst_contrastive_24l.gin", "bitranslation_24l.gin",
                 "ablations/vmsst_no_kl.gin")


# The fast tier takes a train step with these (the distinct code paths: plain, bfloat16,
# scanned + rematerialized + Adafactor, the contrastive term, the factorized output) and
# checks only the parameter tree (no compile) of the other fast-tier files, whose
# switches change the tree; the slow tier steps every file.
STEP_IN_FAST_TIER = ("vmsst_tiny.gin", BF16, "vmsst_24l.gin", "vmsst_contrastive_tiny.gin",
                     "ablations/vmsst_factorized_output.gin")


@pytest.mark.parametrize("name", [pytest.param(v, marks=pytest.mark.slow) if v in SLOW_VARIANTS
                                  else v for v in VARIANTS] + [BF16])
def test_every_variant_builds_and_takes_a_step(name, request):
  import gin
  from vmx import experiment
  from vmx.training import partitioning
  from vmx.training.step import TrainStep
  bindings = TINY + ([] if name in DECODER_DEPTH_ABLATIONS else [SMALL_DECODER])
  bf16 = name == BF16
  if bf16:
    name, bindings = "vmsst_tiny.gin", bindings + ["ACTIVATION_DTYPE = 'bfloat16'"]
  gin.clear_config()
  try:
    model, tx, b, length, _ = experiment.build_experiment([name], bindings)
  finally:
    gin.clear_config()
  if bf16:
    assert model.module.encoder.dtype == model.module.decoder.dtype == "bfloat16"
  batch = _step_batch(b, length)
  if name not in STEP_IN_FAST_TIER and not bf16 and not request.config.getoption("--run-slow"):
    shapes = jax.eval_shape(lambda: model.get_initial_variables(
        jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()}))
    assert STRUCTURE.get(name, lambda p: True)(shapes["params"]), name
    return
  trainer = TrainStep(model, tx, partitioning.Partitioner(num_devices=1),
                    {k: v.shape for k, v in batch.items()})
  state = trainer.create_state(0)
  before = jax.tree.map(np.asarray, state.params)
  if name in STRUCTURE:
    assert STRUCTURE[name](before), name
  if bf16:  # activations really are bfloat16 (parameters stay float32)
    hidden, _ = model.module.apply({"params": before}, batch["left_tokens"],
                                   method=lambda m, t: m.semantic_encoder(t))
    assert hidden.dtype == jnp.bfloat16
  state, metrics = trainer.step(state, batch)
  loss = float(metrics["loss"].compute())
  assert np.isfinite(loss) and loss > 0
  assert float(metrics["grad_norm"].compute()) > 0  # (the rsqrt warmup's lr is 0 at step 0)
  assert int(state.flax_mutables["annealing"]["updates"]) == 1


def test_random_language_assignment_is_seeded_balanced_and_random():
  """Table 4 "4 enc.": languages allocated to the encoders at random (A.1), seeded."""
  from vmx.configurables import random_language_assignment
  from vmx.errors import ConfigError
  langs = [f"l{i}" for i in range(10)]
  a = random_language_assignment(langs, 4, seed=0)
  assert a == random_language_assignment(langs, 4, seed=0)
  assert sorted(np.bincount(a, minlength=4).tolist()) == [2, 2, 3, 3]   # as even as it can be
  assert a != [i % 4 for i in range(10)]                                # not round-robin by id
  assert a != random_language_assignment(langs, 4, seed=1)
  with pytest.raises(ConfigError, match="num_groups"):
    random_language_assignment(langs, 11)


def test_table_6_rows_layer_the_four_languages():
  """Table 6 (A.2): CONTRASTIVE, BITRANSLATION, VMSST and the per-language model on ar,
  en, es, tr: data/vmsst_table6.gin layered after each 6-layer file gives the same
  training and evaluation languages."""
  import gin
  from vmx import experiment
  for files in (["contrastive_6l.gin", "data/vmsst_table6.gin"],
                ["bitranslation_6l.gin", "data/vmsst_table6.gin"],
                ["vmsst_6l.gin", "data/vmsst_table6.gin"],
                ["ablations/vmsst_per_language.gin"]):
    gin.clear_config()
    try:
      experiment.parse_gin(files, ["MODEL_DIR = '/tmp/unused'"])
      got = [gin.query_parameter(f"%{m}") for m in ("TRAIN_LANGUAGES", "LANGUAGES",
                                                    "EVAL_LANGUAGES")]
    finally:
      gin.clear_config()
    assert got == [["ara", "spa", "tur"], ["ara", "spa", "tur", "eng"],
                   ["ara", "spa", "tur"]], files
