"""Data, in the order it flows (docs/data.md tells the same story):

1. Sources: corpus files read and validated (`readers`, `download`, `devsets`,
   `languages`), as SeqIO data sources split by content (`sources`, `nway`), tokenized
   by a vocabulary (`vocab` without TensorFlow, an imported one `hf_tokenizer`, both giving
   `token_rows`' ragged or padded ids; `seqio_vocab`, their one SeqIO adapter; `normalize`), prepared by preprocessors (`preprocessors`) in registered tasks and
   mixtures (`registration`, called by the top-level `tasks` package, whose gin calls are
   `deferred` until a run must register them), shaped for a model by its feature
   converter (`feature_converters`; their features without SeqIO: `features`).
2. The token cache (`token_cache`): every task's examples after all of that, written once
   in shards (in this process, or on Apache Beam), stored locally or in a bucket,
   verified when read.
3. The reader: `stream` maps (seed, step, row) to a cached example (N-way views drawn
   by `views`); `pipeline` holds the dataset configs, finds their caches by their record
   (`token_cache/lookup.py`: no SeqIO) and makes the iterator (or SeqIO's tf.data reader,
   `seqio_reader`); `inputs` hands a config to the training loop as its `Input`
   (`TokenCacheInput`, the protocol of vmx/training/inputs.py).
Beside them: `teacher` (cached teacher vectors for distillation) and `seqio_cache`
(SeqIO's own offline cache, for the seqio reader)."""
