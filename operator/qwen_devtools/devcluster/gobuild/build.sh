#!/usr/bin/env bash
# Builds the local control plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), kwok and helm from Go modules into a per-version cache directory.
# Idempotent: does nothing when the versioned MANIFEST already exists.
#   usage: build.sh OUT_DIR K8S_VERSION KWOK_VERSION HELM_VERSION
set -euo pipefail
OUT=$1 K8S=$2 KWOK=$3 HELM=$4
HERE=$(cd "$(dirname "$0")" && pwd)
if [[ -f "$OUT/MANIFEST" ]]; then exit 0; fi
mkdir -p "$OUT.tmp"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
LDF=$(k8s_ldflags "$K8S")
export CGO_ENABLED=0 GOFLAGS=-mod=mod
cd "$HERE"
step "downloading Go modules for Kubernetes $K8S"
go mod download
# One `go build` for the four: it compiles their shared packages once, keeps both cores busy through
# each program's last packages, and links one program while compiling the next.
step "compiling kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (first build: 15-25 minutes on 2 cores, then cached)"
go build -trimpath "$NODWARF" -ldflags "$LDF" -o "$OUT.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
step "compiling etcd"
go build -trimpath "$NODWARF" -ldflags "-s -w" -o "$OUT.tmp/etcd" go.etcd.io/etcd/server/v3
step "compiling kwok $KWOK"
GOBIN="$OUT.tmp" go install -trimpath "$NODWARF" -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK"
step "compiling helm $HELM"
GOBIN="$OUT.tmp" go install -trimpath "$NODWARF" -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM" "helm.sh/helm/v3/cmd/helm@$HELM"
printf 'kubernetes %s\nkwok %s\nhelm %s\n' "$K8S" "$KWOK" "$HELM" > "$OUT.tmp/MANIFEST"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
step "done: $OUT"
