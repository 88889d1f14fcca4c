"""Tiers behind one gateway (spec.gateway.tiers, aliases), through the real gateway: nginx with its njs
module, one vllm-router per engine set, exactly as rendered, in front of llm-d-inference-sim replicas
(simulated engines: one serving the base model, one per tier under the tier's model name; what is under
test is which engine set a request reaches, which each engine's own request counter tells).

Tiers: qwen3-4b (spills to the base model when saturated), qwen3-8b (no spill-over, a per-key limit),
qwen3-14b, whose deployment has no engine (missing, or not ready), and qwen3-1.7b, which has no engine
either and spills to qwen3-8b (so each of its requests spills). The alias `auto` sends short
prompts without tools to qwen3-4b, requests with the header X-Tier: medium to qwen3-8b, the rest to
the base model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
from qwen_operator.api.review import review

KEYS = {
    "small-team": "sk-small-0123456789abcdef",  # qwen3-4b and auto only
    "admin": "sk-admin-0123456789abcdef",  # in no rule: every model
    "limits": "sk-limits-0123456789abcdef",  # every model; used by the per-key limit test only
    "small-and-base": "sk-small-and-base-0123456789",  # qwen3-4b and the base model (its spill target)
    "overflow-team": "sk-overflow-team-0123456789",  # qwen3-1.7b only, not its spill target
    "spiller": "sk-spiller-0123456789abcdef",  # qwen3-1.7b and qwen3-8b; the spilled-limit test only
}
SMALL, MEDIUM, MISSING, OVERFLOW = "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-1.7b"
#: The engine sets, by the model name each serves.
ENGINES = (SERVED_MODEL, SMALL, MEDIUM)
HTTP = requests.Session()
HTTP.trust_env = False  # everything is on 127.0.0.1
SHORT_PROMPT = "Hello there"
LONG_PROMPT = "word " * 200  # 1000 bytes: above the alias rule's 400


def _deployment() -> dict[str, Any]:
    one_at_a_time = {"maxConcurrentRequests": 1, "queueSize": 0}
    return cpu_qwendeployment(
        gateway={
            "replicas": 1,
            "apiKeysSecret": "chat-api-keys",
            "rateLimit": {"requestsPerMinute": 6000, "burst": 200},
            "tiers": [
                {"name": SMALL, "deploymentRef": {"name": "small"}, "spillTo": SERVED_MODEL, **one_at_a_time},
                {
                    "name": MEDIUM,
                    "deploymentRef": {"name": "medium"},
                    "rateLimit": {"requestsPerMinute": 60, "burst": 3},
                    **one_at_a_time,
                },
                {"name": MISSING, "deploymentRef": {"name": "gone"}},
                {"name": OVERFLOW, "deploymentRef": {"name": "tiny"}, "spillTo": MEDIUM},
            ],
            "aliases": [
                {
                    "name": "auto",
                    "rules": [
                        {"model": SMALL, "maxPromptBytes": 400, "tools": False},
                        {"model": MEDIUM, "header": {"name": "X-Tier", "value": "medium"}},
                    ],
                    "default": SERVED_MODEL,
                }
            ],
            "modelAccess": [
                {"apiKeys": ["small-team"], "models": [SMALL, "auto"]},
                {"apiKeys": ["small-and-base"], "models": [SMALL, SERVED_MODEL]},
                {"apiKeys": ["overflow-team"], "models": [OVERFLOW]},
                {"apiKeys": ["spiller"], "models": [OVERFLOW, MEDIUM]},
            ],
        }
    )


@dataclass
class Stack:
    engines: dict[str, Proc]
    gateway: GatewayStack

    def send(
        self,
        key: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        route: str = "/v1/completions",
    ) -> requests.Response:
        sent = {"Authorization": f"Bearer {KEYS[key]}", "Content-Type": "application/json", **(headers or {})}
        return HTTP.post(f"{self.gateway.url}{route}", data=json.dumps(body), headers=sent, timeout=30)

    def counts(self) -> dict[str, float]:
        """Requests each engine set has answered, from its own metrics."""
        return {
            name: metric_sum(f"{proc.url}/metrics", "vllm:request_success_total")
            for name, proc in self.engines.items()
        }

    def expect_one_more(self, before: dict[str, float], engine: str) -> None:
        want = {name: count + (1 if name == engine else 0) for name, count in before.items()}
        wait_until(lambda: self.counts() == want, 5, f"exactly one more request on {engine}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    rev = review(_deployment())
    assert rev.plan.fits, rev.plan.errors
    logs = temp_log_dir()
    engines: dict[str, Proc] = {}
    gateway = None
    try:
        for name, port in zip(ENGINES, free_ports(len(ENGINES)), strict=True):
            argv = sim_argv(port, 1000, 16, 1024, H100_32B)
            argv[argv.index("--model") + 1] = name
            engines[name] = spawn(f"sim-{port}", argv, logs, env={"POD_IP": "127.0.0.1"}, port=port)
        for proc in engines.values():
            wait_ready(proc, "/health", 30)
        gateway = start_gateway_stack(
            rev,
            [engines[SERVED_MODEL].url],
            KEYS,
            tier_worker_urls=[[engines[SMALL].url], [engines[MEDIUM].url], [], []],
        )
        yield Stack(engines, gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        for proc in engines.values():
            proc.stop()


def _completion(model: str | None, prompt: str = SHORT_PROMPT, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": 2, **extra} | ({"model": model} if model else {})


@pytest.mark.parametrize("model", ENGINES)
def test_each_model_name_reaches_its_own_engine_set(stack: Stack, model: str) -> None:
    before = stack.counts()
    answer = stack.send("admin", _completion(model))
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == model
    stack.expect_one_more(before, model)


# (what the request carries, the engine set the alias `auto` picks)
ALIAS_CASES = {
    "short prompt": ({}, {}, SMALL),
    "long prompt": ({"prompt": LONG_PROMPT}, {}, SERVED_MODEL),
    "short prompt with tools": (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {},
        SERVED_MODEL,
    ),
    "long prompt, header X-Tier: medium": ({"prompt": LONG_PROMPT}, {"X-Tier": "medium"}, MEDIUM),
    "long prompt, another X-Tier": ({"prompt": LONG_PROMPT}, {"X-Tier": "large"}, SERVED_MODEL),
}


@pytest.mark.parametrize(("extra", "headers", "engine"), ALIAS_CASES.values(), ids=ALIAS_CASES.keys())
def test_the_alias_routes_as_its_rules_declare(
    stack: Stack, extra: dict[str, Any], headers: dict[str, str], engine: str
) -> None:
    before = stack.counts()
    answer = stack.send("admin", _completion("auto") | extra, headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == engine, "the model is rewritten to the one the alias picked"
    stack.expect_one_more(before, engine)


def _two_at_once(stack: Stack, model: str, key: str = "admin") -> list[requests.Response]:
    """Two slow requests at once: the tier's router admits one (maxConcurrentRequests 1, queueSize 0)."""
    body = _completion(model, max_tokens=40, ignore_eos=True)  # about 1 s on the simulated engine
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: stack.send(key, body), range(2)))


def test_a_saturated_tier_spills_to_its_spill_target_only_when_enabled(stack: Stack) -> None:
    before = stack.counts()
    answers = _two_at_once(stack, SMALL)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert sorted(a.json()["model"] for a in answers) == sorted([SMALL, SERVED_MODEL])
    after = stack.counts()
    assert after[SMALL] == before[SMALL] + 1 and after[SERVED_MODEL] == before[SERVED_MODEL] + 1, after

    # qwen3-8b has no spillTo: the second request gets the JSON 503, and the base model nothing.
    before = stack.counts()
    answers = _two_at_once(stack, MEDIUM)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 503], [a.text for a in answers]
    refused = next(a for a in answers if a.status_code == 503)
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "overloaded", refused.text
    after = stack.counts()
    assert after[MEDIUM] == before[MEDIUM] + 1 and after[SERVED_MODEL] == before[SERVED_MODEL], after


def test_a_key_that_may_not_use_the_spill_target_gets_the_saturated_tiers_own_refusal(stack: Stack) -> None:
    """small-team may use qwen3-4b, not the base model it spills to: the second request gets qwen3-4b's
    503 (its router's admission is full), as without spillTo, and the base model nothing."""
    before = stack.counts()
    answers = _two_at_once(stack, SMALL, "small-team")
    assert sorted(a.status_code for a in answers) == [200, 503], [a.text for a in answers]
    served = next(a for a in answers if a.status_code == 200)
    assert served.json()["model"] == SMALL, served.text
    refused = next(a for a in answers if a.status_code == 503)
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "overloaded", refused.text
    after = stack.counts()
    assert after[SMALL] == before[SMALL] + 1 and after[SERVED_MODEL] == before[SERVED_MODEL], after


def test_a_tier_without_engines_spills_only_for_keys_that_may_use_the_target(stack: Stack) -> None:
    """qwen3-1.7b has no engine: every request for it spills to qwen3-8b, but overflow-team's gets
    qwen3-1.7b's own 503, which names it, also when it sends the access group header of a key that may
    spill (m3, spiller's: nginx sets the header, never passes the client's)."""
    before = stack.counts()
    for forged in ({}, {"X-Qwen-Access-Group": "m3", "X-Qwen-Key-Id": "spiller"}):
        refused = stack.send("overflow-team", _completion(OVERFLOW), forged)
        assert refused.status_code == 503, (forged, refused.text)
        assert refused.json()["error"]["code"] == "no_engine_available", refused.text
        assert f"No engine replica of {OVERFLOW} is ready" in refused.json()["error"]["message"]
    assert stack.counts() == before, "a request spilled to a model its key may not use"
    for key in ("admin", "spiller"):
        answer = stack.send(key, _completion(OVERFLOW))
        assert answer.status_code == 200 and answer.json()["model"] == MEDIUM, (key, answer.text)
    wait_until(lambda: stack.counts()[MEDIUM] == before[MEDIUM] + 2, 5, "both on qwen3-8b")


def test_a_limited_key_allowed_the_spill_target_still_spills(stack: Stack) -> None:
    before = stack.counts()
    answers = _two_at_once(stack, SMALL, "small-and-base")
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert sorted(a.json()["model"] for a in answers) == sorted([SMALL, SERVED_MODEL])
    after = stack.counts()
    assert after[SMALL] == before[SMALL] + 1 and after[SERVED_MODEL] == before[SERVED_MODEL] + 1, after


def test_the_spill_targets_per_key_limit_counts_the_spilled_requests(stack: Stack) -> None:
    """qwen3-8b allows each key 60 per minute, burst 3 (4 at once): spiller spends that on qwen3-8b, then
    asks for qwen3-1.7b, which spills to qwen3-8b, whose 429 (naming qwen3-8b) it gets. Spent with
    direct requests, which are quicker than spilled ones: the limit takes back one a second."""
    spent: list[int] = []
    while len(spent) < 8 and (not spent or spent[-1] == 200):
        spent.append(stack.send("spiller", _completion(MEDIUM)).status_code)
    assert spent[-1] == 429 and spent.count(200) >= 3, spent
    before = stack.counts()
    limited = stack.send("spiller", _completion(OVERFLOW))
    assert limited.status_code == 429, limited.text
    assert limited.headers["Retry-After"] == "1", limited.headers
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert MEDIUM in limited.json()["error"]["message"], limited.text
    assert stack.counts() == before


def test_an_unsaturated_tier_does_not_spill(stack: Stack) -> None:
    before = stack.counts()
    for _ in range(3):
        answer = stack.send("admin", _completion(SMALL))
        assert answer.status_code == 200 and answer.json()["model"] == SMALL, answer.text
    after = stack.counts()
    assert after[SMALL] == before[SMALL] + 3 and after[SERVED_MODEL] == before[SERVED_MODEL], after


def test_a_tier_without_ready_engines_gets_a_json_error(stack: Stack) -> None:
    for model in (MISSING,):
        answer = stack.send("admin", _completion(model))
        assert answer.status_code == 503, answer.text
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.json()["error"]["code"] == "no_engine_available", answer.text
        assert f"No engine replica of {model} is ready" in answer.json()["error"]["message"]


def test_anthropic_messages_route_by_their_model_and_get_anthropic_errors(stack: Stack) -> None:
    """/v1/messages names its model where a completion does: a tier's request goes to that tier (whose
    refusals come in Anthropic's shape, the tier's name in the message), a limited key's other model is
    refused, and nothing of it reaches an engine."""
    message = {"max_tokens": 2, "messages": [{"role": "user", "content": SHORT_PROMPT}]}
    missing = stack.send("admin", {**message, "model": MISSING}, route="/v1/messages")
    assert missing.status_code == 503, missing.text
    error = missing.json()
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error", error
    assert f"No engine replica of {MISSING} is ready" in error["error"]["message"]
    before = stack.counts()
    denied = stack.send("small-team", {**message, "model": MEDIUM}, route="/v1/messages")
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error", denied.text
    assert stack.counts() == before, "a denied request reached an engine"


@pytest.mark.parametrize(
    ("model", "prompt", "engine"),
    [(SMALL, SHORT_PROMPT, SMALL), ("auto", SHORT_PROMPT, SMALL), (SERVED_MODEL, SHORT_PROMPT, None),
     (MEDIUM, SHORT_PROMPT, None), ("auto", LONG_PROMPT, None)],
)  # fmt: skip
def test_a_key_limited_to_the_small_tier_gets_403_for_the_others(
    stack: Stack, model: str, prompt: str, engine: str | None
) -> None:
    """An alias is checked twice: the key may use `auto`, and the model `auto` picks (a long prompt
    would get the base model, which the key may not use)."""
    before = stack.counts()
    answer = stack.send("small-team", _completion(model, prompt))
    if engine is not None:
        assert answer.status_code == 200, answer.text
        stack.expect_one_more(before, engine)
        return
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "model_not_allowed"
    assert stack.counts() == before, "a denied request reached an engine"


def test_a_tiers_per_key_limit_applies_to_its_requests_only(stack: Stack) -> None:
    """qwen3-8b: 60 per minute, burst 3 (4 at once); the base model's requests do not count."""
    statuses = [stack.send("limits", _completion(MEDIUM)).status_code for _ in range(6)]
    assert statuses[:4] == [200] * 4 and 429 in statuses[4:], statuses
    limited = stack.send("limits", _completion(MEDIUM))
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "1", limited.text
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert MEDIUM in limited.json()["error"]["message"]
    assert stack.send("limits", _completion(SERVED_MODEL)).status_code == 200


@pytest.mark.parametrize(
    ("key", "listed"),
    [("small-team", {SMALL, "auto"}), ("admin", {SERVED_MODEL, SMALL, MEDIUM, MISSING, OVERFLOW, "auto"})],
)
def test_models_lists_what_the_key_may_call(stack: Stack, key: str, listed: set[str]) -> None:
    answer = HTTP.get(f"{stack.gateway.url}/v1/models", headers={"Authorization": f"Bearer {KEYS[key]}"})
    assert answer.status_code == 200, answer.text
    assert {card["id"] for card in answer.json()["data"]} == listed


def test_an_engines_own_error_for_a_tier_passes_unchanged(stack: Stack) -> None:
    """nginx asks again for an engine's refusal whose body it intercepted: at the tier, not the base
    (whose engine would answer 404, a model it does not serve)."""
    before = stack.counts()
    too_long = _completion(SMALL, "word " * 2000)  # over the simulated engine's 1024-token context
    answer = stack.send("admin", too_long)
    assert answer.status_code == 400 and "context length" in answer.text, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    assert stack.counts() == before  # refused by the tier's engine, served nowhere


def test_a_tiers_stream_passes_event_by_event(stack: Stack) -> None:
    body = _completion("auto", max_tokens=5, stream=True)
    sent = {"Authorization": f"Bearer {KEYS['admin']}", "Content-Type": "application/json"}
    with HTTP.post(f"{stack.gateway.url}/v1/completions", data=json.dumps(body), headers=sent, stream=True,
                   timeout=30) as answer:  # fmt: skip
        assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    assert all(json.loads(e[6:])["model"] == SMALL for e in events[:-1]), events
