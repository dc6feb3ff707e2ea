# vmx training image: CPU by default; JAX_EXTRA=cuda12 for NVIDIA GPUs (run with
# --gpus all), JAX_EXTRA=tpu for Cloud TPU VMs (run with --privileged --net=host).
#
#   docker build -t vmx .                            # or --build-arg JAX_EXTRA=cuda12
#   docker run --rm vmx                              # --check_cluster: devices, one all-reduce
#   docker run --rm -v /data:/data -e VMX_DATA_DIR=/data/shared vmx \
#     --gin_file=contrastive_tiny.gin --gin.MODEL_DIR=/data/runs/contrastive_tiny
#
# Arguments after the image name go to launch/train.py (add --multihost on a pod or cluster);
# add --user "$(id -u):$(id -g)" so that files written to mounted directories are yours.
FROM python:3.11-slim

ARG JAX_EXTRA=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /opt/vmx
COPY setup.py README.md ./
COPY vmx ./vmx
COPY tasks ./tasks
# gcc only while installing: it builds the fused CPU kNN kernel (vmx/evaluation/_knn_cpu.c)
# hadolint ignore=DL3008,DL3013
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir ".[train,ems]" \
    && if [ -n "$JAX_EXTRA" ]; then pip install --no-cache-dir "jax[$JAX_EXTRA]>=0.10,<0.11"; fi \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY gin_configs ./gin_configs
COPY launch ./launch
ENTRYPOINT ["python", "launch/train.py"]
CMD ["--check_cluster"]
