#!/usr/bin/env bash
# Builds the real node's kubelet and kube-proxy from the same wrapper module (go.mod here) and Kubernetes
# version as the control plane, into a cache directory of their own (the control plane's stays valid).
# With the control plane's Go build cache about a minute; with an empty one about 10 minutes.
# Idempotent: does nothing when the versioned MANIFEST already exists.
#   usage: build-node.sh OUT_DIR K8S_VERSION
set -euo pipefail
OUT=$1 K8S=$2
HERE=$(cd "$(dirname "$0")" && pwd)
if [[ -f "$OUT/MANIFEST" ]]; then exit 0; fi
# shellcheck source=lib.sh
source "$HERE/lib.sh"
LDF=$(k8s_ldflags "$K8S")
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$OUT.tmp"
cd "$HERE"
step "downloading Go modules for Kubernetes $K8S"
go mod download
step "compiling kubelet and kube-proxy"
go build -trimpath "$NODWARF" -ldflags "$LDF" -o "$OUT.tmp/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
printf 'kubernetes %s\n' "$K8S" > "$OUT.tmp/MANIFEST"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
step "done: $OUT"
