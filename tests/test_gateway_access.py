"""API keys limited to some models (spec.gateway.modelAccess), through the real gateway: nginx with its njs
module, vllm-router and the exporters exactly as rendered, in front of an llm-d-inference-sim replica
that serves the base model and two LoRA adapters by name (simulated: the adapters change nothing there;
tests/test_engine_live.py and the e2e LoRA test use real adapters on vLLM). What is under test is
the gateway's decision, so a simulated engine is enough: every allowed request must reach it and be
answered 200, every denied one must get the gateway's 403 and never reach it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from qwen_devtools.net import free_ports, metric_sum
from qwen_devtools.procs import Proc, spawn, temp_log_dir, wait_ready
from qwen_devtools.realparts.engine import SERVED_MODEL, cpu_qwendeployment
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway_stack
from qwen_devtools.realparts.sim import H100_32B, sim_argv
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import Review, review
from qwen_operator.gateway.access import access_groups

KEYS = {
    "sql-team": "sk-sql-0123456789abcdef",  # lora-sql only
    "base-team": "sk-base-0123456789abcdef",  # the base model and lora-chat
    "admin": "sk-admin-0123456789abcdef",  # in no rule: every model
}
ADAPTERS = ("lora-sql", "lora-chat")
HTTP = requests.Session()
HTTP.trust_env = False  # everything is on 127.0.0.1
COUNT = "qwen_gateway_http_response_count_total"


def _deployment() -> dict[str, Any]:
    body = cpu_qwendeployment(
        gateway={
            "replicas": 1,
            "apiKeysSecret": "chat-api-keys",
            "rateLimit": {"requestsPerMinute": 6000, "burst": 200},
            "modelAccess": [
                {"apiKeys": ["sql-team"], "models": ["lora-sql"]},
                {"apiKeys": ["base-team"], "models": [SERVED_MODEL]},
                {"apiKeys": ["base-team"], "models": ["lora-chat"]},
            ],
        }
    )
    revision = "0123456789abcdef0123456789abcdef01234567"
    body["spec"]["lora"] = {
        "maxLoras": 2,
        "adapters": [
            {"name": name, "source": {"huggingFace": {"repo": f"my-org/{name}", "revision": revision}}}
            for name in ADAPTERS
        ],
    }
    return body


@dataclass
class Stack:
    review: Review
    engine: Proc
    gateway: GatewayStack

    def send(self, key: str, body: str | dict[str, Any], route: str = "/v1/completions") -> requests.Response:
        data = body if isinstance(body, str) else json.dumps(body)
        headers = {"Authorization": f"Bearer {KEYS[key]}", "Content-Type": "application/json"}
        return HTTP.post(f"{self.gateway.url}{route}", data=data, headers=headers, timeout=30)

    def engine_requests(self) -> float:
        return metric_sum(f"{self.engine.url}/metrics", "vllm:request_success_total")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    rev = review(_deployment())
    assert rev.plan.fits, rev.plan.errors
    (port,) = free_ports(1)
    modules = [json.dumps({"name": name}) for name in ADAPTERS]
    argv = [*sim_argv(port, 1000, 16, 1024, H100_32B), "--max-loras", "2", "--lora-modules", *modules]
    engine = spawn("sim", argv, temp_log_dir(), env={"POD_IP": "127.0.0.1"}, port=port)
    gateway = None
    try:
        wait_ready(engine, "/health", 30)
        gateway = start_gateway_stack(rev, [engine.url], KEYS)
        yield Stack(rev, engine, gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


def _completion(model: str | None) -> dict[str, Any]:
    return {"prompt": "Hello there", "max_tokens": 2} | ({"model": model} if model else {})


def test_rules_group_keys_by_the_models_they_may_use() -> None:
    groups = access_groups(review(_deployment()).resource.spec)
    assert [(g.keys, g.models, g.base_allowed) for g in groups] == [
        (("sql-team",), ("lora-sql",), False),
        (("base-team",), (SERVED_MODEL, "lora-chat"), True),
    ]


# (key, model asked for, allowed): a key in no rule may use every model; a request naming no model gets
# the base model.
CASES = [
    ("sql-team", "lora-sql", True),
    ("sql-team", "lora-chat", False),
    ("sql-team", SERVED_MODEL, False),
    ("sql-team", None, False),
    ("sql-team", "LORA-SQL", False),  # names are case-sensitive (nginx's plain map strings are not)
    ("base-team", SERVED_MODEL, True),
    ("base-team", "lora-chat", True),
    ("base-team", "lora-sql", False),
    ("admin", "lora-sql", True),
    ("admin", "lora-chat", True),
    ("admin", SERVED_MODEL, True),
]


@pytest.mark.parametrize(("key", "model", "allowed"), CASES)
def test_a_limited_key_gets_403_for_other_models_and_the_others_reach_the_engine(
    stack: Stack, key: str, model: str | None, allowed: bool
) -> None:
    before = stack.engine_requests()
    answer = stack.send(key, _completion(model))
    if allowed:
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == (model or SERVED_MODEL)
        wait_until(lambda: stack.engine_requests() == before + 1, 5, "the engine to count the request")
        return
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_not_allowed" and error["param"] == "model", error
    may_use = next(g.models for g in access_groups(stack.review.resource.spec) if key in g.keys)
    assert error["message"].endswith(f"it may use: {', '.join(may_use)}."), error
    assert answer.headers["Content-Type"] == "application/json"
    assert stack.engine_requests() == before, "a denied request reached the engine"


# Bodies whose model a pattern match would misread: the engine's JSON parser reads the last of repeated
# keys and decodes escapes, and a nested "model" is not the request's.
TRICKS = {
    "repeated key": '{"model": "lora-sql", "prompt": "Hello", "max_tokens": 2, "model": "lora-chat"}',
    "escaped key": '{"model": "lora-sql", "prompt": "Hello", "max_tokens": 2, "mod\\u0065l": "lora-chat"}',
    "nested model only": '{"prompt": "Hello", "max_tokens": 2, "stream_options": {"model": "lora-sql"}}',
    "NaN (Python reads it, JSON does not)": '{"model": "lora-sql", "prompt": "x", "max_tokens": 2, "t": NaN}',
    "not an object": '["lora-sql"]',
    "a model that is not a string": '{"model": ["lora-sql"], "prompt": "Hello", "max_tokens": 2}',
}


@pytest.mark.parametrize("body", TRICKS.values(), ids=TRICKS.keys())
def test_a_limited_key_cannot_reach_another_model_by_shaping_the_body(stack: Stack, body: str) -> None:
    before = stack.engine_requests()
    answer = stack.send("sql-team", body)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "model_not_allowed"
    assert stack.engine_requests() == before


def test_a_limited_keys_body_above_the_buffer_is_refused_not_guessed(stack: Stack) -> None:
    """Above client_body_buffer_size (1 MiB) nginx writes the body to a file, which njs does not read: a
    limited key's request then gets 403 (an unlimited key's passes), never a guess from a pattern."""
    prompt = "word " * 300_000  # 1.5 MB
    for model in ("lora-sql", "lora-chat"):
        answer = stack.send("sql-team", {"model": model, "prompt": prompt, "max_tokens": 2})
        assert answer.status_code == 403, answer.text
        assert "at most 1 MiB" in answer.json()["error"]["message"]
    # The engine's own refusal of a prompt longer than its context: the request reached it.
    unlimited = stack.send("admin", {"model": "lora-chat", "prompt": prompt, "max_tokens": 2})
    assert unlimited.status_code == 400 and "context length" in unlimited.text, unlimited.text


@pytest.mark.parametrize(
    ("key", "listed"),
    [
        ("sql-team", {"lora-sql"}),
        ("base-team", {SERVED_MODEL, "lora-chat"}),
        ("admin", {SERVED_MODEL, *ADAPTERS}),
    ],
)
def test_models_lists_what_the_key_may_use(stack: Stack, key: str, listed: set[str]) -> None:
    answer = HTTP.get(f"{stack.gateway.url}/v1/models", headers={"Authorization": f"Bearer {KEYS[key]}"})
    assert answer.status_code == 200, answer.text
    cards = answer.json()["data"]
    assert {card["id"] for card in cards} == listed
    # the engine's own cards, unchanged but for the ones left out
    assert all(card["object"] == "model" and "max_model_len" in card for card in cards), cards


def test_chats_are_checked_like_completions(stack: Stack) -> None:
    chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}
    assert stack.send("sql-team", chat | {"model": "lora-sql"}, "/v1/chat/completions").status_code == 200
    assert stack.send("sql-team", chat | {"model": "lora-chat"}, "/v1/chat/completions").status_code == 403


def _settled(url: str) -> None:
    """Waits until the log exporter has counted every request so far (nginx flushes the log each second)."""

    def still() -> bool:
        now = metric_sum(url, COUNT)
        time.sleep(1.5)
        return metric_sum(url, COUNT) == now

    wait_until(still, 20, "the access log to be counted")


def test_metrics_count_requests_per_model_and_denials(stack: Stack) -> None:
    url = stack.gateway.log_metrics_url
    _settled(url)
    before = {m: metric_sum(url, COUNT, model=m) for m in ("lora-sql", "other")}
    denied = metric_sum(url, COUNT, key_id="sql-team", error="model_not_allowed")
    assert stack.send("sql-team", _completion("lora-sql")).status_code == 200
    assert stack.send("admin", _completion("no-such-model")).status_code == 404  # the engine's
    assert stack.send("sql-team", _completion("lora-chat")).status_code == 403
    wait_until(lambda: metric_sum(url, COUNT, model="lora-sql") == before["lora-sql"] + 1, 10, "model label")
    # A made-up name is labeled `other`, never a series of its own.
    assert metric_sum(url, COUNT, model="other") == before["other"] + 1
    assert metric_sum(url, COUNT, model="no-such-model") == 0
    assert metric_sum(url, COUNT, key_id="sql-team", error="model_not_allowed") == denied + 1
