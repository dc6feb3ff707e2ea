#!/usr/bin/env python
r"""Sentences encoded per second by `Encoder.encode` (tokenization included), for each model
directory given: e.g. a static encoder against the one-hour transformer (issue 58's bar:
>= 50x on a CPU).

  python benchmarks/encode_throughput.py /tmp/vmx/static_1h /tmp/vmx/small_1h_packed \
      [--n=20000] [--batch_size=256] [--lang=deu]

The sentences are shared/data's Tatoeba test sentences of --lang (repeated to --n) when
VMX_DATA_DIR has them, else made-up ones of 6-20 words. One warm-up pass (compilation),
then the best of --repeats timed passes (more, until --min_seconds are spent); one JSON
line per model. A static model is
encoded on the host (`Encoder`'s sparse sum of token rows), a Transformer in jitted batches.
Only speed is measured: a model directory at random init (tests/conftest.save_model_dir)
times like a trained one with the same vocabulary.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORDS  # noqa: E402


def sentences(n: int, lang: str) -> list[str]:
  data = os.environ.get("VMX_DATA_DIR")
  path = Path(data or "/nonexistent") / "eval" / "tatoeba" / "v1" / f"tatoeba.{lang}-eng.{lang}"
  if path.is_file():
    base = [l.strip() for l in path.read_text().splitlines() if l.strip()]
  else:
    import random
    rng = random.Random(0)
    base = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 20))) for _ in range(1000)]
  return (base * (n // len(base) + 1))[:n]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("model_dirs", nargs="+")
  ap.add_argument("--n", type=int, default=20000)
  ap.add_argument("--batch_size", type=int, default=256)
  ap.add_argument("--lang", default="deu")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--min_seconds", type=float, default=3.0,
                  help="keep timing passes until this many seconds are spent (a fast model's "
                       "best of 2 passes of 0.15 s varied by 30%% between invocations)")
  args = ap.parse_args(argv)
  from vmx.data.languages import iso3
  from vmx.evaluation import vectors
  from vmx.inference import Encoder
  texts = sentences(args.n, args.lang)
  for d in args.model_dirs:
    enc = Encoder.from_checkpoint(d, batch_size=args.batch_size)
    enc.encode(texts, lang=iso3(args.lang), progress=False)     # compile every shape
    best, spent, runs = float("inf"), 0.0, 0
    while runs < args.repeats or spent < args.min_seconds:
      t = time.perf_counter()
      enc.encode(texts, lang=iso3(args.lang), progress=False)
      took = time.perf_counter() - t
      best, spent, runs = min(best, took), spent + took, runs + 1
    print(json.dumps({"model_dir": d, "vector": vectors.describe(enc),
                      "sentences": len(texts), "passes": runs, "seconds": round(best, 3),
                      "sentences_per_s": round(len(texts) / best, 1)}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
