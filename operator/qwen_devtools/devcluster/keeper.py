"""The real node's keeper: one long-lived process per real node that holds what must outlive ``up``.

* the machine's real-node lock (an flock on an inherited file descriptor: released when this exits);
* the private mount namespace containerd and kubelet run in (entered with nsenter): every mount they
  make (overlay root file systems, volume tmpfs, network namespaces) stays out of the host's namespace
  and goes when the namespace does. In it, files with the values kubelet wants are bind-mounted over six
  /proc/sys entries, so kubelet finds nothing to "fix" and changes no machine-wide sysctl;
* the node's extended resource: the Node's status gets ``nvidia.com/gpu`` capacity and allocatable
  whenever they are missing (after kubelet registers, or registers again).

Started by qwen_devtools.devcluster.realnode as
``unshare --mount --propagation private -- python -m qwen_devtools.devcluster.keeper ...``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import urllib3
from kubernetes import client, config

from qwen_operator.api.catalog import GPU_RESOURCE

RESOURCE = GPU_RESOURCE
POLL_SECONDS = 1.0


def _mount_sysctls(directory: Path) -> None:
    """Bind-mount each file of ``directory`` over its /proc/sys entry (``kernel.panic``: kernel/panic)."""
    for fake in sorted(directory.iterdir()):
        target = Path("/proc/sys") / fake.name.replace(".", "/")
        subprocess.run(["mount", "--bind", str(fake), str(target)], check=True)


def _api(kubeconfig: Path) -> client.CoreV1Api:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.proxy = None
    return client.CoreV1Api(client.ApiClient(configuration))


def _ensure_gpus(api: client.CoreV1Api, node: str, count: str) -> None:
    """Patch the GPUs into the Node's status when they are missing (kubelet keeps them once there)."""
    try:
        # GET of the Node itself: the Node authorizer lets a node read its Node, not nodes/status
        status = api.api_client.sanitize_for_serialization(api.read_node(node)).get("status", {})
    except client.ApiException as error:
        if error.status == 404:
            return  # not registered (yet, or any more)
        raise
    if all((status.get(field) or {}).get(RESOURCE) == count for field in ("capacity", "allocatable")):
        return
    # capacity and allocatable together: allocatable alone would lag until kubelet's next status update
    body = {"status": {"capacity": {RESOURCE: count}, "allocatable": {RESOURCE: count}}}
    api.patch_node_status(node, body)
    print(f"[keeper] patched {RESOURCE}={count} into node {node}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_devtools.devcluster.keeper")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", required=True)
    parser.add_argument("--sysctls", type=Path, required=True, help="directory of the fake kernel tunables")
    parser.add_argument("--ready-file", type=Path, required=True, help="written once the namespace is set up")
    args = parser.parse_args(argv)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _mount_sysctls(args.sysctls)
    args.ready_file.write_text("ready\n")
    print("[keeper] mount namespace ready", flush=True)
    api = _api(args.kubeconfig)
    while True:
        try:
            _ensure_gpus(api, args.node, args.gpus)
        except (client.ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            # the apiserver restarts or goes away during teardown: try again next round
            print(f"[keeper] {type(error).__name__}: {error}", flush=True)
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
