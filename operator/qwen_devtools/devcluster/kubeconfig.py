"""Writing the dev cluster's kubeconfig, and checking that a given kubeconfig points at a local test cluster.

The context of a dev cluster is named ``qwen-devcluster-<name>``, so that tools and tests can tell it
apart from a real cluster. Its server is on 127.0.0.1, or, with a real node, on the node's bridge
address (the apiserver binds there so that pods reach it): nothing else counts as local.
"""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from .network import BRIDGE_ADDRESS

CONTEXT_PREFIX = "qwen-devcluster-"
LOCAL_CONTEXT_PREFIXES = (CONTEXT_PREFIX, "kind-", "k3d-")
LOCAL_CONTEXT_NAMES = ("minikube", "docker-desktop")


def context_name(cluster: str) -> str:
    """The kubeconfig context (and cluster/user) name of dev cluster ``cluster``."""
    return f"{CONTEXT_PREFIX}{cluster}"


def write(path: Path, cluster: str, server: str, ca_pem: bytes, token: str) -> None:
    """Write a token-authenticated kubeconfig for dev cluster ``cluster`` (mode 0600)."""
    _write(path, cluster, server, ca_pem, "admin", {"token": token})


def write_client_cert(
    path: Path, cluster: str, server: str, ca_pem: bytes, user: str, cert: Path, key: Path
) -> None:
    """Write a kubeconfig that authenticates with a client certificate (the real node's components)."""
    _write(path, cluster, server, ca_pem, user, {"client-certificate": str(cert), "client-key": str(key)})


def _write(
    path: Path, cluster: str, server: str, ca_pem: bytes, user: str, credentials: dict[str, str]
) -> None:
    name = context_name(cluster)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": f"{name}-{user}", "user": credentials}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-{user}"}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _current(config: dict[str, Any]) -> tuple[str, str]:
    """Current context name and the server URL of its cluster."""
    context = config.get("current-context") or ""
    entry = next((c for c in config.get("contexts") or [] if c.get("name") == context), None)
    if entry is None:
        return context, ""
    cluster_name = (entry.get("context") or {}).get("cluster")
    cluster: dict[str, Any] = next(
        (c for c in config.get("clusters") or [] if c.get("name") == cluster_name), {}
    )
    return context, (cluster.get("cluster") or {}).get("server", "")


def _is_local(server: str) -> bool:
    host = urlparse(server).hostname or ""
    if host in ("localhost", BRIDGE_ADDRESS):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_local(path: Path) -> str:
    """Return the current context of ``path`` if it is a local test cluster, else raise ValueError.

    Accepted: a context named ``qwen-devcluster-*``, ``kind-*``, ``k3d-*``, ``minikube`` or
    ``docker-desktop`` whose server is on 127.0.0.1/localhost or the dev cluster's bridge address.
    """
    config = yaml.safe_load(path.read_text()) or {}
    context, server = _current(config)
    named_local = context.startswith(LOCAL_CONTEXT_PREFIXES) or context in LOCAL_CONTEXT_NAMES
    if not named_local:
        raise ValueError(
            f"{path}: current context {context!r} is not a local test cluster "
            f"(expected {CONTEXT_PREFIX}*, kind-*, k3d-*, minikube or docker-desktop)"
        )
    if not _is_local(server):
        raise ValueError(
            f"{path}: context {context!r} has server {server!r}, not on 127.0.0.1/localhost"
            f" or the dev cluster's bridge address {BRIDGE_ADDRESS}"
        )
    return context
