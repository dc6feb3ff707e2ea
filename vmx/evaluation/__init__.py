"""Evaluation suite (no TensorFlow): run it with `harness.run(encoder, suite=...)` or
`launch/eval.py`.

  tatoeba    similarity search accuracy both ways, xSIM, XTREME head / long tail
  bucc       BUCC 2018 bitext mining: cosine / ratio margin, best-F1 threshold
  sts        STS 2012-16 (VMSST and SBERT protocols), STS benchmark, SemEval-2017
  retrieval  queries against a knowledge base: R@k, mAP@20, MRR@10
  geometry   invariance, canonical form, isotropy on N-way parallel text
  transfer   zero-shot cross-lingual classifier probe (logistic / MLP; XNLI, MLDoc, Amazon)
  paracrawl  EMS's ParaCrawl retrieval: 2k queries among 200k candidates, margin P@1
  layerwise  an Encoder reading one layer of a checkpoint's encoder (InfoXLM Fig. 1, §4.2)
  vectors    which sentence vector an encoder gives: what every result and figure names
  heldout    the evaluation datasets' sentences training skips (EMS §4.2)
  protocols  each paper's tables: figures, their vectors, what is missing
  knn        blocked, device-sharded exact kNN in both directions (one pass)
  mining     margin scoring, forward/backward/intersect/max, threshold search
  harness    suites, MTEB-like results JSON, summary table, plots
"""
