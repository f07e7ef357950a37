#!/usr/bin/env bash
# Builds the gmeta-tf image from this tree (the Dockerfile beside docker/), starting a
# Docker engine first when none answers (docker/engine.sh; as root it installs Debian's
# docker.io when missing).
#
#   docker/build.sh                  CPU image, tagged gmeta-tf
#   docker/build.sh --gpu            GPU image (CUDA base, NCCL), tagged gmeta-tf:gpu
#   docker/build.sh --tag NAME       another tag
#   docker/build.sh --base IMAGE     another base image (the BASE_CPU / BASE_GPU build arg)
#   docker/build.sh ... -- ARGS      ARGS passed on to `docker build`
#
# The CPU base is the official python:3.11-slim-bookworm. When it is neither present nor
# pullable (no registry reachable), the script makes an equivalent base from Debian's
# packages instead: debootstrap bookworm with Python 3.11 (venv, pip, headers) from the
# Debian mirror apt uses, the machine's CA bundle copied in so pip inside trusts what pip
# outside trusts, imported as gmeta-tf-base:bookworm (made once, reused after). The GPU
# base (nvidia/cuda) has no such stand-in: it must be present or pullable.
#
# Builds and containers use the host's network (--network host): the engine started here
# makes no bridge. Prints the build's time and the image's size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=cpu
tag=
base=
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) variant=gpu ;;
    --cpu) variant=cpu ;;
    --tag) tag=$2; shift ;;
    --base) base=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "docker/build.sh: unknown argument '$1' (see the usage at the top of $0)" >&2
       exit 2 ;;
  esac
  shift
done
[ -n "$tag" ] || { [ "$variant" = gpu ] && tag=gmeta-tf:gpu || tag=gmeta-tf; }

bash docker/engine.sh start
if [ -n "${DOCKER:-}" ]; then :
elif [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker
else DOCKER=docker
fi
export DOCKER_BUILDKIT=1

# The Dockerfile's default for this variant's base (one place states it: the Dockerfile).
arg_name=BASE_$(echo "$variant" | tr a-z A-Z)
default_base=$(sed -n "s/^ARG $arg_name=//p" Dockerfile)
DEBIAN_BASE=gmeta-tf-base:bookworm

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror apt uses here (first http(s) URI serving bookworm), else Debian's CDN.
debian_mirror() {
  if [ -n "${GMETA_DEBIAN_MIRROR:-}" ]; then echo "$GMETA_DEBIAN_MIRROR"; return; fi
  local found
  found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | grep -v '^\s*#' \
          | grep -oE '(https?://[^ ]+/debian)(/| |$)' | head -1 | tr -d ' ' | sed 's:/$::') || true
  echo "${found:-http://deb.debian.org/debian}"
}

make_debian_base() {
  if [ "$(id -u)" != 0 ]; then
    echo "[build] making the Debian base needs root (debootstrap)" >&2; return 1
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "[build] installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap \
      >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; }
  fi
  local mirror rootfs
  mirror=$(debian_mirror)
  rootfs=$(mktemp -d /var/tmp/gmeta-tf-rootfs.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  echo "[build] debootstrap bookworm from $mirror (about a minute)"
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,python3-dev,ca-certificates \
    bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log"; echo "[build] debootstrap failed (log above)" >&2; return 1; }
  rm -f "$rootfs.log"
  # apt inside reads the same mirror, with bookworm's updates as the official image has.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
    > "$rootfs/etc/apt/sources.list"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  echo "[build] importing it as $DEBIAN_BASE"
  tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$DEBIAN_BASE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
}

if [ -z "$base" ]; then
  base=$default_base
  if have_image "$base"; then :
  elif "$DOCKER" pull -q "$base" >/dev/null 2>&1; then
    echo "[build] pulled $base"
  elif [ "$variant" = gpu ]; then
    echo "[build] the GPU base $base is not here and cannot be pulled; pull it where a" \
         "registry is reachable, or pass --base IMAGE (a CUDA 12.3 devel image)" >&2
    exit 1
  else
    echo "[build] $base is not here and cannot be pulled: using $DEBIAN_BASE instead"
    base=$DEBIAN_BASE
    have_image "$base" || make_debian_base
  fi
fi

echo "[build] docker build -t $tag (VARIANT=$variant, $arg_name=$base)"
start=$(date +%s)
"$DOCKER" build --network host --build-arg "VARIANT=$variant" --build-arg "$arg_name=$base" \
  -t "$tag" ${extra[@]+"${extra[@]}"} .
seconds=$(( $(date +%s) - start ))
size=$("$DOCKER" image inspect -f '{{.Size}}' "$tag")
echo "[build] $tag built in ${seconds}s, $(awk -v b="$size" 'BEGIN{printf "%.2f GB", b/1e9}')"
