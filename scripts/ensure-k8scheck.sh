#!/usr/bin/env bash
# k8scheck (tools/k8scheck): Kubernetes manifests decoded strictly into the k8s.io/api types,
# built with this machine's Go toolchain. Idempotent: the binary is cached under a key that
# changes with its sources. Prints the binary's path.
set -euo pipefail
source "$(dirname "$0")/go-binary.sh"

SOURCES="$(cd "$(dirname "$0")/../tools/k8scheck" && pwd)"
KEY="$(cat "$SOURCES/go.mod" "$SOURCES/go.sum" "$SOURCES/main.go" | cksum | cut -d' ' -f1)"

build() {
  (cd "$SOURCES" && go build -o "$1" .)
}

go_binary k8scheck "$KEY" build
