"""What a user gets without the training stack: the base install (inference and
evaluation, no TensorFlow or SeqIO) and the Colab notebook, executed against a tiny
trained checkpoint."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import DATA_DIR, REPO, toy_train

# What `pip install vmx` (no [train] extra) leaves out.
TRAINING_ONLY = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio",
                 "tensorboard", "grain")
BLOCK = ("import sys\n"
         f"for m in {TRAINING_ONLY!r}:\n"
         "  sys.modules[m] = None   # import raises ModuleNotFoundError, as if not installed\n")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, toy_task):
  name, vp, _, _ = toy_task
  d = tmp_path_factory.mktemp("nb_ckpt")
  toy_train(d, name, vp, total_steps=2, period=2)
  return d


def _python(code, tmp_path, *args, timeout=300):
  script = tmp_path / "script.py"
  script.write_text(BLOCK + textwrap.dedent(code))
  return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                        text=True, cwd=REPO, timeout=timeout)


def test_inference_and_evaluation_without_tensorflow_or_seqio(checkpoint, tmp_path):
  """The base install's promise: Encoder, similarity, mining and launch/eval.py run with
  TensorFlow and SeqIO absent; launch/train.py says which extra to install."""
  proc = _python(f"""
      import numpy as np
      from vmx.inference import Encoder
      from vmx.evaluation import harness, mining
      enc = Encoder.from_checkpoint({str(checkpoint)!r})
      x = enc.encode(["alpha beta", "gamma delta", "beta"])
      y = enc.encode(["ALPHA BETA", "GAMMA DELTA", "BETA"])
      assert x.shape == y.shape and np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
      assert enc.similarity(x, y).shape == (3, 3)
      src, tgt, _ = mining.best_pairs(mining.margin_scores(x, y, k=2), "max")
      assert len(src) == 3
      bad = [m for m in {TRAINING_ONLY!r} if sys.modules.get(m) is not None]
      print("loaded:", bad)
      """, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "loaded: []" in proc.stdout

  # Inference depends on nothing of the training package (vmx/modeldir/ owns MODEL_DIR).
  proc = _python(f"""
      sys.modules["vmx.training"] = None
      from vmx.inference import Encoder
      enc = Encoder.from_checkpoint({str(checkpoint)!r})
      print(enc.encode(["alpha beta"]).shape)
      """, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]

  run_eval = (f"import runpy; sys.argv = ['eval.py'] + sys.argv[1:]\n"
              f"runpy.run_path({str(REPO / 'launch/eval.py')!r}, run_name='__main__')\n")
  if DATA_DIR and Path(DATA_DIR, "eval/tatoeba").is_dir():
    out = tmp_path / "eval"
    proc = _python(run_eval, tmp_path, f"--checkpoint_dir={checkpoint}", "--tasks=tatoeba",
                   "--languages=deu,fra", f"--data_dir={DATA_DIR}", f"--output_dir={out}",
                   "--no_plots", "--no_progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "tatoeba.json").read_text())

  run_train = (f"import runpy; sys.argv = ['train.py'] + sys.argv[1:]\n"
               f"runpy.run_path({str(REPO / 'launch/train.py')!r}, run_name='__main__')\n")
  proc = _python(run_train, tmp_path, "--gin_file=contrastive_tiny.gin",
                 f"--gin.MODEL_DIR={tmp_path / 'run'}")
  assert proc.returncode == 2
  assert "pip install 'vmx[train]'" in proc.stderr, proc.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def test_colab_notebook_executes(checkpoint, tmp_path, monkeypatch):
  """notebooks/colab_inference.ipynb runs top to bottom (nbclient, a fresh kernel) on a
  trained checkpoint: no cell errors, the mining cell reports, the plot is an image."""
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  nb = nbformat.read(REPO / "notebooks/colab_inference.ipynb", as_version=4)
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
      "commit the notebook without outputs"
  monkeypatch.setenv("VMX_CHECKPOINT", str(checkpoint))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws PNGs
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}}).execute()
  text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")
  assert f"{checkpoint.name} (checkpoint_2): 16-dim vectors" in text
  assert "top-1 retrieval accuracy" in text
  assert "mined pairs are translations (10 sentences each side)" in text
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) == 1
