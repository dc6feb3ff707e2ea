#!/usr/bin/env python
"""Export a vmx model directory (a BERT / XLM-R encoder imported with
launch/import_checkpoint.py, then trained or not; or a static encoder, static_*.gin, as a
`StaticEmbedding`) as a sentence-transformers folder.

  python launch/export_checkpoint.py --checkpoint_dir=DIR --output_dir=DIR [--step=N]

`sentence_transformers.SentenceTransformer(output_dir)` then gives the same embeddings as
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
  args = p.parse_args(argv)
  from vmx.modeldir.hf_export import export_sentence_transformers  # lazy: jax, after cli.run_main's host set-up
  s = export_sentence_transformers(args.checkpoint_dir, args.output_dir, args.step)
  print(f"exported checkpoint_{s['step']} as a {s['architecture']} with {s['pooling']} "
        f"pooling, max_length {s['max_length']} ({s['tensors']} tensors) -> {s['output_dir']}")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
