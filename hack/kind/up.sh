#!/usr/bin/env bash
# `make kind`: a single-node kind cluster with agentrun installed as users install it.
#   - a Docker Engine (engine.sh: the running one, or one started from the distribution's packages);
#   - kind's node image for the pinned Kubernetes (node-image.sh: published, or built here);
#   - the operator image (Dockerfile), the agent image (Dockerfile.agent) and the bundled store's image
#     (Dockerfile.versitygw, the binary of hack/build-versitygw.sh), each rebuilt only when a hash of its
#     inputs changed (the hash is the image's label dev.agentrun.inputs), loaded into the cluster;
#   - the chart in agentrun-system (2 replicas, the bundled store as a StatefulSet with a volume from
#     local-path), the examples' namespace `agents` (examples/agents.yaml);
#   - the kubeconfig at .devcluster/kind.kubeconfig.
# A cluster whose node image and configuration did not change is reused.
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HERE="$REPO_ROOT/hack/kind"
VERSION="$(sed -n 's/^appVersion: *"\(.*\)"/\1/p' "$REPO_ROOT/charts/agentrun/Chart.yaml")"
OPERATOR_IMAGE="agentrun/operator:$VERSION"
AGENT_IMAGE="agentrun/agent:$VERSION"
STORE_VERSION="$(bash "$REPO_ROOT/hack/build-versitygw.sh" print-version)"
STORE_IMAGE="agentrun/versitygw:$STORE_VERSION"
RELEASE=agentrun
RELEASE_NAMESPACE=agentrun-system
CONTEXT_NODE="$KIND_CLUSTER-control-plane"

ensure_kind() {
  [[ -x "$KIND" ]] && return
  log "installing kind $KIND_VERSION from its Go module"
  mkdir -p "$(dirname "$KIND")"
  GOBIN="$(dirname "$KIND")" GOFLAGS= CGO_ENABLED=0 nice -n 10 go install "sigs.k8s.io/kind@$KIND_VERSION"
}

# build IMAGE KEY DOCKER-BUILD-ARGS...: unless IMAGE exists with that key
build_image() {
  local image="$1" key="$2"
  shift 2
  if [[ "$(docker image inspect -f '{{ index .Config.Labels "dev.agentrun.inputs" }}' "$image" 2>/dev/null)" == "$key" ]]; then
    log "image $image: inputs unchanged, reused"
    return
  fi
  local began=$SECONDS
  log "image $image: building"
  bash -c 'source "$1"; shift; docker_build "$@"' _ "$HERE/lib.sh" -q --label "dev.agentrun.inputs=$key" -t "$image" "$@" >/dev/null ||
    die "building $image failed"
  log "image $image: built in $((SECONDS - began))s, $(docker image inspect -f '{{ .Size }}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

build_images() {
  local python debian store_bin
  python="$(bash "$HERE/base-images.sh" python)"
  debian="$(bash "$HERE/base-images.sh" debian)"
  log "base images: PYTHON_IMAGE=$python, Debian $debian"
  local sources=("$REPO_ROOT/pyproject.toml" "$REPO_ROOT/README.md" "$REPO_ROOT/operator")
  build_image "$OPERATOR_IMAGE" "$(inputs_hash "$python" "$REPO_ROOT/Dockerfile" "${sources[@]}")" \
    --build-arg "PYTHON_IMAGE=$python" -f "$REPO_ROOT/Dockerfile" "$REPO_ROOT"
  build_image "$AGENT_IMAGE" "$(inputs_hash "$python" "$REPO_ROOT/Dockerfile.agent" "${sources[@]}")" \
    --build-arg "PYTHON_IMAGE=$python" -f "$REPO_ROOT/Dockerfile.agent" "$REPO_ROOT"
  bash "$REPO_ROOT/hack/build-versitygw.sh"
  store_bin="$(bash "$REPO_ROOT/hack/build-versitygw.sh" print-bin)"
  build_image "$STORE_IMAGE" "$(inputs_hash "$debian" "$REPO_ROOT/Dockerfile.versitygw" "$store_bin")" \
    --build-arg "BASE_IMAGE=$debian" -f "$REPO_ROOT/Dockerfile.versitygw" "$(dirname "$store_bin")"
}

# The release before the state store (tests/support/history.py: the parent of the commit that added
# operator/agentrun/api/blobref.py), for the e2e test that upgrades from it: its operator and agent images,
# built with its own Dockerfiles from `git archive` of that commit, tagged `previous`, keyed by the commit.
PREVIOUS_OPERATOR_IMAGE=agentrun/operator:previous
PREVIOUS_AGENT_IMAGE=agentrun/agent:previous
build_previous_images() {
  local commit python context
  commit="$(git -C "$REPO_ROOT" log --format=%H --diff-filter=A -- operator/agentrun/api/blobref.py | tail -1)"
  [[ -n "$commit" ]] || die "no commit added operator/agentrun/api/blobref.py (a shallow clone?)"
  commit="$(git -C "$REPO_ROOT" rev-parse "$commit^")"
  python="$(bash "$HERE/base-images.sh" python)"
  context="$KIND_CACHE/previous-$commit"
  if [[ ! -d "$context" ]]; then
    mkdir -p "$context.tmp"
    git -C "$REPO_ROOT" archive "$commit" Dockerfile Dockerfile.agent pyproject.toml README.md operator | tar -x -C "$context.tmp"
    mv "$context.tmp" "$context"
  fi
  log "the release before the state store: ${commit:0:12}"
  build_image "$PREVIOUS_OPERATOR_IMAGE" "$(inputs_hash "$python" "$commit")" \
    --build-arg "PYTHON_IMAGE=$python" -f "$context/Dockerfile" "$context"
  build_image "$PREVIOUS_AGENT_IMAGE" "$(inputs_hash "$python" "$commit")" \
    --build-arg "PYTHON_IMAGE=$python" -f "$context/Dockerfile.agent" "$context"
}

# kind's cluster configuration, with each workaround only where this machine needs it.
cluster_config() {
  local node_image="$1"
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  if [[ "$node_image" == agentrun-local/* ]]; then
    # the locally built node image has no kindnetd: its CNI configuration is static (node-image.sh)
    printf 'networking:\n  disableDefaultCNI: true\n'
  fi
  if [[ -n "$(bash "$HERE/engine.sh" missing-caps)" ]]; then
    printf 'containerdConfigPatches:\n- |-\n  [plugins."io.containerd.grpc.v1.cri"]\n    restrict_oom_score_adj = true\n'
  fi
  if [[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]]; then
    printf 'kubeadmConfigPatches:\n- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n'
  fi
  printf 'nodes:\n- role: control-plane\n'
}

explain_workarounds() {
  local config="$1"
  if grep -q restrict_oom_score_adj "$config"; then
    log "workaround: capabilities missing from the bounding set: the node's containerd gets"
    log "  restrict_oom_score_adj = true (Pod sandboxes could not set their oom_score_adj otherwise)"
  fi
  if grep -q failCgroupV1 "$config"; then
    log "workaround: this machine has cgroup v1, which kubelet $K8S_VERSION refuses by default: failCgroupV1: false"
    log "  (cgroup v1 is deprecated in Kubernetes; a machine with cgroup v2 needs no such setting)"
  fi
}

ensure_cluster() {
  local node_image="$1" config="$KIND_CACHE/cluster-$KIND_CLUSTER.yaml" keyfile="$KIND_CACHE/cluster-$KIND_CLUSTER.key" key
  mkdir -p "$KIND_CACHE" "$(dirname "$KUBECONFIG_PATH")"
  cluster_config "$node_image" >"$config"
  explain_workarounds "$config"
  key="$(inputs_hash "$node_image" "$config" "$KIND_VERSION")"
  if "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    if [[ "$(cat "$keyfile" 2>/dev/null)" == "$key" &&
      "$(docker inspect -f '{{ .State.Running }}' "$CONTEXT_NODE" 2>/dev/null)" == true ]]; then
      log "cluster $KIND_CLUSTER: node image and configuration unchanged, reused"
      "$KIND" get kubeconfig --name "$KIND_CLUSTER" >"$KUBECONFIG_PATH"
      return
    fi
    log "cluster $KIND_CLUSTER: its node image or configuration changed (or its node stopped): recreating it"
    "$KIND" delete cluster --name "$KIND_CLUSTER"
  fi
  rm -f "$keyfile"
  local began=$SECONDS
  log "cluster $KIND_CLUSTER: creating it from $node_image"
  "$KIND" create cluster --name "$KIND_CLUSTER" --image "$node_image" --config "$config" \
    --kubeconfig "$KUBECONFIG_PATH" --wait 180s
  echo "$key" >"$keyfile"
  log "cluster $KIND_CLUSTER: created in $((SECONDS - began))s"
}

load_images() {
  local image began=$SECONDS
  for image in "$OPERATOR_IMAGE" "$AGENT_IMAGE" "$STORE_IMAGE" "$@"; do
    "$KIND" load docker-image --name "$KIND_CLUSTER" "$image" 2>&1 | sed 's/^/  /' >&2
  done
  log "images loaded into the cluster in $((SECONDS - began))s"
}

install_chart() {
  local began=$SECONDS key
  # the operator's Pods roll when its image was rebuilt under the same tag
  key="$(docker image inspect -f '{{ .Id }}' "$OPERATOR_IMAGE" | cut -c8-19)"
  log "helm upgrade --install $RELEASE charts/agentrun -n $RELEASE_NAMESPACE (bundled state store on)"
  "$HELM" --kubeconfig "$KUBECONFIG_PATH" upgrade --install "$RELEASE" "$REPO_ROOT/charts/agentrun" \
    --namespace "$RELEASE_NAMESPACE" --create-namespace \
    --set stateStore.bundled.enabled=true \
    --set-string "stateStore.bundled.image.repository=${STORE_IMAGE%:*}" \
    --set-string "stateStore.bundled.image.tag=$STORE_VERSION" \
    --set-string "podAnnotations.agentrun\.dev/image-id=$key" \
    --wait --timeout 300s >/dev/null
  "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" apply -f "$REPO_ROOT/examples/agents.yaml" >/dev/null
  log "chart installed and examples/agents.yaml applied in $((SECONDS - began))s"
}

prepare() {
  bash "$HERE/engine.sh" up
  ensure_kind
  NODE_IMAGE="$(nice -n 10 bash "$HERE/node-image.sh")"
  log "node image: $NODE_IMAGE"
  build_images
}

main() {
  local began=$SECONDS
  prepare
  ensure_cluster "$NODE_IMAGE"
  load_images
  install_chart
  "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" get pods -n "$RELEASE_NAMESPACE" >&2
  # what a shell needs: KUBECONFIG, and kubectl, helm, kind (to load an image of one's own) and
  # kubectl-agentrun (the venv's) on PATH
  local env_file="${KUBECONFIG_PATH%.kubeconfig}.env"
  printf 'export KUBECONFIG=%q\nexport PATH=%q:%q:%q:"$PATH"\n' "$KUBECONFIG_PATH" "$CONTROL_PLANE_BIN" \
    "$(dirname "$KIND")" "$REPO_ROOT/.venv/bin" >"$env_file"
  log "ready in $((SECONDS - began))s. Go on with: source ${env_file#"$REPO_ROOT"/}"
}

# `make e2e-kind`: a fresh cluster of its own (the e2e tests install the chart themselves, and refuse a
# cluster whose CRDs belong to another release), the same node image and images, and the images of the
# release before the state store; no install.
fresh() {
  local began=$SECONDS
  prepare
  if "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    log "cluster $KIND_CLUSTER: deleting the one left from before (the e2e tests want a fresh cluster)"
    "$KIND" delete cluster --name "$KIND_CLUSTER"
  fi
  build_previous_images
  ensure_cluster "$NODE_IMAGE"
  load_images "$PREVIOUS_OPERATOR_IMAGE" "$PREVIOUS_AGENT_IMAGE"
  log "cluster $KIND_CLUSTER ready in $((SECONDS - began))s (kubeconfig: ${KUBECONFIG_PATH#"$REPO_ROOT"/})"
}

case "${1:-all}" in
  all) main ;;
  fresh) fresh ;;
  delete) "$KIND" delete cluster --name "$KIND_CLUSTER" ;;
  images) build_images ;; # the three images alone (into the running Docker Engine)
  previous-images) build_previous_images ;;
  *) echo "usage: $0 [all|fresh|delete|images|previous-images]" >&2; exit 2 ;;
esac
