"""InfoXLM (Chi et al., "InfoXLM: An Information-Theoretic Framework for Cross-Lingual
Language Model Pre-Training", NAACL 2021): MMLM + TLM + cross-lingual contrast (XLCO).
Details the paper leaves open follow the authors' code (github.com/microsoft/unilm,
infoxlm/: criterions/xlco.py, models/infoxlm.py, data/xlco_dataset.py).

One Transformer encoder f (XLM-R's architecture; `encoder/...` so an imported XLM-R
checkpoint loads as is) is trained by three tasks, each with its own batch every step
(vmx.data.pipeline.MultiTaskConfig, keys 'mmlm', 'tlm', 'xlco'):

  MMLM  monolingual sentences, fairseq masking (15% of the tokens; 80% <mask>, 10% a
        random token, 10% unchanged; vmx.masked_lm.mask_tokens), RoBERTa's LM head
        with the output layer tied to the token table; cross-entropy per masked token.
  TLM   a translation pair joined into one sequence, `<s> x </s> y </s>` (positions run
        on, no language embedding; the order of x and y drawn per example, as the
        authors store both directions), masked and predicted like MMLM.
  XLCO  MoCo between translations: the query q = W f_l(x) (f_l(x): the CLS of layer l)
        from the query encoder
        (the one trained by MMLM/TLM) at the universal layer l (8 of 12 for base, 12 of
        24 for large), the key k = W' f'_l(y)[CLS] from a momentum copy (f', W') of it
        (no gradient; updated after every optimizer step, k <- m k + (1 - m) q, by the
        trainer's `after_update` hook), negatives from a queue of past keys (131,072),
        score = dot product / tau (tau = 0.25, no normalization, the authors' default;
        `normalize=True`: cosines, MoCo's choice, for models trained from scratch):
          L_XLCO = -log exp(q.k / tau) / (exp(q.k / tau) + sum_{n in queue} exp(q.n / tau)).
        Which side of a pair is the query is drawn per example. Mixup contrast (the
        authors' code, always on there; `mixup=False` is the ablation): the query is
        two source sentences of two pairs joined in random order, the key their two
        translations joined in random order (x1 x2 / y2 y1 ...). The current batch's
        keys join the queue after the loss (the oldest leave): they are never
        negatives of their own step.
Loss = mmlm_weight * MMLM + tlm_weight * TLM + xlco_weight * XLCO (each averaged: per
masked token, per query; the authors' fairseq code sums and divides the gradient by
the total sample size instead).

Queue pre-fill (§4.1): a new run encodes queue_size / B_xlco batches of XLCO pairs with the
key encoder before step 1 (`prefill_batches` / `prefill`, called by the trainer), so XLCO
contrasts against a full queue from its first update. `prefill_queue=False`: the queue
starts empty and XLCO is off until training has filled it (the first queue_size / B_xlco
steps, while MMLM and TLM train). Non-gradient state (flax_mutables):
  momentum/params   the key encoder: the query encoder's parameters up to the universal
                    layer and the projection, sharded like them;
  queue/keys        [S, B_xlco, D] (S = queue_size / B_xlco slots of one step's keys),
                    split along 'data' on the B axis; queue/next (the slot written
                    next), queue/filled (slots holding keys).
Differences from the paper: XLCO inputs are not masked (the authors' code masks them
too). With MMLM_BLOCK_LENGTH (512 in the paper files; None, one sentence a row, in the
CPU-scale ones), MMLM reads blocks of consecutive sentences (App. A's 512-token blocks of
CC-100; vmx/data/token_blocks.py) of the training text, which is not CC-100. The
sentence vector for retrieval is f_l(x), the universal layer's CLS before the projection.
`pooling='mean'` replaces the CLS by the mean of the layer (for vmx's own vocabularies,
which have no <s> token: their first token is a word).
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from vmx import encoders, layers, losses, masked_lm
from vmx.errors import ConfigError
from vmx.models import momentum as moco
from vmx.models.base import SentenceEncoderModel, SentenceVector

MOMENTUM_SCHEDULES = ("constant", "inverse_sqrt", "infoxlm15")   # infoxlm15: inverse_sqrt's old name
TASKS = ("mmlm", "tlm", "xlco")


class InfoXLM(nn.Module):
  """Encoder + tied MLM head + XLCO projection at the universal layer."""
  encoder: encoders.TransformerEncoder
  universal_layer: Optional[int] = None   # XLCO's layer (None: the last)
  projection: bool = True                 # XLCO's d x d projection W (no bias)
  pooling: str = "first"                  # CLS (XLM-R's <s>); 'mean' for vocabularies without one
  # The retrieval (inference) vector: the universal layer pooled as XLCO's (None), or the
  # paper's evaluation vector, the mean of layer 7 for base (§4.2, after Hu et al. 2020):
  # retrieval_layer = 7, retrieval_pooling = 'mean'.
  retrieval_layer: Optional[int] = None
  retrieval_pooling: Optional[str] = None

  @property
  def xlco_layer(self) -> int:
    return self.encoder.num_layers if self.universal_layer is None else self.universal_layer

  def setup(self):
    enc = self.encoder
    if not 1 <= self.xlco_layer <= enc.num_layers:
      raise ConfigError(f"InfoXLM.universal_layer={self.universal_layer}: the encoder has "
                        f"{enc.num_layers} layers (TransformerEncoder.num_layers)")
    if self.retrieval_layer is not None and not 1 <= self.retrieval_layer <= enc.num_layers:
      raise ConfigError(f"InfoXLM.retrieval_layer={self.retrieval_layer}: the encoder has "
                        f"{enc.num_layers} layers")
    self.mlm_head = masked_lm.MlmHead(enc.vocab_size, enc.emb_dim, enc.norm_epsilon,
                                      scale_logits=enc.family != "bert", dtype=enc.dtype,
                                      name="mlm_head")
    if self.projection:
      self.xlco_projection = layers.Dense(enc.emb_dim, ("embed", "mlp"), use_bias=False,
                                          dtype=enc.dtype,
                                          kernel_init=nn.initializers.normal(0.02),
                                          name="xlco_projection")

  def mlm_logits(self, tokens_BxL, positions_BxP=None, deterministic: bool = True):
    """[B, P, V] logits at `positions_BxP` (default: every position) from the last layer
    (the head runs only where the loss needs it, as fairseq's masked_tokens)."""
    hidden, _ = self.encoder(tokens_BxL, None, deterministic=deterministic)
    if positions_BxP is not None:
      hidden = jnp.take_along_axis(hidden, positions_BxP[..., None], axis=1)
    return self.mlm_head(hidden, self.encoder.token_embed)

  def sentence_vector(self, tokens_BxL, deterministic: bool = True):
    """f_l(x): the universal layer pooled (CLS), [B, D] float32: the retrieval vector."""
    hidden, valid = self.encoder(tokens_BxL, None, deterministic=deterministic,
                                 depth=self.xlco_layer)
    return self.encoder.pool(hidden, valid, self.pooling)

  def retrieval_vector(self, tokens_BxL, deterministic: bool = True):
    """What inference embeds: `sentence_vector`, or layer `retrieval_layer` pooled with
    `retrieval_pooling` (the paper's Tatoeba vector: the mean of layer 7)."""
    if self.retrieval_layer is None and self.retrieval_pooling is None:
      return self.sentence_vector(tokens_BxL, deterministic)
    hidden, valid = self.encoder(tokens_BxL, None, deterministic=deterministic,
                                 depth=self.retrieval_layer or self.xlco_layer)
    return self.encoder.pool(hidden, valid, self.retrieval_pooling or self.pooling)

  def xlco_vector(self, tokens_BxL, deterministic: bool = True):
    """q (or k, with the momentum parameters): W f_l(x), [B, D] float32."""
    v = self.sentence_vector(tokens_BxL, deterministic)
    return self.xlco_projection(v).astype(jnp.float32) if self.projection else v

  def __call__(self, tokens_BxL, deterministic: bool = True):
    """Initialization: every parameter (MLM head, encoder, projection)."""
    return (self.mlm_logits(tokens_BxL, None, deterministic),
            self.xlco_vector(tokens_BxL, deterministic))


def mixup_partners(pair_B, b: int):
  """[B] the mixup partner of each row: the next row (mod B) whose language pair differs
  (`pair_B`: one id per pair), the next row itself where none differs or `pair_B` is None."""
  nxt = (jnp.arange(b) + 1) % b
  if pair_B is None or b < 2:
    return nxt
  cand = (jnp.arange(b)[:, None] + jnp.arange(1, b)[None, :]) % b              # [B, B-1]
  differs = pair_B[cand] != pair_B[:, None]
  first = cand[jnp.arange(b), jnp.argmax(differs, axis=1)]
  return jnp.where(jnp.any(differs, axis=1), first, nxt)


def momentum_coefficient(schedule: str, momentum: float, step):
  """m at update `step` (1, 2, ...): constant, or `inverse_sqrt`, min(1 - t^-0.51, 0.9995):
  Table 11's "*" schedule of the FROM SCRATCH setting (App. B). `infoxlm15` is the same
  schedule under its old name (vmx once gave it to InfoXLM15, for which the paper names
  no momentum)."""
  if schedule == "constant":
    return jnp.float32(momentum)
  t = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
  return jnp.minimum(1.0 - t ** -0.51, 0.9995)


def key_params(params, xlco_layer: int):
  """The parameters the key encoder needs: the encoder up to the universal layer (layers
  `layers_<i>` and scanned segments `layers_from_<i>` with i >= xlco_layer dropped) and
  the projection."""
  def above(name):
    first = name.rsplit("_", 1)[-1]
    return name.startswith("layers_") and first.isdigit() and int(first) >= xlco_layer
  enc = {k: v for k, v in params["encoder"].items() if not above(k)}
  out = {"encoder": enc}
  if "xlco_projection" in params:
    out["xlco_projection"] = params["xlco_projection"]
  return out


class InfoXLMModel(SentenceEncoderModel):
  """InfoXLM: MMLM + TLM + XLCO with a momentum key encoder and a queue."""
  # An imported XLM-R (or any dual encoder's `encoder/...`) fills the encoder, and an
  # imported masked-LM checkpoint's head (`mlm_head/...`, vmx/modeldir/hf_mlm_head.py) the
  # MLM head, under its own names (§4.1: initialized with XLM-R); the projection starts
  # fresh, and so does the head when the checkpoint has none.
  INITIAL_CHECKPOINT_ASSIGNMENT = ((r"encoder/(.*)", r"encoder/\1"),)
  CONFIG_FIELDS = ("module", "mask_id", "special_ids", "random_low", "mmlm_weight",
                   "tlm_weight", "xlco_weight", "temperature", "queue_size", "momentum",
                   "momentum_schedule", "mixup", "joined_drops_first", "normalize")

  def sentence_vector(self) -> SentenceVector:
    # the universal layer's (XLCO's) vector, or the layer / pooling chosen for retrieval
    m = self.module
    return SentenceVector(m.encoder, m.retrieval_pooling or m.pooling,
                          m.retrieval_layer or m.xlco_layer)

  def __init__(self, module: InfoXLM, mask_id: int = 1, special_ids: Sequence[int] = (),
               random_low: int = 1, mmlm_weight: float = 1.0, tlm_weight: float = 1.0,
               xlco_weight: float = 1.0, temperature: float = 0.25, queue_size: int = 131072,
               momentum: float = 0.9999, momentum_schedule: str = "constant",
               mixup: bool = True, joined_drops_first: bool = False, normalize: bool = False,
               prefill_queue: bool = True, xlco_start: int = 0,
               mixup_partner: str = "other_pair", uniform_init: Optional[float] = None,
               mask_duplicates: bool = True):
    super().__init__(module)
    self.mask_duplicates = mask_duplicates   # in-batch XLCO negatives (the queue's: kept)
    vocab = module.encoder.vocab_size
    if not 0 < mask_id < vocab:
      raise ConfigError(f"InfoXLMModel.mask_id={mask_id}: not an id of the {vocab}-row "
                        "token table (TransformerEncoder.vocab_size)")
    if not 0 < random_low < vocab:
      raise ConfigError(f"InfoXLMModel.random_low={random_low}: expected 1 .. {vocab - 1}")
    enc = module.encoder
    if not 1 <= module.xlco_layer <= enc.num_layers:
      raise ConfigError(f"InfoXLM.universal_layer={module.universal_layer}: the encoder has "
                        f"{enc.num_layers} layers (TransformerEncoder.num_layers)")
    if (enc.scan_layers and module.xlco_layer < enc.num_layers
        and module.xlco_layer not in enc.scan_boundaries):
      raise ConfigError(f"InfoXLM.universal_layer={module.universal_layer} below the top of a "
                        f"scanned encoder needs TransformerEncoder.scan_boundaries = "
                        f"[{module.xlco_layer}] (SCAN_BOUNDARIES), or SCAN_LAYERS = False")
    if momentum_schedule not in MOMENTUM_SCHEDULES:
      raise ConfigError(f"InfoXLMModel.momentum_schedule={momentum_schedule!r}; expected one "
                        f"of {MOMENTUM_SCHEDULES}")
    if not 0.0 <= momentum < 1.0:
      raise ConfigError(f"InfoXLMModel.momentum={momentum}: expected a value in [0, 1)")
    if not isinstance(queue_size, int) or queue_size <= 0:
      raise ConfigError(f"InfoXLMModel.queue_size={queue_size!r}: expected a positive integer")
    if min(mmlm_weight, tlm_weight, xlco_weight) < 0 or not (mmlm_weight or tlm_weight
                                                             or xlco_weight):
      raise ConfigError("InfoXLMModel: mmlm_weight, tlm_weight, xlco_weight must be >= 0 and "
                        "not all 0")
    self.mask_id, self.special_ids, self.random_low = mask_id, tuple(special_ids), random_low
    self.mmlm_weight, self.tlm_weight, self.xlco_weight = mmlm_weight, tlm_weight, xlco_weight
    self.temperature, self.queue_size = temperature, queue_size
    self.momentum, self.momentum_schedule = momentum, momentum_schedule
    self.mixup, self.joined_drops_first = mixup, joined_drops_first
    self.normalize = normalize
    self.prefill_queue = prefill_queue
    if isinstance(xlco_start, bool) or not isinstance(xlco_start, int) or xlco_start < 0:
      raise ConfigError(f"InfoXLMModel.xlco_start={xlco_start!r}: expected an update count >= 0")
    self.xlco_start = xlco_start
    if mixup_partner not in ("other_pair", "next_row"):
      raise ConfigError(f"InfoXLMModel.mixup_partner={mixup_partner!r}; expected 'other_pair' "
                        "(§3.3: a pair from another parallel corpus) or 'next_row'")
    self.mixup_partner = mixup_partner
    if uniform_init is not None and not uniform_init > 0:
      raise ConfigError(f"InfoXLMModel.uniform_init={uniform_init!r}: expected a scale > 0 "
                        "(App. B: 0.02), or None for the layers' own initializers")
    # App. B, from scratch: weights and embeddings U[-0.02, 0.02] (layers.redraw_uniform)
    self.uniform_init = uniform_init

  @property
  def tasks(self) -> tuple:
    """The tasks this model's steps read (those with a non-zero weight)."""
    w = {"mmlm": self.mmlm_weight, "tlm": self.tlm_weight, "xlco": self.xlco_weight}
    return tuple(t for t in TASKS if w[t])

  def feature_converter(self):
    kinds = {"mmlm": "MonolingualFeatureConverter", "tlm": "PairFeatureConverter",
             "xlco": "PairFeatureConverter"}
    return {t: kinds[t] for t in self.tasks}

  # --- pieces of the objective ---

  def _mask(self, rng, tokens_BxL):
    return masked_lm.mask_tokens(rng, tokens_BxL, mask_id=self.mask_id,
                                 vocab_size=self.module.encoder.vocab_size,
                                 special_ids=self.special_ids, random_low=self.random_low)

  @staticmethod
  def _swap(rng, a_BxL, b_BxL):
    """(a, b) or (b, a), drawn per row."""
    swap = jax.random.bernoulli(rng, 0.5, a_BxL.shape[:1])[:, None]
    return jnp.where(swap, b_BxL, a_BxL), jnp.where(swap, a_BxL, b_BxL)

  def _join(self, rng, a_BxL, b_BxL):
    """a b or b a (drawn per row), padding between them removed: [B, 2L]."""
    return masked_lm.join_padded(*self._swap(rng, a_BxL, b_BxL), self.joined_drops_first)

  def xlco_inputs(self, rng, left_BxL, right_BxL, pair_B=None):
    """(query tokens, key tokens): one side of each pair as the query (drawn per row);
    with mixup, row i joins pair i with a partner pair on both sides, each side in its
    own random order. The partner is the next row (mod B) whose language pair `pair_B`
    differs, "a randomly sampled translation pair from another parallel corpus" (§3.3;
    the rows are in random order); the next row itself where every row has the same
    pair, or with `mixup_partner='next_row'`."""
    k_dir, k_q, k_k = jax.random.split(rng, 3)
    src, tgt = self._swap(k_dir, left_BxL, right_BxL)
    if not self.mixup:
      return src, tgt
    partner = mixup_partners(None if self.mixup_partner == "next_row" else pair_B,
                             left_BxL.shape[0])
    return (self._join(k_q, src, src[partner]), self._join(k_k, tgt, tgt[partner]))

  @staticmethod
  def xlco_pairs(batch):
    """[B] the language pair of each XLCO row (unordered), or None without language ids."""
    if "xlco/left_lang" not in batch:
      return None
    a, b = batch["xlco/left_lang"], batch["xlco/right_lang"]
    return jnp.minimum(a, b) * 65536 + jnp.maximum(a, b)

  def _unit(self, v_BxD):
    return losses.l2_normalize(v_BxD) if self.normalize else v_BxD

  def _mlm_term(self, params, rng, tokens_BxL, dropout_rng):
    inputs, targets, weights = self._mask(rng, tokens_BxL)
    # A row has at most floor(0.15 L) + 1 picked positions: the head runs on those only.
    cap = min(tokens_BxL.shape[1], int(masked_lm.MASK_RATE * tokens_BxL.shape[1]) + 1)
    positions = jnp.argsort(weights == 0, axis=1, stable=True)[:, :cap]      # picked first
    logits = self.module.apply({"params": params}, inputs, positions, dropout_rng is None,
                               method=InfoXLM.mlm_logits,
                               rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    return losses.masked_lm_loss(logits, jnp.take_along_axis(targets, positions, axis=1),
                                 jnp.take_along_axis(weights, positions, axis=1))

  def compute_loss(self, params, batch, dropout_rng, flax_mutables):
    training = dropout_rng is not None
    rng = dropout_rng if training else jax.random.PRNGKey(0)   # eval: fixed masks
    k_mmlm, k_tlm, k_join, k_xlco, d_mmlm, d_tlm, d_xlco = jax.random.split(rng, 7)
    drop = (lambda k: k) if training else (lambda k: None)
    loss, m = jnp.zeros((), jnp.float32), {}
    if self.mmlm_weight:
      l, mm = self._mlm_term(params, k_mmlm, batch["mmlm/tokens"], drop(d_mmlm))
      loss += self.mmlm_weight * l
      m.update(mmlm_loss=l, mmlm_accuracy=mm["accuracy"])
    if self.tlm_weight:
      joined = self._join(k_join, batch["tlm/left_tokens"], batch["tlm/right_tokens"])
      l, mm = self._mlm_term(params, k_tlm, joined, drop(d_tlm))
      loss += self.tlm_weight * l
      m.update(tlm_loss=l, tlm_accuracy=mm["accuracy"])
    new = flax_mutables
    if self.xlco_weight:
      q_in, k_in = self.xlco_inputs(k_xlco, batch["xlco/left_tokens"],
                                    batch["xlco/right_tokens"], self.xlco_pairs(batch))
      q = self._unit(self.module.apply({"params": params}, q_in, not training,
                                       method=InfoXLM.xlco_vector,
                                       rngs={"dropout": d_xlco} if training else None))
      if flax_mutables is None:
        # Evaluation without train state: the current parameters give the keys and the
        # other keys of the batch are the negatives.
        k = jax.lax.stop_gradient(self._unit(self.module.apply(
            {"params": params}, k_in, method=InfoXLM.xlco_vector)))
        l, mm = losses.in_batch_softmax_loss(q, k, self.temperature, bidirectional=False,
                                             normalize=False, **self.duplicate_keys(
                                                 {k_: batch[f"xlco/{k_}"]
                                                  for k_ in ("left_tokens", "right_tokens")
                                                  if f"xlco/{k_}" in batch}))
        active = jnp.float32(1.0)
        acc = mm["in_batch_accuracy"]
      else:
        k = jax.lax.stop_gradient(self._unit(self.module.apply(
            {"params": flax_mutables["momentum"]["params"]}, k_in, method=InfoXLM.xlco_vector)))
        queue = flax_mutables["queue"]
        negatives, valid = moco.queued_keys(queue)
        l, mm = losses.queue_infonce(q, k, negatives, valid, self.temperature)
        active = moco.is_full(queue)                      # no pre-fill: XLCO off until full
        if self.xlco_start:   # App. B: the key encoder warms up before XLCO is enabled
          active = active & (flax_mutables["updates"] >= self.xlco_start)
        active = active.astype(jnp.float32)
        acc = mm["accuracy"]
        new = {**flax_mutables, "queue": moco.enqueue(queue, k)}
        m["queue_filled"] = queue["filled"].astype(jnp.float32) / queue["keys"].shape[0]
      loss += self.xlco_weight * active * l
      m.update(xlco_loss=l, xlco_accuracy=acc, xlco_active=active)
    m["loss"] = loss
    return loss, m, new

  # --- trainer hooks: momentum encoder and queue ---

  def derive_mutables(self, params, flax_mutables):
    if "momentum" not in flax_mutables:
      return flax_mutables
    return {**flax_mutables,
            "momentum": {"params": key_params(params, self.module.xlco_layer)}}

  def prefill_batches(self, flax_mutables) -> int:
    """§4.1: "pre-fill the queue with a set of encoded examples until it reaches the
    desired size": a new run encodes queue_size / B batches of XLCO pairs with the key
    encoder before step 1 (`prefill_queue`; False: XLCO stays off until training has
    filled the queue)."""
    queue = (flax_mutables or {}).get("queue")
    return int(queue["keys"].shape[0]) if self.prefill_queue and queue is not None else 0

  def prefill(self, params, batch, flax_mutables):
    """One batch of XLCO keys, as a training step would encode them, into the queue."""
    del params
    queue = flax_mutables["queue"]
    rng = jax.random.fold_in(jax.random.PRNGKey(0), queue["next"])
    _, k_in = self.xlco_inputs(rng, batch["xlco/left_tokens"], batch["xlco/right_tokens"],
                               self.xlco_pairs(batch))
    k = jax.lax.stop_gradient(self._unit(self.module.apply(
        {"params": flax_mutables["momentum"]["params"]}, k_in, method=InfoXLM.xlco_vector)))
    return {**flax_mutables, "queue": moco.enqueue(queue, k)}

  def after_update(self, params, flax_mutables, step):
    if "momentum" not in flax_mutables:
      return flax_mutables
    m = momentum_coefficient(self.momentum_schedule, self.momentum, step)
    key = moco.ema(key_params(params, self.module.xlco_layer),
                       flax_mutables["momentum"]["params"], m)
    out = {**flax_mutables, "momentum": {"params": key}}
    if "updates" in flax_mutables:
      out["updates"] = jnp.asarray(step, jnp.int32)
    return out

  def flax_mutables_axes(self, params_axes, flax_mutables):
    if "momentum" not in flax_mutables:
      return None
    axes = {"momentum": {"params": key_params(params_axes, self.module.xlco_layer)},
            "queue": {"keys": (None, "batch", "embed"), "next": (), "filled": ()}}
    if "updates" in flax_mutables:
      axes["updates"] = ()
    return axes

  # --- t5x interface ---

  def embed(self, params, tokens_BxL, lang_B=None, side: str = "left"):
    return self.module.apply({"params": params}, tokens_BxL, method=InfoXLM.retrieval_vector)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    lengths = [s[1] for k, s in input_shapes.items() if len(s) == 2]
    joined = 2 * max((s[1] for k, s in input_shapes.items()
                      if k.startswith(("tlm/", "xlco/")) and len(s) == 2), default=0)
    if joined > self.module.encoder.max_length:
      raise ConfigError(f"TLM and XLCO join two sentences of up to {joined // 2} tokens: "
                        f"TransformerEncoder.max_length={self.module.encoder.max_length} must "
                        f"be at least {joined} (2 x MAX_LENGTH)")
    if max(lengths) > self.module.encoder.max_length:   # MMLM's blocks of text
      raise ConfigError(f"the MMLM rows hold {max(lengths)} tokens (MMLM_BLOCK_LENGTH): "
                        f"TransformerEncoder.max_length={self.module.encoder.max_length} must "
                        f"be at least that")
    tokens = jnp.ones((1, max(lengths)), jnp.int32)
    variables = dict(self.module.init({"params": rng}, tokens, deterministic=True))
    if self.uniform_init:
      variables["params"] = layers.redraw_uniform(
          variables["params"], jax.random.fold_in(rng, 1), self.uniform_init)
    if "xlco" in self.tasks and "xlco/left_tokens" in input_shapes:
      b = input_shapes["xlco/left_tokens"][0]
      if self.queue_size % b:
        raise ConfigError(f"InfoXLMModel.queue_size={self.queue_size} is not a multiple of "
                          f"the global XLCO batch {b} (the queue holds whole batches of keys)")
      d = self.module.encoder.emb_dim
      variables["momentum"] = {"params": key_params(variables["params"],
                                                    self.module.xlco_layer)}
      variables["queue"] = moco.new_queue(self.queue_size // b, d, rows=b)
      if self.xlco_start:   # updates so far, for the delayed start of XLCO
        variables["updates"] = jnp.zeros((), jnp.int32)
    return variables
