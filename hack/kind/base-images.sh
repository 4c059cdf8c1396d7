#!/usr/bin/env bash
# Base images for the kind build, printed on stdout:
#   base-images.sh python   the Dockerfiles' PYTHON_IMAGE: the official python:3.11-slim-bookworm where a
#                           registry answers; otherwise Debian bookworm's python3 (3.11) and venv
#   base-images.sh debian   a plain Debian bookworm: the base of kind's node image and its component
#                           images where no registry answers (otherwise debian:bookworm-slim)
# Without a registry they are made with debootstrap from the distribution's packages (the mirror apt uses
# here), with the machine's locally added CA certificates installed, so that HTTPS (pip) works in builds.
# Each is tagged by a hash of what made it and reused.
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE=bookworm
OFFICIAL_PYTHON=python:3.11-slim-bookworm
OFFICIAL_DEBIAN=debian:bookworm-slim
LOCAL_CA_DIR=/usr/local/share/ca-certificates
DEBIAN_PACKAGES=ca-certificates
PYTHON_PACKAGES="python3 python3-venv python-is-python3"
# Part of the made images' keys: change it when the way they are made changes.
RECIPE=1

# The mirror apt uses on this machine (deb822 sources or sources.list).
apt_mirror() {
  local mirror
  mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs: *\([^ ]*\).*/\1/p' |
    grep -v security | head -1)"
  [[ -n "$mirror" ]] || mirror="$(sed -n 's/^deb \(\[[^]]*\] \)\?\([^ ]*\) .*/\2/p' /etc/apt/sources.list 2>/dev/null |
    grep -v security | head -1)"
  [[ -n "$mirror" ]] || die "no Debian mirror found in the apt sources"
  echo "$mirror"
}

local_debian_name() {
  echo "agentrun-local/debian:$SUITE-$(inputs_hash "$SUITE" "$(apt_mirror)" "$DEBIAN_PACKAGES" "$RECIPE" "$LOCAL_CA_DIR")"
}

local_python_name() {
  echo "agentrun-local/python:3.11-$SUITE-$(inputs_hash "$(local_debian_name)" "$PYTHON_PACKAGES")"
}

local_debian() {
  local image mirror
  image="$(local_debian_name)"
  mirror="$(apt_mirror)"
  if have_image "$image"; then echo "$image"; return; fi
  [[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap from the distribution's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local root="$KIND_CACHE/rootfs-$SUITE"
  rm -rf "$root"
  log "no registry answers: making Debian $SUITE with debootstrap from $mirror (about a minute)"
  debootstrap --variant=minbase --include="$DEBIAN_PACKAGES" "$SUITE" "$root" "$mirror" >"$KIND_CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$KIND_CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
  if compgen -G "$LOCAL_CA_DIR/*.crt" >/dev/null; then
    log "adding this machine's local CA certificates ($LOCAL_CA_DIR) to the base"
    cp "$LOCAL_CA_DIR"/*.crt "$root$LOCAL_CA_DIR/"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$image" >/dev/null
  rm -rf "$root"
  log "made $image"
  echo "$image"
}

# The official image when it is here or a registry answers; otherwise the one made here (made once).
choose() {
  local official="$1" made="$2" make="$3"
  if have_image "$official"; then echo "$official"; return; fi
  if have_image "$made"; then echo "$made"; return; fi
  if pull_image "$official"; then echo "$official"; return; fi
  "$make"
}

debian() { choose "$OFFICIAL_DEBIAN" "$(local_debian_name)" local_debian; }

python() { choose "$OFFICIAL_PYTHON" "$(local_python_name)" local_python; }

local_python() {
  local base image
  base="$(local_debian)"
  image="$(local_python_name)"
  log "making $image: $base with $PYTHON_PACKAGES"
  printf 'FROM %s\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends %s >/dev/null && rm -rf /var/lib/apt/lists/* && python -c "import sys; assert sys.version_info >= (3, 11), sys.version"\n' \
    "$base" "$PYTHON_PACKAGES" | docker_build -q -t "$image" - >/dev/null
  echo "$image"
}

case "${1:-}" in
  python) python ;;
  debian) debian ;;
  *) echo "usage: $0 python|debian" >&2; exit 2 ;;
esac
