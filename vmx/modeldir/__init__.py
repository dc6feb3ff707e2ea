"""MODEL_DIR: one package owns the model directory's names, readers and writers.

  layout.py       the file names and the small files: vmx_model.json (what inference
                  needs besides the parameters), config.gin, metrics.jsonl's path, the
                  vocabulary copy (`write_inference_files`)
  checkpoints.py  orbax checkpoints checkpoint_<step>/ with checksum manifests, damaged/,
                  best/, the run's checkpointer and `restore_params` for inference
  t5x_format.py   t5x's own checkpoint layouts (Orbax and legacy msgpack), read without t5x
  hf_import.py    Hugging Face checkpoints -> a vmx model directory (its tokenizer, its
                  files), from hf_weights.py (the tensors' map: encoder, T5 decoder)
                  and hf_mlm_head.py (a masked-LM head, mlm_head/)
  hf_export.py    a vmx model directory -> a sentence-transformers folder
  model_card.py   the README.md an export writes: how the model was trained and scored
  run.py          the run's lock, its stored config as the contract of a restart, and
                  --fresh (moving an earlier run aside)
Training, inference and the converters all read and write MODEL_DIR through these.
"""
