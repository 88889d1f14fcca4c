"""A fault-injecting HTTP proxy in front of a REAL kube-apiserver, for the fault tests of the operator.

A real apiserver will not answer 409, 429 + Retry-After, 503 for a minute, a 410 Gone watch or a silent
watch on demand; this proxy does, for the requests a test picks, and passes everything else through to
the apiserver unchanged, so the operator still converges against real Kubernetes once a fault ends.
Every request is logged with its start and end time (monotonic clock of this process), who answered it
and how: tests read the client's retry intervals from this log, on the server side of the connection,
not from the client's own counters.

The operator talks plain HTTP to the proxy on 127.0.0.1 (its kubeconfig from `client_kubeconfig`) and
the proxy talks HTTPS to the apiserver, verifying it with the cluster's CA; the client's bearer token is
passed through, so the apiserver authorises the client exactly as without the proxy. (kubectl, like
every client-go program, sends no bearer token over plain HTTP: the proxy serves the Python clients,
kopf's and the kubernetes package's, which the operator uses.)

Use::

    with FaultProxy.in_front_of(kubeconfig) as proxy:
        proxy.client_kubeconfig(kubeconfig, tmp / "proxied")
        proxy.inject("conflict", Match(methods={"PATCH"}, path=r".*/deployments/x"), Reply(409), seconds=10)
        ...
        attempts = proxy.exchanges(answered_by="conflict")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import ssl
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yaml
from aiohttp import web

from .net import LOOPBACK, free_port

UPSTREAM = "upstream"  # `Exchange.answered_by` of requests passed through to the apiserver
#: Not forwarded in either direction: hop-by-hop headers, and what the proxy recomputes.
_DROPPED_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Accept-Encoding",  # the upstream session decompresses; what the client gets is identity
        "Content-Encoding",
    )
)
_REASONS = {
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Exchange:
    """One request as the proxy saw it: `started`/`ended` on time.monotonic() of this process."""

    started: float
    method: str
    path: str
    query: dict[str, str]
    user_agent: str
    answered_by: str = UPSTREAM  # UPSTREAM or the name of the fault that answered it
    status: int = 0  # 0: no answer yet (or the upstream could not be reached: then 502)
    ended: float | None = None  # None while the response is still streaming

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass(frozen=True)
class Match:
    """Which requests a fault answers; every given criterion must hold (none given: every request)."""

    methods: frozenset[str] = frozenset()
    path: str = ""  # a regular expression the whole path must match
    watch: bool | None = None  # True: only watch requests, False: only other requests
    user_agent: str = ""  # a substring of the User-Agent header ("kopf/" for kopf's own requests)
    exclude: str = ""  # a regular expression of paths that never match

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))

    def matches(self, exchange: Exchange) -> bool:
        return (
            (not self.methods or exchange.method in self.methods)
            and (not self.path or re.fullmatch(self.path, exchange.path) is not None)
            and (self.watch is None or exchange.watch == self.watch)
            and self.user_agent in exchange.user_agent
            and not (self.exclude and re.fullmatch(self.exclude, exchange.path))
        )


class Answer(Protocol):
    """How the proxy answers a request itself."""

    async def respond(self, request: web.BaseRequest, exchange: Exchange) -> web.StreamResponse: ...


def status_body(code: int, message: str, retry_after: int | None = None) -> dict[str, Any]:
    """A metav1.Status as the apiserver sends it with an error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "InternalError"),
        "code": code,
    }
    if retry_after is not None:
        body["details"] = {"retryAfterSeconds": retry_after}
    return body


@dataclass(frozen=True)
class Reply:
    """An API error answered at once: 409, 429 (with Retry-After), 5xx, as a metav1.Status."""

    code: int
    retry_after: int | None = None  # seconds, in the Retry-After header and details.retryAfterSeconds
    message: str = ""

    async def respond(self, request: web.BaseRequest, exchange: Exchange) -> web.StreamResponse:
        message = self.message or f"{_REASONS.get(self.code, 'error')} (injected by the fault proxy)"
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        exchange.status = self.code
        return web.json_response(
            status_body(self.code, message, self.retry_after), status=self.code, headers=headers
        )


@dataclass(frozen=True)
class WatchGone:
    """A watch whose resourceVersion expired, as the apiserver says it: 200, one ERROR event of a 410
    Status ("too old resource version"), end of stream."""

    async def respond(self, request: web.BaseRequest, exchange: Exchange) -> web.StreamResponse:
        event = {"type": "ERROR", "object": status_body(410, "too old resource version (fault proxy)")}
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        exchange.status = 200
        return response


@dataclass(frozen=True)
class WatchStall:
    """A watch that is accepted (200, headers sent) and then stays open sending nothing, until the
    client gives up on it (or the proxy stops): a dead stream that looks alive."""

    async def respond(self, request: web.BaseRequest, exchange: Exchange) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        exchange.status = 200
        await asyncio.Event().wait()  # cancelled when the client disconnects
        return response


@dataclass
class Fault:
    """An injected fault: answers matching requests while it is active (until `deadline`, at most
    `times` requests), and counts what it answered."""

    name: str
    match: Match
    answer: Answer
    deadline: float | None = None  # time.monotonic(); None: no end in time
    times: int | None = None  # None: any number of requests
    answered: int = 0

    def takes(self, exchange: Exchange) -> bool:
        """Whether this fault answers `exchange` (and, if so, count it)."""
        if self.deadline is not None and exchange.started >= self.deadline:
            return False
        if self.times is not None and self.answered >= self.times:
            return False
        if not self.match.matches(exchange):
            return False
        self.answered += 1
        return True


@dataclass
class _Open:
    exchange: Exchange
    request: web.BaseRequest


@dataclass
class FaultProxy:
    """The proxy, served from a thread of its own (its own event loop) on 127.0.0.1."""

    upstream: str  # https://host:port of the apiserver
    ca_pem: bytes
    port: int = field(default_factory=free_port)
    _faults: list[Fault] = field(default_factory=list)
    _log: list[Exchange] = field(default_factory=list)
    _open: dict[int, _Open] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.BaseRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @classmethod
    def in_front_of(cls, kubeconfig: Path) -> FaultProxy:
        """A proxy for the apiserver (and its CA) of the current context of `kubeconfig`."""
        cluster = _current_cluster(yaml.safe_load(kubeconfig.read_text()))
        return cls(upstream=cluster["server"].rstrip("/"), ca_pem=_ca_pem(cluster, kubeconfig.parent))

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def client_kubeconfig(self, kubeconfig: Path, dest: Path) -> Path:
        """A copy of `kubeconfig` (same user and token) whose current cluster is this proxy."""
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = _current_cluster(config)
        cluster.pop("certificate-authority-data", None)
        cluster.pop("certificate-authority", None)
        cluster["server"] = self.url
        dest.write_text(yaml.safe_dump(config))
        return dest

    # --- faults and the log (called from the test's thread) ---------------------------------------
    def inject(
        self,
        name: str,
        match: Match,
        answer: Answer,
        seconds: float | None = None,
        times: int | None = None,
        cut: bool = False,
    ) -> Fault:
        """Answer requests matching `match` with `answer` for `seconds` (None: for good), at most
        `times` of them. `cut`: also drop the matching streams open now, so that their clients
        reconnect into the fault (a watch opened before the fault would otherwise never see it)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        fault = Fault(name, match, answer, deadline, times)
        with self._lock:
            self._faults.append(fault)
        if cut:
            self.cut(match)
        return fault

    def cut(self, match: Match) -> int:
        """Close the connections of the open (streaming) requests matching `match`; how many."""
        with self._lock:
            doomed = [o.request for o in self._open.values() if match.matches(o.exchange)]
        for request in doomed:
            self._call(_close(request))
        return len(doomed)

    def exchanges(
        self, match: Match | None = None, answered_by: str | None = None, since: float = 0.0
    ) -> list[Exchange]:
        """The logged requests (in arrival order) matching `match`, answered by `answered_by`,
        started at or after `since` (time.monotonic())."""
        with self._lock:
            log = list(self._log)
        return [
            e
            for e in log
            if e.started >= since
            and (match is None or match.matches(e))
            and (answered_by is None or e.answered_by == answered_by)
        ]

    # --- life cycle --------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="faultproxy", daemon=True)
        self._thread.start()
        self._call(self._serve()).result(timeout=15)
        return self

    def stop(self) -> None:
        """Close every open stream and the listener, then end the thread."""
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown()).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=15)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _call(self, coro: Any) -> Future[Any]:
        assert self._loop is not None, "the proxy is not running"
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _serve(self) -> None:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent",),
        )
        server = web.Server(self._handle, handler_cancellation=True)
        runner = web.ServerRunner(server, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, self.port).start()
        self._runner = runner

    async def _shutdown(self) -> None:
        with self._lock:
            requests = [o.request for o in self._open.values()]
        for request in requests:
            await _close(request)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # --- serving (the proxy's own thread) ------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        exchange = Exchange(
            started=time.monotonic(),
            method=request.method,
            path=request.path,
            query=dict(request.query),
            user_agent=request.headers.get("User-Agent", ""),
        )
        with self._lock:
            self._log.append(exchange)
            fault = next((f for f in self._faults if f.takes(exchange)), None)
            key = id(exchange)
            self._open[key] = _Open(exchange, request)
        try:
            if fault is not None:
                exchange.answered_by = fault.name
                return await fault.answer.respond(request, exchange)
            return await self._pass(request, exchange)
        finally:
            exchange.ended = time.monotonic()
            with self._lock:
                self._open.pop(key, None)

    async def _pass(self, request: web.BaseRequest, exchange: Exchange) -> web.StreamResponse:
        """Forward the request to the apiserver; stream watch responses through as they come."""
        assert self._session is not None
        headers = _forwarded(request.headers.items())
        body = await request.read()
        url = self.upstream + request.raw_path
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=body or None, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as error:
            exchange.status = 502
            return web.json_response(status_body(502, f"fault proxy: upstream: {error}"), status=502)
        async with upstream:
            exchange.status = upstream.status
            reply_headers = _forwarded(upstream.headers.items())
            if not exchange.watch:
                data = await upstream.read()
                return web.Response(status=upstream.status, body=data, headers=reply_headers)
            response = web.StreamResponse(status=upstream.status, headers=reply_headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def _forwarded(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in headers if k.lower() not in _DROPPED_HEADERS}


async def _close(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.close()


def _current_cluster(config: dict[str, Any]) -> dict[str, Any]:
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    entry = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    cluster: dict[str, Any] = entry["cluster"]
    return cluster


def _ca_pem(cluster: dict[str, Any], base: Path) -> bytes:
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    return (base / cluster["certificate-authority"]).read_bytes()
