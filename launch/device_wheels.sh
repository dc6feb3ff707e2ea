#!/usr/bin/env bash
# The wheels a bare accelerator image lacks, for Python 3.12 on x86-64 Linux, into
# wheels/ (git-ignored), to carry with a command there:
#
#   bash launch/device_wheels.sh            # here, once (needs PyPI)
#   # on the device, the working tree and wheels/ carried:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/vmx-deps wheels/*.whl
#   PYTHONPATH=/tmp/vmx-deps:. python3 benchmarks/accelerator.py
#
# The image (the device tool's KINDS.md) has jax 0.11.2, flax, optax, orbax-checkpoint,
# numpy, scipy, tensorstore, etils, tensorboard, sentencepiece, tokenizers, tqdm, chex;
# vmx's training needs besides: gin-config, clu and clu's ml-collections; grain for the
# index reader of a real token cache (array-record and portpicker, its dependencies the
# image lacks). --no-deps: nothing the image has is replaced. docs/performance.md, "On a
# GPU", says what was tested where.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels
mkdir wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any -d wheels \
  'gin-config==0.5.0' 'clu==0.0.12' 'ml-collections' 'grain==0.2.18' 'array-record' \
  'portpicker'
ls -l wheels
total=$(du -cb wheels/*.whl | tail -1 | cut -f1)
echo "wheels/: $((total / 1024)) KiB"
if [ "$total" -gt $((40 * 1024 * 1024)) ]; then
  echo "error: the bundle is over 40 MiB" >&2
  exit 1
fi
