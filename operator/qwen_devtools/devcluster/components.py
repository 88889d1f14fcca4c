"""Command lines and health probes of the control plane components, all bound to 127.0.0.1, except the
apiserver of a cluster with a real node: it binds to the node's bridge address, so pods reach it.

The flags follow what envtest and kwokctl use: etcd on tmpfs without fsync; an RBAC apiserver with a
static admin token, service account keys, the front-proxy flags an aggregated API needs and a JSON
audit log of all writes; KCM and scheduler without leader election; kwok managing the fake nodes.
With a real node the apiserver also keeps the ``kubernetes`` Service's endpoints (lease reconciler),
reaches kubelet by its InternalIP with a client certificate, and kwok's fake pod addresses move out of
the real pods' subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from . import build
from .pki import FRONT_PROXY_CLIENT_CN, Pki
from .procs import Probe

ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PORT_NAMES = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
#: kwok's fake pod addresses beside a real node: apart from the real pods' 10.244.0.0/24.
SIMULATED_POD_CIDR_BESIDE_REAL_NODE = "10.244.128.0/17"
HPA_SYNC_PERIOD = "5s"
STAGES_FILE = Path(__file__).resolve().with_name("stages.yaml")
AUDIT_POLICY_FILE = Path(__file__).resolve().with_name("audit-policy.yaml")
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Layout:
    """Everything a command line needs: state directory, ports, PKI, the advertised and bound addresses."""

    dir: Path
    ports: dict[str, int]
    pki: Pki
    advertise_address: str
    bind_address: str = "127.0.0.1"
    real_node: bool = False

    @property
    def kubeconfig(self) -> str:
        return str(self.dir / "kubeconfig")

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.log"

    def local(self, component: str) -> str:
        return f"127.0.0.1:{self.ports[component]}"

    @property
    def api_server(self) -> str:
        """The apiserver's URL, as every kubeconfig of the cluster names it."""
        return f"https://{self.bind_address}:{self.ports['kube-apiserver']}"


def _interface_ipv4(sock: socket.socket, interface: str) -> str | None:
    request = struct.pack("256s", interface[:15].encode())
    try:
        return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24])
    except OSError:
        return None


def _default_route_interface() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == "00000000":
                return fields[0]
    return None


def advertise_address() -> str:
    """A non-loopback IPv4 address of this host, read from the kernel (no packet is sent).

    The apiserver refuses a loopback ``--advertise-address``; the address is only published, never
    dialled, because ``--endpoint-reconciler-type=none``. The default-route interface is preferred.
    Hosts without any other address fall back to the in-cluster service IP, which is never routed.
    """
    interfaces = [name for _, name in socket.if_nameindex()]
    preferred = _default_route_interface()
    if preferred in interfaces:
        interfaces.insert(0, preferred)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for interface in interfaces:
            address = _interface_ipv4(sock, interface)
            if address and not ipaddress.ip_address(address).is_loopback:
                return address
    return "10.96.0.1"


def _etcd(layout: Layout) -> list[str]:
    client, peer = f"http://{layout.local('etcd')}", f"http://{layout.local('etcd-peer')}"
    return [
        str(build.binary("etcd")),
        "--name=devcluster",
        f"--data-dir={layout.dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        "--unsafe-no-fsync=true",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def _real_node_flags(pki: Pki) -> list[str]:
    return [
        "--endpoint-reconciler-type=lease",
        # the node's hostname resolves nowhere
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki.path('apiserver-kubelet-client.crt')}",
        f"--kubelet-client-key={pki.path('apiserver-kubelet-client.key')}",
    ]


def _apiserver(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(build.binary("kube-apiserver")),
        f"--etcd-servers=http://{layout.local('etcd')}",
        f"--bind-address={layout.bind_address}",
        f"--secure-port={layout.ports['kube-apiserver']}",
        f"--advertise-address={layout.advertise_address}",
        *(_real_node_flags(pki) if layout.real_node else ["--endpoint-reconciler-type=none"]),
        f"--tls-cert-file={pki.path('apiserver.crt')}",
        f"--tls-private-key-file={pki.path('apiserver.key')}",
        f"--client-ca-file={pki.path('ca.crt')}",
        f"--token-auth-file={pki.path('tokens.csv')}",
        # The real node's kubelet has its own identity (system:node:<name>), confined by the Node
        # authorizer and NodeRestriction; OwnerReferencesPermissionEnforcement (OpenShift's and many
        # hardened clusters' default) makes every test run under the rule that setting
        # blockOwnerDeletion needs update on the owner's finalizers.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.path('sa.pub')}",
        f"--service-account-signing-key-file={pki.path('sa.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        f"--requestheader-client-ca-file={pki.path('front-proxy-ca.crt')}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT_CN}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.path('front-proxy-client.crt')}",
        f"--proxy-client-key-file={pki.path('front-proxy-client.key')}",
        f"--audit-policy-file={AUDIT_POLICY_FILE}",
        f"--audit-log-path={layout.audit_log}",
        "--audit-log-maxsize=200",
        "--audit-log-maxbackup=1",
        "--profiling=false",
    ]


def _serving_flags(layout: Layout, component: str) -> list[str]:
    """Kubeconfig, delegated auth and loopback serving (with the cluster's cert) for KCM and scheduler."""
    return [
        f"--kubeconfig={layout.kubeconfig}",
        f"--authentication-kubeconfig={layout.kubeconfig}",
        f"--authorization-kubeconfig={layout.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports[component]}",
        f"--tls-cert-file={layout.pki.path('apiserver.crt')}",
        f"--tls-private-key-file={layout.pki.path('apiserver.key')}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def _controller_manager(layout: Layout) -> list[str]:
    return [
        str(build.binary("kube-controller-manager")),
        *_serving_flags(layout, "kube-controller-manager"),
        "--controllers=*",
        # Each controller under its own service account (as kubeadm runs it), so the audit log names the
        # writer: system:serviceaccount:kube-system:horizontal-pod-autoscaler for the HPA's scale writes.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.pki.path('sa.key')}",
        f"--root-ca-file={layout.pki.path('ca.crt')}",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
    ]


def _scheduler(layout: Layout) -> list[str]:
    return [str(build.binary("kube-scheduler")), *_serving_flags(layout, "kube-scheduler")]


def _kwok(layout: Layout) -> list[str]:
    return [
        str(build.binary("kwok")),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={STAGES_FILE}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-ip=127.0.0.1",
        f"--node-port={layout.ports['kwok']}",
        f"--server-address={layout.local('kwok')}",
        f"--cidr={SIMULATED_POD_CIDR_BESIDE_REAL_NODE if layout.real_node else POD_CIDR}",
        "--node-lease-duration-seconds=40",
    ]


_ARGV = {
    "etcd": _etcd,
    "kube-apiserver": _apiserver,
    "kube-controller-manager": _controller_manager,
    "kube-scheduler": _scheduler,
    "kwok": _kwok,
}


def argv(component: str, layout: Layout) -> list[str]:
    """Command line of ``component``."""
    return _ARGV[component](layout)


def probe(component: str, layout: Layout) -> Probe:
    """Health endpoint of ``component``."""
    ca = layout.pki.path("ca.crt")
    if component == "etcd":
        return Probe(f"http://{layout.local('etcd')}/health")
    if component == "kube-apiserver":
        return Probe(f"{layout.api_server}/readyz", ca, layout.pki.admin_token)
    if component == "kwok":
        return Probe(f"http://{layout.local('kwok')}/healthz")
    return Probe(f"https://{layout.local(component)}/healthz", ca)
