"""The activator (qwen_operator.activator): its real server, in-process on loopback, in front of a stand-in
router on loopback that has no ready engine (503 to /readiness and to requests) until a test makes it
ready. The requests come straight from the tests, with the key header nginx sets; nginx in front of it
is tests/test_gateway_hold.py's. Memory is measured, not assumed: tracemalloc's peak while bodies
arrive, and the activator's own count of the body bytes it keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from qwen_devtools.net import LOOPBACK, free_ports
from qwen_operator.activator import KEY_HEADER, Activator, Settings, serve

#: Small, so that the tests move little data; the activator's default is 128 MiB.
BUDGET = 8 * 2**20
CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 5}


@dataclass
class Router:
    """vllm-router's answers without an engine (503, not JSON), and an engine's once `ready`."""

    ready: bool = False
    seen: list[CIMultiDict[str]] = field(default_factory=list)

    async def readiness(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def request(self, request: web.Request) -> web.Response:
        await request.read()
        self.seen.append(request.headers.copy())
        if not self.ready:
            return web.Response(status=503, text="no ready engine")
        return web.json_response({"choices": [{"message": {"content": "Hi"}}]})


@dataclass
class Running:
    activator: Activator
    url: str
    port: int
    router: Router


@contextlib.asynccontextmanager
async def running(max_held: int = 64, hold_seconds: float = 30) -> AsyncIterator[Running]:
    router = Router()
    app = web.Application()
    app.router.add_get("/readiness", router.readiness)
    app.router.add_route("*", "/{path:.*}", router.request)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    router_port, port, metrics_port = free_ports(3)
    await web.TCPSite(runner, LOOPBACK, router_port).start()
    settings = Settings(
        router_url=f"http://{LOOPBACK}:{router_port}",
        hold_seconds=hold_seconds,
        max_held=max_held,
        poll_seconds=0.2,
        host=LOOPBACK,
        port=port,
        metrics_host=LOOPBACK,
        metrics_port=metrics_port,
        held_bytes_budget=BUDGET,
    )
    stop = asyncio.Event()
    started: asyncio.Future[Activator] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(settings, stop, started.set_result))
    try:
        either: set[asyncio.Future[Any]] = {server, started}
        await asyncio.wait(either, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # its error
        yield Running(started.result(), f"http://{LOOPBACK}:{port}", port, router)
    finally:
        stop.set()
        await asyncio.wait({server}, timeout=10)
        await runner.cleanup()
        if not server.done():
            server.cancel()
            raise AssertionError("the activator did not stop within 10 s of its stop signal")


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


async def until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str:
        return str(json.loads(self.body)["error"]["code"])


async def post(
    session: aiohttp.ClientSession,
    r: Running,
    key: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    async with session.post(
        f"{r.url}/v1/chat/completions",
        data=json.dumps(CHAT).encode() if body is None else body,
        headers={"Content-Type": "application/json", KEY_HEADER: key, **(headers or {})},
    ) as response:
        return Answer(response.status, dict(response.headers), await response.read())


async def raw_head(r: Running, headers: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection on which a POST's head is sent, its body left to the test."""
    reader, writer = await asyncio.open_connection(LOOPBACK, r.port)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {LOOPBACK}\r\n{headers}\r\n".encode())
    await writer.drain()
    return reader, writer


async def raw_answer(reader: asyncio.StreamReader) -> Answer:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status_line, *lines = head.strip().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    body = await reader.readexactly(int(headers["Content-Length"]))
    return Answer(int(status_line.split()[1]), headers, body)


def assert_refused(answer: Answer, code: str = "overloaded") -> None:
    assert answer.status == 503, answer
    assert answer.headers["Retry-After"] == "10", answer
    assert answer.headers["Content-Type"].startswith("application/json"), answer
    assert answer.error_code() == code, answer


# --- item 1: what is read before admission is bounded --------------------------------------------------


def test_a_declared_length_over_the_budget_is_refused_before_its_body_comes() -> None:
    async def test() -> None:
        async with running() as r, aiohttp.ClientSession() as session:
            # Half the budget held ...
            held = asyncio.create_task(post(session, r, "team-a", b"x" * (BUDGET // 2)))
            await until(lambda: len(r.activator.waiting) == 1, "one held request")
            # ... a declared body over what is left is refused at once, none of it sent.
            head = f"Content-Length: {BUDGET // 2 + 1}\r\n{KEY_HEADER}: team-b\r\n"
            reader, writer = await raw_head(r, head)
            answer = await asyncio.wait_for(raw_answer(reader), 5)
            assert_refused(answer)
            assert "memory" in json.loads(answer.body)["error"]["message"]
            writer.close()
            # A declared body that fits is read and held.
            fits = asyncio.create_task(post(session, r, "team-b", b"y" * (BUDGET // 2)))
            await until(lambda: len(r.activator.waiting) == 2, "two held requests")
            assert r.activator.held_bytes == BUDGET
            held.cancel()
            fits.cancel()
            await until(lambda: r.activator.active == 0, "no request left in the activator")
            assert r.activator.held_bytes == 0

    run(test)


def chunked_upload(
    r: Running, key: str, chunk: bytes, chunks: int, opened: list[socket.socket]
) -> Answer | None:
    """A chunked POST, from a thread with blocking sends of one chunk made beforehand: the client adds
    nothing to the traced memory. None when the test shuts its connection before an answer (held)."""
    sock = socket.create_connection((LOOPBACK, r.port))
    opened.append(sock)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {LOOPBACK}\r\nTransfer-Encoding: chunked\r\n"
    sock.sendall(f"{head}{KEY_HEADER}: {key}\r\n\r\n".encode())
    frame = f"{len(chunk):x}\r\n".encode()
    with contextlib.suppress(OSError):  # a refusal may close the connection early
        for _ in range(chunks):
            sock.sendall(frame)
            sock.sendall(chunk)
            sock.sendall(b"\r\n")
        sock.sendall(b"0\r\n\r\n")
    with contextlib.suppress(OSError), sock.makefile("rb") as answer:
        status_line = answer.readline().decode()
        if not status_line:
            return None
        headers = {}
        while (line := answer.readline().decode().strip()) != "":
            name, value = line.split(": ", 1)
            headers[name] = value
        return Answer(int(status_line.split()[1]), headers, answer.read(int(headers["Content-Length"])))
    return None


def test_concurrent_uploads_without_a_length_stay_within_the_budget() -> None:
    """Ten 4 MiB chunked uploads at once against an 8 MiB budget: bodies are counted as they arrive and
    refused once over, so what the process holds stays near the budget (before: all 40 MiB read)."""
    uploads, chunk, chunks = 10, b"z" * 2**16, 64  # 4 MiB each

    async def test() -> None:
        async with running() as r:
            counted = 0

            async def sample() -> None:
                nonlocal counted
                while True:
                    counted = max(counted, r.activator.held_bytes)
                    await asyncio.sleep(0.001)

            sampler = asyncio.create_task(sample())
            opened: list[socket.socket] = []
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(uploads) as pool:
                tracemalloc.start()
                try:
                    sent = [
                        loop.run_in_executor(pool, chunked_upload, r, f"key-{i}", chunk, chunks, opened)
                        for i in range(uploads)
                    ]
                    await until(
                        lambda: sum(f.done() for f in sent) + len(r.activator.waiting) == uploads,
                        "every upload held or answered",
                        timeout=30,
                    )
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
                    sampler.cancel()
                    for sock in opened:  # the held ones
                        sock.shutdown(socket.SHUT_RDWR)
                answers = await asyncio.gather(*sent)
            refused = [a for a in answers if a is not None]
            for answer in refused:
                assert_refused(answer)
            assert 1 <= uploads - len(refused) <= BUDGET // (len(chunk) * chunks)
            assert counted <= BUDGET
            # Beyond the budget: a body without a length grows by an eighth at a time (bytearray); a held
            # body is decoded once to see whether it asks for a stream (one at a time); aiohttp reads
            # ahead on each connection (twice READ_CHUNK, after a socket read of up to 256 KiB).
            slack = BUDGET // 8 + len(chunk) * chunks + uploads * 384 * 2**10
            print(f"peak traced {peak / 2**20:.1f} MiB, counted {counted / 2**20:.1f} MiB")
            assert peak <= BUDGET + slack, f"{peak / 2**20:.1f} MiB traced at the peak"
            await until(lambda: r.activator.active == 0, "no request left in the activator")
            assert r.activator.held_bytes == 0

    run(test)


# --- item 14 (and 1): nothing is left counted by a client that leaves mid-body ------------------------


def test_clients_that_leave_mid_body_leave_nothing_counted() -> None:
    """Then the activator stops at once on its signal (before: `active` stayed up, SIGTERM waited for
    SIGKILL)."""

    async def test() -> None:
        async with running() as r:
            for head, part in [
                ("Content-Length: 1000000\r\n", b"x" * 1000),
                ("Transfer-Encoding: chunked\r\n", b"1000\r\n" + b"x" * 4096 + b"\r\n1000\r\n" + b"x" * 100),
            ]:
                _, writer = await raw_head(r, f"{head}{KEY_HEADER}: team-a\r\n")
                writer.write(part)
                await writer.drain()
                await until(lambda: r.activator.active == 1, "the request in the activator")
                writer.close()
                await until(lambda: r.activator.active == 0, f"nothing left after leaving ({head.strip()})")
                assert r.activator.held_bytes == 0
                assert not r.activator.waiting

    run(test)


# --- item 9: one key cannot take every held place -------------------------------------------------------


def test_a_key_cannot_take_every_held_place_from_the_others() -> None:
    """maxHeld 4, all taken by team-a: team-b still gets held, in the place of team-a's newest (a stream
    here: it gets the error event), until both hold as many; then the pod is full for both."""

    async def test() -> None:
        async with running(max_held=4) as r, aiohttp.ClientSession() as session:
            a = []
            for i in range(4):  # alone, a key may use every place
                body = json.dumps({**CHAT, "stream": i == 3}).encode()
                a.append(asyncio.create_task(post(session, r, "team-a", body)))
                await until(lambda: len(r.activator.waiting) == len(a), f"{len(a)} held")
            b = [asyncio.create_task(post(session, r, "team-b"))]
            evicted = await asyncio.wait_for(a[3], 5)  # team-a's newest makes room ...
            assert evicted.status == 200 and evicted.headers["Content-Type"] == "text/event-stream"
            events = [e for e in evicted.body.decode().split("\n\n") if e.startswith("data: ")]
            assert json.loads(events[0].removeprefix("data: "))["error"]["code"] == "overloaded"
            assert events[-1] == "data: [DONE]"
            assert not b[0].done()  # ... for team-b's, held
            assert len(r.activator.waiting) == 4
            b.append(asyncio.create_task(post(session, r, "team-b")))
            assert_refused(await asyncio.wait_for(a[2], 5))
            # Two each: neither key takes a place of the other now.
            assert_refused(await asyncio.wait_for(post(session, r, "team-b"), 5))
            assert_refused(await asyncio.wait_for(post(session, r, "team-a"), 5))
            assert [t.done() for t in (a[0], a[1], *b)] == [False] * 4
            assert len(r.activator.waiting) == 4
            for t in (*a, *b):
                t.cancel()
            await until(lambda: r.activator.active == 0, "no request left in the activator")

    run(test)


def test_the_key_header_stays_between_nginx_and_the_activator() -> None:
    async def test() -> None:
        async with running() as r, aiohttp.ClientSession() as session:
            r.router.ready = True
            answer = await asyncio.wait_for(post(session, r, "team-a", headers={"X-Request-Id": "r-1"}), 10)
            assert answer.status == 200, answer
            (forwarded,) = r.router.seen
            assert forwarded["X-Request-Id"] == "r-1"
            assert KEY_HEADER not in forwarded

    run(test)
