"""The gateway builders: objects and their invariants, strict schemas, and the real nginx, vllm-router and
exporters accepting exactly what is rendered. Fast: no engine is started.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import http.server
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import requests
import yaml

from qwen_devtools.net import LOOPBACK, free_port, http_get
from qwen_devtools.procs import running, spawn, wait_ready
from qwen_devtools.realparts.exporters import nginx_exporter_bin, nginxlog_exporter_bin
from qwen_devtools.realparts.gateway import kubelet_args, loopback_wiring, write_secret_volume
from qwen_devtools.realparts.nginx import nginx_bin, nginx_check
from qwen_devtools.vllm_env import vllm_router_bin
from qwen_operator import gateway, names, versions
from qwen_operator.api.review import Review, review
from qwen_operator.api.spec import SpecError
from qwen_operator.gateway import GATEWAY_METRICS_PORTS, Limits, config_files, router_args
from qwen_operator.gateway.router import ENGINE_KEY_ENV
from qwen_operator.manifests.exposure import build_client_service, build_routes
from qwen_operator.manifests.gateway import GENERATED_KEY_ID, build_gateway, generated_api_keys_secret
from support import EXAMPLES, KEDA_AT_ZERO, REPO, load

K8S_SCHEMA_VERSION = "1.36"  # the dev cluster's Kubernetes version
UID = "0b1c2d3e-0000-4000-8000-000000000005"


def _review(example: Path | None = None, **gateway_fields: Any) -> Review:
    body = copy.deepcopy(load(example or EXAMPLES[0]))
    body["metadata"]["uid"] = UID
    body["spec"].setdefault("gateway", {}).update(gateway_fields)
    return review(body)


def _with_engine_key(rev: Review) -> Review:
    body = rev.resource.model_dump(by_alias=True, exclude_none=True)
    body["metadata"]["uid"] = UID
    body["spec"]["engine"]["apiKeySecret"] = {"name": "engine-key", "key": "token"}
    return review(body)


def _kinds(objects: list[dict[str, Any]]) -> list[str]:
    return [o["kind"] for o in objects]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


_WIRING = loopback_wiring(Path("/tmp/unused"), ["http://127.0.0.1:1"])


def _pod(rev: Review) -> dict[str, Any]:
    pod: dict[str, Any] = _one(build_gateway(rev), "Deployment")["spec"]["template"]["spec"]
    return pod


def _containers(rev: Review) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod(rev)["containers"]}


# --- objects -----------------------------------------------------------------------------------------


def test_objects_in_apply_order_named_and_labelled() -> None:
    rev = _review()
    objects = build_gateway(rev)
    assert _kinds(objects) == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment"]
    qd = rev.resource
    for obj in objects:
        assert obj["metadata"]["name"] == names.gateway(qd)
        assert obj["metadata"]["namespace"] == qd.metadata.namespace
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == qd.spec.gateway.replicas
    assert deployment["spec"]["selector"]["matchLabels"] == names.selector(qd, "gateway")


def test_optional_ingress_and_http_route() -> None:
    rev = _review(
        ingress={"host": "chat.example.com", "className": "nginx", "tlsSecretName": "chat-tls"},
        httpRoute={"parentRefs": [{"name": "public", "namespace": "gw"}], "hostnames": ["chat.example.com"]},
        requestTimeoutSeconds=900,
    )
    objects = [*build_gateway(rev), *build_routes(rev)]
    assert _kinds(objects)[-2:] == ["Ingress", "HTTPRoute"]
    ingress = _one(objects, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": names.client_service(rev.resource), "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["chat.example.com"], "secretName": "chat-tls"}]
    rule = _one(objects, "HTTPRoute")["spec"]["rules"][0]
    assert rule["backendRefs"] == [{"name": names.client_service(rev.resource), "port": 80}]
    assert rule["timeouts"] == {"request": "900s"}  # long streams are not cut by the Gateway's default


def test_disabled_gateway_renders_nothing_and_the_service_selects_engines() -> None:
    rev = _review(enabled=False)
    assert build_gateway(rev) == []
    service = build_client_service(rev)
    assert service["spec"]["selector"] == names.selector(rev.resource, "engine")
    assert service["spec"]["ports"][0]["targetPort"] == "http"  # the engine's port name too


def test_client_service_follows_the_spec() -> None:
    annotations = {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}
    rev = _review(service={"type": "LoadBalancer", "port": 443, "annotations": annotations})
    service = build_client_service(rev)
    assert service["metadata"]["name"] == rev.resource.metadata.name
    assert service["metadata"]["annotations"] == annotations
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["selector"] == names.selector(rev.resource, "gateway")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 443, "targetPort": "http", "protocol": "TCP"}
    ]
    assert "http" in {p["name"] for p in _containers(rev)["nginx"]["ports"]}


def _variants() -> list[tuple[str, Review]]:
    out = []
    for example in EXAMPLES:
        rev = _review(example)
        out.append((example.stem, rev))
        out.append((f"{example.stem}-engine-key", _with_engine_key(rev)))
    out.append(("no-auth", _review(apiKeysSecret=None)))
    out.append(("ingress", _review(ingress={"host": "chat.example.com", "tlsSecretName": "chat-tls"})))
    return out


@pytest.mark.parametrize(("name", "rev"), _variants(), ids=[n for n, _ in _variants()])
def test_objects_pass_strict_schema_validation(name: str, rev: Review) -> None:
    for obj in [*build_gateway(rev), build_client_service(rev)]:
        clean = yaml.safe_load(yaml.safe_dump(obj))
        kubernetes_validate.validate(clean, K8S_SCHEMA_VERSION, strict=True)


# --- the pod -----------------------------------------------------------------------------------------


def test_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = _pod(_with_engine_key(_review()))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, container["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert ctx["runAsNonRoot"] is True, container["name"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
    for volume in pod["volumes"]:
        assert set(volume) & {"configMap", "secret", "emptyDir", "projected"}, volume  # no hostPath


def test_pod_needs_no_gpu_and_spreads_over_nodes() -> None:
    rev = _review()
    pod = _pod(rev)
    assert "tolerations" not in pod and "nodeSelector" not in pod
    for container in pod["containers"]:
        resources = container["resources"]
        assert not any("gpu" in r for part in resources.values() for r in part), container["name"]
        assert "memory" in resources["limits"] and "cpu" not in resources["limits"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == names.selector(rev.resource, "gateway")
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_probes_and_metrics_ports() -> None:
    containers = _containers(_review())
    ports = {p["name"]: p["containerPort"] for c in containers.values() for p in c["ports"]}
    assert set(GATEWAY_METRICS_PORTS) <= set(ports)
    assert "metrics" in ports
    assert len(set(ports.values())) == len(ports)
    nginx = containers["nginx"]
    assert nginx["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "status"}
    assert nginx["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "status"}
    assert all("livenessProbe" in c for c in containers.values())


def test_only_the_router_gets_api_credentials() -> None:
    rev = _review()
    pod = _pod(rev)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == names.gateway(rev.resource)
    with_token = [
        c["name"]
        for c in pod["containers"]
        if any(m["mountPath"] == gateway.SERVICE_ACCOUNT_DIR for m in c.get("volumeMounts", []))
    ]
    assert with_token == ["router"]
    role = _one(build_gateway(rev), "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _one(build_gateway(rev), "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_secrets_are_mounted_as_files_for_rotation() -> None:
    rev = _with_engine_key(_review(apiKeysSecret="chat-keys"))
    volumes = {v["name"]: v for v in _pod(rev)["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] == "chat-keys"
    assert volumes["engine-key"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    nginx_env = _containers(rev)["nginx"].get("env", [])
    assert not any("valueFrom" in e for e in nginx_env)  # env would never change without a restart
    no_auth = _pod(_review(apiKeysSecret=None, auth="none"))
    assert "api-keys" not in {v["name"] for v in no_auth["volumes"]}


def test_without_a_named_secret_the_gateway_uses_the_generated_one() -> None:
    rev = _review(apiKeysSecret=None)
    volumes = {v["name"]: v for v in _pod(rev)["volumes"]}
    name = f"{rev.resource.metadata.name}-gateway-api-keys"
    assert volumes["api-keys"]["secret"]["secretName"] == name
    secret = generated_api_keys_secret(rev, "sk-random")
    assert secret is not None and secret["metadata"]["name"] == name
    assert secret["stringData"] == {GENERATED_KEY_ID: "sk-random"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID  # it goes with the QwenDeployment
    wiring = loopback_wiring(Path("/tmp/unused"), ["http://127.0.0.1:1"])
    assert "keys.map" not in config_files(_review(apiKeysSecret=None, auth="none"), wiring)["nginx.conf"]
    assert "keys.map" in config_files(rev, wiring)["nginx.conf"]
    assert generated_api_keys_secret(_review(apiKeysSecret="chat-keys"), "k") is None
    assert generated_api_keys_secret(_review(apiKeysSecret=None, auth="none"), "k") is None


def test_router_discovers_the_engine_pods_of_this_deployment() -> None:
    rev = _review(policy="round_robin")
    args = _containers(rev)["router"]["args"]
    assert args == router_args(rev)
    assert "--worker-urls" not in args
    selector = args[args.index("--selector") + 1 : args.index("--service-discovery-namespace")]
    assert dict(s.split("=", 1) for s in selector) == names.selector(rev.resource, "engine")
    assert args[args.index("--service-discovery-namespace") + 1] == rev.resource.metadata.namespace
    assert args[args.index("--service-discovery-port") + 1] == "8000"
    assert args[args.index("--policy") + 1] == "round_robin"
    assert args[args.index("--host") + 1] == "127.0.0.1"  # admin routes never leave the pod


def test_limits_are_shared_out_across_replicas() -> None:
    rev = _review(
        replicas=3,
        rateLimit={"requestsPerMinute": 100, "burst": 10},
        maxConcurrentRequests=90,
        queueSize=30,
        queueTimeoutSeconds=7,
    )
    limits = Limits.of(rev)
    assert (limits.rate_per_minute, limits.burst) == (33, 2)  # rounded down: 3 x 33 <= 100, 3 x 3 <= 11
    assert (limits.max_concurrent, limits.queue_size, limits.in_flight) == (30, 10, 40)
    assert limits.retry_after == 2  # 60 s / 33 per minute, rounded up
    args = router_args(rev)
    assert args[args.index("--max-concurrent-requests") + 1] == "30"
    assert args[args.index("--queue-size") + 1] == "10"
    assert args[args.index("--queue-timeout-secs") + 1] == "7"
    conf = gateway.nginx_conf(rev)
    assert "rate=33r/m" in conf and "burst=2 nodelay" in conf and "limit_conn in_flight 40;" in conf


def test_timeouts_follow_the_spec() -> None:
    rev = _review(requestTimeoutSeconds=1234, connectTimeoutSeconds=3)
    conf = gateway.nginx_conf(rev)
    assert "proxy_read_timeout 1234s;" in conf and "proxy_connect_timeout 3s;" in conf
    assert "proxy_buffering off;" in conf
    args = router_args(rev)
    assert args[args.index("--request-timeout-secs") + 1] == "1234"
    # A pod drains at most 600 s by default: a node drain is not held for the whole request timeout.
    assert _pod(rev)["terminationGracePeriodSeconds"] == 600 + 15
    assert "worker_shutdown_timeout 1234s;" in conf  # a reload (key rotation) keeps long streams
    assert "left=600\n" in gateway.config_files(rev, _WIRING)["run-nginx.sh"]


@pytest.mark.parametrize(
    ("gateway_spec", "grace", "drain"),
    [
        ({"requestTimeoutSeconds": 120}, 135, 120),  # the request timeout, plus 15 s to leave and exit
        ({"requestTimeoutSeconds": 7200}, 615, 600),  # capped: 128K-token requests run for hours
        ({"requestTimeoutSeconds": 7200, "terminationGracePeriodSeconds": 3615}, 3615, 3600),  # asked for
        ({"requestTimeoutSeconds": 60, "terminationGracePeriodSeconds": 900}, 900, 60),  # no stream outlives
    ],
)
def test_a_gateway_pod_drains_within_its_grace_period(
    gateway_spec: dict[str, int], grace: int, drain: int
) -> None:
    rev = _review(**gateway_spec)
    assert rev.plan.gateway_drain_seconds == drain
    pod = _pod(rev)
    assert pod["terminationGracePeriodSeconds"] == grace
    assert f"left={drain}\n" in gateway.config_files(rev, _WIRING)["run-nginx.sh"]
    router = next(c for c in pod["containers"] if c["name"] == "router")
    wait = router["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert f"time.monotonic() + {drain + 5}\n" in wait  # routes until nginx has drained


def test_the_default_policy_keeps_conversations_on_one_engine() -> None:
    """consistent_hash: no extra call per request; nginx names the conversation (tested below)."""
    args = router_args(_review())
    assert args[args.index("--policy") + 1] == "consistent_hash"
    assert "proxy_set_header X-Session-Id $session_id;" in gateway.nginx_conf(_review())


def test_balance_threshold_scales_with_the_engine_batch() -> None:
    body = copy.deepcopy(load(EXAMPLES[0]))
    body["spec"]["engine"]["maxNumSeqs"] = 256
    assert gateway.balance_abs_threshold(review(body)) == 64  # vllm-router's own default
    body["spec"]["engine"]["maxNumSeqs"] = 8
    assert gateway.balance_abs_threshold(review(body)) == 2


def test_configuration_changes_roll_the_pods() -> None:
    def config_hash(rev: Review) -> str:
        template = _one(build_gateway(rev), "Deployment")["spec"]["template"]
        return str(template["metadata"]["annotations"]["qwenops.dev/config-hash"])

    base = config_hash(_review())
    assert config_hash(_review()) == base
    assert config_hash(_review(rateLimit={"requestsPerMinute": 60})) != base


def test_images_are_the_tested_versions() -> None:
    dockerfile = (REPO / "images" / "gateway" / "Dockerfile").read_text()
    requirements = (REPO / "images" / "gateway" / "requirements.txt").read_text()
    assert f"vllm-router=={versions.VLLM_ROUTER}" in requirements.splitlines()
    assert f"NGINX_VERSION={versions.NGINX}-" in dockerfile
    assert versions.LOG_EXPORTER_IMAGE.endswith(f":{versions.NGINXLOG_EXPORTER}")
    assert versions.NGINX_EXPORTER_IMAGE.endswith(f":{versions.NGINX_EXPORTER.lstrip('v')}")
    version = subprocess.run([str(nginx_bin()), "-v"], capture_output=True, text=True).stderr
    assert f"nginx/{versions.NGINX}" in version


# --- the real programs accept what is rendered --------------------------------------------------------


def _render(rev: Review, root: Path, keys: dict[str, str] | None, engine_key: str | None) -> Path:
    wiring = loopback_wiring(root, ["http://127.0.0.1:9"])
    config = Path(wiring.config_dir)
    config.mkdir(parents=True)
    for name, text in config_files(rev, wiring).items():
        (config / name).write_text(text)
    if keys is not None:
        write_secret_volume(Path(wiring.api_keys_dir), keys)
    if engine_key is not None:
        write_secret_volume(Path(wiring.engine_key_file).parent, {"token": engine_key})
    subprocess.run(["/bin/sh", str(config / "run-nginx.sh"), "render"], check=True, capture_output=True)
    return root


def _with_model_access() -> Review:
    served = _review().resource.spec.served_model_name
    return _review(modelAccess=[{"apiKeys": ["team-a"], "models": [served]}])


@pytest.mark.parametrize("variant", ["keys", "keys-and-engine-key", "no-auth", "model-access"])
def test_nginx_accepts_the_rendered_config(variant: str, tmp_path: Path) -> None:
    variants = {"no-auth": lambda: _review(apiKeysSecret=None), "model-access": _with_model_access}
    rev = variants.get(variant, _review)()
    if variant == "keys-and-engine-key":
        rev = _with_engine_key(rev)
    keys = {"team-a": "sk-0123456789abcdef"} if variant != "no-auth" else None
    engine_key = "engine-0123456789" if variant == "keys-and-engine-key" else None
    root = _render(rev, tmp_path, keys, engine_key)
    result = nginx_check(root / "config" / "nginx.conf")
    assert result.returncode == 0, result.stderr
    assert "[warn]" not in result.stderr, result.stderr


def test_run_nginx_renders_keys_like_kubelet_mounts_them(tmp_path: Path) -> None:
    keys = {
        "team-a": "sk-aaaaaaaaaaaaaaaa\n",  # a trailing newline (echo > file) is dropped
        "team-b": "sk-bbbbbbbbbbbbbbbb",
        "copy-of-a": "sk-aaaaaaaaaaaaaaaa",  # the same key twice: the second id is skipped
        "quoted": 'sk-"; evil',  # would break the nginx config: skipped
        "empty": "",
    }
    root = _render(_with_engine_key(_review()), tmp_path, keys, "engine-secret\n")
    state = root / "state"
    lines = sorted((state / "keys.map").read_text().splitlines())
    a, b = '"~^[Bb]earer +sk-aaaaaaaaaaaaaaaa$"', '"~^[Bb]earer +sk-bbbbbbbbbbbbbbbb$"'
    assert lines in ([f'{a} "copy-of-a";', f'{b} "team-b";'], [f'{a} "team-a";', f'{b} "team-b";'])
    engine_auth = (state / "engine-auth.conf").read_text()
    assert engine_auth == 'proxy_set_header Authorization "Bearer engine-secret";\n'


def test_regex_characters_in_keys_are_escaped(tmp_path: Path) -> None:
    root = _render(_review(), tmp_path, {"team-a": "sk.a+b/c=d~e_f-g"}, None)
    line = (root / "state" / "keys.map").read_text().strip()
    assert line == r'"~^[Bb]earer +sk\.a\+b/c=d~e_f-g$" "team-a";'


def test_without_an_engine_key_the_client_key_is_dropped(tmp_path: Path) -> None:
    root = _render(_review(), tmp_path, {"team-a": "sk-0123456789abcdef"}, None)
    assert (root / "state" / "engine-auth.conf").read_text() == 'proxy_set_header Authorization "";\n'


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_vllm_router_accepts_the_rendered_command_line(example: Path, tmp_path: Path) -> None:
    """The pod's exact arguments (Kubernetes discovery included) with only the ports moved to free ones;
    outside a cluster the router logs that discovery is unavailable and serves anyway. The engine key is
    expanded as the kubelet does, with a key that begins with "-" (token_urlsafe's alphabet has it)."""
    rev = _review(example)
    args = kubelet_args(router_args(rev), {ENGINE_KEY_ENV: "-Zk3_generated-engine-key"})
    port, metrics_port = free_port(), free_port()
    for flag, value in (("--port", port), ("--prometheus-port", metrics_port)):
        args[args.index(flag) + 1] = str(value)
    args[args.index("--prometheus-host") + 1] = LOOPBACK
    proc = spawn("router", [str(vllm_router_bin()), *args], tmp_path, port=port)
    with running(proc):
        wait_ready(proc, "/liveness", 30)
        assert http_get(f"http://{LOOPBACK}:{metrics_port}/metrics")[0] == 200
        log = proc.tail(200)
    assert "Router ready" in log
    assert "health checker for workers with 5s interval" in log  # the rendered flags took effect


def test_log_exporter_accepts_its_rendered_config(tmp_path: Path) -> None:
    root = _render(_review(), tmp_path, {"team-a": "sk-0123456789abcdef"}, None)
    config = root / "config" / "nginxlog-exporter.yml"
    result = subprocess.run(
        [str(nginxlog_exporter_bin()), "-config-file", str(config), "-verify-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    assert parsed["namespaces"][0]["name"] == gateway.LOG_METRICS_NAMESPACE


def test_nginx_exporter_accepts_its_rendered_args(tmp_path: Path) -> None:
    wiring = loopback_wiring(tmp_path, [])
    proc = spawn(
        "nginx-exporter",
        [str(nginx_exporter_bin()), *gateway.nginx_exporter_args(wiring)],
        tmp_path,
        port=wiring.nginx_metrics_port,
    )
    with running(proc):
        wait_ready(proc, "/metrics", 30)
        body = http_get(f"{proc.url}/metrics")[1]
    assert "nginx_up 0" in body  # no nginx behind it here; the live tests scrape a real one


def test_render_cli_shows_the_gateway() -> None:
    from support import cli_in_process

    result = cli_in_process("render", "-f", str(EXAMPLES[0]))
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    gateway_names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    name = load(EXAMPLES[0])["metadata"]["name"]
    assert ("ConfigMap", f"{name}-gateway") in gateway_names
    assert ("Deployment", f"{name}-gateway") in gateway_names
    assert ("Service", name) in gateway_names
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert set(config_map["data"]) == {"nginx.conf", "run-nginx.sh", "nginxlog-exporter.yml", "errors.js"}


# --- routing: the turns of a conversation on one engine -----------------------------------------------

SYSTEM = "You are a helpful assistant. " * 200
FIRST = "What is the capital of France, please?"


def _chat_body(*messages: tuple[str, str], content_first: bool = False) -> dict[str, Any]:
    as_json = [{"content": c, "role": r} if content_first else {"role": r, "content": c} for r, c in messages]
    return {"model": "Qwen/Qwen3-32B", "messages": as_json, "max_tokens": 2}


class _SessionIds(http.server.ThreadingHTTPServer):
    """Stands in for the router behind nginx: answers 200 and keeps each request's X-Session-Id."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.seen.append(self.headers.get("X-Session-Id"))
                self._reply()

            def do_GET(self) -> None:  # nginx's /ready probe
                self._reply()

            def _reply(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__((LOOPBACK, 0), Handler)


@contextlib.contextmanager
def _nginx_in_front_of(port: int, root: Path, rev: Review | None = None) -> Iterator[str]:
    """The rendered nginx (keys on) with its router upstream at `port`; yields the chat completions URL."""
    root.chmod(0o755)  # nginx's workers drop root: they must reach the temp directory
    wiring = dataclasses.replace(loopback_wiring(root, []), router_port=port)
    config = Path(wiring.config_dir)
    config.mkdir(parents=True)
    rev = rev or _review(rateLimit={"requestsPerMinute": 60_000, "burst": 1_000})
    for name, text in config_files(rev, wiring).items():
        (config / name).write_text(text)
    write_secret_volume(Path(wiring.api_keys_dir), {"team-a": "sk-0123456789abcdef"})
    Path(wiring.temp_dir).mkdir(parents=True)
    Path(wiring.temp_dir).chmod(0o777)
    path = f"{nginx_bin().parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    proc = spawn(
        "nginx", ["/bin/sh", str(config / "run-nginx.sh")], root, env={"PATH": path}, port=wiring.status_port
    )
    with running(proc):
        wait_ready(proc, "/ready", 30)
        yield f"http://{LOOPBACK}:{wiring.http_port}/v1/chat/completions"


def test_nginx_names_the_conversation_of_a_chat(tmp_path: Path) -> None:
    """Every turn of a chat gets the same X-Session-Id, a bucket of the start of its first user message
    (its JSON text, either key order, any language); a client's own X-Session-Id is bucketed instead;
    no text reaches the router; requests without a first user message of 16 bytes get none."""
    recorder = _SessionIds()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    auth = {"Authorization": "Bearer sk-0123456789abcdef", "Content-Type": "application/json"}
    first_turn = _chat_body(("system", SYSTEM), ("user", FIRST))
    later_turn = _chat_body(
        ("system", SYSTEM), ("user", FIRST), ("assistant", "Paris."), ("user", "And Spain?")
    )
    cases: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
        "first turn": (first_turn, {}),
        "later turn": (later_turn, {}),
        "content first": (_chat_body(("system", SYSTEM), ("user", FIRST), content_first=True), {}),
        "escapes": (_chat_body(("user", 'Say "hi"\nthen stop, please.')), {}),
        "other conversation": (_chat_body(("system", SYSTEM), ("user", "Tell me a story about a fox.")), {}),
        "not ascii": (_chat_body(("user", "Größe der Stadt München, bitte?")), {}),
        "too short": (_chat_body(("user", "Hi"), ("assistant", "Hello!")), {}),
        "no user message": (_chat_body(("system", SYSTEM)), {}),
        "completion": ({"model": "Qwen/Qwen3-32B", "prompt": FIRST * 3}, {}),
        "client's id": (later_turn, {"X-Session-Id": "client-7"}),
        "client's id again": (_chat_body(("user", "Hi")), {"X-Session-Id": "client-7"}),
    }
    spread = [_chat_body(("user", f"Question number {n} about something else")) for n in range(200)]
    try:
        with _nginx_in_front_of(recorder.server_address[1], tmp_path) as url:
            for body, headers in [*cases.values(), *((b, {}) for b in spread)]:
                raw = json.dumps(body, ensure_ascii=False).encode()  # as httpx and most clients send it
                assert requests.post(url, data=raw, headers=auth | headers, timeout=10).status_code == 200
    finally:
        recorder.shutdown()
    seen = dict(zip(cases, recorder.seen, strict=False))
    named = {case: seen[case] for case in cases if case not in ("too short", "no user message", "completion")}
    assert all(re.fullmatch(r"c\d{1,3}", str(name)) for name in named.values()), seen
    assert seen["first turn"] == seen["later turn"] == seen["content first"]
    assert len({seen["first turn"], seen["other conversation"], seen["escapes"], seen["not ascii"]}) == 4
    assert seen["too short"] is seen["no user message"] is seen["completion"] is None
    assert seen["client's id"] == seen["client's id again"]
    assert len(set(recorder.seen[len(cases) :])) > 150  # 200 conversations over 1000 buckets


# --- the engines' adapter-loading routes stay behind the gateway ----------------------------------------


def test_nginx_never_forwards_the_adapter_loading_routes(tmp_path: Path) -> None:
    """With spec.lora the engines serve /v1/load_lora_adapter and /v1/unload_lora_adapter
    (VLLM_ALLOW_RUNTIME_LORA_UPDATING), and vLLM 0.32's SageMaker layer adds POST /adapters and DELETE
    /adapters/{name}, which --api-key does not guard: for the operator only. The gateway answers them 404
    itself, with the OpenAI-style body, and nothing reaches the router (the routes do not depend on the
    spec)."""
    recorder = _SessionIds()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    auth = {"Authorization": "Bearer sk-0123456789abcdef"}
    body = {"lora_name": "sql", "lora_path": "/models/loras/sql"}
    paths = [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/v1/load_lora_adapter/",
        "/v1//load_lora_adapter",
        "/adapters",
        "/adapters/sql",
    ]
    try:
        with _nginx_in_front_of(recorder.server_address[1], tmp_path) as url:
            base = url.removesuffix("/v1/chat/completions")
            for path in paths:
                for method in ("POST", "GET", "DELETE"):
                    response = requests.request(method, base + path, json=body, headers=auth, timeout=10)
                    assert response.status_code == 404, (method, path, response.text)
                    assert response.headers["content-type"] == "application/json"
                    assert response.json()["error"]["code"] == "unknown_url"
            chat = _chat_body(("user", "Hi"))
            assert requests.post(url, json=chat, headers=auth, timeout=10).status_code == 200
    finally:
        recorder.shutdown()
    assert recorder.seen == [None], "only the chat completion may reach the router"


def test_an_adapters_requests_are_hashed_on_its_name(tmp_path: Path) -> None:
    """With spec.lora, a request for any model but the base one carries X-Session-Id lora-<model>, so
    the router keeps each adapter on few engines; the base model's chats keep their conversation bucket.
    The served name is written into nginx.conf escaped (a leading ~ would make it a regular expression).
    nginx reads the model as the body's JSON spells it, so names that JSON escapes (quotes, backslashes)
    would not match their own requests; map_key keeps nginx.conf valid for them all the same."""
    body = copy.deepcopy(load(EXAMPLES[0]))
    body["spec"]["gateway"] = {"rateLimit": {"requestsPerMinute": 60_000, "burst": 1_000}}
    body["spec"]["model"]["servedModelName"] = served = "~qwen-32b base"
    body["spec"]["model"]["cache"] = {"claimName": "models"}
    body["spec"]["lora"] = {"adapters": [{"name": "sql", "source": {"path": "loras/sql"}}]}
    rev = review(body)
    assert rev.ok, rev.plan.errors
    recorder = _SessionIds()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    auth = {"Authorization": "Bearer sk-0123456789abcdef", "Content-Type": "application/json"}
    chat = _chat_body(("user", FIRST))
    try:
        with _nginx_in_front_of(recorder.server_address[1], tmp_path, rev) as url:
            for model in ("sql", "sql", served, "other"):
                sent = requests.post(url, json={**chat, "model": model}, headers=auth, timeout=10)
                assert sent.status_code == 200
    finally:
        recorder.shutdown()
    assert recorder.seen[:2] == ["lora-sql", "lora-sql"]
    assert re.fullmatch(r"c\d{1,3}", str(recorder.seen[2])), recorder.seen  # the base model: its bucket
    assert recorder.seen[3] == "lora-other"  # the engines answer an unknown model with their 404


def test_map_key_keeps_nginx_conf_valid_for_any_served_name() -> None:
    assert gateway.nginx.map_key('a "b" \\ c') == 'a \\"b\\" \\\\ c'
    assert gateway.nginx.map_key("~x") == "\\~x" and gateway.nginx.map_key("default") == "\\default"


# --- holding requests at zero (autoscaling.minReplicas 0) ----------------------------------------------


def _holding(**gateway_fields: Any) -> Review:
    rev = _review(REPO / "tests" / "golden" / "inputs" / "scale-to-zero.yaml", **gateway_fields)
    assert rev.holding is not None
    return rev


def _overloaded_location(conf: str) -> str:
    found = re.search(r"\n        location @overloaded \{\n(.*?)\n        \}\n", conf, re.S)
    assert found, "no @overloaded location"
    return found.group(1)


def test_a_reload_keeps_a_held_request_to_its_end() -> None:
    """A key rotation reloads nginx; its old workers must outlive a request held at zero and then served:
    the hold, then the request timeout."""
    rev = _holding(requestTimeoutSeconds=1234)
    assert rev.holding is not None
    shutdown = int(re.findall(r"^worker_shutdown_timeout (\d+)s;$", gateway.nginx_conf(rev), re.M)[0])
    assert shutdown >= rev.holding.hold_seconds + 1234


@pytest.mark.parametrize(("auth", "key"), [("apiKeys", "$key_id"), ("none", "$remote_addr")])
def test_only_the_activator_gets_the_key_of_a_held_request(auth: str, key: str, tmp_path: Path) -> None:
    """The activator shares its held places out by key: nginx sets the key header (never the client's
    copy) on the requests it hands the activator, and on no other."""
    rev = _holding(auth=auth)
    conf = gateway.nginx_conf(rev)
    setting = f"proxy_set_header X-Qwen-Hold-Key-Id {key};"
    assert setting in _overloaded_location(conf)
    assert conf.count("X-Qwen-Hold-Key-Id") == 1
    root = _render(rev, tmp_path, {"team-a": "sk-0123456789abcdef"} if auth == "apiKeys" else None, None)
    result = nginx_check(root / "config" / "nginx.conf")
    assert result.returncode == 0, result.stderr
    assert "[warn]" not in result.stderr, result.stderr


#: The longest API key id the spec allows (a Secret's data key).
LONG_KEY_ID = "k" * 253
#: Characters a name might hold: every ASCII one (control characters too) and one outside ASCII.
_CANDIDATE_CHARACTERS = [*map(chr, range(1, 128)), "é"]


def _accepted(field: str, make: Any) -> str:
    """The candidate characters the spec accepts in one name field (`make(name)` builds the body)."""
    accepted = []
    for char in _CANDIDATE_CHARACTERS:
        try:
            review(make(f"x{char}"))
        except SpecError:
            continue
        accepted.append(char)
    assert accepted, field
    return "".join(accepted)


def _every_name_kind(served: str, routed: str) -> dict[str, Any]:
    """A deployment whose every name nginx.conf and model-access.js carry is `served` (the base model) or
    built of `routed` (tiers, their spill-over and per-key limits, an alias and its picks, a limited key,
    an adapter), as long as the spec allows, at zero replicas so that the held /v1/models lists render
    too; the limited keys' ids are as long as the spec allows."""
    body = copy.deepcopy(load(EXAMPLES[0]))
    body["metadata"]["uid"] = UID
    body["spec"]["model"]["servedModelName"] = served
    body["spec"]["lora"] = {
        "adapters": [{"name": "a-0", "source": {"huggingFace": {"repo": "my-org/a-0", "revision": "0" * 40}}}]
    }
    body["spec"].pop("replicas", None)
    body["spec"]["autoscaling"] = dict(KEDA_AT_ZERO)
    small, medium, alias = (f"{prefix}{routed * 3}"[:256] for prefix in ("~1", "default", "2"))
    body["spec"]["gateway"] |= {
        "tiers": [
            {"name": small, "deploymentRef": {"name": "small"}, "spillTo": medium},
            {"name": medium, "deploymentRef": {"name": "medium"}, "rateLimit": {"requestsPerMinute": 60}},
        ],
        "aliases": [
            {
                "name": alias,
                "rules": [{"model": small, "header": {"name": "X-Tier", "value": f"v{routed}"[:256]}}],
                "default": served,
            }
        ],
        "modelAccess": [
            {"apiKeys": ["team-a"], "models": [small, alias]},
            {"apiKeys": [LONG_KEY_ID], "models": [served, "a-0", medium]},
        ],
    }
    return body


def test_every_name_the_spec_accepts_renders_a_config_nginx_accepts(tmp_path: Path) -> None:
    """Each name field takes the characters the spec allows it, all at once; nginx -t reads nginx.conf
    and compiles model-access.js (njs), so a name nginx or njs would read otherwise fails here."""
    served = _accepted("servedModelName", lambda name: _every_name_kind(name, "x"))
    routed = _accepted("tier and alias names", lambda name: _every_name_kind("base", name))
    rev = review(_every_name_kind(served, routed))
    root = _render(rev, tmp_path, {"team-a": "sk-0123456789abcdef", LONG_KEY_ID: "sk-fedcba9876543210"}, None)
    conf = root / "config" / "nginx.conf"
    assert served in conf.read_text() and routed in (root / "config" / "model-access.js").read_text()
    assert LONG_KEY_ID in (root / "state" / "keys.map").read_text()
    result = nginx_check(conf)
    assert result.returncode == 0, result.stderr
    assert "[warn]" not in result.stderr, result.stderr


def test_a_tier_spills_only_the_keys_that_may_use_its_spill_target() -> None:
    """The spill-over backup is an upstream of its own: keys limited to models without the spill target
    get the tier's router alone (their access group, which only nginx sets, picks it)."""
    served = _review().resource.spec.served_model_name
    rev = _review(
        tiers=[{"name": "small", "deploymentRef": {"name": "small"}, "spillTo": served}],
        modelAccess=[
            {"apiKeys": ["small-only"], "models": ["small"]},
            {"apiKeys": ["small-and-base"], "models": ["small", served]},
        ],
    )
    conf = gateway.nginx_conf(rev)
    denied = re.search(r"map \$http_x_qwen_access_group \$tier_t0_upstream \{\n(.*?)\n    \}", conf, re.S)
    assert denied, conf
    assert denied.group(1).split("\n") == ["        default tier_t0_route;", "        m0 tier_t0_alone;"]
    assert "proxy_pass http://$tier_t0_upstream;" in conf
    assert re.search(r"upstream tier_t0_alone \{\n[^}]*max_fails=0;\n        keepalive 64;\n    \}", conf)
    # the client's copies are replaced on the way in; the spill target gets the key id, not the group
    assert "proxy_set_header X-Qwen-Access-Group $tier_access_group;" in conf
    assert "proxy_set_header X-Qwen-Key-Id $http_x_qwen_key_id;" in conf
