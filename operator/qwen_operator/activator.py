"""`qwen-operator activator`: where the gateway's requests wait while no engine is ready (minReplicas 0).

A sidecar of the gateway pod, present only when the engines may scale to zero. nginx sends it nothing
while engines serve: only a request that vllm-router answered with its own 503 (no ready engine) is
proxied again, body and all, to this process on loopback (nginx.conf's @overloaded). Here it waits:

- at most `max_held` requests at once in this pod (beyond: a JSON 503 with Retry-After at once), each at
  most `hold_seconds` (then a JSON 503 with Retry-After);
- shared out by API key (nginx's key id in KEY_HEADER; the client address with auth none): alone, a key
  may take every place; once they are all taken, a request of a key that holds at least two fewer than
  the key holding the most takes the place of that key's newest request (answered a JSON 503 with
  Retry-After, or an error event). So no key keeps another out: the places even out between the keys;
- bodies in memory at most `held_bytes_budget`, counted before they are kept: a Content-Length over what
  is left of it is refused at once (a JSON 503 with Retry-After), its body unread; a body without one is
  counted as it arrives and refused once over; at most READS_AT_ONCE bodies are read at once. Beyond the
  counted bytes, aiohttp reads ahead a little per connection (READ_CHUNK);
- a `"stream": true` request is answered 200 `text/event-stream` at once and gets an SSE comment line
  every `keepalive_seconds`, so that proxies and clients see bytes; at the bound it gets an OpenAI-style
  error event (`data: {"error": ...}`) and the stream closes;
- the router's /readiness is polled every `poll_seconds` while anything waits; once it reports a ready
  engine the held requests go to the router in arrival order, and the router's answer (a stream or a
  whole response) is relayed unchanged. A 503 of the router again (the engine left meanwhile) puts the
  request back in its place.

/metrics (Prometheus) and /scale (JSON `{"held": n}`, for KEDA's metrics-api scaler: the wake signal has
to come from the gateway, since engines at zero export nothing) are served on a second port.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import json
import logging
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .api.coldstart import HOLD_RETRY_AFTER_SECONDS
from .clientapis import api_of, error_payload

log = logging.getLogger("qwen.activator")

#: A cold start of a 32B engine takes minutes: buckets up to an hour.
WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180, 240, 300, 450, 600, 900, 1200, 1800, 3600)
#: Bodies held in memory at once, at most: half the container's memory limit (manifests/gateway.py), so
#: that a few huge prompts cannot get the sidecar, and every request it holds, killed. A typical chat
#: body is kilobytes; a 128K-token prompt about 0.5 MB; nginx refuses bodies over 16 MiB.
HELD_BYTES_BUDGET = 128 * 2**20
#: Bodies being read at once.
READS_AT_ONCE = 4
#: The most read from a body in a step, and aiohttp's read-ahead per connection (twice this, and one
#: socket read of up to 256 KiB): what is in memory beyond the counted bytes.
READ_CHUNK = 2**14
KEEPALIVE_COMMENT = b": waiting for an engine\n\n"
#: The API key's id (nginx's $key_id; the client address with auth none), set by nginx on the requests
#: it sends here, never passed on to the router.
KEY_HEADER = "X-Qwen-Hold-Key-Id"
#: Headers not passed between the connections (RFC 9110 hop-by-hop, lengths aiohttp sets itself, and
#: nginx's key id, for this process only).
NOT_PASSED = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
        "Host", "Content-Length", KEY_HEADER,
    )
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    router_url: str
    hold_seconds: float
    max_held: int
    retry_after_seconds: int = HOLD_RETRY_AFTER_SECONDS
    keepalive_seconds: float = 5.0
    poll_seconds: float = 1.0
    host: str = "127.0.0.1"
    port: int = 8092
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9114
    held_bytes_budget: int = HELD_BYTES_BUDGET  # smaller in tests


def error_body(path: str, code: str, message: str, status: int = 503) -> dict[str, object]:
    """An error of the activator's own, in the shape of the request's API (OpenAI's, or Anthropic's on
    /v1/messages)."""
    return error_payload(api_of(path), status, code, message)


def error_event(path: str, error: dict[str, object]) -> bytes:
    """The last event of a held stream that ends in `error`: Anthropic's `error` event, or the OpenAI
    routes' error data line and [DONE]."""
    if api_of(path) == "anthropic":
        return f"event: error\ndata: {json.dumps(error)}\n\n".encode()
    return f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()


def wants_stream(body: bytes | bytearray) -> bool:
    """The request asks for server-sent events (`"stream": true` at the top of its JSON body)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def forwarded_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in headers if k.lower() not in NOT_PASSED}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.held = Gauge(
            "qwen_gateway_held_requests", "Requests waiting for a ready engine now.", registry=r
        )
        self.holds = Counter("qwen_gateway_holds", "Requests held since start.", registry=r)
        self.wait = Histogram(
            "qwen_gateway_hold_wait_seconds",
            "How long held requests waited, by outcome (forwarded to an engine, timeout at the bound, "
            "cancelled by the client, evicted for another API key's request).",
            ["outcome"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.timeouts = Counter(
            "qwen_gateway_hold_timeouts", "Held requests answered 503 at the hold bound.", registry=r
        )
        self.rejected = Counter(
            "qwen_gateway_hold_rejected", "Requests answered 503 at once: the pod held its most.", registry=r
        )


@dataclass(order=True)
class Waiter:
    """One held request; ordered by arrival."""

    seq: int
    since: float = field(compare=False)
    request_id: str = field(compare=False)
    key: str = field(compare=False)
    released: asyncio.Event = field(compare=False, default_factory=asyncio.Event)
    forwarded: bool = field(compare=False, default=False)
    evicted: bool = field(compare=False, default=False)  # its place given to another key's request


class Activator:
    """The held requests of one gateway pod, in arrival order, and the poller that releases them."""

    def __init__(self, settings: Settings, session: aiohttp.ClientSession) -> None:
        self.s = settings
        self.session = session
        self.metrics = Metrics()
        self.waiting: list[Waiter] = []  # sorted by arrival
        self.active = 0  # requests in this process: held, or being forwarded
        self.held_bytes = 0  # their bodies, counted before they are kept
        self._reads = asyncio.Semaphore(READS_AT_ONCE)
        self._seq = itertools.count()
        self._someone_waits = asyncio.Event()

    # --- the poller -------------------------------------------------------------------------------

    async def engine_ready(self) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=max(1.0, self.s.poll_seconds * 2))
            async with self.session.get(f"{self.s.router_url}/readiness", timeout=timeout) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def poll(self) -> None:
        """While anything waits: ask the router whether an engine is ready; if so release every held
        request, the oldest first."""
        while True:
            await self._someone_waits.wait()
            if await self.engine_ready():
                for waiter in self.waiting:
                    waiter.released.set()
                    log.info(
                        "released %s after %.1f s (seq %d)", waiter.request_id, self._age(waiter), waiter.seq
                    )
                self.waiting.clear()
                self._changed()
            await asyncio.sleep(self.s.poll_seconds)

    def _age(self, waiter: Waiter) -> float:
        return time.monotonic() - waiter.since

    def _changed(self) -> None:
        self.metrics.held.set(len(self.waiting))
        if self.waiting:
            self._someone_waits.set()
        else:
            self._someone_waits.clear()

    def _enqueue(self, waiter: Waiter) -> None:
        waiter.released.clear()
        bisect.insort(self.waiting, waiter)
        self._changed()

    def _dequeue(self, waiter: Waiter) -> None:
        if waiter in self.waiting:
            self.waiting.remove(waiter)
            self._changed()

    def _admit(self, waiter: Waiter) -> bool:
        """Into the queue, if a place is free or its key holds at least two fewer than the key holding the
        most, whose newest request then gives up its place."""
        if len(self.waiting) >= self.s.max_held:
            held = collections.Counter(w.key for w in self.waiting)
            busiest, most = held.most_common(1)[0]
            if most <= held[waiter.key] + 1:
                return False
            newest = next(w for w in reversed(self.waiting) if w.key == busiest)
            log.info("evicting %s (seq %d) for %s", newest.request_id, newest.seq, waiter.request_id)
            newest.evicted = True
            self._dequeue(newest)
            newest.released.set()
        self._enqueue(waiter)
        return True

    # --- requests ---------------------------------------------------------------------------------

    def _error(self, request: web.Request, code: str, message: str) -> web.Response:
        return web.json_response(
            error_body(request.path, code, message),
            status=503,
            headers={"Retry-After": str(self.s.retry_after_seconds)},
        )

    def _memory_full(self, request: web.Request) -> web.Response:
        self.metrics.rejected.inc()
        return self._error(
            request,
            "overloaded",
            "The requests waiting in this gateway pod for an engine to start fill its memory; retry later.",
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The body read within the budget (a declared length counted before any of it is read, another
        body as it arrives), then held."""
        counted = 0  # this request's part of held_bytes
        self.active += 1
        try:
            declared = request.content_length
            if declared is not None:
                if declared > self.s.held_bytes_budget - self.held_bytes:
                    return self._memory_full(request)
                counted = declared
                self.held_bytes += counted
            body = bytearray(counted)  # filled in place: no copy of the whole body while it grows
            size = 0
            async with self._reads:
                async for chunk in request.content.iter_chunked(READ_CHUNK):
                    end = size + len(chunk)
                    if end > counted:
                        if end - counted > self.s.held_bytes_budget - self.held_bytes:
                            return self._memory_full(request)
                        self.held_bytes += end - counted
                        counted = end
                    body[size:end] = chunk
                    size = end
            del body[size:]
            return await self._handle(request, body)
        finally:
            self.active -= 1
            self.held_bytes -= counted

    async def _handle(self, request: web.Request, body: bytearray) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-Id", "-")
        waiter = Waiter(next(self._seq), time.monotonic(), request_id, request.headers.get(KEY_HEADER, ""))
        if not self._admit(waiter):
            self.metrics.rejected.inc()
            return self._error(
                request,
                "overloaded",
                f"{self.s.max_held} requests already wait in this gateway pod for an engine to start; "
                "retry later.",
            )
        self.metrics.holds.inc()
        log.info("holding %s (seq %d, %d held)", waiter.request_id, waiter.seq, len(self.waiting) + 1)
        stream: web.StreamResponse | None = None
        if wants_stream(body):
            stream = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                },
            )
        outcome = "cancelled"  # unless the hold ends otherwise: the client went away
        try:
            if stream is not None:
                await stream.prepare(request)
                await stream.write(KEEPALIVE_COMMENT)
            answer = await self._hold_and_forward(request, body, waiter, stream)
            if answer is not None:
                return answer
            if waiter.evicted:
                outcome, code = "evicted", "overloaded"
                message = "Requests of other API keys need this gateway pod's places; retry later."
            else:
                outcome, code = "timeout", "no_engine_available"
                self.metrics.timeouts.inc()
                message = f"No engine became ready within {self.s.hold_seconds:g} s; retry later."
                log.info("timeout %s after %.1f s", waiter.request_id, self._age(waiter))
            if stream is None:
                return self._error(request, code, message)
            await stream.write(error_event(request.path, error_body(request.path, code, message)))
            await stream.write_eof()
            return stream
        except ConnectionError:  # the client left: nothing to answer
            return stream if stream is not None else web.Response(status=499)
        finally:
            self._dequeue(waiter)
            if not waiter.forwarded:
                self.metrics.wait.labels(outcome).observe(self._age(waiter))

    async def _hold_and_forward(
        self, request: web.Request, body: bytearray, waiter: Waiter, stream: web.StreamResponse | None
    ) -> web.StreamResponse | None:
        """Wait for a release (the waiter is queued), then forward; None at the bound or once evicted."""
        deadline = waiter.since + self.s.hold_seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            step = min(left, self.s.keepalive_seconds) if stream is not None else left
            try:
                await asyncio.wait_for(waiter.released.wait(), step)
            except TimeoutError:
                if stream is not None:
                    await stream.write(KEEPALIVE_COMMENT)
                continue
            if waiter.evicted:
                return None
            answer = await self._forward(request, body, waiter, stream)
            if answer is not None:
                return answer
            self._enqueue(waiter)  # the engine left again: back in its place

    async def _forward(
        self, request: web.Request, body: bytearray, waiter: Waiter, stream: web.StreamResponse | None
    ) -> web.StreamResponse | None:
        """The request to the router; its answer relayed, or None for the router's own 503 (no engine)."""
        url = f"{self.s.router_url}{request.path_qs}"
        headers = forwarded_headers(request.headers.items())
        if stream is not None:  # its headers are sent: the events must come as they are, not compressed
            headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
        try:
            upstream = await self.session.request(request.method, url, headers=headers, data=body)
        except aiohttp.ClientError as error:
            log.warning("forwarding %s failed: %s", waiter.request_id, error)
            return None
        async with upstream:
            if upstream.status == 503 and upstream.content_type != "application/json":
                return None
            waiter.forwarded = True
            self.metrics.wait.labels("forwarded").observe(self._age(waiter))
            if stream is not None:
                await self._relay_into_stream(request.path, upstream, stream)
                return stream
            response = web.StreamResponse(
                status=upstream.status, headers=forwarded_headers(upstream.headers.items())
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    @staticmethod
    async def _relay_into_stream(
        path: str, upstream: aiohttp.ClientResponse, stream: web.StreamResponse
    ) -> None:
        """The engine's events into a stream already answered 200; an error answer becomes an error event."""
        if upstream.status == 200:
            async for chunk in upstream.content.iter_any():
                await stream.write(chunk)
        else:
            text = await upstream.text()
            try:
                event = json.loads(text)
            except ValueError:
                event = None
            if not (isinstance(event, dict) and "error" in event):  # an engine's own error passes as it is
                message = f"The engine answered {upstream.status}: {text[:500]}"
                event = error_body(path, "upstream_error", message, upstream.status)
            await stream.write(error_event(path, event))
        await stream.write_eof()

    # --- metrics port -----------------------------------------------------------------------------

    async def scale(self, _: web.Request) -> web.Response:
        return web.json_response({"held": len(self.waiting)})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def serve(
    settings: Settings, stop: asyncio.Event, started: Callable[[Activator], None] | None = None
) -> None:
    """Both listeners until `stop` is set; `started` (tests) is called once they listen."""
    timeout = aiohttp.ClientTimeout(total=None, connect=5)
    # Never a proxy from the environment: the router is on loopback.
    # No cap on connections to the router (aiohttp's default is 100): every released request is forwarded
    # at once, and a long stream must not keep the next one waiting; max_held bounds them.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        activator = Activator(settings, session)
        held = web.Application()  # bodies are read by `handle`, within the budget
        held.router.add_route("*", "/{path:.*}", activator.handle)
        metrics = web.Application()
        metrics.router.add_get("/metrics", activator.prometheus)
        metrics.router.add_get("/scale", activator.scale)
        metrics.router.add_get("/healthz", healthz)
        runners = [
            web.AppRunner(held, handler_cancellation=True, access_log=None, read_bufsize=READ_CHUNK),
            web.AppRunner(metrics, access_log=None),
        ]
        poller = asyncio.create_task(activator.poll())
        try:
            for runner, host, port in zip(
                runners,
                (settings.host, settings.metrics_host),
                (settings.port, settings.metrics_port),
                strict=True,
            ):
                await runner.setup()
                await web.TCPSite(runner, host, port).start()
            log.info(
                "holding up to %d requests for %g s each; router %s",
                settings.max_held,
                settings.hold_seconds,
                settings.router_url,
            )
            if started is not None:
                started(activator)
            await stop.wait()
            # SIGTERM reaches every container of the pod at once; nginx drains its requests, so the held
            # and forwarded ones here are finished too (the pod's grace period bounds it).
            log.info("stopping once %d requests are done", activator.active)
            while activator.active:
                await asyncio.sleep(0.5)
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            for runner in runners:
                await runner.cleanup()


def run(settings: Settings) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
