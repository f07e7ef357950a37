#!/usr/bin/env bash
# Creates .venv-peers: the peers that benchmarks compare against, kept out of the project's
# pinned .venv. Idempotent: a stamp holds the hash of the pins below and this file.
#
# TensorFlow Recommenders-Addons 0.8.1 declares `tensorflow>=2.11.0,<=2.16.2` and its
# custom ops load with TensorFlow 2.16.2, so the peers use the project's own TensorFlow
# (same kernels, same thread pools: a like-for-like comparison). TFRA is installed with
# --no-deps because it names the full `tensorflow` wheel, which would land a second copy
# of TensorFlow over tensorflow-cpu. It stays in its own venv anyway: importing it patches
# TensorFlow's save/restore and optimizer classes, which must not reach the project.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${GMETA_PEERS_VENV:-$ROOT/.venv-peers}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

PINS=(tensorflow-cpu==2.16.2 tf-keras==2.16.0 numpy==1.26.4)
NODEPS_PINS=(tensorflow-recommenders-addons==0.8.1)

want=$( { printf '%s\n' "${PINS[@]}" "${NODEPS_PINS[@]}"; cat "$0"; } | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.stamp-peers" 2>/dev/null)" = "$want" ]; then
  echo "[setup_peers] ready: $VENV"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_peers] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
echo "[setup_peers] installing ${PINS[*]} ${NODEPS_PINS[*]}"
"$VENV/bin/python" -m pip install --quiet --upgrade "pip==24.2"
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}"
"$VENV/bin/python" -m pip install --quiet --no-deps "${NODEPS_PINS[@]}"

# Prove the op libraries load against this TensorFlow before stamping.
TF_CPP_MIN_LOG_LEVEL=3 TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -c '
import tensorflow as tf
import tensorflow_recommenders_addons as tfra
from tensorflow_recommenders_addons import dynamic_embedding as de
de.get_variable("probe", key_dtype=tf.int64, value_dtype=tf.float32, dim=2).size()
print("[setup_peers] tensorflow", tf.__version__, "tfra", tfra.__version__)
' 2>&1 | grep '^\[setup_peers\]'
echo "$want" > "$VENV/.stamp-peers"
echo "[setup_peers] ready: $VENV"
