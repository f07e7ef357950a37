#!/usr/bin/env bash
# The Docker engine that docker/build.sh and the image smoke test use.
#
#   docker/engine.sh start    use the engine that answers; if none does and we are root,
#                             install Debian's docker.io when dockerd is missing and start
#                             dockerd (prints what it did; exit 1 with the reason if it can't)
#   docker/engine.sh stop     stop the dockerd that `start` started, and only that one
#   docker/engine.sh status   exit 0 when an engine answers
#
# dockerd is started with --bridge=none --iptables=false: it makes no bridge and no
# firewall rules, so builds and containers use the host's network (`--network host`).
# Its state (pid file, log) is kept in $GMETA_DOCKERD_STATE (default /run/gmeta-tf-dockerd);
# images and build cache stay in dockerd's data root (/var/lib/docker), so a later build
# reuses its layers.
set -euo pipefail

STATE=${GMETA_DOCKERD_STATE:-/run/gmeta-tf-dockerd}
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log

# Debian's client has BuildKit built in; a newer client elsewhere on the PATH may want buildx.
docker_client() {
  if [ -n "${DOCKER:-}" ]; then echo "$DOCKER"
  elif [ -x /usr/bin/docker ]; then echo /usr/bin/docker
  else command -v docker || echo docker
  fi
}

answers() { "$(docker_client)" info >/dev/null 2>&1; }

our_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# apt-get that waits up to 10 minutes for the package locks another apt run holds (a
# setup installing the local cluster's packages, unattended upgrades) rather than failing
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

install_engine() {
  echo "[engine] installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt_get install -y -q --no-install-recommends docker.io >"$STATE/apt.log" 2>&1; then
    apt_get update -q >>"$STATE/apt.log" 2>&1 || true
    apt_get install -y -q --no-install-recommends docker.io >>"$STATE/apt.log" 2>&1 || {
      tail -5 "$STATE/apt.log"; echo "[engine] apt-get install docker.io failed"; return 1; }
  fi
}

start() {
  if answers; then
    echo "[engine] a Docker engine answers already; using it"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "[engine] no Docker engine answers and starting one needs root"
    return 1
  fi
  mkdir -p "$STATE"
  command -v dockerd >/dev/null 2>&1 || install_engine
  if [ ! -x "$(command -v "$(docker_client)")" ]; then
    echo "[engine] no docker client found"; return 1
  fi
  echo "[engine] starting dockerd (--bridge=none --iptables=false; log $LOG)"
  # setsid: dockerd outlives the shell that started it, until `stop`.
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --pidfile "$STATE/dockerd.self.pid" >"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 60); do
    if answers; then
      echo "[engine] dockerd $(cat "$PIDFILE") is up"
      return 0
    fi
    if ! our_pid >/dev/null; then
      tail -20 "$LOG"
      echo "[engine] dockerd exited at start (log above)"
      rm -f "$PIDFILE"
      return 1
    fi
    sleep 1
  done
  tail -20 "$LOG"
  echo "[engine] dockerd did not answer within 60 s (log above); stopping it"
  stop
  return 1
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    rm -f "$PIDFILE"
    return 0
  fi
  echo "[engine] stopping dockerd $pid"
  kill -TERM "$pid"
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; echo "[engine] dockerd stopped"; return 0; }
    sleep 1
  done
  echo "[engine] dockerd $pid still running after 30 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
