"""autoscaling.minReplicas 0, offline: the spec's rules, the expected cold start and the holding bounds the
plan derives from it, and what the gateway renders for it (nginx's hold location, the activator sidecar,
its scrape port). The held requests themselves, with real processes: test_gateway_hold.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.realparts.gateway import loopback_wiring, write_secret_volume
from qwen_devtools.realparts.nginx import nginx_check
from qwen_devtools.require import missing
from qwen_operator import cli, recording
from qwen_operator.api import coldstart
from qwen_operator.api.crd import crd
from qwen_operator.api.review import Review, review
from qwen_operator.api.spec import SpecError
from qwen_operator.gateway import ACTIVATOR_METRICS_PORT, GatewayConfig, activator_args, config_files
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.manifests.engine import startup_seconds
from qwen_operator.manifests.monitoring import build_gateway_pod_monitor
from qwen_operator.manifests.scaling import build_scaled_object, traffic_window
from support import example

KEDA = {"driver": "keda", "prometheusAddress": "http://prometheus.monitoring.svc:9090"}


def to_zero(
    name: str = "a100-80gb-tp2-bf16", gateway: dict[str, Any] | None = None, **autoscaling: Any
) -> Review:
    """An example switched to autoscaling from zero with KEDA."""
    body = example(name)
    body["spec"].pop("replicas", None)
    body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, **KEDA, **autoscaling}
    if gateway is not None:
        body["spec"]["gateway"] = gateway
    return review(body)


def problems(**autoscaling: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        to_zero(**autoscaling)
    return caught.value.problems


# --- the spec -----------------------------------------------------------------------------------------


def test_min_replicas_zero_needs_keda() -> None:
    ((path, message),) = problems(driver="hpa", prometheusAddress=None)
    assert path == "spec.autoscaling.minReplicas"
    assert "needs driver: keda" in message


def test_min_replicas_zero_needs_the_gateway() -> None:
    with pytest.raises(SpecError) as caught:
        to_zero(gateway={"enabled": False})
    ((path, message),) = caught.value.problems
    assert path == "spec.gateway.enabled" and "holds requests" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("idleSeconds", 59), ("holdSeconds", 4), ("maxHeldRequests", 0), ("holdSeconds", 14_401)],
)
def test_scale_to_zero_bounds(field: str, value: int) -> None:
    ((path, _),) = problems(scaleToZero={field: value})
    assert path == f"spec.autoscaling.scaleToZero.{field}"


def test_the_crd_refuses_what_the_operator_refuses() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    top = {r["fieldPath"]: r["rule"] for r in schema["x-kubernetes-validations"]}
    assert "self.gateway.enabled" in top[".gateway.enabled"]
    autoscaling = schema["properties"]["autoscaling"]
    rules = {r["fieldPath"]: r["rule"] for r in autoscaling["x-kubernetes-validations"]}
    assert "self.minReplicas > 0" in rules[".minReplicas"] and "'keda'" in rules[".minReplicas"]
    assert autoscaling["properties"]["minReplicas"]["minimum"] == 0
    assert set(autoscaling["properties"]["scaleToZero"]["properties"]) == {
        "idleSeconds",
        "holdSeconds",
        "maxHeldRequests",
    }


# --- the plan -----------------------------------------------------------------------------------------


def test_expected_cold_start_is_weights_from_the_cache_plus_engine_start() -> None:
    r = to_zero()
    files = r.plan.download_bytes
    expected = coldstart.ENGINE_START_SECONDS + -(-files // int(coldstart.MODEL_CACHE_READ_BYTES_PER_SECOND))
    h = r.holding
    assert h is not None
    assert abs(h.expected_cold_start_seconds - expected) <= 1
    # Minutes for bf16 32B, well below the probe's ceiling (about 1,255 s).
    assert 200 < h.expected_cold_start_seconds < startup_seconds(r) / 2
    smaller = to_zero("l40s-48gb-tp1-awq").holding
    assert smaller is not None and smaller.expected_cold_start_seconds < h.expected_cold_start_seconds


def test_default_hold_is_two_cold_starts_in_minutes_within_the_probe_budget() -> None:
    h = to_zero().holding
    assert h is not None
    assert h.hold_seconds % 60 == 0
    assert 2 * h.expected_cold_start_seconds <= h.hold_seconds < 2 * h.expected_cold_start_seconds + 60
    # A probe budget shorter than that bounds both: an engine is restarted after it anyway.
    body = example("a100-80gb-tp2-bf16")
    body["spec"].pop("replicas", None)
    body["spec"]["engine"] = {**body["spec"].get("engine", {}), "probes": {"startupSeconds": 200}}
    body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, **KEDA}
    short = review(body).holding
    assert short is not None
    assert (short.expected_cold_start_seconds, short.hold_seconds) == (200, 200)


def test_max_held_defaults_to_what_the_first_engine_takes_split_across_gateway_pods() -> None:
    r = to_zero()
    h = r.holding
    assert h is not None
    assert h.max_held_requests == 2 * r.resource.spec.engine.max_num_seqs
    assert h.max_held_per_pod == -(-h.max_held_requests // r.resource.spec.gateway.replicas)
    set_ = to_zero(scaleToZero={"maxHeldRequests": 5, "holdSeconds": 30, "idleSeconds": 600}).holding
    assert set_ is not None
    assert (set_.max_held_requests, set_.hold_seconds, set_.idle_seconds) == (5, 30, 600)
    assert set_.max_held_per_pod == 3  # 5 over 2 gateway pods, rounded up


def test_the_plan_warns_that_the_first_request_after_idle_waits_a_cold_start() -> None:
    r = to_zero()
    d = r.plan_dict()
    assert d["scaleToZero"]["expectedColdStartSeconds"] == r.holding.expected_cold_start_seconds  # type: ignore[union-attr]
    (warning,) = [w for w in d["warnings"] if w.startswith("spec.autoscaling.minReplicas")]
    assert f"waits about {d['scaleToZero']['expectedColdStartSeconds']} s" in warning
    short = to_zero(scaleToZero={"holdSeconds": 30}).plan_dict()["warnings"]
    assert any(w.startswith("spec.autoscaling.scaleToZero.holdSeconds") for w in short)
    # Above zero: no holding, no warning, no plan entry.
    body = example("a100-80gb-tp2-bf16")
    body["spec"].pop("replicas", None)
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2, **KEDA}
    above = review(body)
    assert above.holding is None and "scaleToZero" not in above.plan_dict()
    assert not [w for w in above.plan_dict()["warnings"] if "minReplicas" in w]


def test_plan_table_shows_the_cold_start() -> None:
    table = cli._table(to_zero())
    assert "Scale to zero" in table and "Requests held at zero" in table


# --- the gateway --------------------------------------------------------------------------------------


def test_only_a_deployment_at_zero_gets_the_activator() -> None:
    r = to_zero()
    children = build_children(r).objects
    gateway = next(
        o for o in children if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")
    )
    containers = {c["name"]: c for c in gateway["spec"]["template"]["spec"]["containers"]}
    activator = containers["activator"]
    assert activator["command"] == ["qwen-operator"]
    assert activator["args"] == GatewayConfig.of(r).activator_args
    assert activator["ports"][0]["name"] == ACTIVATOR_METRICS_PORT
    h = r.holding
    assert h is not None
    args = activator["args"]
    assert args[args.index("--hold-seconds") + 1] == str(h.hold_seconds)
    assert args[args.index("--max-held") + 1] == str(h.max_held_per_pod)
    assert args[args.index("--host") + 1] == "127.0.0.1"  # held requests come from nginx only
    monitor = next(o for o in children if o["kind"] == "PodMonitor")
    assert ACTIVATOR_METRICS_PORT in [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]

    serving = review(example("a100-80gb-tp2-bf16"))
    assert activator_args(serving) is None
    conf = config_files(serving)["nginx.conf"]
    assert "activator" not in conf


def test_the_activator_accepts_its_rendered_arguments() -> None:
    args = cli.parser().parse_args(activator_args(to_zero()))
    assert args.func is cli.cmd_activator
    assert args.hold_seconds > 0 and args.max_held >= 1


def test_nginx_sends_only_the_routers_own_503_of_a_post_to_the_activator() -> None:
    conf = config_files(to_zero())["nginx.conf"]
    overloaded = conf[conf.index("location @overloaded") :]
    overloaded = overloaded[: overloaded.index("location @router_unavailable")]
    assert '"router|POST" hold;' in conf
    assert "proxy_pass http://activator$uri$is_args$args;" in overloaded
    # The in-flight cap and an engine's JSON 503 are answered by nginx, as without holding.
    assert "return 503 $error_overloaded;" in overloaded and "return 503 $error_no_engine;" in overloaded
    # nginx waits for the activator as long as a hold plus a request may last.
    r = to_zero()
    h = r.holding
    assert h is not None
    assert f"proxy_read_timeout {h.hold_seconds + r.plan.request_timeout_seconds}s;" in overloaded


ACCESS = {"apiKeysSecret": "keys", "modelAccess": [{"apiKeys": ["team-b"], "models": ["Qwen/Qwen3-32B"]}]}


@pytest.mark.parametrize("gateway", [None, ACCESS], ids=["keys", "model-access"])
def test_nginx_accepts_the_rendered_config_at_zero(gateway: dict[str, Any] | None, tmp_path: Path) -> None:
    wiring = loopback_wiring(tmp_path, [])
    config = Path(wiring.config_dir)
    config.mkdir(parents=True)
    for name, text in config_files(to_zero(gateway=gateway), wiring).items():
        (config / name).write_text(text)
    write_secret_volume(Path(wiring.api_keys_dir), {"team-a": "sk-0123456789abcdef"})
    subprocess.run(["/bin/sh", str(config / "run-nginx.sh"), "render"], check=True, capture_output=True)
    result = nginx_check(config / "nginx.conf")
    assert result.returncode == 0, result.stderr
    assert "[warn]" not in result.stderr, result.stderr


def test_a_listing_at_zero_shows_each_key_the_models_it_may_use() -> None:
    lora = {
        "adapters": [
            {"name": "sql", "source": {"huggingFace": {"repo": "org/sql-lora", "revision": "a" * 40}}}
        ]
    }
    body = example("a100-80gb-tp2-bf16")
    body["spec"].pop("replicas", None)
    body["spec"]["lora"] = lora
    body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, **KEDA}
    body["spec"]["gateway"] = {
        "apiKeysSecret": "keys",
        "modelAccess": [{"apiKeys": ["team-b"], "models": ["sql"]}],
    }
    conf = config_files(review(body))["nginx.conf"]
    block = conf[conf.index("map $access_group $models_at_zero") :]
    entries = dict(re.findall(r"^\s+(\S+) '(.*)\\n';$", block[: block.index("}\n")], re.M))
    everyone = [m["id"] for m in json.loads(entries["default"])["data"]]
    limited = json.loads(entries['"m0"'])["data"]
    assert everyone == ["Qwen/Qwen3-32B", "sql"]
    assert [m["id"] for m in limited] == ["sql"] and limited[0]["parent"] == "Qwen/Qwen3-32B"
    assert "return 200 $models_at_zero;" in conf


def test_the_client_routes_are_the_same_as_above_zero() -> None:
    """Nothing on the path of a request that engines serve changes: only the router's 503 goes elsewhere."""

    def client_route(min_replicas: int) -> str:
        body = example("a100-80gb-tp2-bf16")
        body["spec"].pop("replicas", None)
        body["spec"]["autoscaling"] = {"minReplicas": min_replicas, "maxReplicas": 2, **KEDA}
        conf = config_files(review(body))["nginx.conf"]
        routes = "chat/completions|completions|messages|messages/count_tokens|models"
        start = conf.index(f"location ~ ^/v1/({routes})$")
        return conf[start : conf.index("\n        }\n", start)]

    # but for recursive error pages, which let @overloaded's proxying to the activator fail as JSON
    recursive = [
        "# @overloaded may hand a request to the activator, whose absence is an error page again.",
        "recursive_error_pages on;",
    ]
    at_zero = [line for line in client_route(0).splitlines() if line.strip() not in recursive]
    assert len(at_zero) == len(client_route(0).splitlines()) - 2
    assert at_zero == client_route(1).splitlines()
    assert "error_page 503 = @overloaded;" in client_route(0)


def test_the_gateway_wakes_the_engines_and_its_traffic_keeps_them_up() -> None:
    """At zero the engines export nothing: KEDA activates on the gateway's held requests (a threshold of
    everything the gateway holds: one replica, however many wait) and stays up while the gateway answers
    completions; it goes to zero after idleSeconds with no trigger active."""
    rev = to_zero(scaleToZero={"idleSeconds": 900})
    scaled = build_scaled_object(rev)["spec"]
    assert (scaled["minReplicaCount"], scaled["cooldownPeriod"], scaled["pollingInterval"]) == (0, 900, 10)
    queue, held, traffic = scaled["triggers"]
    assert queue["metadata"]["query"].startswith("sum(qwen_engine:queue_depth{")
    qd = rev.resource.metadata
    scope = f'namespace="{qd.namespace}",qwendeployment="{qd.name}"'
    assert held["metadata"]["query"] == f"sum(qwen_gateway_held_requests{{{scope}}})"
    assert rev.holding is not None
    assert held["metadata"]["threshold"] == str(rev.holding.max_held_requests)
    # four 15 s scrape intervals (the default), the least window
    assert traffic["metadata"]["query"] == recording.gateway_traffic_query(qd.namespace, qd.name, "60s")
    for trigger in (held, traffic):
        assert trigger["metadata"]["activationThreshold"] == "0"


def test_engines_stay_at_one_until_every_gateway_pod_holds() -> None:
    """The edit to minReplicas 0 rolls the gateway out with the activator; a pod without it answers 503 at
    once at zero, so the ScaledObject keeps one engine until the reconcile sees no such pod. Above zero the
    floor changes nothing."""
    rev = to_zero()
    scaled = build_scaled_object(rev, gateway_holds=False)["spec"]
    assert scaled["minReplicaCount"] == 1
    assert len(scaled["triggers"]) == 3, "the wake and traffic triggers are in place already"
    assert build_scaled_object(rev, gateway_holds=True)["spec"]["minReplicaCount"] == 0
    assert build_scaled_object(to_zero(minReplicas=2), gateway_holds=False)["spec"]["minReplicaCount"] == 2
    (child,) = [
        o
        for o in build_children(rev, ClusterFacts(gateway_holds=False)).objects
        if o["kind"] == "ScaledObject"
    ]
    assert child["spec"]["minReplicaCount"] == 1


@pytest.mark.parametrize(
    ("interval", "window"), [("5s", "60s"), ("15s", "60s"), ("30s", "120s"), ("1m", "240s")]
)
def test_the_traffic_window_is_four_scrape_intervals_and_at_least_a_minute(
    interval: str, window: str
) -> None:
    rev = to_zero()
    rev.resource.spec.monitoring.interval = interval
    (_, _, traffic) = build_scaled_object(rev)["spec"]["triggers"]
    assert f"[{window}]" in traffic["metadata"]["query"]
    assert traffic_window(rev) == window


def test_above_zero_the_scaled_object_keeps_the_queue_trigger_alone() -> None:
    scaled = build_scaled_object(to_zero(minReplicas=1))["spec"]
    assert len(scaled["triggers"]) == 1 and "cooldownPeriod" not in scaled


def test_gateway_series_carry_their_deployment_for_the_triggers() -> None:
    pod_monitor = build_gateway_pod_monitor(to_zero(), ["metrics", "activator"])
    for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]:
        (relabel,) = endpoint["relabelings"]
        assert relabel["targetLabel"] == "qwendeployment"
        assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]


def _promtool_test(promtool: str, directory: Path, unit: dict[str, Any]) -> None:
    """`promtool test rules` on one unit-test file; its own report when a case fails."""
    (directory / "traffic.test.yaml").write_text(yaml.safe_dump(unit))
    run = subprocess.run(
        [promtool, "test", "rules", "traffic.test.yaml"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_traffic_trigger_sees_answers_that_created_their_counter(tmp_path: Path) -> None:
    """promtool (Prometheus's own PromQL engine) on synthetic series: a counter born with a wake's burst
    of answers (8, never 0 before) keeps the trigger active for the window, where rate() sees nothing;
    a counter that grows keeps it active; an idle one, or a burst older than the window, does not."""
    promtool = shutil.which("promtool")
    if not promtool:
        missing("promtool", "run `make setup` (tools/system-packages.sh installs Debian's prometheus)")
    query = recording.gateway_traffic_query("llm", "nightly", "2m")
    counter = recording.GATEWAY_RESPONSES
    labels = 'namespace="llm", qwendeployment="nightly", route="/v1/chat/completions", status="200"'

    def case(name: str, values: str, expected: dict[str, float]) -> dict[str, Any]:
        series = [{"series": f'{counter}{{{labels}, error="", pod="nightly-gateway-1"}}', "values": values}]
        tests = [
            {"expr": f"({query}) > bool 0", "eval_time": at, "exp_samples": [{"labels": "{}", "value": v}]}
            for at, v in expected.items()
        ]
        return {"name": name, "interval": "15s", "input_series": series, "promql_expr_test": tests}

    unit = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            # absent for 7 samples (1m45s), then born at 8 (the wake's 8 answers)
            case("born with a burst", "_x7 8x30", {"2m30s": 1, "3m30s": 1, "4m": 0, "8m": 0}),
            case("growing", "0+1x40", {"5m": 1}),
            case("idle", "5x40", {"5m": 0}),
        ],
    }
    _promtool_test(promtool, tmp_path, unit)
    # Answers to requests refused before admission (no key, a model the key may not use, its rate
    # limit, nginx's own 413) keep nothing up, however many; one admitted answer among them does.
    refused = [
        {
            "series": f'{counter}{{{labels}, error="{error}", pod="nightly-gateway-0"}}',
            "values": "0+4x40",
        }
        for error in ("unauthorized", "model_not_allowed", "rate_limited", "request_error")
    ]
    admitted = {
        "series": f'{counter}{{{labels}, error="", pod="nightly-gateway-0"}}',
        "values": "_x10 1x30",
    }
    test = {"expr": f"({query}) > bool 0", "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": 0}]}
    unit["tests"] = [
        {"name": "refused only", "interval": "15s", "input_series": refused, "promql_expr_test": [test]},
        {
            "name": "one admitted",
            "interval": "15s",
            "input_series": [*refused, admitted],
            "promql_expr_test": [{**test, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 1}]}],
        },
    ]
    _promtool_test(promtool, tmp_path, unit)
    # the old query, sum(rate(...)), misses the burst
    rate = query.split(" + ")[0].replace("increase", "rate")
    unit["tests"] = [case("rate misses it", "_x7 8x30", {"2m30s": 0})]
    unit["tests"][0]["promql_expr_test"][0]["expr"] = f"({rate}) > bool 0"
    _promtool_test(promtool, tmp_path, unit)


def test_every_error_label_of_the_gateway_is_admitted_or_refused() -> None:
    """The traffic trigger counts answers by nginx's $gateway_error (recording.ADMITTED_ERRORS): every
    value the rendered map can write is classified, so a new error cannot silently wake the engines or
    stop keeping them up."""
    conf = config_files(to_zero())["nginx.conf"]
    block = conf.split('map "$status:$upstream_status" $gateway_error {', 1)[1].split("}", 1)[0]
    written = {line.split()[-1].rstrip(";") for line in block.strip().splitlines()}
    written = {"" if value == '""' else value for value in written}
    assert written == set(recording.ADMITTED_ERRORS) | set(recording.REFUSED_ERRORS)
    assert not set(recording.ADMITTED_ERRORS) & set(recording.REFUSED_ERRORS)
