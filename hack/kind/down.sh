#!/usr/bin/env bash
# `make kind-down`: deletes the kind cluster of `make kind`, then stops the Docker Engine only if `make kind`
# started it. The cached images and binaries stay (a next `make kind` reuses them).
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# make kind's cluster, and the one make e2e-kind may have left
for cluster in "$KIND_CLUSTER" "$KIND_CLUSTER-e2e"; do
  if [[ -x "$KIND" ]] && docker info >/dev/null 2>&1 && "$KIND" get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "deleting the kind cluster $cluster"
    "$KIND" delete cluster --name "$cluster"
  fi
  rm -f "$KIND_CACHE/cluster-$cluster.key"
done
rm -f "$KUBECONFIG_PATH" "${KUBECONFIG_PATH%.kubeconfig}.env" "${KUBECONFIG_PATH%.kubeconfig}-e2e.kubeconfig"
bash "$(dirname "${BASH_SOURCE[0]}")/engine.sh" down
