"""Files, command lines and health probes of the real node's processes: containerd, kubelet, kube-proxy
and CoreDNS (pure: paths and ports in, text out).

Why the settings that are not defaults (each one was needed, or checked, on these machines):

* containerd: ``restrict_oom_score_adj`` (without CAP_SYS_RESOURCE every sandbox fails), runc with
  cgroupfs, no AppArmor or hugetlb, the local pause image as sandbox image, a CNI conf dir of its own,
  network namespaces under its state dir, the stream server on 127.0.0.1, NRI off (its socket is a fixed
  path). Its root, the image store, lives in the cache so images survive ``down``. Every registry is
  mapped to a closed loopback port: a pull (a missing image, ``imagePullPolicy: Always``) fails at once
  instead of sending anything off the machine.
* kubelet: cgroupfs, ``failCgroupV1: false`` (these hosts are cgroup v1 "hybrid"), swap allowed, no
  static pods, serving on the node IP only, healthz on 127.0.0.1, DNS of the cluster's own, eviction
  and image GC thresholds that keep a dev machine's preloaded images.
* kube-proxy: nftables (its ``--cleanup`` restores the ruleset exactly), bound to the node IP, conntrack
  values 0 so that it changes no host sysctl.
* kube-network-policies: the node's name, the queue network.py fills, metrics on 127.0.0.1; the admin
  kubeconfig, as CoreDNS (it reads pods, namespaces and NetworkPolicies everywhere, and posts Events).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from qwen_operator.api.catalog import GPU_PRODUCT_LABEL

from ..cache import cache_dir
from . import nodebuild
from .components import POD_CIDR
from .network import BRIDGE_ADDRESS, NFQUEUE_ID, cni_config
from .procs import Probe

NODE_NAME = "qwen-real-0"
#: kubelet's port is fixed on purpose: one real node per machine (its other paths are fixed too).
KUBELET_PORT = 10250
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
PORT_NAMES = (
    "kubelet-healthz",
    "kube-proxy-healthz",
    "kube-proxy-metrics",
    "coredns-ready",
    "containerd-stream",
    "netpol-metrics",
)
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"
#: Where every image pull goes: a closed port on loopback (see the module docstring).
NO_REGISTRY = "http://127.0.0.1:9"
#: kubelet and containerd find `mount` and friends here, and no iptables: kubelet would otherwise add
#: its KUBE-FIREWALL and canary chains to the host's tables, which nothing removes.
NODE_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The kernel tunables kubelet sets when they differ (vm.overcommit_memory, kernel.panic, ...): it reads
#: these values from files bind-mounted over /proc/sys in its private mount namespace instead.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def image_store() -> Path:
    """containerd's root: content, snapshots and metadata of every image imported on this machine."""
    return cache_dir() / "real-node" / "containerd"


@dataclass(frozen=True)
class NodeLayout:
    """Where the real node of one cluster keeps its files (``<cluster state dir>/node``), and its ports."""

    dir: Path
    ports: dict[str, int]
    #: The cluster's admin kubeconfig: CoreDNS's (it reads Services and EndpointSlices everywhere) and
    #: kube-network-policies'.
    kubeconfig: Path
    ca_file: Path
    pause_ref: str
    #: kubelet's (and the keeper's, its stand-in device plugin): system:node:<NODE_NAME>, confined by the
    #: Node authorizer and NodeRestriction to this node and the pods bound to it.
    kubelet_kubeconfig: Path
    #: kube-proxy's: system:kube-proxy (Kubernetes' default system:node-proxier role).
    proxy_kubeconfig: Path

    @property
    def containerd_state(self) -> Path:
        return self.dir / "containerd"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def notify_socket(self) -> Path:
        return self.dir / "containerd-notify.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def sysctl_dir(self) -> Path:
        return self.dir / "sysctl"

    @property
    def registry_dir(self) -> Path:
        return self.dir / "registry"

    def file(self, name: str) -> Path:
        return self.dir / name

    def local(self, port: str) -> str:
        return f"127.0.0.1:{self.ports[port]}"


def write_files(layout: NodeLayout) -> None:
    """Every configuration file of the node's processes, and the kubelet's fake kernel tunables."""
    for directory in (layout.dir, layout.containerd_state, layout.cni_conf_dir, layout.kubelet_root):
        directory.mkdir(parents=True, exist_ok=True)
    cni = cni_config(layout.dir / "cni" / "ipam")
    (layout.cni_conf_dir / "10-qwen-devcluster.conflist").write_text(json.dumps(cni, indent=2) + "\n")
    layout.file("containerd.toml").write_text(containerd_config(layout))
    # containerd's hosts directory: _default applies to every registry without a directory of its own
    (layout.registry_dir / "_default").mkdir(parents=True, exist_ok=True)
    (layout.registry_dir / "_default" / "hosts.toml").write_text(f"server = {_q(NO_REGISTRY)}\n")
    layout.file("kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(layout), sort_keys=False))
    layout.file("kube-proxy.yaml").write_text(yaml.safe_dump(kube_proxy_config(layout), sort_keys=False))
    layout.file("Corefile").write_text(corefile(layout))
    # Pods with dnsPolicy Default get this, and kubelet adds it to ClusterFirst pods: CoreDNS only.
    layout.file("resolv.conf").write_text(f"nameserver {BRIDGE_ADDRESS}\n")
    for name, value in KUBELET_SYSCTLS.items():
        path = layout.sysctl_dir / name.replace("/", ".")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")


def _q(value: str) -> str:
    """A TOML basic string (JSON's escaping is valid TOML for these paths and names)."""
    return json.dumps(value)


def containerd_config(layout: NodeLayout) -> str:
    """containerd's config.toml (version 4, containerd 2.4)."""
    root, state = image_store(), layout.containerd_state
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 4
root = {_q(str(root))}
state = {_q(str(state))}
temp = {_q(str(state / "tmp"))}

[plugins.'io.containerd.server.v1.grpc']
  address = {_q(str(layout.socket))}

[plugins.'io.containerd.server.v1.ttrpc']
  address = {_q(str(layout.socket) + ".ttrpc")}

[plugins.'io.containerd.internal.v1.opt']
  path = {_q(str(root / "opt"))}

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {_q(layout.pause_ref)}

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = {_q(str(layout.registry_dir))}

[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_q(RUNC)}
  Root = {_q(str(state / "runc"))}
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = [{_q(CNI_BIN_DIR)}]
  conf_dir = {_q(str(layout.cni_conf_dir))}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = {_q(str(layout.ports["containerd-stream"]))}
"""


def kubelet_config(layout: NodeLayout) -> dict[str, Any]:
    """The KubeletConfiguration."""
    endpoint = f"unix://{layout.socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "staticPodPath": "",
        "address": BRIDGE_ADDRESS,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": layout.ports["kubelet-healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(layout.file("resolv.conf")),
        "podLogsDir": str(layout.dir / "pod-logs"),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "rotateCertificates": False,
        # Pod syncs every 10 s (default 1m): Secret and ConfigMap volume updates (API-key rotation, the
        # LoRA desired file) reach the pods in seconds, so the real-node tests wait less. Production
        # kubelets keep their minute; docs/gateway.md and docs/lora.md say "about a minute".
        "syncFrequency": "10s",
    }


def kube_proxy_config(layout: NodeLayout) -> dict[str, Any]:
    """The KubeProxyConfiguration."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(layout.proxy_kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": BRIDGE_ADDRESS,
        "healthzBindAddress": layout.local("kube-proxy-healthz"),
        "metricsBindAddress": layout.local("kube-proxy-metrics"),
        "nodePortAddresses": [f"{BRIDGE_ADDRESS}/32"],
        "clusterCIDR": POD_CIDR,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False},
    }


def corefile(layout: NodeLayout) -> str:
    """CoreDNS: the cluster's names from the API, NXDOMAIN for every other name (nothing is forwarded)."""
    return f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {BRIDGE_ADDRESS}
    errors
    ready {layout.local("coredns-ready")}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {layout.kubeconfig}
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {BRIDGE_ADDRESS}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def labels() -> dict[str, str]:
    """The real node's labels: found by the tests and the demo, and a GPU product no kwok pool has."""
    return {
        "qwenops.dev/real-node": "true",
        GPU_PRODUCT_LABEL: "QWEN-DEV-CPU",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "8",
    }


def argv(component: str, layout: NodeLayout) -> list[str]:
    """Command line of ``component`` (containerd, kubelet, kube-proxy, coredns, kube-network-policies),
    without namespace entry."""
    if component == "containerd":
        return [str(nodebuild.binary("containerd")), "--config", str(layout.file("containerd.toml"))]
    if component == "kubelet":
        node_labels = ",".join(f"{k}={v}" for k, v in labels().items())
        return [
            str(nodebuild.binary("kubelet")),
            f"--config={layout.file('kubelet.yaml')}",
            f"--kubeconfig={layout.kubelet_kubeconfig}",
            f"--root-dir={layout.kubelet_root}",
            # its serving certificate, which would otherwise go to /var/lib/kubelet/pki
            f"--cert-dir={layout.kubelet_root / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={BRIDGE_ADDRESS}",
            f"--node-labels={node_labels}",
        ]
    if component == "kube-proxy":
        return [str(nodebuild.binary("kube-proxy")), f"--config={layout.file('kube-proxy.yaml')}"]
    if component == "coredns":
        return [str(nodebuild.binary("coredns")), "-conf", str(layout.file("Corefile"))]
    if component == nodebuild.NETPOL_BINARY:
        return [
            str(nodebuild.binary(nodebuild.NETPOL_BINARY)),
            f"--kubeconfig={layout.kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--nfqueue-id={NFQUEUE_ID}",
            f"--metrics-bind-address={layout.local('netpol-metrics')}",
        ]
    raise ValueError(f"unknown real-node component {component!r}")


def probe(component: str, layout: NodeLayout) -> Probe:
    """Health endpoint of kubelet, kube-proxy, CoreDNS or kube-network-policies (its metrics: it has no
    health endpoint; whether it reads its queue is network.policy_queue_bound). containerd reports
    readiness itself."""
    paths = {
        "kubelet": ("kubelet-healthz", "/healthz"),
        "kube-proxy": ("kube-proxy-healthz", "/healthz"),
        nodebuild.NETPOL_BINARY: ("netpol-metrics", "/metrics"),
    }
    port, path = paths.get(component, ("coredns-ready", "/ready"))
    return Probe(f"http://{layout.local(port)}{path}")


def kube_dns_objects() -> list[dict[str, Any]]:
    """The selectorless ``kube-dns`` Service and the EndpointSlice that points it at CoreDNS on the host."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "clusterIP": CLUSTER_DNS,
            "ports": [{"name": name, "protocol": protocol, "port": 53} for name, protocol in ports],
        },
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-host",
            "namespace": "kube-system",
            # not the EndpointSlice controller's: it leaves slices of other managers alone
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "qwen-devcluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [BRIDGE_ADDRESS], "conditions": {"ready": True}}],
        "ports": [{"name": name, "protocol": protocol, "port": 53} for name, protocol in ports],
    }
    return [service, endpoints]
