"""LoRA adapters without engine restarts, operator side: the adapters' ConfigMap, the lora-sync sidecar in
the engine pod, the NetworkPolicy rule for its port, the scrape of its /metrics, and status.lora /
AdaptersLoaded from what the sidecars report. (The sidecar itself against a real engine:
tests/test_engine_live.py.)"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from qwen_devtools.net import LOOPBACK
from qwen_operator.adapters import LoraObservation, observe
from qwen_operator.api.lorafile import FILE_NAME, SIDECAR_PORT, parse
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_all
from qwen_operator.manifests.policy import DEFAULT_SCRAPERS, parse_operator_peer
from qwen_operator.manifests.upgrade import ENGINE_GENERATION, ENGINE_TEMPLATE, hold_engine_template
from qwen_operator.objects import content_hash
from qwen_operator.reconcile import _sidecar_status
from qwen_operator.status import Observed, compute_status
from support import example

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OPERATOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "qwen-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "qwen-operator"}},
}


def minimal_body() -> dict[str, Any]:
    return example("a100-80gb-tp2-bf16")


def _body(*adapters: dict[str, Any]) -> dict[str, Any]:
    body = minimal_body()
    body["spec"]["model"]["cache"] = {"claimName": "models"}
    body["spec"]["lora"] = {"maxLoras": 2, "maxLoraRank": 16, "adapters": list(adapters)}
    return body


SQL = {"name": "sql", "source": {"path": "loras/sql"}}
CHAT = {"name": "chat", "source": {"huggingFace": {"repo": "org/chat-lora", "revision": COMMIT}}}


def _objects(body: dict[str, Any], operator: dict[str, Any] | None = None) -> dict[tuple[str, str], Any]:
    rev = review(body)
    assert rev.ok, rev.plan.errors
    return {(o["kind"], o["metadata"]["name"]): o for o in build_all(rev, ClusterFacts(operator=operator))}


def _engine_pod(objects: dict[tuple[str, str], Any]) -> dict[str, Any]:
    (deployment,) = [o for (k, n), o in objects.items() if k == "Deployment" and n.endswith("-engine")]
    return dict(deployment["spec"]["template"])


def test_the_adapters_go_to_a_config_map_the_sidecar_reads() -> None:
    objects = _objects(_body(SQL, CHAT))
    config_map = objects[("ConfigMap", "chat-a100-lora")]
    assert [(a.name, a.path, a.hub) for a in parse(config_map["data"][FILE_NAME])] == [
        ("sql", "loras/sql", None),
        ("chat", None, parse(config_map["data"][FILE_NAME])[1].hub),
    ]
    assert parse(config_map["data"][FILE_NAME])[1].hub.revision == COMMIT  # type: ignore[union-attr]
    pod = _engine_pod(objects)["spec"]
    vllm, sidecar = pod["containers"]
    assert sidecar["name"] == "lora-sync" and sidecar["command"] == ["qwen-operator", "lora-sync"]
    assert sidecar["ports"] == [{"name": "lora-sync", "containerPort": SIDECAR_PORT, "protocol": "TCP"}]
    # The engine's key and cache, nothing else of its environment.
    assert {e["name"] for e in sidecar["env"]} == {"HF_HOME", "VLLM_API_KEY"}
    assert next(e for e in sidecar["env"] if e["name"] == "VLLM_API_KEY") == next(
        e for e in vllm["env"] if e["name"] == "VLLM_API_KEY"
    )
    assert sidecar["volumeMounts"][0] == vllm["volumeMounts"][0]  # the model cache, same path
    assert {"name": "lora-adapters", "configMap": {"name": "chat-a100-lora", "defaultMode": 0o444}} in pod[
        "volumes"
    ]


def test_adding_or_removing_an_adapter_changes_the_config_map_not_the_engine_pod() -> None:
    one, two, none = _objects(_body(SQL)), _objects(_body(SQL, CHAT)), _objects(_body())
    assert _engine_pod(one) == _engine_pod(two) == _engine_pod(none)
    assert one[("ConfigMap", "chat-a100-lora")] != two[("ConfigMap", "chat-a100-lora")]


def test_without_lora_there_is_no_sidecar_no_config_map_and_no_sidecar_port() -> None:
    objects = _objects(minimal_body(), OPERATOR)
    assert not [k for k in objects if k[0] == "ConfigMap" and k[1].endswith("-lora")]
    assert [c["name"] for c in _engine_pod(objects)["spec"]["containers"]] == ["vllm"]
    policy = objects[("NetworkPolicy", "chat-a100-engine")]
    assert all(p["port"] != SIDECAR_PORT for rule in policy["spec"]["ingress"] for p in rule["ports"])


def test_the_sidecar_port_admits_the_scrapers_and_the_operator_only() -> None:
    policy = _objects(_body(SQL), OPERATOR)[("NetworkPolicy", "chat-a100-engine")]
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == SIDECAR_PORT]
    assert OPERATOR in rule["from"]
    assert all(set(peer) == {"namespaceSelector", "podSelector"} for peer in rule["from"])
    # The engine port is unchanged: the operator does not reach the engine itself.
    engine_rules = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] != SIDECAR_PORT]
    assert all(OPERATOR not in r["from"] for r in engine_rules)


def _scrape(objects: dict[tuple[str, str], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """{port name: Service port} of the engine Service, {port name: endpoint} of its ServiceMonitor."""
    service = objects[("Service", "chat-a100-engine")]
    monitor = objects[("ServiceMonitor", "chat-a100-engine")]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    return ports, {e["port"]: e for e in monitor["spec"]["endpoints"]}


def test_the_sidecars_metrics_are_scraped_through_the_engine_service() -> None:
    """Service port -> the sidecar's container port, ServiceMonitor endpoint -> that Service port, with the
    `qwendeployment` relabeling of the engine endpoint, and the NetworkPolicy admits the scrapers."""
    objects = _objects(_body(SQL), OPERATOR)
    ports, endpoints = _scrape(objects)
    assert list(endpoints) == ["http", "lora-sync"]
    containers = {
        p["name"]: p["containerPort"] for c in _engine_pod(objects)["spec"]["containers"] for p in c["ports"]
    }
    for name, endpoint in endpoints.items():
        assert containers[ports[name]["targetPort"]] == ports[name]["port"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["relabelings"] == endpoints["http"]["relabelings"]
        assert endpoint["interval"] == endpoints["http"]["interval"]
    assert ports["lora-sync"]["port"] == SIDECAR_PORT
    policy = objects[("NetworkPolicy", "chat-a100-engine")]
    (rule,) = [
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": SIDECAR_PORT}]
    ]
    assert all(peer in rule["from"] for peer in DEFAULT_SCRAPERS)


def test_an_edit_removing_spec_lora_removes_the_sidecar_scrape() -> None:
    """Server-side apply drops what the new render leaves out: the Service port and the endpoint."""
    ports, endpoints = _scrape(_objects(_body(SQL)))
    assert "lora-sync" in ports and "lora-sync" in endpoints
    ports, endpoints = _scrape(_objects(minimal_body()))
    assert list(ports) == list(endpoints) == ["http"]


def test_the_operator_peer_must_select_something() -> None:
    assert parse_operator_peer(None) is None and parse_operator_peer(" ") is None
    assert parse_operator_peer(json.dumps(OPERATOR)) == OPERATOR
    with pytest.raises(ValueError, match="empty one selects everything"):
        parse_operator_peer(json.dumps({**OPERATOR, "podSelector": {}}))


def _pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_where_each_adapter_is_loaded_is_counted_from_the_sidecars() -> None:
    reports = {
        "http://10.0.0.1:8001/status": {"adapters": {"sql": {"loaded": True}, "chat": {"loaded": True}}},
        "http://10.0.0.2:8001/status": {
            "adapters": {"sql": {"loaded": True}, "chat": {"loaded": False, "error": "rank 64 > 16"}}
        },
    }

    def fetch(url: str) -> dict[str, Any]:
        if url not in reports:
            raise OSError("connection refused")
        return copy.deepcopy(reports[url])

    pods = [_pod("a", "10.0.0.1"), _pod("b", "10.0.0.2"), _pod("c", "10.0.0.3"), _pod("d", "", ready=False)]
    seen = observe(pods, ["sql", "chat"], fetch)
    assert seen.pods == 3  # d is not ready
    assert seen.adapters["sql"].loaded == 2 and seen.adapters["chat"].loaded == 1
    assert seen.adapters["chat"].errors == ["b: rank 64 > 16"]
    assert seen.silent == ["c: connection refused"]


def _status(seen: LoraObservation | None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    obs = Observed(generation=1, review=review(body or _body(SQL, CHAT)), lora=seen)
    return compute_status(obs, None)


def _adapters_loaded(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "AdaptersLoaded")


def test_adapters_loaded_says_loading_failed_or_loaded() -> None:
    reports = {"sql": {"loaded": True}, "chat": {"loaded": True}}
    everywhere = observe([_pod("a", "10.0.0.1")], ["sql", "chat"], lambda url: {"adapters": reports})
    status = _status(everywhere)
    assert _adapters_loaded(status)["status"] == "True" and _adapters_loaded(status)["reason"] == "Loaded"
    assert status["lora"] == {
        "adapters": [{"name": "sql", "loaded": "1/1"}, {"name": "chat", "loaded": "1/1"}]
    }

    failing = observe(
        [_pod("a", "10.0.0.1")],
        ["sql", "chat"],
        lambda url: {
            "adapters": {"sql": {"loaded": True}, "chat": {"loaded": False, "error": "no such dir"}}
        },
    )
    status = _status(failing)
    condition = _adapters_loaded(status)
    assert (condition["status"], condition["reason"]) == ("False", "LoadFailed")
    assert "chat (a: no such dir)" in condition["message"]
    assert status["lora"]["adapters"][1] == {"name": "chat", "loaded": "0/1", "error": "a: no such dir"}

    loading = observe([_pod("a", "10.0.0.1")], ["sql", "chat"], lambda url: {"adapters": {}})
    assert _adapters_loaded(_status(loading))["reason"] == "Loading"

    # chat removed from the spec; the sidecar still runs the old list until kubelet updates its file.
    old_list = {"sql": {"loaded": True}, "chat": {"loaded": True}}
    unloading = observe([_pod("a", "10.0.0.1")], ["sql"], lambda url: {"adapters": old_list})
    condition = _adapters_loaded(_status(unloading, _body(SQL)))
    assert (condition["status"], condition["reason"]) == ("False", "Unloading")
    assert "chat on 1/1" in condition["message"]
    assert _adapters_loaded(_status(None))["reason"] == "NoReadyEngine"


def test_without_lora_the_status_has_no_adapters_and_no_condition_for_them() -> None:
    status = _status(None, minimal_body())
    assert "lora" not in status
    assert all(c["type"] != "AdaptersLoaded" for c in status["conditions"])


# --- readiness: a pod is Ready once its sidecar has loaded the adapters --------------------------


def _containers(objects: dict[tuple[str, str], Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _engine_pod(objects)["spec"]["containers"]}


def test_the_sidecar_makes_the_pod_ready_only_once_it_holds_its_adapters() -> None:
    """Pod readiness is every container's: the router and the activator see an engine pod only once its
    lora-sync sidecar answers /ready (the first round's adapters loaded, or failed). No startup budget:
    a failing readiness probe restarts nothing, and the engine's own startupProbe covers the start."""
    containers = _containers(_objects(_body(SQL, CHAT)))
    sidecar = containers["lora-sync"]
    probe = sidecar["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": "lora-sync"}
    assert probe["periodSeconds"] <= 5 and probe.get("successThreshold", 1) == 1
    assert "startupProbe" not in sidecar
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"  # liveness is not readiness
    assert containers["vllm"]["readinessProbe"]["httpGet"]["path"] == "/health"
    # Adapters live in the ConfigMap: adding one leaves the pod template (and its probes) alone.
    assert _containers(_objects(_body(SQL))) == containers


def test_the_new_readiness_probe_waits_for_an_edit_after_an_operator_upgrade() -> None:
    """An engine pod rendered by an earlier operator version (no /ready probe) is held until the spec is
    next edited (manifests/upgrade.py): the probe is not a security setting, so no SecurityUpdateHeld."""
    (desired,) = [
        o for (k, n), o in _objects(_body(SQL)).items() if k == "Deployment" and n.endswith("-engine")
    ]
    live = copy.deepcopy(desired)
    for container in live["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "lora-sync":
            del container["readinessProbe"]
    live["metadata"]["annotations"] = {
        ENGINE_GENERATION: "4",
        ENGINE_TEMPLATE: content_hash(live["spec"]["template"]),
    }
    held = hold_engine_template(desired, live, 4, 4, "OnEdit")
    assert held.deployment["spec"]["template"] == live["spec"]["template"]
    assert held.changes == [".spec.containers[1].readinessProbe"]
    assert held.security == []
    edited = hold_engine_template(desired, live, 5, 4, "OnEdit")  # any edit rolls it out
    assert edited.deployment["spec"]["template"] == desired["spec"]["template"] and not edited.changes


# --- sidecar answers are untrusted: any pod with the engine labels can answer -----------------------


class Sidecar:
    """An HTTP server on loopback answering /status with fixed bytes (and, to cut an answer short, a
    Content-Length larger than what it sends)."""

    def __init__(self) -> None:
        self.body, self.length = b"{}", None
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(sidecar.length or len(sidecar.body)))
                self.end_headers()
                self.wfile.write(sidecar.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fetch(self, url: str) -> Any:
        """The operator's own GET (reconcile._sidecar_status) of a pod at 127.0.0.1, sent to this port."""
        assert url == f"http://{LOOPBACK}:{SIDECAR_PORT}/status"
        return _sidecar_status(f"http://{LOOPBACK}:{self.port}/status")


@pytest.fixture
def sidecar() -> Iterator[Sidecar]:
    server = Sidecar()
    yield server
    server.server.shutdown()
    server.server.server_close()


MALFORMED = {
    "a list": b"[1, 2]",
    "a string": b'"ok"',
    "a number": b"42",
    "null": b"null",
    "not JSON": b"<html>502</html>",
    "adapters a list": b'{"adapters": ["sql"]}',
    "adapters missing": b'{"engineReachable": true}',
    "an adapter a string": b'{"adapters": {"sql": "loaded"}}',
    "loaded not a boolean": b'{"adapters": {"sql": {"loaded": "yes"}}}',
    "error not a string": b'{"adapters": {"sql": {"loaded": false, "error": {"nested": [1]}}}}',
    "loaded a list": b'{"adapters": {"sql": {"loaded": [true]}}}',
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "invalid UTF-8": b'{"adapters": {"\xff": {}}}',
    "over 1 MiB": b'{"adapters": {}, "pad": "' + b"x" * (2 << 20) + b'"}',
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_sidecar_answer_makes_that_pod_unknown_and_never_raises(
    sidecar: Sidecar, body: bytes
) -> None:
    sidecar.body = body
    pods = [_pod("a", LOOPBACK), _pod("b", "10.0.0.2")]
    good = {"http://10.0.0.2:8001/status": {"adapters": {"sql": {"loaded": True, "error": None}}}}
    seen = observe(pods, ["sql"], lambda url: good[url] if url in good else sidecar.fetch(url))
    assert seen.pods == 2 and seen.adapters["sql"].loaded == 1 and seen.adapters["sql"].errors == []
    (silent,) = seen.silent
    assert silent.startswith("a: ") and 3 < len(silent) < 200
    condition = _adapters_loaded(_status(LoraObservation(seen.pods, seen.adapters, seen.silent)))
    assert (condition["status"], condition["reason"]) == ("False", "Loading")


def test_a_sidecar_answer_cut_short_makes_that_pod_unknown(sidecar: Sidecar) -> None:
    sidecar.body, sidecar.length = b'{"adapters": {', 1000
    seen = observe([_pod("a", LOOPBACK)], ["sql"], sidecar.fetch)
    assert len(seen.silent) == 1 and seen.silent[0].startswith("a: ")
