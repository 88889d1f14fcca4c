"""The real node's network on the host: the ``qwen0`` bridge, its nft table and the pods' CNI config.

The bridge (10.244.0.1/24) exists before the control plane: the apiserver binds to its address so that
pods reach it through the ``kubernetes`` Service, and it is the node IP of kubelet, kube-proxy and
CoreDNS. Pods get addresses on it from the CNI bridge plugin, and a route to the Service range only (no
default route), so nothing a pod sends can leave the machine. Forwarding is switched on for this one
interface (pod -> Service -> pod is routed back into the bridge); no machine-wide sysctl is touched, and
the CNI plugin is not made the gateway because it would switch on ``net.ipv4.ip_forward`` for the host.

The private nft table ``ip qwen_devcluster`` drops traffic to the pod range (10.244.0.0/16, which also
holds the simulated pods' fake addresses) unless it comes from loopback or the bridge, keeps anything
the pods send from being forwarded off the bridge, and drops what would leave towards the pod range on
another interface (a Service whose endpoint is a simulated pod). That last check is on postrouting:
in the output hook the interface is still the one chosen before kube-proxy's DNAT.

NetworkPolicy is enforced by kube-network-policies (``gobuild/netpol``), which decides each new
connection to a pod of the node in userspace. Its first packet reaches it through netfilter queue
``NFQUEUE_ID``: the chain ``QWEN-NETPOL`` of iptables-nft's ``filter`` table, jumped to first from
``FORWARD``, queues every packet of a new connection to the node's subnet. Pod-to-pod packets on the
bridge pass the forward hook too (``br_netfilter``, ``net.bridge.bridge-nf-call-iptables``), as do
those kube-proxy sent from a Service to a pod; the node's own connections (kubelet's probes, processes
on the host) do not pass it, as upstream lets root's traffic pass. Upstream queues with an nftables
``queue`` statement, which these kernels lack (``CONFIG_NFT_QUEUE``); iptables-nft's ``NFQUEUE`` is the
xtables target, which they have. Without a bypass flag: while nothing reads the queue, new connections
to pods fail, so the chain is loaded only once the controller reads it (``policy_queue_bound``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .components import POD_CIDR, SERVICE_CIDR

BRIDGE = "qwen0"
BRIDGE_ADDRESS = "10.244.0.1"
#: The real node's pods (the bridge's subnet); pods start at .10.
NODE_SUBNET = "10.244.0.0/24"
#: kwok's fake pod addresses while a real node runs: inside POD_CIDR, apart from the real pods.
SIMULATED_POD_CIDR = "10.244.128.0/17"
NFT_TABLE = "qwen_devcluster"
CNI_NETWORK = "qwen-devcluster"
#: The netfilter queue kube-network-policies reads, and our chain of iptables-nft's filter table.
NFQUEUE_ID = 100
POLICY_CHAIN = "QWEN-NETPOL"
_NFQUEUE_STATUS = Path("/proc/net/netfilter/nfnetlink_queue")
#: Every CNI network of the node's pods: ours, and the loopback one containerd adds to each pod.
CNI_NETWORKS = (CNI_NETWORK, "cni-loopback")
_FORWARDING = Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/forwarding")

_RULES = f"""\
table ip {NFT_TABLE} {{
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    ip daddr {POD_CIDR} iifname != {{ "lo", "{BRIDGE}" }} drop
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    ip daddr {POD_CIDR} iifname != "{BRIDGE}" drop
    iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
  }}
  chain postrouting {{
    type filter hook postrouting priority filter - 10; policy accept;
    ip daddr {POD_CIDR} oifname != {{ "lo", "{BRIDGE}" }} drop
  }}
}}
"""


class NetworkError(RuntimeError):
    """The bridge or the nft table could not be set up."""


def _find(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _tool(name: str) -> str:
    path = _find(name)
    if path is None:
        raise NetworkError(f"{name} is missing; run: bash tools/system-packages.sh")
    return path


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True)
    if check and result.returncode:
        raise NetworkError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def bridge_exists() -> bool:
    """True if the bridge is there (a running real node, or one a killed run left)."""
    return Path(f"/sys/class/net/{BRIDGE}").exists()


def table_exists() -> bool:
    """True if our nft table is loaded."""
    return _run("nft", "list", "table", "ip", NFT_TABLE, check=False).returncode == 0


def create() -> None:
    """Create the bridge with its address, switch on its forwarding and load the nft table."""
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/{NODE_SUBNET.split('/')[1]}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _FORWARDING.write_text("1\n")
    result = subprocess.run([_tool("nft"), "-f", "-"], input=_RULES, capture_output=True, text=True)
    if result.returncode:
        raise NetworkError(f"loading nft table {NFT_TABLE} failed: {result.stderr.strip()}")


def _ports() -> list[str]:
    """Interfaces enslaved to the bridge (the pods' host-side veths)."""
    result = _run("ip", "-j", "link", "show", "master", BRIDGE, check=False)
    if result.returncode or not result.stdout.strip():
        return []
    return [str(link["ifname"]) for link in json.loads(result.stdout)]


def policy_queue_bound() -> bool:
    """True when a process reads netfilter queue ``NFQUEUE_ID`` (the kernel lists bound queues first)."""
    try:
        lines = _NFQUEUE_STATUS.read_text().splitlines()
    except FileNotFoundError:
        return False
    return any(line.split()[:1] == [str(NFQUEUE_ID)] for line in lines)


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run("iptables-nft", "-w", "-t", "filter", *args, check=check)


def enforce_policies() -> None:
    """Queue the first packet of every new connection to the node's pods to kube-network-policies."""
    _iptables("-N", POLICY_CHAIN)
    _iptables(
        "-A", POLICY_CHAIN, "-d", NODE_SUBNET, "-m", "conntrack", "--ctstate", "NEW",
        "-m", "comment", "--comment", "qwen devcluster: NetworkPolicy by kube-network-policies",
        "-j", "NFQUEUE", "--queue-num", str(NFQUEUE_ID),
    )  # fmt: skip
    _iptables("-I", "FORWARD", "1", "-j", POLICY_CHAIN)


def policies_enforced() -> bool:
    """True if our chain is loaded (a running real node, or one a killed run left)."""
    return _iptables("-S", POLICY_CHAIN, check=False).returncode == 0


def _stop_enforcing() -> None:
    """Remove our chain and the jump to it; then the ``filter`` table itself if nothing else uses it."""
    if _find("iptables-nft") is None or not policies_enforced():
        return
    while _iptables("-D", "FORWARD", "-j", POLICY_CHAIN, check=False).returncode == 0:
        pass
    _iptables("-F", POLICY_CHAIN)
    _iptables("-X", POLICY_CHAIN)
    rules = _run("iptables-nft-save", "-t", "filter").stdout.splitlines()
    if not any(line.startswith(("-A", ":")) and not _builtin_chain(line) for line in rules):
        _run("nft", "delete", "table", "ip", "filter", check=False)


def _builtin_chain(line: str) -> bool:
    return line.split(" ", 1)[0] in (":INPUT", ":FORWARD", ":OUTPUT")


def remove() -> None:
    """Remove the policy chain, the veths on the bridge, the bridge and the nft table (idempotent)."""
    _stop_enforcing()
    for port in _ports():
        _run("ip", "link", "delete", port, check=False)
    if bridge_exists():
        _run("ip", "link", "delete", BRIDGE)
    if table_exists():
        _run("nft", "delete", "table", "ip", NFT_TABLE)


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    """The pods' CNI network: a port on the bridge, an address of its subnet, a route to the Services."""
    ipam = {
        "type": "host-local",
        "dataDir": str(ipam_dir),
        "ranges": [[{"subnet": NODE_SUBNET, "rangeStart": "10.244.0.10", "gateway": BRIDGE_ADDRESS}]],
        "routes": [{"dst": SERVICE_CIDR}],
    }
    bridge = {
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": False,
        "isDefaultGateway": False,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [bridge]}
