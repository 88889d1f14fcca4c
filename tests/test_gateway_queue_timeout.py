"""vllm-router's queue timeout through the real gateway (nginx with its njs module, vllm-router and the
exporters exactly as rendered) in front of one llm-d-inference-sim replica (simulated: what is under test
is the gateway's answer, not the engine's). One slot and a 1 s queue timeout: a long request holds the
slot, so the next one waits in the router's queue and times out. The tests run in file order (the last
reads the first two's log lines).

vllm-router sends that 408 with no body, and nginx cannot replace a 408 with an error page (it closes
the connection instead); templates/errors.js gives it the OpenAI-style body. The filter must leave every
other answer alone: a stream arrives as the engine writes it, whole.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from qwen_devtools.net import LOOPBACK
from qwen_devtools.realparts.engine import SERVED_MODEL, cpu_qwendeployment
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway_stack
from qwen_devtools.realparts.sim import start_sims
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.gateway.nginx import QUEUE_TIMEOUT_RETRY_AFTER

KEY = "sk-team-a-0123456789abcdef"
QUEUE_TIMEOUT_SECONDS = 1
#: A long answer: at the simulated 25 ms per token, about 4 s, well past the queue timeout.
LONG_TOKENS = 160
#: Requests sent at once behind the long one (the router's queue holds them all).
QUEUED = 4


@dataclass
class Stack:
    gateway: GatewayStack
    timed_out: int = 0

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(LOOPBACK, self.gateway.wiring.http_port, timeout=30)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    body = cpu_qwendeployment(
        gateway={
            "replicas": 1,
            "apiKeysSecret": "chat-api-keys",
            "maxConcurrentRequests": 1,
            "queueSize": QUEUED,
            "queueTimeoutSeconds": QUEUE_TIMEOUT_SECONDS,
        }
    )
    with start_sims(1, 1000, 16, 1024) as sims:
        gateway = start_gateway_stack(review(body), [sims[0].url], {"team-a": KEY})
        try:
            yield Stack(gateway)
        finally:
            gateway.stop()


def _post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> http.client.HTTPResponse:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", json.dumps({"model": SERVED_MODEL, **body}), headers)
    return conn.getresponse()


def _stream(stack: Stack) -> tuple[bytes, float, float]:
    """A long stream: its bytes, and when its first and last bytes came (monotonic)."""
    conn = stack.connection()
    body = {"prompt": "A long story", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
    response = _post(conn, body)
    assert response.status == 200
    data, first = b"", 0.0
    while chunk := response.read1(65536):
        first = first or time.monotonic()
        data += chunk
    conn.close()
    return data, first, time.monotonic()


def _queue_timeout(stack: Stack, body: dict[str, Any]) -> None:
    """vllm-router admits through a token bucket of maxConcurrentRequests tokens refilled at as many per
    second: with a long request holding the one token, of QUEUED requests sent at once at most one or
    two get a refilled token within the 1 s timeout; the others time out."""
    holder: list[int] = []

    def hold() -> None:
        conn = stack.connection()
        long = {"prompt": "hold the slot", "max_tokens": LONG_TOKENS, "ignore_eos": True}
        holder.append(_post(conn, long).status)
        conn.close()

    def queued(i: int) -> tuple[int, dict[str, str], bytes, http.client.HTTPConnection]:
        conn = stack.connection()
        response = _post(conn, {"prompt": f"Wait for it {i}", "max_tokens": 2, **body})
        return response.status, dict(response.getheaders()), response.read(), conn

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    time.sleep(0.3)  # the holder is in the engine (its prefill is 65 ms)
    with ThreadPoolExecutor(QUEUED) as pool:
        answers = list(pool.map(queued, range(QUEUED)))
    timed_out = [a for a in answers if a[0] == 408]
    assert {a[0] for a in answers} <= {200, 408} and len(timed_out) >= 2, [(a[0], a[2]) for a in answers]
    for _, headers, data, conn in timed_out:
        assert headers["Content-Type"] == "application/json"
        assert headers["Retry-After"] == str(QUEUE_TIMEOUT_RETRY_AFTER)
        error = json.loads(data)["error"]
        assert error["code"] == "queue_timeout" and error["type"] == "server_error", error
        assert f"waited {QUEUE_TIMEOUT_SECONDS} s" in error["message"]
        # The connection stays open for the client's next request.
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert conn.getresponse().status == 200
    for *_, conn in answers:
        conn.close()
    thread.join(30)
    assert holder == [200]
    stack.timed_out += len(timed_out)


def test_a_request_that_times_out_in_the_queue_gets_a_json_408(stack: Stack) -> None:
    _queue_timeout(stack, {})


def test_a_stream_that_times_out_in_the_queue_gets_the_same_json_408(stack: Stack) -> None:
    _queue_timeout(stack, {"stream": True})


def test_other_answers_pass_the_filter_untouched_and_streams_as_written(stack: Stack) -> None:
    data, first, last = _stream(stack)
    assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    assert data.count(b"data: {") >= LONG_TOKENS
    assert last - first > 2.0  # tokens came over seconds, not in one buffered piece


def test_the_access_log_names_the_queue_timeout(stack: Stack) -> None:
    def entries() -> list[dict[str, Any]]:
        lines = stack.gateway.procs["nginx"].log.read_text().splitlines()
        return [e for e in (json.loads(x) for x in lines if x.startswith('{"time"')) if e["status"] == "408"]

    assert stack.timed_out
    wait_until(lambda: len(entries()) >= stack.timed_out, 20, "the 408s in the access log")
    assert {(e["error"], e["upstream_status"]) for e in entries()} == {("queue_timeout", "408")}
