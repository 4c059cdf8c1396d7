#!/usr/bin/env bash
# Builds a minimal OpenTelemetry Collector (the OTLP receiver and the contrib file exporter) from its Go
# modules at pinned versions, into the cache outside the checkout, for the tracing tests: a real OTLP
# receiver that writes what it received as OTLP JSON lines, which the tests read.
#
# The core distribution (cmd/otelcorecol) cannot be `go install`ed (its go.mod replaces modules with
# local paths) and has no file exporter, so, as for etcd, a scratch module holds a small main that
# lists the components, like the collector builder (ocb) would generate. Re-running reuses the binary.
set -euo pipefail

OTELCOL_VERSION="${OTELCOL_VERSION:-v0.165.0}"   # collector modules v0.x (component modules v1.71.0)
OTELCOL_STABLE_VERSION="${OTELCOL_STABLE_VERSION:-v1.71.0}"
CACHE_DIR="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
BIN="$CACHE_DIR/bin/otelcol-$OTELCOL_VERSION/otelcol-agentrun"
MOD="$CACHE_DIR/build/otelcol-$OTELCOL_VERSION"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

if [[ "${1:-}" == print-bin ]]; then echo "$BIN"; exit 0; fi
if [[ -x "$BIN" ]]; then echo "[otelcol build] reusing $BIN" >&2; exit 0; fi
start=$SECONDS
mkdir -p "$MOD" "$(dirname "$BIN")"
cat >"$MOD/go.mod" <<GOMOD
module agentrun.dev/build/otelcol

go 1.26.0

require (
	go.opentelemetry.io/collector/otelcol $OTELCOL_VERSION
	go.opentelemetry.io/collector/receiver/otlpreceiver $OTELCOL_VERSION
	go.opentelemetry.io/collector/confmap $OTELCOL_STABLE_VERSION
	go.opentelemetry.io/collector/confmap/provider/fileprovider $OTELCOL_STABLE_VERSION
	go.opentelemetry.io/collector/component $OTELCOL_STABLE_VERSION
	go.opentelemetry.io/collector/service $OTELCOL_VERSION
	github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $OTELCOL_VERSION
)
GOMOD
cat >"$MOD/main.go" <<'GO'
// Command otelcol-agentrun is an OpenTelemetry Collector with the OTLP receiver and the file exporter.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if factories.Receivers, err = otelcol.MakeFactoryMap(otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Exporters, err = otelcol.MakeFactoryMap(fileexporter.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	return factories, nil
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol-agentrun", Description: "agentrun test collector", Version: "dev"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
				DefaultScheme:     "file",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
GO
echo "[otelcol build] building the collector $OTELCOL_VERSION (cold: a few minutes)" >&2
# -e: the contrib modules' tests import modules the proxy does not serve; the build does not need them
(cd "$MOD" && go mod tidy -e && go build -trimpath -ldflags "-s -w" -o "$BIN" .)
echo "[otelcol build] built $BIN in $((SECONDS - start))s" >&2
