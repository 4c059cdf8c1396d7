#!/usr/bin/env bash
# Builds versitygw (Apache-2.0), an S3-compatible gateway in one process, from its Go module at a pinned
# version into the cache outside the checkout: the local control plane's object store (the agent-state
# store of docs/state-store.md), with a posix backend on a directory and conditional writes
# (If-None-Match: *). Its go.mod has no replace directives, so `go install module@version` builds it
# as published. Re-running reuses the binary.
set -euo pipefail

# The pin has one source, which the Helm chart's image tag comes from too (agentrun.deploy.generate).
PIN_SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/operator/agentrun/statestore/versitygw.py"
PINNED="$(sed -n 's/^VERSION: Final = "\(v[0-9][0-9.]*\)"$/\1/p' "$PIN_SOURCE")"
[[ -n "$PINNED" ]] || { echo "[versitygw build] no VERSION pin found in $PIN_SOURCE" >&2; exit 1; }
VERSITYGW_VERSION="${VERSITYGW_VERSION:-$PINNED}"
CACHE_DIR="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
BIN="$CACHE_DIR/bin/versitygw-$VERSITYGW_VERSION/versitygw"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

case "${1:-build}" in
  print-bin) echo "$BIN"; exit 0 ;;
  print-version) echo "$VERSITYGW_VERSION"; exit 0 ;;
  build) ;;
  *) echo "usage: $0 [build|print-bin|print-version]" >&2; exit 2 ;;
esac
if [[ -x "$BIN" ]]; then echo "[versitygw build] reusing $BIN" >&2; exit 0; fi
start=$SECONDS
mkdir -p "$(dirname "$BIN")"
echo "[versitygw build] building versitygw $VERSITYGW_VERSION (cold: a few minutes on 2 cores)" >&2
# The version the binary prints (`versitygw --version`), as its own Makefile sets it.
main=main
GOBIN="$(dirname "$BIN")" GOFLAGS= go install -trimpath \
  -ldflags "-s -w -X $main.Version=$VERSITYGW_VERSION -X $main.Build=module -X $main.BuildTime=1970-01-01T00:00:00Z" \
  "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
[[ -x "$BIN" ]] || { echo "[versitygw build] the build produced no $BIN" >&2; exit 1; }
echo "[versitygw build] built $BIN in $((SECONDS - start))s" >&2
