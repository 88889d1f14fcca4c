"""The gateway's OpenAI Responses and Anthropic Messages routes, what the gateway decides itself, with the
real `openai` and `anthropic` SDKs as clients: nginx (its njs modules), vllm-router and the activator
exactly as rendered, in front of no engine at all (a deployment at zero that never wakes: every admitted
request is held, then answered at the bound). What needs an engine's answer (a served message, a
response, streams, tool calls, the engine's own errors) runs against a real vLLM engine through the same
gateway in test_engine_live.py.

Each SDK must raise its own exception class from the gateway's errors, so each error is checked by the
SDK's class and the body its users read: keys sent as Anthropic's x-api-key or as a Bearer token, a
model the key may not use, the per-key rate limit, a request held until the bound (plain and streamed),
and the Responses API's stored responses, which the gateway refuses by name.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest
import requests

from qwen_devtools.net import http_get, metric_sum
from qwen_devtools.procs import spawn, wait_ready
from qwen_devtools.realparts.engine import SERVED_MODEL, at_zero, cpu_qwendeployment
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway
from qwen_devtools.realparts.nginx import nginx_bin
from qwen_operator import recording
from qwen_operator.api.review import review
from qwen_operator.gateway import errors

KEYS = {
    "team-a": "sk-team-a-0123456789abcdef",
    "team-b": "sk-team-b-0123456789abcdef",
    "burst": "sk-burst-0123456789abcdef",
    "sql-team": "sk-sql-0123456789abcdef",  # lora-sql only
}
HOLD_SECONDS = 5
BURST = 3
HTTP = requests.Session()
HTTP.trust_env = False  # everything is on 127.0.0.1
COUNT = "qwen_gateway_http_response_count_total"


def _deployment() -> dict[str, Any]:
    body = cpu_qwendeployment(
        gateway={
            "replicas": 1,
            "apiKeysSecret": "chat-api-keys",
            # per minute, so the burst is what a test spends: each test its own key
            "rateLimit": {"requestsPerMinute": 60, "burst": BURST},
            "modelAccess": [{"apiKeys": ["sql-team"], "models": ["lora-sql"]}],
        }
    )
    revision = "0123456789abcdef0123456789abcdef01234567"
    body["spec"]["lora"] = {
        "maxLoras": 1,
        "adapters": [
            {"name": "lora-sql", "source": {"huggingFace": {"repo": "my-org/lora-sql", "revision": revision}}}
        ],
    }
    return at_zero(body, HOLD_SECONDS, max_held=8, max_replicas=1)


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with start_gateway(review(_deployment()), [], api_keys=KEYS) as gateway:
        yield gateway


def _anthropic(stack: GatewayStack, key: str = "team-a", **kwargs: Any) -> anthropic.Anthropic:
    # no retries: each answer of the gateway is what is under test
    return anthropic.Anthropic(
        api_key=KEYS.get(key, key), base_url=stack.url, max_retries=0, timeout=30, **kwargs
    )


def _openai(stack: GatewayStack, key: str = "team-a") -> openai.OpenAI:
    return openai.OpenAI(api_key=KEYS.get(key, key), base_url=f"{stack.url}/v1", max_retries=0, timeout=30)


def _message(client: anthropic.Anthropic, model: str = SERVED_MODEL, **kwargs: Any) -> Any:
    return client.messages.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "Hello there"}], **kwargs
    )


def _held(stack: GatewayStack) -> int:
    status, text = http_get(f"{stack.activator_url}/scale")
    assert status == 200, text
    return int(json.loads(text)["held"])


def test_anthropic_clients_authenticate_with_x_api_key_and_read_anthropic_errors(stack: GatewayStack) -> None:
    """A key as Anthropic's x-api-key header (what Anthropic's API reference and many clients send) or as
    Authorization: Bearer (what the anthropic SDK 2.17 sends for api_key): a wrong one is the SDK's
    AuthenticationError, in Anthropic's error shape; a limited key's model it may not use is its
    PermissionDeniedError."""
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        _message(_anthropic(stack, "sk-not-a-key-0123456789"))
    assert wrong.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": errors.INVALID_API_KEY.message},
    }
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        _message(_anthropic(stack, "sql-team"))
    assert denied.value.body["error"]["type"] == "permission_error"
    assert "lora-sql" in denied.value.body["error"]["message"]
    with pytest.raises(anthropic.PermissionDeniedError):
        _anthropic(stack, "sql-team").messages.count_tokens(
            model=SERVED_MODEL, messages=[{"role": "user", "content": "Hello"}]
        )
    # x-api-key alone: the limited key is known (its 403), a wrong one is not (401), in Anthropic's shape.
    message = {"model": SERVED_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}

    def with_x_api_key(key: str, route: str = "/v1/messages") -> requests.Response:
        return HTTP.post(f"{stack.url}{route}", json=message, headers={"x-api-key": key}, timeout=10)

    known = with_x_api_key(KEYS["sql-team"])
    assert known.status_code == 403 and known.json()["error"]["type"] == "permission_error", known.text
    unknown = with_x_api_key("sk-not-a-key-0123456789")
    assert unknown.status_code == 401 and unknown.json() == errors.INVALID_API_KEY.payload("anthropic")
    # The OpenAI routes keep OpenAI's shape, whichever header carries the key.
    answer = with_x_api_key("sk-not-a-key-0123456789", "/v1/responses")
    assert answer.status_code == 401 and answer.json() == errors.INVALID_API_KEY.payload()


def test_a_held_message_ends_at_the_bound_as_the_sdks_overloaded_error(stack: GatewayStack) -> None:
    """No engine ever wakes: an admitted message (plain, streamed) and a response are held, then answered
    in their API's shape; the Anthropic stream ends with Anthropic's error event."""
    client = _anthropic(stack, "team-b")
    with ThreadPoolExecutor(3) as pool:
        started = time.monotonic()
        plain = pool.submit(_message, client)
        streamed = pool.submit(lambda: list(_message(client, stream=True)))
        response = pool.submit(
            lambda: _openai(stack, "team-b").responses.create(model=SERVED_MODEL, input="Hi")
        )
        deadline = time.monotonic() + 10
        while _held(stack) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _held(stack) == 3  # all three routes wait for an engine
        with pytest.raises(anthropic.InternalServerError) as error:
            plain.result(30)
        assert HOLD_SECONDS <= time.monotonic() - started < HOLD_SECONDS + 5
        assert error.value.status_code == 503 and error.value.body["error"]["type"] == "overloaded_error"
        assert error.value.response.headers["Retry-After"]
        # The stream was answered 200 at once and ends with Anthropic's `error` event, which the SDK raises.
        with pytest.raises(anthropic.APIStatusError) as stream_error:
            streamed.result(30)
        assert stream_error.value.body["error"]["type"] == "overloaded_error"
        with pytest.raises(openai.InternalServerError) as openai_error:
            response.result(30)
        assert openai_error.value.code == "no_engine_available"


def test_the_rate_limit_is_the_sdks_rate_limit_error(stack: GatewayStack) -> None:
    """Past the key's burst, nginx's 429 (before anything is held) in Anthropic's shape, Retry-After set;
    the requests within it are admitted (held to the bound)."""
    client = _anthropic(stack, "burst")

    def count() -> Exception:
        try:
            client.messages.count_tokens(model=SERVED_MODEL, messages=[{"role": "user", "content": "x"}])
        except anthropic.APIStatusError as error:
            return error
        raise AssertionError("answered 200 with no engine")

    with ThreadPoolExecutor(BURST + 3) as pool:
        outcomes = list(pool.map(lambda _: count(), range(BURST + 3)))
    limited = [e for e in outcomes if isinstance(e, anthropic.RateLimitError)]
    held = [e for e in outcomes if isinstance(e, anthropic.InternalServerError)]
    assert len(limited) >= 2 and len(held) >= BURST, outcomes
    assert limited[0].body["error"]["type"] == "rate_limit_error"
    assert int(limited[0].response.headers["Retry-After"]) >= 1


def test_stored_responses_are_refused_by_name(stack: GatewayStack) -> None:
    """Nothing is stored, so what needs a stored response is the SDK's BadRequestError naming the field,
    or its NotFoundError: answered at once by the gateway, never held for an engine."""
    client = _openai(stack)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as previous:
        client.responses.create(model=SERVED_MODEL, input="And then?", previous_response_id="resp_0123")
    assert (
        previous.value.code == "stored_responses_disabled" and previous.value.param == "previous_response_id"
    )
    with pytest.raises(openai.BadRequestError) as background:
        client.responses.create(model=SERVED_MODEL, input="Later", background=True)
    assert background.value.param == "background"
    with pytest.raises(openai.NotFoundError) as retrieve:
        client.responses.retrieve("resp_0123")
    assert retrieve.value.code == "stored_responses_disabled"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_0123")
    with pytest.raises(openai.AuthenticationError):
        _openai(stack, "sk-not-a-key-0123456789").responses.retrieve("resp_0123")
    assert time.monotonic() - started < HOLD_SECONDS  # none was held
    # previous_response_id: null, background: false need nothing stored: held like any request.
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=SERVED_MODEL, input="Hi", background=False, previous_response_id=None)


def test_every_route_has_its_label_and_the_admitted_ones_count_as_traffic(stack: GatewayStack) -> None:
    """The per-key metrics by route; the wake trigger's routes are every route that needs an engine."""
    assert set(recording.TRAFFIC_ROUTES) == {
        "/v1/chat/completions", "/v1/completions", "/v1/responses",
        "/v1/messages", "/v1/messages/count_tokens",
    }  # fmt: skip
    url = stack.log_metrics_url

    def count(route: str) -> float:
        return metric_sum(url, COUNT, route=route)

    deadline = time.monotonic() + 15  # the access log is flushed within a second, then tailed
    while time.monotonic() < deadline and not all(count(r) for r in ("/v1/messages", "/v1/responses")):
        time.sleep(0.5)
    assert count("/v1/messages") >= 2 and count("/v1/responses") >= 2
    assert count("/v1/messages/count_tokens") >= 1
    assert metric_sum(url, COUNT, route="/v1/messages", error="unauthorized") >= 1
    assert metric_sum(url, COUNT, route="/v1/messages", error="model_not_allowed") >= 1


def test_an_nginx_killed_without_cleaning_up_starts_again_over_its_sockets(stack: GatewayStack) -> None:
    """A container restart keeps the pod's state directory, and a killed nginx leaves its Unix sockets
    there: run-nginx.sh must clear the refusals server's, or the new nginx cannot bind it and never
    starts. Last in the module: it replaces the module's nginx."""
    old = stack.procs["nginx"]
    os.killpg(old.pid, signal.SIGKILL)  # no exit handler runs: the sockets stay
    old.popen.wait(10)
    sockets = sorted(p.name for p in (stack.root / "state").glob("*.sock"))
    assert "refusals.sock" in sockets, sockets
    w = stack.wiring
    path = f"{nginx_bin().parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    again = spawn(
        "nginx-again", ["/bin/sh", f"{w.config_dir}/run-nginx.sh"], stack.root / "logs", env={"PATH": path},
        port=w.status_port,
    )  # fmt: skip
    stack.procs["nginx"] = again  # stopped with the stack
    wait_ready(again, "/ready", 30)
    # The refusals server answers again: a stored response's refusal goes through its socket.
    with pytest.raises(openai.BadRequestError):
        _openai(stack).responses.create(model=SERVED_MODEL, input="And?", previous_response_id="resp_1")
