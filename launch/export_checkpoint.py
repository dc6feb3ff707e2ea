#!/usr/bin/env python
r"""Export a vmx model directory (a BERT / XLM-R encoder imported with
launch/import_checkpoint.py, then trained or not; or a static encoder, static_*.gin, as a
`StaticEmbedding`) as a sentence-transformers folder, or a static encoder in Model2Vec's
Hugging Face layout.

  python launch/export_checkpoint.py --checkpoint_dir=DIR --output_dir=DIR [--step=N] \
      [--format=sentence-transformers|model2vec]

`sentence_transformers.SentenceTransformer(output_dir)` (or
`model2vec.StaticModel.from_pretrained(output_dir)`) then gives the same embeddings as
`vmx.inference.Encoder.from_checkpoint(checkpoint_dir)` (vmx/modeldir/hf_export.py says
which models can be exported; any other is a one-line error and nothing is written).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True, help="vmx model directory")
  p.add_argument("--output_dir", required=True, help="sentence-transformers folder to create")
  p.add_argument("--step", type=int, default=None, help="default: the newest intact checkpoint")
  p.add_argument("--format", choices=("sentence-transformers", "model2vec"),
                 default="sentence-transformers",
                 help="model2vec: Model2Vec's layout (config.json, model.safetensors, "
                      "tokenizer.json), static encoders only")
  args = p.parse_args(argv)
  from vmx.modeldir import hf_export  # lazy: jax, after cli.run_main's host set-up
  export = (hf_export.export_model2vec if args.format == "model2vec"
            else hf_export.export_sentence_transformers)
  s = export(args.checkpoint_dir, args.output_dir, args.step)
  print(f"exported checkpoint_{s['step']} as a {s['architecture']} with {s['pooling']} "
        f"pooling, max_length {s['max_length']} ({s['tensors']} tensors) -> {s['output_dir']}")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
