# gmeta-tf image: the project set up by scripts/setup.sh (the same script `make demo` and
# `make test` run), so the image holds the pinned stack, Horovod and the op library.
#
#   CPU (default):  docker build -t gmeta-tf .
#   GPU:            docker build --build-arg VARIANT=gpu -t gmeta-tf:gpu .
#   or docker/build.sh [--gpu], which starts an engine when none runs and, when no registry
#   is reachable, builds on a base made from Debian's packages (BASE_CPU below).
#
# The base images are build arguments: BASE_CPU (a Debian bookworm with Python 3.11, its
# venv module, pip and headers) and BASE_GPU (a CUDA 12.3 devel image).
#
# The GPU variant starts from CUDA 12.3 (what TensorFlow 2.16 is built against), installs
# `tensorflow[and-cuda]` in place of `tensorflow-cpu` (same version, same ABI), and builds
# Horovod with NCCL for GPU all-reduce (HOROVOD_GPU_OPERATIONS=NCCL); hash tables stay in
# host memory, the dense tower runs on each rank's GPU.
#
#   docker run --rm gmeta-tf demo                       # the main job (make demo)
#   docker run --rm gmeta-tf test                       # the test suite (make test)
#   docker run --rm -v $PWD/runs:/opt/gmeta-tf/runs gmeta-tf gmeta eval --config default
#   docker run --rm --gpus all gmeta-tf:gpu horovodrun -np 4 -H localhost:4 gmeta train
#
# ../shared/data (MovieLens, Criteo) is not in the image: mount it at /opt/shared/data.

ARG VARIANT=cpu
ARG BASE_CPU=python:3.11-slim-bookworm
ARG BASE_GPU=nvidia/cuda:12.3.2-devel-ubuntu22.04

FROM ${BASE_CPU} AS base-cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ cmake make openssh-client \
 && rm -rf /var/lib/apt/lists/*
ENV GMETA_TF_PACKAGE=tensorflow-cpu

FROM ${BASE_GPU} AS base-gpu
# The devel image carries nvcc and NCCL (libnccl2, libnccl-dev) that Horovod builds against.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv python3.11-dev g++ cmake make openssh-client \
 && rm -rf /var/lib/apt/lists/*
ENV GMETA_TF_PACKAGE="tensorflow[and-cuda]" \
    HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_NCCL_LINK=SHARED

FROM base-${VARIANT}
WORKDIR /opt/gmeta-tf
ENV TF_USE_LEGACY_KERAS=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    PYTHON=python3.11

# Layers from the slowest-changing up: the stack (pinned requirements, Horovod) from the
# requirements and the set-up script alone, then the op library from ops/ alone, then the
# package; a change to the Python code or the README rebuilds only the last, in seconds.
# setup.sh reads GMETA_TF_PACKAGE: the GPU variant gets the GPU build of the same pinned
# TensorFlow; everything else is the script the README uses, as is.
COPY requirements.txt ./
COPY scripts/setup.sh scripts/
RUN bash scripts/setup.sh --stack \
 && rm -rf /root/.cache/pip
COPY Makefile ./
COPY ops/ ops/
RUN mkdir -p gmeta_tf && make ops
COPY scripts/ scripts/
COPY pyproject.toml README.md ./
COPY gmeta_tf/ gmeta_tf/
RUN bash scripts/setup.sh \
 && rm -rf /root/.cache/pip

COPY pipelines/ pipelines/
COPY benchmarks/ benchmarks/
COPY tests/ tests/
COPY .ci/ .ci/
COPY docker/ docker/
RUN chmod +x docker/entrypoint.sh

ENV PATH=/opt/gmeta-tf/.venv/bin:$PATH
ENTRYPOINT ["/opt/gmeta-tf/docker/entrypoint.sh"]
CMD ["demo"]
