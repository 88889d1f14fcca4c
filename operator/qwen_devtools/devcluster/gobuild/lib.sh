# Shared by build.sh and build-node.sh: progress lines and the version stamp of Kubernetes binaries.
# Without the -X flags the binaries report v0.0.0 (kubectl version, the apiserver's /version, the Node).
step() { printf '[devcluster build] %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
k8s_ldflags() {
  local k8s=$1 maj min v=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  maj=${k8s#v}; maj=${maj%%.*}; min=${k8s#v*.}; min=${min%%.*}
  printf '%s' "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=$maj -X $v.gitMinor=$min -X $v.gitTreeState=clean
 -X $c.gitVersion=$k8s -X $c.gitMajor=$maj -X $c.gitMinor=$min -X $c.gitTreeState=clean"
}
# No DWARF from the compiler either (-ldflags -w drops it at link time, after it was generated): the
# binaries are stripped anyway, and the first build compiles a little less.
NODWARF="-gcflags=all=-dwarf=false"
