"""The gateway of a deployment scaled to zero (autoscaling.minReplicas 0) holds requests while no engine is
ready, with real processes on loopback: nginx (run-nginx.sh and nginx.conf as rendered), vllm-router
(its rendered command line) and the activator sidecar as a real `qwen-operator activator` process (its
rendered arguments); only ports, paths and how engines join are the test's.

What is simulated: the engine is llm-d-inference-sim (qwen_devtools.realparts.sim), which speaks vLLM's
OpenAI API, /health and /metrics and starts in about a second, so that "an engine becomes ready later"
takes a second here where a real Qwen3-32B takes minutes. It joins the router through the router's own
add_worker, which is what vllm-router's Kubernetes discovery does when an engine pod turns Ready (in
the pod the router discovers engines; it cannot be given a static engine that is not up yet, since it
waits at start-up for every static engine to be healthy). No scaler runs here: the test starts the
engine itself, in the place of KEDA.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from qwen_devtools.net import LOOPBACK, free_port, http_get, metric_sum
from qwen_devtools.procs import Proc, spawn, temp_log_dir, wait_ready
from qwen_devtools.realparts.engine import SERVED_MODEL, at_zero, cpu_qwendeployment
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway
from qwen_devtools.realparts.sim import H100_32B, sim_argv
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
AUTH = {"Authorization": f"Bearer {KEYS['team-a']}"}
HTTP = requests.Session()
HTTP.trust_env = False  # never a proxy: everything is on 127.0.0.1


def _body(hold_seconds: int = 60, max_held: int = 16) -> dict[str, Any]:
    """A deployment that scales to zero, one gateway pod, generous rate limits."""
    body = cpu_qwendeployment(
        gateway={
            "apiKeysSecret": "chat-api-keys",
            "replicas": 1,
            "rateLimit": {"requestsPerMinute": 6000, "burst": 200},
            "requestTimeoutSeconds": 60,
        }
    )
    return at_zero(body, hold_seconds, max_held, max_replicas=2)


@dataclass
class Engine:
    """An engine that starts later, on a port chosen now."""

    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, stack: GatewayStack) -> None:
        argv = sim_argv(self.port, kv_blocks=4096, max_num_seqs=8, max_model_len=1024, timings=H100_32B)
        self.proc = spawn(f"sim-{self.port}", argv, temp_log_dir(), env={"POD_IP": LOOPBACK}, port=self.port)
        wait_ready(self.proc, "/health", 30)
        stack.add_worker(self.url)  # what discovery does once the engine pod is Ready

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.stop()


def _stack(**body: Any) -> Any:
    return start_gateway(review(_body(**body)), [], api_keys=KEYS)


def _chat(content: str, stream: bool = False, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _post(
    stack: GatewayStack, body: dict[str, Any], timeout: float = 90, key: str = "team-a", **headers: str
) -> requests.Response:
    headers["Authorization"] = f"Bearer {KEYS[key]}"
    return HTTP.post(
        f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=timeout, stream=body["stream"]
    )


def _held(stack: GatewayStack) -> int:
    status, text = http_get(f"{stack.activator_url}/scale")
    assert status == 200, text
    return int(json.loads(text)["held"])


def _wait_held(stack: GatewayStack, n: int) -> None:
    wait_until(lambda: _held(stack) == n, 20, f"{n} held requests")


def _metric(stack: GatewayStack, name: str, **labels: str) -> float:
    return metric_sum(f"{stack.activator_url}/metrics", name, **labels)


@dataclass
class StreamReader:
    """Reads a streamed response's lines in a thread, each with when it arrived."""

    response: requests.Response
    lines: list[tuple[float, str]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines(decode_unicode=True):
                if line:
                    self.lines.append((time.monotonic(), line))
        finally:
            self.done.set()

    def comments(self) -> list[str]:
        return [line for _, line in self.lines if line.startswith(":")]

    def data(self) -> list[str]:
        return [line for _, line in self.lines if line.startswith("data:")]


def test_a_held_request_is_answered_once_an_engine_is_ready(engine: Engine) -> None:
    with _stack() as stack, ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        answer = pool.submit(_post, stack, _chat("Hello, is anyone there?"))
        _wait_held(stack, 1)
        time.sleep(2)  # held, not answered: no engine
        assert not answer.done()
        engine.start(stack)
        response = answer.result(30)
        waited = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
        assert _held(stack) == 0
        assert _metric(stack, "qwen_gateway_holds_total") == 1
        assert _metric(stack, "qwen_gateway_hold_wait_seconds_count", outcome="forwarded") == 1
        # Engines serving: requests go straight to them; the activator sees none.
        again = _post(stack, _chat("And again?"))
        assert again.status_code == 200, again.text
        assert _metric(stack, "qwen_gateway_holds_total") == 1
        print(f"held request answered after {waited:.1f} s (engine started at >= 2 s)")


def test_eight_held_requests_are_all_answered_in_arrival_order(engine: Engine) -> None:
    with _stack() as stack, ThreadPoolExecutor(8) as pool:
        answers: list[Future[requests.Response]] = []
        for i in range(8):  # one at a time, so the arrival order is known
            answers.append(pool.submit(_post, stack, _chat(f"Request number {i} of eight, please")))
            _wait_held(stack, i + 1)
        engine.start(stack)
        responses = [a.result(60) for a in answers]
        assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]
        sent_ids = [r.headers["X-Request-Id"] for r in responses]
        log = stack.procs["activator"].log.read_text()
        released = re.findall(r"released (\S+) after", log)
        assert released == sent_ids  # forwarded to the router oldest first
        assert _metric(stack, "qwen_gateway_holds_total") == 8


def test_a_held_stream_gets_keepalive_comments_then_its_tokens(engine: Engine) -> None:
    with _stack() as stack:
        response = _post(stack, _chat("Tell me a story", stream=True, max_tokens=10))
        # The 200 and the event stream start at once, while no engine is ready.
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        reader = StreamReader(response)
        wait_until(lambda: len(reader.comments()) >= 2, 15, "two keep-alive comments")
        assert not reader.data()
        engine.start(stack)
        assert reader.done.wait(30)
        data = reader.data()
        assert data[-1] == "data: [DONE]"
        chunks = [json.loads(d.removeprefix("data: ")) for d in data[:-1]]
        assert all("error" not in c for c in chunks), chunks
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text
        first_data = next(t for t, line in reader.lines if line.startswith("data:"))
        assert all(t < first_data for t, line in reader.lines if line.startswith(":"))


def test_without_an_engine_requests_end_at_the_bounds() -> None:
    """Hold bound 5 s and 2 held requests at most; no engine ever starts."""
    with _stack(hold_seconds=5, max_held=2) as stack, ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        plain = pool.submit(_post, stack, _chat("Anyone?"))
        _wait_held(stack, 1)
        stream = StreamReader(_post(stack, _chat("Anyone streaming?", stream=True)))
        _wait_held(stack, 2)
        # Beyond maxHeld: 503 at once.
        t0 = time.monotonic()
        over = _post(stack, _chat("One too many"))
        assert time.monotonic() - t0 < 2
        assert over.status_code == 503 and over.headers["Retry-After"] == "10"
        assert over.json()["error"]["code"] == "overloaded"
        # Listing the models is not held (and wakes nothing): nginx answers it.
        t0 = time.monotonic()
        models = HTTP.get(f"{stack.url}/v1/models", headers=AUTH, timeout=10)
        assert time.monotonic() - t0 < 2
        assert models.status_code == 200, models.text
        assert models.headers["Content-Type"].startswith("application/json")
        assert [m["id"] for m in models.json()["data"]] == [SERVED_MODEL]
        assert _held(stack) == 2
        # At the bound: the JSON 503 with Retry-After ...
        response = plain.result(30)
        waited = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "10"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "no_engine_available"
        assert 5 <= waited < 10
        # ... and for the stream, an error event, then the stream closes.
        assert stream.done.wait(15)
        events = stream.data()
        assert json.loads(events[0].removeprefix("data: "))["error"]["code"] == "no_engine_available"
        assert events[-1] == "data: [DONE]"
        assert stream.comments()  # it was kept alive meanwhile
        assert _held(stack) == 0
        assert _metric(stack, "qwen_gateway_hold_timeouts_total") == 2
        assert _metric(stack, "qwen_gateway_hold_rejected_total") == 1
        assert _metric(stack, "qwen_gateway_hold_wait_seconds_count", outcome="timeout") == 2


def test_one_key_cannot_take_every_held_place() -> None:
    """maxHeld 2, both taken by team-a: team-b's request is held in the place of team-a's newest. nginx
    tells the activator the key; a client's own copy of that header counts for nothing."""
    with _stack(hold_seconds=8, max_held=2) as stack, ThreadPoolExecutor(3) as pool:
        oldest = pool.submit(_post, stack, _chat("First of team-a"))
        _wait_held(stack, 1)
        newest = pool.submit(_post, stack, _chat("Second of team-a"))
        _wait_held(stack, 2)
        forged = _post(stack, _chat("Third, as team-b"), timeout=5, **{"X-Qwen-Hold-Key-Id": "team-b"})
        assert forged.status_code == 503 and forged.json()["error"]["code"] == "overloaded", forged.text
        other = pool.submit(_post, stack, _chat("First of team-b"), key="team-b")
        evicted = newest.result(5)
        assert evicted.status_code == 503 and evicted.headers["Retry-After"] == "10", evicted.text
        assert evicted.json()["error"]["code"] == "overloaded"
        assert _held(stack) == 2 and not oldest.done() and not other.done()
        # No engine: both end at the hold bound.
        assert [r.result(15).json()["error"]["code"] for r in (oldest, other)] == ["no_engine_available"] * 2
        assert _metric(stack, "qwen_gateway_hold_wait_seconds_count", outcome="evicted") == 1


def test_a_client_that_gives_up_leaves_no_held_request_behind() -> None:
    with _stack() as stack:
        with pytest.raises(requests.ReadTimeout):
            _post(stack, _chat("I will not wait long"), timeout=2)
        # nginx closes its connection to the activator, which drops the request.
        _wait_held(stack, 0)
        assert _metric(stack, "qwen_gateway_hold_wait_seconds_count", outcome="cancelled") == 1
        assert _metric(stack, "qwen_gateway_hold_timeouts_total") == 0


def test_a_stopping_activator_finishes_what_it_holds(engine: Engine) -> None:
    """SIGTERM reaches every container of a pod at once: held requests are still answered."""
    with _stack() as stack, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, stack, _chat("Are you shutting down?"))
        _wait_held(stack, 1)
        activator = stack.procs["activator"]
        activator.popen.terminate()
        time.sleep(1)
        assert activator.alive()
        engine.start(stack)
        response = answer.result(30)
        assert response.status_code == 200, response.text
        assert activator.popen.wait(10) == 0


def test_a_held_request_the_engine_refuses_gets_the_engines_own_error(engine: Engine) -> None:
    """max_tokens over the context: the engine's 400 passes unchanged; a held stream, already answered
    200, gets the engine's error as an event (the simulator streams it so; vLLM answers 400, which the
    activator turns into the same event)."""
    with _stack() as stack, ThreadPoolExecutor(1) as pool:
        plain = pool.submit(_post, stack, _chat("Too long", max_tokens=5000))
        _wait_held(stack, 1)
        stream = StreamReader(_post(stack, _chat("Too long, streamed", stream=True, max_tokens=5000)))
        _wait_held(stack, 2)
        engine.start(stack)
        response = plain.result(30)
        assert response.status_code == 400, response.text
        assert "maximum context length" in response.json()["error"]["message"]
        assert stream.done.wait(30)
        events = stream.data()
        assert "maximum context length" in json.loads(events[0].removeprefix("data: "))["error"]["message"]
        assert events[-1] == "data: [DONE]"


def test_without_its_activator_the_gateway_still_answers_json() -> None:
    """The activator container restarting: a request that would be held gets a JSON 503, not nginx's
    HTML 502."""
    with _stack() as stack:
        stack.procs["activator"].stop()
        response = _post(stack, _chat("Anyone there?"), timeout=30)
        assert response.status_code == 503, response.text
        assert response.headers["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "no_engine_available"
        assert response.headers["Retry-After"] == "1"
