#!/usr/bin/env bash
# Entry point of the gmeta-tf image.
#   demo | test            the README's two commands (make demo, make test)
#   gmeta VERB ...         the gmeta command (train, eval, export, data, config)
#   horovodrun ...         a launch across ranks or hosts, e.g.
#                          horovodrun -np 16 -H host1:8,host2:8 gmeta train --config default
#   anything else          run as is (bash, python, ...)
set -euo pipefail
cd /opt/gmeta-tf
export PATH=/opt/gmeta-tf/.venv/bin:$PATH
export TF_USE_LEGACY_KERAS=1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# The ready pipelines read ../shared/data from the project root: mount it at /opt/shared/data.

case "${1:-demo}" in
  demo) shift || true; exec make demo "$@" ;;
  test) shift || true; exec make test "$@" ;;
  gmeta) shift; exec gmeta "$@" ;;
  train|eval|export|data|config) exec gmeta "$@" ;;
  *) exec "$@" ;;
esac
