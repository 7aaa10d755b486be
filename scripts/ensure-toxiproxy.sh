#!/usr/bin/env bash
# Toxiproxy's server (Shopify's TCP proxy with injectable faults), built from its Go module with
# this machine's Go toolchain, for the network fault tests and the soak. Idempotent: nothing to
# do when this version's binary is already in the cache. Prints the binary's path.
set -euo pipefail
source "$(dirname "$0")/go-binary.sh"

VERSION=v2.12.0

build() {
  local scratch
  scratch="$(mktemp -d)"
  GOBIN="$scratch" GOFLAGS=-mod=mod go install "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION"
  mv "$scratch/server" "$1"
  rm -rf "$scratch"
}

go_binary toxiproxy-server "$VERSION" build
