#!/usr/bin/env python
r"""Mine parallel sentences from two monolingual corpora (LASER's margin-scored kNN).

  python launch/mine.py --checkpoint_dir=DIR --source=de.txt --target=en.txt \
      --output=mined.tsv [--margin=ratio] [--k=4] [--retrieval=max] [--threshold=1.06]

Corpora: text files (local, gs:// or .gz), one sentence a line, any size; empty lines are
skipped and counted. OUTPUT gets `score<TAB>source<TAB>target` lines, the best first;
OUTPUT.json the summary. With `--retrieval=forward` and no threshold, every source
sentence gets its best target and its score. The vectors and neighbour lists are kept in
--work_dir (default OUTPUT.work/): a killed job continues where it stopped when rerun
(exit 75 on SIGTERM), and a rerun with another --threshold, --top_n, --margin or
--retrieval re-scores without encoding again. Several processes (--multihost, or
--coordinator_address / --num_processes / --process_id on each) share the shards; or
Beam workers embed and search them (--beam_runner, the `beam` extra; with
--beam_runner=DataflowRunner every path on gs://, vmx/bitext_beam.py says what runs where):

  python launch/mine.py ... --beam_runner=DirectRunner --beam_workers=2
  python launch/mine.py --checkpoint_dir=gs://b/model --source=gs://b/de.txt \
      --target=gs://b/en.txt --output=gs://b/mined.tsv --beam_runner=DataflowRunner \
      --beam_options="--project=P --region=R --temp_location=gs://b/tmp --setup_file=./setup.py"

docs/mining.md has the stages and figures.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
  from vmx import cli   # (light: neither jax nor TensorFlow)
  p = cli.ArgumentParser(description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint_dir", required=True,
                 help="vmx model directory (trained, or imported: launch/import_checkpoint.py)")
  p.add_argument("--step", type=cli.step_flag, default=None,
                 help="checkpoint step, or 'best' (default: the newest intact one)")
  p.add_argument("--source", required=True, help="source corpus, one sentence a line")
  p.add_argument("--target", required=True, help="target corpus, one sentence a line")
  p.add_argument("--output", required=True, help="the mined pairs (TSV); OUTPUT.json: summary")
  p.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
  p.add_argument("--work_dir", default=None,
                 help="shards of vectors and neighbour lists (default: OUTPUT.work)")
  p.add_argument("--margin", default="ratio", choices=("ratio", "distance", "cosine"),
                 help="ratio: cos / mean kNN cos (LASER's default); distance: cos - mean; "
                      "cosine: no margin")
  p.add_argument("--k", type=int, default=4, help="neighbours of the margin's means")
  p.add_argument("--retrieval", default="max",
                 choices=("forward", "backward", "intersect", "max"),
                 help="forward: each source's best target; backward: each target's best "
                      "source; intersect: pairs that are both; max: both merged greedily "
                      "by score, each sentence used once (LASER's default)")
  p.add_argument("--threshold", type=float, default=None,
                 help="keep pairs scoring at least this (default: all)")
  p.add_argument("--top_n", type=int, default=None, help="keep the N best pairs")
  p.add_argument("--source_lang", default=None,
                 help="ISO 639-3 code, for models that read language ids")
  p.add_argument("--target_lang", default=None)
  cli.add_vector_flags(p, "search")
  p.add_argument("--shard_size", type=int, default=100_000,
                 help="sentences a shard of vectors (memory: two shards at a time)")
  p.add_argument("--batch_size", type=int, default=256, help="sentences an encoder batch")
  cli.add_process_flags(p, "several processes share the shards")
  cli.add_beam_flags(p, "embed and search the shards")
  args = p.parse_args(argv)
  if args.beam_runner and (args.multihost or args.coordinator_address):
    p.error("--beam_runner: Beam's workers share the shards; leave out --multihost and "
            "--coordinator_address")
  from vmx import bitext, bitext_beam, signals
  from vmx.inference import Encoder   # lazy: jax, after cli.run_main's host set-up
  encoder_options = dict(step=args.step, batch_size=args.batch_size, **cli.vector_options(args))
  engine = bitext_beam.engine_from_flags(args, encoder_options)
  if args.multihost or args.coordinator_address:
    from vmx.training import distributed   # lazy: jax
    # (several processes: JAX's preemption service owns SIGTERM, vmx/signals.py)
    print(distributed.layout(distributed.initialize(
        args.coordinator_address, args.num_processes, args.process_id)), flush=True)
  else:
    signals.install()   # SIGTERM / SIGINT: exit 75, the finished shards kept
  settings = bitext.Settings(k=args.k, margin=args.margin, retrieval=args.retrieval,
                             threshold=args.threshold, top_n=args.top_n,
                             shard_size=args.shard_size, source_lang=args.source_lang,
                             target_lang=args.target_lang, batch_size=args.batch_size)
  settings.check()
  bitext.check_output(args.output, args.overwrite)
  with signals.activity("loading the checkpoint"):
    enc = Encoder.from_checkpoint(args.checkpoint_dir, **encoder_options)
  s = bitext.mine(enc, args.checkpoint_dir, args.source, args.target, args.output,
                  args.work_dir or args.output + ".work", settings, overwrite=args.overwrite,
                  engine=engine)
  if s is None:   # a process other than 0: its shards are done, process 0 writes
    return
  print(f"mined {s['pairs']:,} pairs from {s['source_sentences']:,} x "
        f"{s['target_sentences']:,} sentences ({args.margin} margin, k={args.k}, "
        f"{args.retrieval}"
        + (f", score >= {args.threshold}" if args.threshold is not None else "")
        + (f", top {args.top_n}" if args.top_n is not None else "")
        + f") in {s['seconds']} s -> {s['output']}")
  cut = {side: s[f"{side}_truncated"] for side in ("source", "target")}
  if any(cut.values()):
    print(f"warning: sentences longer than the model's max_length were truncated "
          f"(source {cut['source']:,}, target {cut['target']:,})")


if __name__ == "__main__":
  from vmx.cli import run_main
  run_main(main, host_malloc="off")   # memory, not step speed (vmx/cli.py)
