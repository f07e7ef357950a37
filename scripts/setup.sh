#!/usr/bin/env bash
# One set-up path for every machine (developer, CI, Docker image): creates .venv inside
# the project, installs the pinned stack, builds Horovod with TensorFlow + Gloo, builds
# the op library. Each stage is skipped when its stamp says it is already done.
# `setup.sh --stack` stops after Horovod (the Dockerfile caches that layer on its own).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${GMETA_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

stamp() { echo "$VENV/.stamp-$1"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }  # content only, not file names

# The local cluster (gmeta_tf.local_cluster, its tests and benchmarks.cluster) needs ip/tc
# (iproute2) and sshd/ssh (openssh): installed here when running as root and missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing="$missing iproute2"
  [ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
  command -v ssh >/dev/null 2>&1 || missing="$missing openssh-client"
  if [ -n "$missing" ]; then
    echo "[setup] installing the local cluster's Debian packages:$missing"
    # another apt run (a second setup, the Docker engine's install, unattended upgrades)
    # holds the package locks for a while: wait for it rather than fail
    apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
      --no-install-recommends $missing \
      >/dev/null
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
export PATH="$VENV/bin:$PATH"

# GPU hosts: GMETA_TF_PACKAGE='tensorflow[and-cuda]' installs the GPU build of the same
# pinned version in place of tensorflow-cpu (and Horovod then builds with
# HOROVOD_GPU_OPERATIONS=NCCL when that is set).
TF_PACKAGE=${GMETA_TF_PACKAGE:-tensorflow-cpu}
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
sed "s/^tensorflow-cpu==/${TF_PACKAGE}==/" requirements.txt > "$requirements"
req_hash=$(hash_of "$requirements")
if [ "$(cat "$(stamp req)" 2>/dev/null)" != "$req_hash" ]; then
  echo "[setup] installing pinned requirements ($TF_PACKAGE)"
  python -m pip install --quiet --upgrade "pip==24.2" "setuptools<75" wheel
  python -m pip install --quiet -r "$requirements"
  echo "$req_hash" > "$(stamp req)"
fi

if ! python -c "import horovod.tensorflow" >/dev/null 2>&1; then
  echo "[setup] building horovod 0.28.1 with TensorFlow and Gloo (2-3 minutes)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
  MAKEFLAGS="-j$(nproc)" \
    python -m pip install --quiet --no-cache-dir --no-build-isolation horovod==0.28.1
fi

if [ "${1:-}" = "--stack" ]; then
  echo "[setup] stack ready: $VENV"
  exit 0
fi

echo "[setup] building the op library"
make -s -j"$(nproc)" -C ops PYTHON="$VENV/bin/python"

pkg_hash=$(hash_of pyproject.toml)
if [ "$(cat "$(stamp editable)" 2>/dev/null)" != "$pkg_hash" ]; then
  echo "[setup] installing gmeta_tf (editable) and its commands"
  python -m pip install --quiet --no-deps --no-build-isolation -e .
  echo "$pkg_hash" > "$(stamp editable)"
fi
echo "[setup] ready: $VENV"
