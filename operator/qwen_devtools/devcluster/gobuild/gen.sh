#!/usr/bin/env bash
# Regenerates go.mod/go.sum of the wrapper module that builds the control plane from k8s.io/kubernetes.
# k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces every staging module with a local
# path), so this module requires it and pins each staging module to its published v0.X.Y tag.
# The version is qwen_operator.versions.KUBERNETES unless K8S_VERSION says otherwise.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K8S=${K8S_VERSION:-$(python3 "$HERE/../../../qwen_operator/versions.py" KUBERNETES)}
STAGING="v0.${K8S#v1.}"
cd "$HERE"
printf 'module qwenops.dev/devcluster/k8sbins\n\ngo 1.26\n' > go.mod
KMOD=$(go mod download -json "k8s.io/kubernetes@${K8S}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*|\1|p' "$KMOD" | sort -u); do
  go mod edit -replace="${m}=${m}@${STAGING}"
done
go mod edit -require="k8s.io/kubernetes@${K8S}"
grep -E '^godebug ' "$KMOD" >> go.mod || true
go mod tidy
