# syntax=docker/dockerfile:1
# fabricbench images for GPU clusters, and one for CPU. One file, four targets:
#   docker build --target cuda   -t fabricbench:cuda   .   # CUDA + PyTorch and DeepSpeed (locked)
#   docker build --target rocm   -t fabricbench:rocm   .   # ROCm PyTorch base (RCCL) + fabricbench
#   docker build --target sglang -t fabricbench:sglang .   # SGLang's image + fabricbench's client side
#   docker build --target vllm   -t fabricbench:vllm   .   # vLLM's image + fabricbench's client side
#   make image                                             # cpu: the cuda target on a Debian base made here
# The CPU image is the cuda target itself, built with CUDA_BASE set to a Debian base
# (tools/image.sh): the image CI builds and runs is the one GPU clusters run, step for step, and
# no second copy of its steps can drift from the first.
# Every GPU image carries RDMA user space (rdma-core, libibverbs providers, ibverbs-utils,
# perftest, infiniband-diags) so NCCL/RCCL can use IB/RoCE and `ib_write_bw` can check a link.
#
# Python dependencies are installed with the README's own commands (Makefile `sync`):
# uv bootstrapped into .tools/, then `uv sync --frozen` from uv.lock. tests/launch/test_dockerfile.py
# checks that these RUN lines and the Makefile stay the same commands.

# The CUDA major of the base must be the lock's torch's (torch 2.15.0+cu132: CUDA 13, which
# needs an R580+ driver); tests/launch/test_dockerfile.py checks the two agree.
ARG CUDA_BASE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
ARG ROCM_BASE=rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.6.0
ARG SGLANG_BASE=lmsysorg/sglang:latest
ARG VLLM_BASE=vllm/vllm-openai:latest

# ---------------------------------------------------------------------------------------
FROM ${CUDA_BASE} AS cuda
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1
# A site whose HTTPS is inspected passes its CA bundle for pip and uv (tools/image.sh does): build
# arguments, so nothing of the site stays in the image's environment.
ARG SSL_CERT_FILE
ARG PIP_CERT
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev make git ca-certificates build-essential ninja-build \
        rdma-core ibverbs-providers ibverbs-utils perftest infiniband-diags libibverbs-dev librdmacm-dev \
        iproute2 pciutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/fabricbench
# Dependencies first, from the lock alone (their layer survives every edit but the lock's and
# pyproject's: a README or Makefile change must not re-install ~4 GB of wheels), then the project.
COPY pyproject.toml uv.lock ./
RUN python3 -m venv .tools && .tools/bin/pip install -q uv
RUN .tools/bin/uv sync --frozen --no-install-project
COPY . .
RUN .tools/bin/uv sync --frozen
# No DeepSpeed op pre-build: training uses torch.optim.AdamW (no fused DeepSpeed op), and a
# build against a toolkit other than torch's CUDA fails DeepSpeed's CUDA-version check.
ENV PATH=/opt/fabricbench/.venv/bin:${PATH} OMP_NUM_THREADS=1 FB_CLIENT_PYTHON=/opt/fabricbench/.venv/bin/python
# Which code and image this is, for the records made inside (no .git in the image; a label is
# not visible from inside): tools/image.sh passes them. Last, so a new commit rebuilds nothing else.
ARG FB_GIT_COMMIT=""
ARG FB_GIT_DIRTY_HASH=""
ARG FB_IMAGE=""
ENV FABRICBENCH_GIT_COMMIT=${FB_GIT_COMMIT} FABRICBENCH_GIT_DIRTY_HASH=${FB_GIT_DIRTY_HASH} FABRICBENCH_IMAGE=${FB_IMAGE}
CMD ["python", "launch/train.py", "--help"]

# ---------------------------------------------------------------------------------------
# ROCm: the base image's PyTorch is the ROCm build (RCCL inside); the venv sees it through
# --system-site-packages and the lock's CUDA torch wheels are not installed.
FROM ${ROCM_BASE} AS rocm
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-venv make git ca-certificates \
        rdma-core ibverbs-providers ibverbs-utils perftest infiniband-diags \
        iproute2 pciutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/fabricbench
COPY . .
RUN python3 -m venv .tools && .tools/bin/pip install -q uv
RUN python3 -m venv --system-site-packages .venv \
    && .tools/bin/uv sync --frozen --inexact --no-install-package torch --no-install-package triton
ENV PATH=/opt/fabricbench/.venv/bin:${PATH} OMP_NUM_THREADS=1 FB_CLIENT_PYTHON=/opt/fabricbench/.venv/bin/python
# Which code and image this is, for the records made inside (no .git in the image; a label is
# not visible from inside): tools/image.sh passes them. Last, so a new commit rebuilds nothing else.
ARG FB_GIT_COMMIT=""
ARG FB_GIT_DIRTY_HASH=""
ARG FB_IMAGE=""
ENV FABRICBENCH_GIT_COMMIT=${FB_GIT_COMMIT} FABRICBENCH_GIT_DIRTY_HASH=${FB_GIT_DIRTY_HASH} FABRICBENCH_IMAGE=${FB_IMAGE}
CMD ["python", "launch/train.py", "--help"]

# ---------------------------------------------------------------------------------------
# Serving images: the engine stays in the image's own Python; fabricbench (load generator,
# records, analysis) lives in its own venv so neither disturbs the other's pins.
FROM ${SGLANG_BASE} AS sglang
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-venv make ca-certificates \
        rdma-core ibverbs-providers ibverbs-utils perftest infiniband-diags iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/fabricbench
COPY . .
RUN python3 -m venv .tools && .tools/bin/pip install -q uv
RUN .tools/bin/uv sync --frozen
# fabricbench runs in its venv (FB_CLIENT_PYTHON: launch/slurm/python.sh and docs/cluster.md's
# docker run use it), never in `python3`, which is the image's own interpreter with SGLang
# and no hydra; the server adapter starts SGLang with that one (conf/server/sglang.yaml
# reads FB_ENGINE_PYTHON).
ENV FB_CLIENT_PYTHON=/opt/fabricbench/.venv/bin/python FB_ENGINE_PYTHON=python3
# Which code and image this is, for the records made inside (no .git in the image; a label is
# not visible from inside): tools/image.sh passes them. Last, so a new commit rebuilds nothing else.
ARG FB_GIT_COMMIT=""
ARG FB_GIT_DIRTY_HASH=""
ARG FB_IMAGE=""
ENV FABRICBENCH_GIT_COMMIT=${FB_GIT_COMMIT} FABRICBENCH_GIT_DIRTY_HASH=${FB_GIT_DIRTY_HASH} FABRICBENCH_IMAGE=${FB_IMAGE}
CMD ["/opt/fabricbench/.venv/bin/python", "launch/infer.py", "--help"]

FROM ${VLLM_BASE} AS vllm
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-venv make ca-certificates \
        rdma-core ibverbs-providers ibverbs-utils perftest infiniband-diags iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/fabricbench
COPY . .
RUN python3 -m venv .tools && .tools/bin/pip install -q uv
RUN .tools/bin/uv sync --frozen
# As in the sglang image: fabricbench in its venv, `python`/`python3` are vLLM's.
ENV FB_CLIENT_PYTHON=/opt/fabricbench/.venv/bin/python
# The vLLM image's entrypoint is `vllm serve`; fabricbench's commands must run as given, and
# the adapter starts `vllm` itself.
# Which code and image this is, for the records made inside (no .git in the image; a label is
# not visible from inside): tools/image.sh passes them. Last, so a new commit rebuilds nothing else.
ARG FB_GIT_COMMIT=""
ARG FB_GIT_DIRTY_HASH=""
ARG FB_IMAGE=""
ENV FABRICBENCH_GIT_COMMIT=${FB_GIT_COMMIT} FABRICBENCH_GIT_DIRTY_HASH=${FB_GIT_DIRTY_HASH} FABRICBENCH_IMAGE=${FB_IMAGE}
ENTRYPOINT []
CMD ["/opt/fabricbench/.venv/bin/python", "launch/infer.py", "--help"]
