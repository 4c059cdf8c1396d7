#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl) and helm from the Go module proxy at pinned versions, into a cache outside the checkout.
#
# `go install module@version` refuses modules whose go.mod has replace directives (k8s.io/kubernetes
# replaces its ~31 staging modules with ./staging/...), so each build goes through a generated
# scratch module that pins every staging module to its published v0.X.Y twin.
#
# Re-running is cheap: binaries already in the cache are reused.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE_DIR="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
BIN_DIR="$CACHE_DIR/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION"
WORK_DIR="$CACHE_DIR/build"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

what="${1:-all}"
case "$what" in
  print-bin-dir) echo "$BIN_DIR"; exit 0 ;;
  print-versions) echo "kubernetes=$K8S_VERSION etcd=$ETCD_VERSION helm=$HELM_VERSION"; exit 0 ;;
esac

start=$SECONDS
log() { printf '[control-plane build %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }

# Prints one progress line per 100 packages compiled, so a cold build shows it is alive.
progress() { awk -v what="$1" '{ n++; if (n % 100 == 0) { printf "  %s: %d packages compiled\n", what, n; fflush() } }' >&2; }

have_all() { for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done; }

# Arguments: a name for its scratch module, then the commands of k8s.io/kubernetes/cmd to build.
build_kubernetes() {
  local scratch="$1"
  shift
  local bins=("$@")
  if have_all "${bins[@]}"; then log "reusing Kubernetes $K8S_VERSION binaries in $BIN_DIR"; return; fi
  local mod="$WORK_DIR/$scratch-$K8S_VERSION" minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  mkdir -p "$mod" "$BIN_DIR"
  log "resolving k8s.io/kubernetes@$K8S_VERSION"
  local upstream
  upstream=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  {
    echo "module agentrun.dev/build/kubernetes"
    echo
    grep -E '^go [0-9]' "$upstream"
    grep -E '^godebug ' "$upstream" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # every staging module, pinned to the tag published alongside this Kubernetes release
    sed -n 's#^\s*\(k8s.io/[^ ]*\) => ./staging/src/.*#\t\1 => \1 v0.'"${K8S_VERSION#v1.}"'#p' "$upstream"
    echo ")"
  } >"$mod/go.mod"
  local ldflags="-s -w"
  local v=k8s.io/component-base/version
  ldflags+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
  ldflags+=" -X $v.buildDate=1970-01-01T00:00:00Z"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  log "building ${bins[*]} (cold build: tens of minutes on 2 cores)"
  local pkgs=()
  for b in "${bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$mod" && go build -v -trimpath -ldflags "$ldflags" -o "$BIN_DIR/" "${pkgs[@]}" 2>&1 | progress kubernetes)
  have_all "${bins[@]}" || { log "Kubernetes build did not produce all binaries"; exit 1; }
  log "built Kubernetes $K8S_VERSION"
}

build_etcd() {
  if have_all etcd; then log "reusing etcd $ETCD_VERSION"; return; fi
  local mod="$WORK_DIR/etcd-$ETCD_VERSION"
  mkdir -p "$mod" "$BIN_DIR"
  cat >"$mod/go.mod" <<GOMOD
module agentrun.dev/build/etcd

go 1.25.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$mod/main.go" <<'GO'
// Command etcd is the etcd server, built from its Go module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && go mod tidy)
  (cd "$mod" && go build -v -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd" . 2>&1 | progress etcd)
  have_all etcd || { log "etcd build failed"; exit 1; }
  log "built etcd $ETCD_VERSION"
}

build_helm() {
  if have_all helm; then log "reusing helm $HELM_VERSION"; return; fi
  mkdir -p "$BIN_DIR"
  log "building helm $HELM_VERSION"
  GOBIN="$BIN_DIR" GOFLAGS= go install -v -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" 2>&1 | progress helm
  have_all helm || { log "helm build failed"; exit 1; }
  log "built helm $HELM_VERSION"
}

CONTROL_PLANE=(kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl)
# kind's node image (hack/kind/node-image.sh): the binaries a node runs, built from the same version
NODE=(kubernetes-node kubelet kubeadm kube-proxy)
case "$what" in
  all) build_etcd; build_kubernetes "${CONTROL_PLANE[@]}"; build_helm ;;
  etcd) build_etcd ;;
  kubernetes) build_kubernetes "${CONTROL_PLANE[@]}" ;;
  node) build_kubernetes "${NODE[@]}" ;;
  helm) build_helm ;;
  *) echo "usage: $0 [all|etcd|kubernetes|node|helm|print-bin-dir|print-versions]" >&2; exit 2 ;;
esac
log "binaries in $BIN_DIR"
