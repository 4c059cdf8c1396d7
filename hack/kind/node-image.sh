#!/usr/bin/env bash
# kind's node image for the pinned Kubernetes (the local control plane's version), printed on stdout.
#
# Where a registry answers, kind's published node image of that version (kindest/node:<version>).
# Otherwise it is built here with `kind build node-image --type file`, everything from source or from the
# distribution's packages, cached in Docker under a tag keyed by every version that goes into it:
#   - a base image made like kind's own (its images/base, read from kind's module): Debian bookworm
#     (base-images.sh) with systemd, runc and the CNI plugins from the distribution's packages; containerd
#     v2 and crictl built from their Go modules (the distribution's containerd 1.6 lacks the
#     `ctr images import --label` that kind's build uses); kind's files (entrypoint, units, containerd
#     configuration); no kindnetd: a static ptp + host-local CNI configuration (single node only: the
#     cluster is created with disableDefaultCNI);
#   - a release-style tarball: kubelet, kubeadm, kube-proxy (hack/build-control-plane.sh node) and
#     kubectl, kube-apiserver, kube-controller-manager, kube-scheduler (the local control plane's); images
#     made from those binaries, plus etcd at the version kubeadm pins, CoreDNS and local-path-provisioner
#     from their modules and a static pause from the C source in the Kubernetes module, all packed into the
#     tarball's four image archives (kind takes image names from those alone, and pulls any other).
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONTAINERD_VERSION=v2.3.7
CRICTL_VERSION=v1.34.0 # the proxy refuses v1.35.0
LOCAL_PATH_VERSION=v0.0.30 # kind's own build uses v0.0.34, which the proxy refuses
# Part of the image's key: change it when the way the image is made changes.
RECIPE=1

KIND_MOD="$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION"
K8S_MOD="$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION"
BUILD="$KIND_CACHE/node-build"
BINS="$KIND_CACHE/bin"

published() {
  local image="kindest/node:$K8S_VERSION"
  if have_image "$image" || pull_image "$image"; then echo "$image"; return 0; fi
  return 1
}

# What kind and kubeadm expect, read from their sources.
read_pins() {
  [[ -d "$KIND_MOD" ]] || (cd /tmp && GOFLAGS=-mod=mod go mod download "sigs.k8s.io/kind@$KIND_VERSION")
  [[ -d "$K8S_MOD" ]] || (cd /tmp && GOFLAGS=-mod=mod go mod download "k8s.io/kubernetes@$K8S_VERSION")
  local constants="$K8S_MOD/cmd/kubeadm/app/constants/constants.go"
  ETCD_TAG="$(sed -n 's/^\s*DefaultEtcdVersion = "\(.*\)"/\1/p' "$constants")" # e.g. 3.6.6-0
  ETCD_VERSION="v${ETCD_TAG%-*}"
  COREDNS_VERSION="$(sed -n 's/^\s*CoreDNSVersion = "\(.*\)"/\1/p' "$constants")"
  PAUSE_IMAGE="$(sed -n 's/^\s*sandbox_image = "\(.*\)"/\1/p' "$KIND_MOD/images/base/files/etc/containerd/config.toml")"
  KINDNETD_IMAGE="$(sed -n 's/^const kindnetdImage = "\(.*\)"/\1/p' "$KIND_MOD/pkg/build/nodeimage/const_cni.go")"
  PROVISIONER_IMAGE="$(sed -n 's/^const storageProvisionerImage = "\(.*\)"/\1/p' "$KIND_MOD/pkg/build/nodeimage/const_storage.go")"
  HELPER_IMAGE="$(sed -n 's/^const storageHelperImage = "\(.*\)"/\1/p' "$KIND_MOD/pkg/build/nodeimage/const_storage.go")"
  for pin in ETCD_TAG COREDNS_VERSION PAUSE_IMAGE KINDNETD_IMAGE PROVISIONER_IMAGE HELPER_IMAGE; do
    [[ -n "${!pin}" ]] || die "could not read $pin from kind's or kubeadm's source"
  done
}

# go install PKG@VERSION into the cache (reused), with extra `go install` flags after the version.
go_bin() {
  local name="$1" pkg="$2" version="$3"
  shift 3
  local dir="$BINS/$name-$version"
  if [[ -x "$dir/$name" ]]; then return; fi
  log "building $name $version from its Go module"
  mkdir -p "$dir"
  GOBIN="$dir" GOFLAGS= CGO_ENABLED=0 go install -trimpath "$@" "$pkg@$version" ||
    die "building $name failed"
}

build_etcd() {
  local dir="$BINS/etcd-$ETCD_VERSION" mod="$BUILD/etcd-$ETCD_VERSION"
  [[ -x "$dir/etcd" ]] && return
  log "building etcd $ETCD_VERSION (the version kubeadm $K8S_VERSION pins) from its Go module"
  mkdir -p "$dir" "$mod"
  printf 'module agentrun.dev/build/etcd\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$mod/go.mod"
  printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >"$mod/main.go"
  (cd "$mod" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/etcd" .) || die "building etcd failed"
}

build_binaries() {
  local cd=github.com/containerd/containerd/v2
  local tags=(-tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "-s -w -X $cd/version.Version=$CONTAINERD_VERSION")
  go_bin containerd "$cd/cmd/containerd" "$CONTAINERD_VERSION" "${tags[@]}"
  go_bin ctr "$cd/cmd/ctr" "$CONTAINERD_VERSION" "${tags[@]}"
  go_bin containerd-shim-runc-v2 "$cd/cmd/containerd-shim-runc-v2" "$CONTAINERD_VERSION" "${tags[@]}"
  go_bin crictl sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_VERSION" -ldflags "-s -w"
  go_bin coredns github.com/coredns/coredns "$COREDNS_VERSION" -ldflags "-s -w"
  go_bin local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION" -ldflags "-s -w"
  build_etcd
  local k8s
  for k8s in kubelet kubeadm kube-proxy; do
    [[ -x "$CONTROL_PLANE_BIN/$k8s" ]] || { bash "$REPO_ROOT/hack/build-control-plane.sh" node; break; }
  done
  for k8s in kubectl kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "$CONTROL_PLANE_BIN/$k8s" ]] || { bash "$REPO_ROOT/hack/build-control-plane.sh" kubernetes; break; }
  done
}

# An image from a generated Dockerfile (stdin) and a context directory.
image_from() {
  local tag="$1" context="$2"
  docker_build -q -t "$tag" -f - "$context" >/dev/null || die "building $tag failed"
}

base_image() {
  local debian="$1" key="$2"
  local image="agentrun-local/kind-base:$key" ctx="$BUILD/base"
  if have_image "$image"; then echo "$image"; return; fi
  log "making kind's node base image $image"
  rm -rf "$ctx" && mkdir -p "$ctx/bin"
  cp -r "$KIND_MOD/images/base/files" "$ctx/files"
  chmod -R u+w "$ctx/files"
  local b
  for b in containerd ctr containerd-shim-runc-v2; do cp "$BINS/$b-$CONTAINERD_VERSION/$b" "$ctx/bin/"; done
  cp "$BINS/crictl-$CRICTL_VERSION/crictl" "$ctx/bin/"
  # One node: a point-to-point link per Pod, addresses from the node's Pod range (kind's default Pod
  # subnet is 10.244.0.0/16; the controller manager gives the only node 10.244.0.0/24).
  cat >"$ctx/10-agentrun-ptp.conflist" <<'JSON'
{
  "cniVersion": "0.4.0",
  "name": "agentrun-ptp",
  "plugins": [
    {"type": "ptp", "ipMasq": true, "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  image_from "$image" "$ctx" <<DOCKERFILE
FROM $debian
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
COPY bin/ /usr/local/bin/
COPY 10-agentrun-ptp.conflist /etc/cni/net.d/
RUN chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \
 && DEBIAN_FRONTEND=noninteractive clean-install systemd conntrack iptables nftables iproute2 ethtool \
      util-linux mount kmod libseccomp2 pigz bash ca-certificates curl jq procps runc containernetworking-plugins \
 && mkdir -p /opt/cni/bin && cp /usr/lib/cni/host-local /usr/lib/cni/loopback /usr/lib/cni/ptp /usr/lib/cni/portmap /opt/cni/bin/ \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
      /etc/systemd/system/containerd-fuse-overlayfs.service \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -s /usr/lib/systemd/systemd /sbin/init \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests \
 && ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && containerd --version && runc --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
DOCKERFILE
  echo "$image"
}

# The images kubeadm and kind's manifests name, made from what was built; printed one per line.
component_images() {
  local debian="$1" ctx="$BUILD/components"
  rm -rf "$ctx" && mkdir -p "$ctx"
  local reg=registry.k8s.io b
  for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl; do cp "$CONTROL_PLANE_BIN/$b" "$ctx/"; done
  cp "$BINS/etcd-$ETCD_VERSION/etcd" "$BINS/coredns-$COREDNS_VERSION/coredns" \
    "$BINS/local-path-provisioner-$LOCAL_PATH_VERSION/local-path-provisioner" "$ctx/"
  cp "$K8S_MOD/build/pause/linux/pause.c" "$ctx/"
  chmod u+w "$ctx"/*
  local static="ENV PATH=/usr/local/bin:/usr/bin:/bin"
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    printf 'FROM scratch\n%s\nCOPY %s /usr/local/bin/\n' "$static" "$b" | image_from "$reg/$b:$K8S_VERSION" "$ctx"
    echo "$reg/$b:$K8S_VERSION"
  done
  printf 'FROM %s\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables nftables conntrack ipset kmod >/dev/null && rm -rf /var/lib/apt/lists/*\nCOPY kube-proxy /usr/local/bin/\n' \
    "$debian" | image_from "$reg/kube-proxy:$K8S_VERSION" "$ctx"
  echo "$reg/kube-proxy:$K8S_VERSION"
  printf 'FROM scratch\n%s\nCOPY etcd /usr/local/bin/\n' "$static" | image_from "$reg/etcd:$ETCD_TAG" "$ctx"
  echo "$reg/etcd:$ETCD_TAG"
  printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' | image_from "$reg/coredns/coredns:$COREDNS_VERSION" "$ctx"
  echo "$reg/coredns/coredns:$COREDNS_VERSION"
  printf 'FROM %s AS build\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null\nCOPY pause.c /\nRUN gcc -Os -Wall -Werror -static -DVERSION=v%s -o /pause /pause.c\nFROM scratch\nCOPY --from=build /pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' \
    "$debian" "${PAUSE_IMAGE##*:}" | image_from "$PAUSE_IMAGE" "$ctx"
  echo "$PAUSE_IMAGE"
  printf 'FROM scratch\n%s\nCOPY local-path-provisioner /usr/local/bin/\nENTRYPOINT ["/usr/local/bin/local-path-provisioner"]\n' "$static" |
    image_from "$PROVISIONER_IMAGE" "$ctx"
  echo "$PROVISIONER_IMAGE"
  # the provisioner's helper Pods run sh, mkdir and rm
  printf 'FROM %s\n' "$debian" | image_from "$HELPER_IMAGE" "$ctx"
  echo "$HELPER_IMAGE"
  # kind's build requires an image of this name (its default CNI's); the cluster is created without that CNI
  # (disableDefaultCNI), so it is never run: the pause image stands under its name
  docker tag "$PAUSE_IMAGE" "$KINDNETD_IMAGE"
  echo "$KINDNETD_IMAGE"
}

# docker save IMAGES into ARCHIVE, with a `repositories` entry first naming every image fully (kind reads
# the archive's first metadata entry and compares fully qualified names).
save_archive() {
  local archive="$1"
  shift
  docker save -o "$archive.raw" "$@"
  python3 - "$archive.raw" "$archive" <<'PY'
import io
import json
import sys
import tarfile


def qualified(name):
    first = name.split("/", 1)[0]
    if "/" not in name:
        return "docker.io/library/" + name
    if "." in first or ":" in first or first == "localhost":
        return name
    return "docker.io/" + name


with tarfile.open(sys.argv[1]) as raw, tarfile.open(sys.argv[2], "w") as out:
    manifest = json.load(raw.extractfile("manifest.json"))
    repositories = {}
    for entry in manifest:
        for tag in entry.get("RepoTags") or []:
            repo, _, version = tag.rpartition(":")
            repositories.setdefault(qualified(repo), {})[version] = entry["Config"].split(".")[0].split("/")[-1]
    data = json.dumps(repositories).encode()
    info = tarfile.TarInfo("repositories")
    info.size, info.mode = len(data), 0o644
    out.addfile(info, io.BytesIO(data))
    for member in raw.getmembers():
        if member.name != "repositories":
            out.addfile(member, raw.extractfile(member) if member.isfile() else None)
PY
  rm -f "$archive.raw"
}

release_tarball() {
  local tarball="$1"
  shift
  local images=("$@") dir="$BUILD/release" bin
  rm -rf "$dir" && mkdir -p "$dir/kubernetes/server/bin"
  echo "$K8S_VERSION" >"$dir/kubernetes/version"
  bin="$dir/kubernetes/server/bin"
  cp "$CONTROL_PLANE_BIN/kubelet" "$CONTROL_PLANE_BIN/kubeadm" "$CONTROL_PLANE_BIN/kubectl" "$bin/"
  local reg=registry.k8s.io extra=() image
  save_archive "$bin/kube-apiserver.tar" "$reg/kube-apiserver:$K8S_VERSION"
  save_archive "$bin/kube-controller-manager.tar" "$reg/kube-controller-manager:$K8S_VERSION"
  save_archive "$bin/kube-scheduler.tar" "$reg/kube-scheduler:$K8S_VERSION"
  for image in "${images[@]}"; do
    case "$image" in "$reg/kube-apiserver:"* | "$reg/kube-controller-manager:"* | "$reg/kube-scheduler:"*) ;; *) extra+=("$image") ;; esac
  done
  save_archive "$bin/kube-proxy.tar" "${extra[@]}"
  tar -C "$dir" -czf "$tarball" kubernetes
  rm -rf "$dir"
}

main() {
  if published; then return; fi
  read_pins
  local debian key image
  debian="$(bash "$REPO_ROOT/hack/kind/base-images.sh" debian)"
  key="$(inputs_hash "$RECIPE" "$KIND_VERSION" "$K8S_VERSION" "$CONTAINERD_VERSION" "$CRICTL_VERSION" \
    "$LOCAL_PATH_VERSION" "$ETCD_TAG" "$COREDNS_VERSION" "$PAUSE_IMAGE" "$debian")"
  image="agentrun-local/kind-node:$K8S_VERSION-$key"
  if have_image "$image"; then echo "$image"; return; fi
  log "no published node image here: building $image (cold: about 10 minutes of builds)"
  mkdir -p "$BUILD"
  build_binaries
  local base images=()
  base="$(base_image "$debian" "$key")"
  log "making the component images"
  mapfile -t images < <(component_images "$debian")
  log "packing the release tarball"
  release_tarball "$BUILD/kubernetes-server-linux-amd64.tar.gz" "${images[@]}"
  log "kind build node-image"
  "$KIND" build node-image --type file "$BUILD/kubernetes-server-linux-amd64.tar.gz" \
    --base-image "$base" --image "$image" >"$BUILD/node-image.log" 2>&1 ||
    { tail -30 "$BUILD/node-image.log" >&2; die "kind build node-image failed (log: $BUILD/node-image.log)"; }
  rm -f "$BUILD/kubernetes-server-linux-amd64.tar.gz"
  log "built $image"
  echo "$image"
}

main
