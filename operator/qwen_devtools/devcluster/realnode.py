"""The dev cluster's opt-in real node (``up --real-node``): a kubelet with containerd, runc and the CNI
bridge, kube-proxy, CoreDNS and kube-network-policies (NetworkPolicy enforced) beside the kwok pools,
where pods really run. One per machine.

The node registers as ``qwen-real-0`` (labels in ``nodecomponents.labels()``: ``qwenops.dev/real-node=true``,
``nvidia.com/gpu.product=QWEN-DEV-CPU``), with ``nvidia.com/gpu: 8`` patched into its capacity and
allocatable (scheduling and admission only: there is no GPU) and no taint.

Why one per machine: kubelet's port 10250, /var/lib/kubelet/device-plugins, /var/log/containers,
containerd's shim sockets in /run/containerd, the kubepods cgroups and the bridge are machine-wide. An
flock on ``/run/qwen-devcluster-real-node.lock`` (holding the cluster's name) is taken before anything
is touched; the node's keeper process (``keeper.py``) holds it while the node lives.

Start order: the bridge and nft table (before the control plane, see cluster.up), the keeper, containerd
(until its CRI answers), the pause image, kubelet, kube-proxy, CoreDNS with the ``kube-dns`` Service,
kube-network-policies (once it reads its queue, the chain that fills it: network.py), then the Node
Ready with its GPUs. Teardown order (what worked on these machines): pods deleted through the API,
``kube-proxy --cleanup``, CoreDNS and kube-network-policies stopped, kubelet stopped, the Node deleted,
containerd's containers removed and containerd stopped, every mount under the node's directory
unmounted, the kubepods cgroups removed; after the control plane: the policy chain, the bridge, its
veths and the nft table. ``up`` runs the same cleanup first
for whatever a killed run left. The image store (containerd's root in the cache) is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from qwen_operator.api.catalog import GPU_PRODUCT_LABEL, GPU_RESOURCE

from ..wait import Timeout, wait_until
from . import containerd, hostclean, network, nodebuild, nodecomponents, procs
from .nodecomponents import NODE_NAME, NODE_PATH, NodeLayout
from .procs import ComponentError
from .state import STATE_PREFIX, STATE_ROOT, State

LOCK_FILE = Path("/run/qwen-devcluster-real-node.lock")
#: The NetworkPolicy controller's component name (its binary's).
NETPOL = nodebuild.NETPOL_BINARY
#: The host processes started after containerd, in order.
HOST_PROCESSES = ("kubelet", "kube-proxy", "coredns", NETPOL)
#: Start order; teardown goes its own way (see the module docstring).
COMPONENTS = ("keeper", "containerd", "kubelet", "kube-proxy", "coredns", NETPOL)
GPUS = "8"
RESOURCE = GPU_RESOURCE
START_TIMEOUT = 60.0
POD_DELETE_TIMEOUT = 30.0
IMPORT_TIMEOUT = 900.0
#: The real-node tests' own cluster (e2e/conftest.py; ``QWEN_E2E_REAL_CLUSTER`` names another). The tests
#: stop it at the end; `make demo` stops one left behind (QWEN_E2E_KEEP=1, a killed run), saying so.
TESTS_CLUSTER = "test-real"


def log(message: str) -> None:
    print(f"[devcluster] {message}", flush=True)


class RealNodeError(RuntimeError):
    """The real node cannot run on this machine (not root, a Debian package missing)."""


class RealNodeBusy(RealNodeError):
    """Another dev cluster holds this machine's real node."""

    def __init__(self, holder: str) -> None:
        super().__init__(
            f"the real node of this machine is held by dev cluster {holder!r} (one per machine: kubelet's"
            f" port and paths are fixed); stop it first: `make demo-down` if it is the demo, else"
            f" `python -m qwen_devtools.devcluster down --name {holder}`"
        )
        self.holder = holder


def _read_name(fd: int) -> str | None:
    return os.pread(fd, 256, 0).decode(errors="replace").strip() or None


def holder() -> str | None:
    """The dev cluster holding this machine's real node, or None."""
    try:
        fd = os.open(LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_name(fd) or "?"
    finally:
        os.close(fd)
    return None


#: What the node runs that is not built here: Debian packages (tools/system-packages.sh) and util-linux.
HOST_TOOLS = (
    nodecomponents.RUNC,
    *(f"{nodecomponents.CNI_BIN_DIR}/{plugin}" for plugin in ("bridge", "host-local", "loopback")),
    "/usr/sbin/nft",
    "/usr/sbin/iptables-nft",
    "/usr/sbin/ip",
    "/usr/bin/unshare",
    "/usr/bin/nsenter",
    "/usr/bin/mount",
)


def preflight() -> None:
    """RealNodeError unless this process is root and every host tool is installed."""
    if os.geteuid() != 0:
        raise RealNodeError("the real node needs root (kubelet, containerd, the bridge, nftables)")
    missing = [tool for tool in HOST_TOOLS if not os.access(tool, os.X_OK)]
    if missing:
        raise RealNodeError(f"missing {', '.join(missing)}; run: bash tools/system-packages.sh")


def acquire(name: str) -> tuple[int, str | None]:
    """Take the machine's real-node lock for cluster ``name``: its file descriptor (hand it to the keeper,
    then close it) and the previous holder's name (a killed run's, whose leftovers to clean).

    RealNodeBusy when another cluster holds it.
    """
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held_by = _read_name(fd) or "?"
        os.close(fd)
        raise RealNodeBusy(held_by) from None
    previous = _read_name(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{name}\n".encode(), 0)
    return fd, previous


def node_layout(state: State) -> NodeLayout:
    """Where the real node of ``state``'s cluster keeps its files."""
    return NodeLayout(
        dir=state.dir / "node",
        ports=state.ports,
        kubeconfig=state.dir / "kubeconfig",
        ca_file=state.dir / "pki" / "ca.crt",
        pause_ref=nodebuild.pause_image().ref,
        kubelet_kubeconfig=state.dir / "kubelet.kubeconfig",
        proxy_kubeconfig=state.dir / "kube-proxy.kubeconfig",
    )


# --- start ---------------------------------------------------------------------------------------------


def start(state: State, lock_fd: int, core: client.CoreV1Api) -> None:
    """Start the real node of a cluster whose control plane is up (see the module docstring)."""
    node = node_layout(state)
    nodecomponents.write_files(node)
    started = time.monotonic()
    _start_keeper(state, node, lock_fd)
    _start_containerd(state, node)
    ctr = containerd.Ctr(node.socket)
    left = ctr.remove_all_containers()
    if left:
        log(f"removed {left} containers a killed run left in the image store")
    pause = nodebuild.pause_image()
    load_image(state.name, pause.archive, pause.ref)
    log(f"containerd ready, pause image in its store ({time.monotonic() - started:.1f}s)")
    for component in HOST_PROCESSES:
        _start_node_process(state, node, component)
    _create_kube_dns(core)
    for component in HOST_PROCESSES:
        _wait_healthy(state, node, component)
    _enforce_network_policies(state)
    _wait_node(state, core)
    log(f"real node {NODE_NAME} Ready with {RESOURCE}={GPUS} ({time.monotonic() - started:.1f}s)")


def _record(state: State, component: str, pid: int, executable: str) -> None:
    state.pids[component] = pid
    state.executables[component] = executable
    state.save()


def _wait_exec(state: State, component: str) -> None:
    """Wait until the launcher (unshare, nsenter) has exec'd the component itself."""
    pid, executable = state.pids[component], state.executables[component]
    try:
        wait_until(lambda: procs.running(pid, executable), 5, f"{component} to start", interval=0.02)
    except Timeout:
        raise ComponentError(component, "did not start", state.log_file(component)) from None


def _start_keeper(state: State, node: NodeLayout, lock_fd: int) -> None:
    ready = node.file("keeper.ready")
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        sys.executable, "-m", "qwen_devtools.devcluster.keeper",
        "--kubeconfig", str(node.kubelet_kubeconfig), "--node", NODE_NAME, "--gpus", GPUS,
        "--sysctls", str(node.sysctl_dir), "--ready-file", str(ready),
    ]  # fmt: skip
    pid = procs.start("keeper", argv, state.dir / "logs", pass_fds=(lock_fd,))
    _record(state, "keeper", pid, os.path.realpath(sys.executable))
    _wait_exec(state, "keeper")

    def namespace_ready() -> bool:
        if not state.running("keeper"):
            raise ComponentError("keeper", "exited during start-up", state.log_file("keeper"))
        return ready.exists()

    try:
        wait_until(namespace_ready, START_TIMEOUT, "the keeper's mount namespace", interval=0.05)
    except Timeout:
        raise ComponentError("keeper", "mount namespace not set up", state.log_file("keeper")) from None


def _in_namespace(state: State, argv: list[str]) -> list[str]:
    return ["nsenter", f"--mount=/proc/{state.pids['keeper']}/ns/mnt", "--", *argv]


def _start_containerd(state: State, node: NodeLayout) -> None:
    notify = containerd.NotifySocket(node.notify_socket)
    env = {"PATH": f"{nodebuild.containerd_dir()}:{NODE_PATH}", "NOTIFY_SOCKET": str(node.notify_socket)}
    argv = nodecomponents.argv("containerd", node)
    pid = procs.start("containerd", _in_namespace(state, argv), state.dir / "logs", env=env)
    _record(state, "containerd", pid, os.path.realpath(argv[0]))
    _wait_exec(state, "containerd")
    notify.wait_ready(pid, state.executables["containerd"], state.log_file("containerd"), START_TIMEOUT)


def _start_node_process(state: State, node: NodeLayout, component: str) -> None:
    """kubelet in the keeper's mount namespace, with a PATH without iptables; the others on the host."""
    argv = nodecomponents.argv(component, node)
    kubelet = component == "kubelet"
    launched = _in_namespace(state, argv) if kubelet else argv
    pid = procs.start(component, launched, state.dir / "logs", env={"PATH": NODE_PATH} if kubelet else {})
    _record(state, component, pid, os.path.realpath(argv[0]))
    _wait_exec(state, component)


def _wait_healthy(state: State, node: NodeLayout, component: str) -> None:
    pid, executable = state.pids[component], state.executables[component]
    probe = nodecomponents.probe(component, node)
    procs.wait_healthy(component, pid, executable, probe, state.log_file(component), START_TIMEOUT)


def _enforce_network_policies(state: State) -> None:
    """Once kube-network-policies reads its queue (its informers synced), queue new pod connections to it."""

    def reading() -> bool:
        if not state.running(NETPOL):
            raise ComponentError(NETPOL, "exited during start-up", state.log_file(NETPOL))
        return network.policy_queue_bound()

    try:
        wait_until(reading, START_TIMEOUT, f"{NETPOL} to read netfilter queue {network.NFQUEUE_ID}")
    except Timeout:
        raise ComponentError(NETPOL, "never read its queue", state.log_file(NETPOL)) from None
    network.enforce_policies()


def _create_kube_dns(core: client.CoreV1Api) -> None:
    service, endpoints = nodecomponents.kube_dns_objects()
    discovery = client.DiscoveryV1Api(core.api_client)
    # the client accepts plain dicts
    core.create_namespaced_service("kube-system", service)  # type: ignore[arg-type]
    discovery.create_namespaced_endpoint_slice("kube-system", endpoints)  # type: ignore[arg-type]


def read_node(core: client.CoreV1Api) -> dict[str, Any] | None:
    """The real Node as a plain dict, None when it is not registered."""
    try:
        node = core.read_node(NODE_NAME)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return dict(core.api_client.sanitize_for_serialization(node))


def _allocatable_gpus(node: dict[str, Any]) -> str:
    return str((node.get("status", {}).get("allocatable") or {}).get(RESOURCE, "0"))


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
    return ready and _allocatable_gpus(node) == GPUS and "node.kubernetes.io/not-ready" not in taints


def _wait_node(state: State, core: client.CoreV1Api) -> None:
    def ready() -> bool:
        for component in COMPONENTS:
            if not state.running(component):
                raise ComponentError(component, "exited", state.log_file(component))
        node = read_node(core)
        return node is not None and _node_ready(node)

    try:
        wait_until(ready, START_TIMEOUT, f"node {NODE_NAME}", interval=0.25)
    except Timeout:
        raise ComponentError(
            "kubelet", f"node {NODE_NAME} not Ready after {START_TIMEOUT:.0f}s", state.log_file("kubelet")
        ) from None


# --- images ----------------------------------------------------------------------------------------------


def _socket(cluster: str | None) -> Path:
    name = cluster or holder()
    if name is None:
        raise RuntimeError("no dev cluster runs a real node on this machine (up --real-node starts one)")
    state = State.load(name)
    if state is None or not state.real_node or not state.running("containerd"):
        raise RuntimeError(f"dev cluster {name!r} runs no real node")
    return node_layout(state).socket


def image_present(ref: str, cluster: str | None = None) -> bool:
    """Whether the real node's containerd has image ``ref`` (of ``cluster``, default: whichever cluster
    holds this machine's real node)."""
    return containerd.Ctr(_socket(cluster)).manifest_digest(ref) is not None


def load_image(cluster: str, archive: Path, ref: str) -> bool:
    """Import a docker-archive into the real node's containerd (namespace ``k8s.io``) as ``ref``, unless
    the store already has ``ref`` with the archive's image ID; returns whether it imported.

    ``ref`` must be a name the archive carries (``podman save`` of that reference).
    """
    ctr = containerd.Ctr(_socket(cluster))
    wanted = containerd.archive_config_digest(archive)
    if ctr.config_digest(ref) == wanted:
        return False
    started = time.monotonic()
    size = archive.stat().st_size / 2**20
    log(f"importing {ref} ({size:.0f} MiB) into the real node's containerd")
    ctr.import_archive(archive, IMPORT_TIMEOUT)
    found = ctr.config_digest(ref)
    if found != wanted:
        raise RuntimeError(f"{archive} imported, but {ref} is {found}, not the archive's {wanted}")
    log(f"imported {ref} ({time.monotonic() - started:.1f}s)")
    return True


# --- teardown ----------------------------------------------------------------------------------------------


def stop(state: State, core: client.CoreV1Api | None, timeout: float) -> None:
    """Stop the real node of ``state`` (its control plane may be up, ``core``, or gone, None)."""
    node = node_layout(state)
    if core is not None:
        _delete_pods(core)
    _stop(state, "kube-proxy", timeout)
    _kube_proxy_cleanup(node)
    _stop(state, "coredns", timeout)
    _stop(state, NETPOL, timeout)
    _stop(state, "kubelet", timeout)
    if core is not None:
        with contextlib.suppress(client.ApiException):
            core.delete_node(NODE_NAME)
    if state.running("containerd"):
        with contextlib.suppress(containerd.CtrError, subprocess.TimeoutExpired):
            containerd.Ctr(node.socket).remove_all_containers()
    _stop(state, "containerd", timeout)
    _clean_host(node, state.pids.get("keeper") if state.running("keeper") else None)


def _delete_pods(core: client.CoreV1Api) -> None:
    """Cordon the node (so controllers' replacements stay off it), delete its pods, wait until gone."""
    selector = f"spec.nodeName={NODE_NAME}"
    try:
        if read_node(core) is None:
            return  # never registered (a start that failed early)
        core.patch_node(NODE_NAME, {"spec": {"unschedulable": True}})
        pods = core.api_client.sanitize_for_serialization(
            core.list_pod_for_all_namespaces(field_selector=selector)
        )
        for pod in pods["items"]:
            meta = pod["metadata"]
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=1)
        wait_until(
            lambda: not core.list_pod_for_all_namespaces(field_selector=selector).items,
            POD_DELETE_TIMEOUT,
            f"the pods on {NODE_NAME} to go",
            interval=0.25,
        )
    except client.ApiException as error:
        log(f"deleting the real node's pods: {error.status} {error.reason} (continuing)")
    except Timeout as error:
        log(f"deleting the real node's pods: {error} (continuing)")


def _stop(state: State, component: str, timeout: float) -> None:
    if component in state.pids:
        procs.stop(state.pids[component], state.executables[component], timeout)


def _kube_proxy_cleanup(node: NodeLayout) -> None:
    """Remove kube-proxy's nft tables (``--cleanup`` restores the ruleset as it was)."""
    with contextlib.suppress(FileNotFoundError):
        kube_proxy = nodebuild.binary("kube-proxy")
        subprocess.run(
            [str(kube_proxy), "--cleanup", f"--config={node.file('kube-proxy.yaml')}"],
            capture_output=True,
            timeout=30,
            check=False,
        )


def _clean_host(node: NodeLayout | None, keeper: int | None) -> None:
    """Leftover shims (of ``node``'s containerd) and container processes, the mounts under ``node``'s
    directory (in the keeper's namespace too while it runs), the kubepods cgroups, the fixed paths."""
    # without a node (its state is gone): what any dev cluster's node left, none of which runs now
    prefix = f"{node.dir}/" if node else str(STATE_ROOT / STATE_PREFIX)
    with contextlib.suppress(FileNotFoundError):
        shim = os.path.realpath(nodebuild.binary("containerd-shim-runc-v2"))
        hostclean.kill_shims(prefix, shim)
    if hostclean.kill_pods_processes():
        time.sleep(0.2)  # let the kernel reap them before their cgroups are removed
    if node is not None:
        if keeper is not None:
            hostclean.unmount_under(node.dir, keeper)
        hostclean.unmount_under(node.dir)
    left = hostclean.remove_kubepods_cgroups()
    if left:
        log(f"kubepods cgroups still in use: {', '.join(map(str, left[:3]))}")
    hostclean.remove_fixed_paths(prefix, network.CNI_NETWORKS)


def release(state: State | None, timeout: float) -> None:
    """After the control plane stopped: remove the policy chain, the bridge, veths and nft table, then let
    the keeper (and
    with it the machine's real-node lock) go."""
    network.remove()
    if state is not None:
        _stop(state, "keeper", timeout)


def clean_leftovers(previous: State | None) -> None:
    """What a killed run left, before a new real node starts (the caller holds the lock): the previous
    holder's node processes (recorded pids, checked executables) and everything on the host."""
    if previous is not None and previous.real_node:
        log(f"removing what a killed run of cluster {previous.name!r} left of its real node")
        stop(previous, None, 5.0)
        _stop(previous, "keeper", 5.0)
        if previous.running("kube-apiserver"):
            log(f"cluster {previous.name!r} runs on without its node; `down --name {previous.name}` stops it")
    else:
        _clean_host(None, None)
    network.remove()


# --- status ----------------------------------------------------------------------------------------------


def status(state: State, core: client.CoreV1Api | None) -> bool:
    """Print the real node's processes and Node; True when all run and the node is Ready with its GPUs."""
    running = {component: state.running(component) for component in COMPONENTS}
    for component, is_running in running.items():
        log(f"{component:<24} {'running' if is_running else 'STOPPED'} (pid {state.pids.get(component)})")
    ready = False
    if core is not None:
        node = read_node(core)
        ready = node is not None and _node_ready(node)
        gpus = _allocatable_gpus(node) if node else "-"
        log(f"node {NODE_NAME:<19} {'Ready' if ready else 'NOT READY'}, {RESOURCE}={gpus}")
    log(f"real-node lock {LOCK_FILE}: held by {holder()!r}")
    return ready and all(running.values())


def node_row(core: client.CoreV1Api) -> tuple[str, str, str, str, str] | None:
    """The real node as a row of the node table (name, pool, product, GPUs, ready), None when absent."""
    node = read_node(core)
    if node is None:
        return None
    labels = node["metadata"].get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL, "-")
    return (NODE_NAME, "real", product, _allocatable_gpus(node), str(_node_ready(node)))
