#!/usr/bin/env python
r"""Reference point for train_throughput.py: a sentence-transformers training step with
MultipleNegativesRankingLoss on a randomly initialised BERT of the same shape
(mean pooling, AdamW), on synthetic full-length batches. Needs torch, transformers and
sentence-transformers (not vmx dependencies; use a separate venv):

  python benchmarks/torch_mnrl_baseline.py --layers=4 --d=256 --heads=4 --d_ff=1024 \
      --vocab=32000 --length=32 --batch=64

Prints one JSON line: step_s, pairs_per_s, tokens_per_s, torch_threads.
"""
import argparse
import json
import tempfile
import time


def main():
  import torch
  from sentence_transformers import SentenceTransformer, losses, models
  from transformers import BertConfig, BertModel, BertTokenizerFast

  p = argparse.ArgumentParser()
  for k, v in dict(layers=4, d=256, heads=4, d_ff=1024, vocab=32000, length=32, batch=64,
                   steps=20, warmup=3).items():
    p.add_argument(f"--{k}", type=int, default=v)
  a = p.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.d, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.d_ff,
                     max_position_embeddings=max(a.length, 512),
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(cfg).save_pretrained(tmp)
    with open(f"{tmp}/vocab.txt", "w") as f:
      f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                        + [f"tok{i}" for i in range(a.vocab - 5)]))
    BertTokenizerFast(vocab_file=f"{tmp}/vocab.txt").save_pretrained(tmp)
    word = models.Transformer(tmp, max_seq_length=a.length)
    model = SentenceTransformer(modules=[word, models.Pooling(a.d, "mean")], device="cpu")
  loss_fn = losses.MultipleNegativesRankingLoss(model)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
  g = torch.Generator().manual_seed(0)

  def features():
    ids = torch.randint(5, a.vocab, (a.batch, a.length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids)}

  batch = [features(), features()]
  model.train()

  def step():
    opt.zero_grad()
    loss = loss_fn(batch, None)
    loss.backward()
    opt.step()

  for _ in range(a.warmup):
    step()
  t = time.perf_counter()
  for _ in range(a.steps):
    step()
  step_s = (time.perf_counter() - t) / a.steps
  print(json.dumps({"step_s": step_s, "pairs_per_s": a.batch / step_s,
                    "tokens_per_s": 2 * a.batch * a.length / step_s,
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
  main()
