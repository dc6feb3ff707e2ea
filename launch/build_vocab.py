#!/usr/bin/env python
r"""Train a SentencePiece vocabulary (T5 conventions: pad 0, eos 1, unk 2; language tags
`<2xx>` as user-defined symbols).

  python launch/build_vocab.py --output=/tmp/vocab.model --vocab_size=32000 \
      --languages=deu,fra,eng --input=a.txt.gz,b.txt
  python launch/build_vocab.py --output=/tmp/vocab.model --vocab_size=8000 \
      --corpus=tatoeba-challenge --languages=deu,fra     (files from the data dir)

EMS §4.2's normalization (vmx/data/normalize.py), kept with the vocabulary:
  --lowercase                the model case-folds what it encodes
  --pretokenize=moses        Moses, jieba for Chinese, Juman++ for Japanese, in each file's
                             language (--corpus: the corpus's; --input: the file name's,
                             `train.deu.gz`); --output is then a directory (vocab.model +
                             vmx_tokenizer.json): pass that directory as VOCAB_PATH
  --japanese=none            leave Japanese to SentencePiece (no Juman++ needed)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx.data import normalize, vocab  # lazy: after cli.run_main's host set-up
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--output", required=True,
                 help="path of the .model to write (with --pretokenize: a directory)")
  p.add_argument("--vocab_size", type=int, default=32000)
  p.add_argument("--languages", default="", help="language codes: one <2xx> tag each")
  p.add_argument("--input", default="", help="comma-separated text files (.gz ok)")
  p.add_argument("--corpus", default="", help="or a registered corpus, e.g. tatoeba-challenge")
  p.add_argument("--data_dir", default=None)
  p.add_argument("--max_sentences_per_file", type=int, default=200_000)
  p.add_argument("--lowercase", action="store_true", help="lowercase (EMS §4.2)")
  p.add_argument("--pretokenize", default=None, choices=normalize.METHODS,
                 help="pre-tokenize by language before SentencePiece (EMS §4.2)")
  p.add_argument("--japanese", default="jumanpp", choices=normalize.JAPANESE_MODES,
                 help="with --pretokenize: Japanese with Juman++, or left to SentencePiece")
  args = p.parse_args(argv)
  from vmx import signals
  signals.install()   # SIGTERM / SIGINT: exit 75, one `preempted:` line, nothing half-written
  signals.leaves(f"nothing was written to {args.output} (a vocabulary appears whole or "
                 f"not at all); rerun the same command")
  langs = [l for l in args.languages.split(",") if l]
  files = [f for f in args.input.split(",") if f]
  file_langs = [normalize.file_language(f) for f in files]
  if args.corpus:
    from tasks.parallel import CORPORA, corpus_files  # lazy: seqio/TensorFlow, after cli.run_main
    if args.corpus not in CORPORA:
      p.error(f"--corpus={args.corpus!r}: expected one of {', '.join(sorted(CORPORA))}")
    pivot = CORPORA[args.corpus].pivot
    for lang, src, piv in corpus_files(args.corpus, [l for l in langs if l != pivot],
                                       args.data_dir):
      for f, l in ((src, lang), (piv, pivot)):
        if f not in files:
          files.append(f)
          file_langs.append(l)
  if not files:
    p.error("give --input files or --corpus")
  pretok = (normalize.Pretokenizer(args.pretokenize, args.japanese, "build_vocab",
                                   switch="--japanese=none")
            if args.pretokenize else None)
  with signals.activity("building the vocabulary"):
    print(f"[vmx] building a {args.vocab_size}-piece vocabulary from {len(files)} file(s) "
          f"(up to {args.max_sentences_per_file} sentences each) -> {args.output}",
          flush=True)
    path = vocab.train_vocabulary(files, args.output, args.vocab_size, langs,
                                  args.lowercase, pretok, file_langs,
                                  args.max_sentences_per_file)
  signals.saved(f"the vocabulary {path} is written whole")
  tok = vocab.load_tokenizer(path)
  norm = ", ".join(filter(None, ["lowercased" if tok.lowercases else "",
                                 f"pre-tokenized ({pretok.settings})" if pretok else ""]))
  print(f"wrote {path}: {tok.vocab_size} pieces, {len(langs)} language tags"
        + (f", {norm}" if norm else ""))


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main)
