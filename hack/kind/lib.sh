# Shared by the hack/kind scripts (sourced, not run): where things are cached, the pinned versions, logging.
# shellcheck shell=bash

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_DIR="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
KIND_CACHE="$CACHE_DIR/kind"

KIND_VERSION="${KIND_VERSION:-v0.33.0}"
KIND_CLUSTER="${KIND_CLUSTER:-agentrun}"
# The Kubernetes of the node image: the same pin as the local control plane.
K8S_VERSION="$(bash "$REPO_ROOT/hack/build-control-plane.sh" print-versions | sed -n 's/.*kubernetes=\([^ ]*\).*/\1/p')"
CONTROL_PLANE_BIN="$(bash "$REPO_ROOT/hack/build-control-plane.sh" print-bin-dir)"
KIND="$KIND_CACHE/bin/kind-$KIND_VERSION/kind"
KUBECTL="$CONTROL_PLANE_BIN/kubectl"
HELM="$CONTROL_PLANE_BIN/helm"
KUBECONFIG_PATH="${AGENTRUN_KIND_KUBECONFIG:-$REPO_ROOT/.devcluster/kind.kubeconfig}"

export GOTOOLCHAIN=local

_kind_start=$SECONDS
log() { printf '[kind %4ds] %s\n' "$((SECONDS - _kind_start))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The hash of files and strings: an image's cache key, so that an unchanged input reuses its image.
inputs_hash() {
  local item
  for item in "$@"; do
    if [[ -d "$item" ]]; then
      (cd "$item" && find . -type f -not -name '*.pyc' -not -path '*/__pycache__/*' -print0 | sort -z |
        xargs -0 sha256sum)
    elif [[ -f "$item" ]]; then
      sha256sum <"$item"
    else
      printf '%s\n' "$item"
    fi
  done | sha256sum | cut -c1-16
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Does a registry answer for this image? (docker pull, bounded: on a machine without one it fails fast or
# times out.) Pulls it when one does.
pull_image() { timeout "${AGENTRUN_PULL_TIMEOUT:-60}" docker pull --quiet "$1" >/dev/null 2>&1; }

# docker build with BuildKit where the CLI has it (buildx), otherwise the classic builder (the Dockerfiles
# here need neither BuildKit nor a registry for their syntax line).
docker_build() {
  if docker buildx version >/dev/null 2>&1; then
    DOCKER_BUILDKIT=1 docker build "$@"
  else
    # (without its notice that the classic builder is deprecated: the paragraph up to the first blank line)
    DOCKER_BUILDKIT=0 docker build "$@" 2> >(awk 'NR == 1 && /^DEPRECATED/ { skip = 1 } skip && /^ *$/ { skip = 0; next } !skip' >&2)
  fi
}
