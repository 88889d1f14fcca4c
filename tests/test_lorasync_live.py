"""The lora-sync sidecar with a real vLLM CPU engine (tiny random Qwen3, --enable-lora, max 2 adapters of
rank 8, runtime LoRA updating on) and the sidecar as a real `qwen-operator lora-sync` process, driven by
editing its desired file as the kubelet would when the operator changes the ConfigMap.

One engine start for the module (about a minute on two cores); the tests share it in file order, and
the last one restarts the engine on the same port.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from qwen_devtools.net import LOOPBACK, free_port, metric_sum
from qwen_devtools.procs import Proc, spawn, temp_log_dir, wait_ready
from qwen_devtools.realparts.engine import (
    ENGINE_START_SECONDS,
    SERVED_MODEL,
    cpu_qwendeployment,
    spawn_engine,
    test_engine_args,
)
from qwen_devtools.realparts.lora import write_random_lora
from qwen_devtools.wait import wait_until
from qwen_operator.api.lorafile import Adapter, render
from qwen_operator.api.review import review
from support import cli_path

pytestmark = pytest.mark.engine

KEY = "engine-0123456789abcdef"
LORA_FLAGS = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
ENGINE_ENV = {"VLLM_API_KEY": KEY, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
#: Seconds from writing the desired file to the engine listing the adapters, asserted; the measured
#: time is printed (the sidecar's default 2 s interval plus the loads).
LOAD_BOUND = 15.0
PROMPT = "Kubernetes operators reconcile"
HTTP = requests.Session()
HTTP.trust_env = False  # everything is on 127.0.0.1
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Live:
    engine: Proc  # replaced by the restart test
    sidecar: Proc
    model: Path
    cache: Path  # the model cache root both processes see
    desired: Path
    extra: list[str]
    logs: Path
    #: Answers at temperature 0, by model, from the first engine: a later engine must give the same.
    answers: dict[str, str] = field(default_factory=dict)

    @property
    def status_url(self) -> str:
        return f"{self.sidecar.url}/status"

    def want(self, *adapters: Adapter) -> float:
        """Write the desired file as the kubelet does (a new file renamed over the old); returns when."""
        tmp = self.desired.with_suffix(".tmp")
        tmp.write_text(render(adapters))
        tmp.replace(self.desired)
        return time.monotonic()

    def engine_adapters(self) -> set[str]:
        answer = HTTP.get(f"{self.engine.url}/v1/models", headers=AUTH, timeout=10)
        assert answer.status_code == 200, answer.text
        return {card["id"] for card in answer.json()["data"] if card.get("parent")}

    def status(self) -> dict[str, Any]:
        answer = HTTP.get(self.status_url, timeout=10)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def complete(self, model: str) -> requests.Response:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        return HTTP.post(f"{self.engine.url}/v1/completions", json=body, headers=AUTH, timeout=60)

    def text(self, model: str) -> str:
        answer = self.complete(model)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["choices"][0]["text"])

    def diagnostics(self) -> str:
        return f"sidecar log:\n{self.sidecar.tail()}\nengine log:\n{self.engine.tail(20)}"


A = Adapter("lora-a", path="loras/a")
B = Adapter("lora-b", path="loras/b")
BIG = Adapter("lora-rank16", path="loras/rank16")
GONE = Adapter("lora-missing", path="loras/not-there")


@pytest.fixture(scope="module")
def live(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    cache = tmp_path_factory.mktemp("model-cache")
    for adapter, rank, seed in ((A, 8, 1), (B, 8, 2), (BIG, 16, 3)):
        write_random_lora(cache / str(adapter.path), tiny_model, rank=rank, seed=seed)
    desired_dir = tmp_path_factory.mktemp("lora-config")
    desired = desired_dir / "adapters.json"
    desired.write_text(render([]))
    logs = temp_log_dir()
    extra = test_engine_args(review(cpu_qwendeployment()).command) + LORA_FLAGS
    engine = spawn_engine(tiny_model, extra_args=extra, env=ENGINE_ENV, log_dir=logs)
    port = free_port()
    sidecar = spawn(
        "lora-sync",
        [str(cli_path()), "lora-sync", "--desired-file", str(desired), "--engine", engine.url,
         "--model-cache", str(cache), "--host", LOOPBACK, "--port", str(port)],
        logs,
        env={"VLLM_API_KEY": KEY},
        port=port,
    )  # fmt: skip
    state = Live(engine, sidecar, tiny_model, cache, desired, extra, logs)
    try:
        wait_ready(sidecar, "/healthz", 30)
        wait_ready(engine, "/health", ENGINE_START_SECONDS)
        wait_until(lambda: state.status()["engineReachable"], 30, "the sidecar reaching the engine")
        yield state
    finally:
        state.sidecar.stop()
        state.engine.stop()


def _wait_adapters(live: Live, expected: set[str], what: str, timeout: float = 60) -> None:
    try:
        wait_until(lambda: live.engine_adapters() == expected, timeout, what, interval=0.1)
    except AssertionError as error:
        raise AssertionError(
            f"{error}; engine lists {live.engine_adapters()}\n{live.diagnostics()}"
        ) from None


def test_added_adapters_load_without_restarting_the_engine(live: Live) -> None:
    pid = live.engine.pid
    base = live.text(SERVED_MODEL)
    written = live.want(A, B)
    _wait_adapters(live, {"lora-a", "lora-b"}, "both adapters loaded")
    seconds = time.monotonic() - written
    print(f"\n[lora-sync] two adapters loaded {seconds:.2f} s after the file changed (bound {LOAD_BOUND} s)")
    assert seconds < LOAD_BOUND
    assert live.engine.alive() and live.engine.pid == pid
    status = live.status()
    assert status["adapters"] == {
        "lora-a": {"loaded": True, "error": None},
        "lora-b": {"loaded": True, "error": None},
    }

    a, b = live.text("lora-a"), live.text("lora-b")
    print(f"[lora-sync] temperature 0, {PROMPT!r}: base {base!r}, lora-a {a!r}, lora-b {b!r}")
    assert live.text(SERVED_MODEL) == base  # deterministic, so the differences below are the adapters'
    assert a != base and b != base and a != b
    live.answers.update({"lora-a": a, SERVED_MODEL: base})


def test_removed_adapter_is_unloaded(live: Live) -> None:
    live.want(A)
    _wait_adapters(live, {"lora-a"}, "lora-b unloaded", timeout=LOAD_BOUND)
    answer = live.complete("lora-b")
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"].startswith("The model `lora-b` does not exist.")
    assert live.complete("lora-a").status_code == 200
    wait_until(lambda: set(live.status()["adapters"]) == {"lora-a"}, 10, "lora-b gone from /status")


def test_failures_are_reported_and_hold_up_nothing(live: Live) -> None:
    live.want(A, BIG, GONE)

    def reported() -> dict[str, Any] | None:
        adapters = live.status()["adapters"]  # the new names appear once the sidecar read the file
        return adapters if all(adapters.get(n, {}).get("error") for n in (BIG.name, GONE.name)) else None

    adapters = wait_until(reported, 30, "both failures in /status")
    print(f"[lora-sync] /status: {json.dumps(adapters)}")
    assert adapters["lora-a"] == {"loaded": True, "error": None}
    assert not adapters[BIG.name]["loaded"] and not adapters[GONE.name]["loaded"]
    assert "LoRA rank 16 is greater than max_lora_rank 8" in adapters[BIG.name]["error"]
    # vLLM writes <path> for the path in its message: the sidecar says which it asked for
    assert adapters[GONE.name]["error"].startswith(f"load from {live.cache / str(GONE.path)}: HTTP 404: ")
    assert "Loading lora lora-missing failed: No adapter found" in adapters[GONE.name]["error"]

    metrics = f"{live.sidecar.url}/metrics"
    for name in (BIG.name, GONE.name):
        assert metric_sum(metrics, "qwen_lora_adapter_loaded", adapter=name) == 0
        assert metric_sum(metrics, "qwen_lora_adapter_load_failures_total", adapter=name) >= 1
    assert metric_sum(metrics, "qwen_lora_adapter_loaded", adapter="lora-a") == 1
    assert metric_sum(metrics, "qwen_lora_adapter_load_failures_total", adapter="lora-a") == 0
    assert live.engine_adapters() == {"lora-a"}
    assert live.complete("lora-a").status_code == 200


def test_restarted_engine_gets_the_adapters_again(live: Live) -> None:
    old = live.engine
    old.stop()
    wait_until(lambda: not live.status()["engineReachable"], 30, "the sidecar noticing the engine is gone")
    assert live.status()["adapters"]["lora-a"]["loaded"] is False
    live.engine = spawn_engine(live.model, old.port, live.extra, ENGINE_ENV, log_dir=live.logs)
    wait_ready(live.engine, "/health", ENGINE_START_SECONDS)
    ready = time.monotonic()
    assert live.engine.pid != old.pid
    _wait_adapters(live, {"lora-a"}, "lora-a loaded into the new engine", timeout=LOAD_BOUND)
    print(
        f"\n[lora-sync] lora-a loaded again {time.monotonic() - ready:.2f} s after the new engine was ready"
    )
    # Another engine process with the same adapter files answers exactly as the first one did.
    assert live.text("lora-a") == live.answers["lora-a"]
    assert live.text(SERVED_MODEL) == live.answers[SERVED_MODEL]
