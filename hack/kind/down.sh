#!/usr/bin/env bash
# `make kind-down`: deletes the kind cluster of `make kind`, then stops the Docker Engine only if `make kind`
# started it. The cached images and binaries stay (a next `make kind` reuses them).
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$KIND" ]] && docker info >/dev/null 2>&1 && "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  log "deleting the kind cluster $KIND_CLUSTER"
  "$KIND" delete cluster --name "$KIND_CLUSTER"
fi
rm -f "$KIND_CACHE/cluster-$KIND_CLUSTER.key" "$KUBECONFIG_PATH" "${KUBECONFIG_PATH%.kubeconfig}.env"
bash "$(dirname "${BASH_SOURCE[0]}")/engine.sh" down
