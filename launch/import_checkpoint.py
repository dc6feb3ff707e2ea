#!/usr/bin/env python
"""Import a Hugging Face checkpoint (BertModel, XLMRobertaModel, T5EncoderModel /
MT5EncoderModel, or a model built on one) as a vmx model directory.

  python launch/import_checkpoint.py --hf_dir=DIR --output_dir=DIR [--pooling=mean|first|pooler]
      [--max_length=N] [--decoder]

The output opens with `vmx.inference.Encoder.from_checkpoint(output_dir)` and starts a
training run with `--gin.INITIAL_CHECKPOINT_PATH="'output_dir'"`. safetensors are read
without torch; pytorch_model.bin needs torch. Nothing is written unless every tensor
of the checkpoint is accounted for (see vmx/modeldir/hf_import.py). `--decoder` keeps an
mT5 / T5 encoder-decoder checkpoint's decoder (without its cross-attention) for VMSST's
and BITRANSLATION's decoders (VMSST §6.5; gin_configs/vmsst_24l_mt5.gin).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--hf_dir", required=True, help="Hugging Face model directory")
  p.add_argument("--output_dir", required=True, help="vmx model directory to create")
  p.add_argument("--pooling", default=None, choices=("mean", "first", "pooler"),
                 help="default: the sentence-transformers config's; else first (BERT, "
                      "XLM-R) or mean (mT5)")
  p.add_argument("--max_length", type=int, default=None,
                 help="tokens per sentence (default: sentence-transformers' max_seq_length, "
                      "else 128)")
  p.add_argument("--decoder", action="store_true",
                 help="also import the decoder of a T5 / mT5 encoder-decoder checkpoint "
                      "(MT5ForConditionalGeneration) for VMSST / BITRANSLATION")
  args = p.parse_args(argv)
  from vmx import signals
  signals.install()   # SIGTERM / SIGINT: exit 75, one `preempted:` line, nothing half-written
  signals.leaves(f"nothing was written to {args.output_dir} (an import appears whole or "
                 f"not at all); rerun the same command")
  with signals.activity(f"importing {args.hf_dir}"):
    print(f"[vmx] importing {args.hf_dir} -> {args.output_dir}", flush=True)
    from vmx.modeldir.hf_import import import_checkpoint  # lazy: jax, after run_main's set-up
    s = import_checkpoint(args.hf_dir, args.output_dir, args.pooling, args.max_length,
                          decoder=args.decoder)
  print(f"imported {s['family']} encoder: {s['tensors']} tensors, {s['parameters']:,} "
        f"parameters, {s['pooling']} pooling, max_length {s['max_length']}, tokenizer "
        f"{s['tokenizer']} -> {s['output_dir']}")
  if s["decoder"]:
    print(f"imported t5 decoder: {s['decoder_tensors']} tensors, "
          f"{s['decoder_parameters']:,} parameters ({s['decoder']['num_layers']} layers; its "
          f"cross-attention left out) -> {s['output_dir']}/decoder")
  if s["ignored"]:
    print(f"ignored (not part of the encoder): {', '.join(s['ignored'])}")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
