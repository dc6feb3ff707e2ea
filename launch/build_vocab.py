#!/usr/bin/env python
"""Train a SentencePiece vocabulary (T5 conventions: pad 0, eos 1, unk 2; language tags
`<2xx>` as user-defined symbols).

  python launch/build_vocab.py --output=/tmp/vocab.model --vocab_size=32000 \
      --languages=deu,fra,eng --input=a.txt.gz,b.txt
  python launch/build_vocab.py --output=/tmp/vocab.model --vocab_size=8000 \
      --corpus=tatoeba-challenge --languages=deu,fra     (files from the data dir)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx.data import vocab  # lazy: after cli.run_main's host set-up
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--output", required=True, help="path of the .model to write")
  p.add_argument("--vocab_size", type=int, default=32000)
  p.add_argument("--languages", default="", help="language codes: one <2xx> tag each")
  p.add_argument("--input", default="", help="comma-separated text files (.gz ok)")
  p.add_argument("--corpus", default="", help="or a registered corpus, e.g. tatoeba-challenge")
  p.add_argument("--data_dir", default=None)
  p.add_argument("--max_sentences_per_file", type=int, default=200_000)
  args = p.parse_args(argv)
  langs = [l for l in args.languages.split(",") if l]
  files = [f for f in args.input.split(",") if f]
  if args.corpus:
    from tasks.parallel import CORPORA, corpus_text_files  # lazy: seqio/TensorFlow, after cli.run_main
    if args.corpus not in CORPORA:
      p.error(f"--corpus={args.corpus!r}: expected one of {', '.join(sorted(CORPORA))}")
    files += corpus_text_files(args.corpus, [l for l in langs if l != CORPORA[args.corpus].pivot],
                               args.data_dir)
  if not files:
    p.error("give --input files or --corpus")
  path = vocab.train_sentencepiece(files, args.output, args.vocab_size, langs,
                                   max_sentences_per_file=args.max_sentences_per_file)
  tok = vocab.Tokenizer(path)
  print(f"wrote {path}: {tok.vocab_size} pieces, {len(langs)} language tags")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
