#!/usr/bin/env bash
# Toxiproxy's server (Shopify's TCP proxy with injectable faults), built from its Go module with
# this machine's Go toolchain, for the network fault tests. Idempotent: nothing to do when this
# version's binary is already in the cache. Prints the binary's path.
set -euo pipefail

VERSION=v2.12.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/bridge/toxiproxy-$VERSION"
BINARY="$CACHE/toxiproxy-server"
if [ ! -x "$BINARY" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "go not found: the network fault tests need Toxiproxy, built with Go 1.22+ (https://go.dev/dl)" >&2
    exit 1
  fi
  mkdir -p "$CACHE"
  echo "building Toxiproxy $VERSION with $(go version | cut -d' ' -f3)" >&2
  GOBIN="$CACHE" GOFLAGS=-mod=mod go install "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION"
  mv "$CACHE/server" "$BINARY"
fi
echo "$BINARY"
