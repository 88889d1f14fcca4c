"""Networking of the tests: free ports on 127.0.0.1, HTTP GET and POST that never use a proxy and only
go to loopback or to the networks the dev cluster made, and a metric read from a Prometheus endpoint."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Mapping, Sequence

#: The only address tests bind to, and (besides the dev cluster's own networks) send traffic to.
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


def check_destination(url: str, networks: Sequence[str] = ()) -> None:
    """Tests talk to loopback, or to the networks the dev cluster made (its pods and Services)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    allowed = host == LOOPBACK or any(
        ipaddress.ip_address(host) in ipaddress.ip_network(n) for n in networks if _is_ip(host)
    )
    assert allowed, f"tests only talk to {LOOPBACK} or {list(networks)}: {url}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def http_get(
    url: str,
    timeout: float = 2.0,
    headers: Mapping[str, str] | None = None,
    networks: Sequence[str] = (),
) -> tuple[int, str]:
    """(status, body) of a GET without proxies; status 0 when nothing answers. Only to loopback or
    `networks` (the dev cluster's pod and Service ranges)."""
    return _request(urllib.request.Request(url, headers=dict(headers or {})), timeout, networks)


def http_post(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a POST with an empty body (an admin call), as `http_get` sends a GET."""
    return _request(urllib.request.Request(url, data=b"", method="POST"), timeout, ())


def _request(request: urllib.request.Request, timeout: float, networks: Sequence[str]) -> tuple[int, str]:
    check_destination(request.full_url, networks)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` at a Prometheus endpoint (`url` is the whole /metrics address)
    whose labels include `labels`; 0 when there is none."""
    return metric_sums(url, [name], **labels)[name]


def metric_sums(url: str, names: Collection[str], **labels: str) -> dict[str, float]:
    """`metric_sum` of each of `names`, from one read of the endpoint."""
    status, text = http_get(url, timeout=5)
    assert status == 200, url
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) not in totals:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            totals[match.group(1)] += float(match.group(4))
    return totals
