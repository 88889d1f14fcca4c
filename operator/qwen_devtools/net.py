"""Loopback networking of the tests: free ports on 127.0.0.1 and an HTTP GET that never uses a proxy."""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping

#: The only address tests bind to and send traffic to.
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 (held open together so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 2.0, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a GET without proxies; status 0 when nothing answers."""
    assert url.startswith(f"http://{LOOPBACK}:"), f"tests only talk to {LOOPBACK}: {url}"
    request = urllib.request.Request(url, headers=dict(headers or {}))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError:
        return 0, ""
