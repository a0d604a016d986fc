#!/usr/bin/env bash
# The main job: build the binaries into bin/ and play a fleet run on the
# input (default input.json). Ctrl-C stops the host and every worker and
# keeps the run directory.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="/usr/local/go/bin:$PATH"
input="${1:-input.json}"
go build -o bin/ ./cmd/fleet-host ./cmd/fleet-worker ./cmd/fleet-run ./cmd/fleetctl
exec bin/fleet-run --bin bin --input "$input"
