"""A QwenDeployment really served on the dev cluster's real node, end to end, with nothing simulated:

the chart's operator pod (from its image built here, under its RBAC) reconciles the dev QwenDeployment
(examples/dev/cpu-real-node.yaml); the engine is the CPU build of vLLM in its image (TP 1 here, see the
fixture; `make demo` serves TP 2), reading the
tiny model from a model cache PVC; the gateway pod (nginx + vllm-router, restricted Pod Security) finds
the engine pods through the API with its own ServiceAccount and routes to them. Every answer is checked
to come from a pod on the real node, and the engine's own metrics count it.

Tests run in file order on one served deployment: serve, roll with traffic, scale out, then the cases
that need a deployment of their own.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from qwen_devtools import serving
from qwen_devtools.capacity import CapacityWatch
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster import nodebuild
from qwen_devtools.devcluster.nodecomponents import NODE_NAME
from qwen_devtools.net import http_get
from qwen_devtools.operator_proc import assert_settled_writes_nothing
from qwen_devtools.realparts.lora import write_random_lora
from qwen_devtools.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.real_node, pytest.mark.engine]

NAMESPACE = "e2e-serving"
NAME = "chat-dev"
ENGINE_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=engine"
GATEWAY_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=gateway"
OPERATOR_USER = f"system:serviceaccount:{serving.OPERATOR_NAMESPACE}:{serving.RELEASE}"


@dataclass
class Served:
    cluster: devcluster.Cluster
    key: str
    url: str
    #: Ready condition seen while the engine pod existed but was not ready yet (None: never seen).
    ready_before_engine: dict[str, Any] | None = None
    seconds_to_ready: float = 0.0
    notes: list[str] = field(default_factory=list)

    def kubectl_json(self, *args: str) -> Any:
        return serving.get_json(self.cluster, *args)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items = self.kubectl_json("-n", NAMESPACE, "get", "pods", "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def qwd(self, name: str = NAME) -> dict[str, Any]:
        return dict(self.kubectl_json("-n", NAMESPACE, "get", "qwd", name))

    def patch(self, spec: dict[str, Any], name: str = NAME) -> None:
        self.cluster.kubectl(
            "-n", NAMESPACE, "patch", "qwd", name, "--type=merge", "-p", json.dumps({"spec": spec})
        )


@pytest.fixture(scope="module")
def served(real_cluster: devcluster.Cluster) -> Iterator[Served]:
    assert real_cluster.name
    serving.load_images(real_cluster.name)
    serving.install_operator(real_cluster)
    serving.prepare_namespace(real_cluster, NAMESPACE)
    body = serving.dev_qwendeployment(namespace=NAMESPACE)
    # TP 1 here: the rollout and scale-out tests run two engines at once on 2 cores, and two TP-2
    # engines' workers (each pinned to both cores, busy-polling their shared-memory queues) starve the
    # starting one for minutes. `make demo` serves the TP-2 default.
    body["spec"]["parallelism"]["tensor"] = 1
    # Without torch.compile an engine starts in about 40 s instead of 70-300 s beside a busy one.
    body["spec"]["engine"]["extraArgs"] = ["--enforce-eager"]
    serving.model_cache(real_cluster, NAMESPACE, body["spec"]["model"]["cache"]["claimName"])
    key = serving.api_key_secret(real_cluster, NAMESPACE, body["spec"]["gateway"]["apiKeysSecret"])
    started = time.monotonic()
    serving.apply(real_cluster, body)
    stack = Served(real_cluster, key, "")
    stack.ready_before_engine = _ready_while_engine_starts(stack)
    serving.wait_serving(real_cluster, NAMESPACE, NAME)
    stack.seconds_to_ready = time.monotonic() - started
    stack.url = serving.service_url(real_cluster, NAMESPACE, NAME)
    yield stack
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    serving.uninstall_operator(real_cluster)


def _ready_while_engine_starts(stack: Served) -> dict[str, Any] | None:
    """The Ready condition once the engine container runs but has not passed readiness yet."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for pod in stack.pods(ENGINE_SELECTOR):
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if statuses and "running" in statuses[0]["state"] and not statuses[0]["ready"]:
                time.sleep(5)  # the operator reconciles on the pod's events; give it one
                conditions = stack.qwd().get("status", {}).get("conditions", [])
                return next((c for c in conditions if c["type"] == "Ready"), None)
        time.sleep(1)
    return None


def _engine_requests(pod: dict[str, Any]) -> float:
    """vllm:request_success_total of one engine, read from its own /metrics on the pod IP."""
    status, text = serving.pod_get(f"http://{pod['status']['podIP']}:8000/metrics")
    assert status == 200, text[:300]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def _chat_ok(stack: Served, prompt: str = "Say hello.") -> str:
    status, body = serving.chat(stack.url, stack.key, prompt)
    assert status == 200, body
    return str(body["choices"][0]["message"].get("content") or body["choices"][0]["message"])


# --- the served deployment ---------------------------------------------------------------------------


def test_chat_completion_through_the_gateway_is_answered_on_the_real_node(served: Served) -> None:
    (engine,) = served.pods(ENGINE_SELECTOR)
    (gateway,) = served.pods(GATEWAY_SELECTOR)
    assert engine["spec"]["nodeName"] == NODE_NAME and gateway["spec"]["nodeName"] == NODE_NAME
    before = _engine_requests(engine)
    answer = _chat_ok(served)
    assert answer
    assert _engine_requests(engine) == before + 1  # this engine, no other, answered
    status, body = serving.chat(served.url, "sk-not-a-key", "hi")
    assert status == 401, body


def test_ready_only_once_an_engine_passes_readiness(served: Served) -> None:
    assert served.ready_before_engine is not None, "never saw the engine running but not ready"
    assert served.ready_before_engine["status"] == "False"
    assert served.ready_before_engine["reason"] in ("NoReadyReplicas", "GatewayNotReady")
    status = served.qwd()["status"]
    assert status["readyReplicas"] == 1 and status["replicasSummary"] == "1/1"


def test_slow_starting_engine_is_not_killed(served: Served) -> None:
    """The engine takes longer to start than its readiness and liveness probes allow: the startup
    probe's budget (sized from the weights) holds them off, and the container never restarted."""
    (engine,) = served.pods(ENGINE_SELECTOR)
    container = engine["spec"]["containers"][0]
    status = engine["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0
    started = _time(status["state"]["running"]["startedAt"])
    ready = _time(
        next(c for c in engine["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    )
    readiness = container["readinessProbe"]
    startup = container["startupProbe"]
    assert ready - started > readiness["periodSeconds"] * readiness["failureThreshold"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def _time(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_operator_runs_as_a_pod_under_the_charts_rbac(served: Served) -> None:
    pods = served.kubectl_json("-n", serving.OPERATOR_NAMESPACE, "get", "pods")["items"]
    operators = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "qwen-operator"]
    assert len(operators) == 2  # the chart's default: a leader and a standby
    for operator in operators:
        assert operator["spec"]["nodeName"] == NODE_NAME
        assert operator["status"]["phase"] == "Running"
        assert operator["spec"]["serviceAccountName"] == serving.RELEASE
    lease = served.kubectl_json("-n", serving.OPERATOR_NAMESPACE, "get", "lease", "qwen-operator")
    assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in operators}
    lines = (served.cluster.kubeconfig.parent / "audit.log").read_text().splitlines()
    audit = [json.loads(line) for line in lines if line.strip()]
    status_writes = [
        e
        for e in audit
        if e.get("user", {}).get("username") == OPERATOR_USER
        and e.get("objectRef", {}).get("subresource") == "status"
        and e.get("objectRef", {}).get("name") == NAME
    ]
    assert status_writes, "the operator pod's ServiceAccount never wrote the status"


def test_router_discovers_engines_with_its_own_service_account(served: Served) -> None:
    (gateway,) = served.pods(GATEWAY_SELECTOR)
    log = served.cluster.kubectl("-n", NAMESPACE, "logs", gateway["metadata"]["name"], "-c", "router").stdout
    (engine,) = served.pods(ENGINE_SELECTOR)
    assert engine["status"]["podIP"] in log, log[-2000:]
    can_i = served.cluster.kubectl(
        "auth", "can-i", "list", "pods", "-n", NAMESPACE,
        f"--as=system:serviceaccount:{NAMESPACE}:{NAME}-gateway", check=False,
    )  # fmt: skip
    assert can_i.stdout.strip() == "yes"
    cannot = served.cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-n", NAMESPACE,
        f"--as=system:serviceaccount:{NAMESPACE}:{NAME}-gateway", check=False,
    )  # fmt: skip
    assert cannot.stdout.strip() == "no"


def test_max_model_len_edit_rolls_engines_with_zero_failed_requests(served: Served) -> None:
    (old,) = served.pods(ENGINE_SELECTOR)
    results: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            status, _ = serving.chat(served.url, served.key, "Count to three.", max_tokens=4, timeout=120)
            results.append(status)
            time.sleep(0.5)

    client = threading.Thread(target=traffic, daemon=True)
    client.start()
    try:
        served.patch({"engine": {"maxModelLen": 512}})

        def rolled() -> bool:
            pods = served.pods(ENGINE_SELECTOR)
            gone = all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in pods)
            ready = [p for p in pods if all(s["ready"] for s in p["status"].get("containerStatuses", []))]
            return (
                gone
                and len(ready) == 1
                and "--max-model-len" in _args(ready[0])
                and _value(ready[0], "--max-model-len") == "512"
            )

        wait_until(rolled, 600, "the engine rolled to maxModelLen 512", interval=3)
        time.sleep(5)
    finally:
        stop.set()
        client.join(timeout=150)
    assert results, "no request was sent during the rollout"
    failed = [s for s in results if s != 200]
    assert failed == [], f"{len(failed)} of {len(results)} requests failed during the rollout: {failed}"
    assert served.qwd()["status"]["rolloutStrategy"].startswith("Surge")


def _args(pod: dict[str, Any]) -> list[str]:
    return list(pod["spec"]["containers"][0]["args"])


def _value(pod: dict[str, Any], flag: str) -> str:
    args = _args(pod)
    return args[args.index(flag) + 1]


def test_scaled_to_two_replicas_the_new_engine_gets_traffic(served: Served) -> None:
    (first,) = served.pods(ENGINE_SELECTOR)
    served.patch({"replicas": 2})
    serving.wait_serving(served.cluster, NAMESPACE, NAME)
    wait_until(lambda: served.qwd()["status"].get("readyReplicas") == 2, 300, "2 ready replicas")
    engines = served.pods(ENGINE_SELECTOR)
    assert len(engines) == 2 and all(p["spec"]["nodeName"] == NODE_NAME for p in engines)
    (second,) = [p for p in engines if p["metadata"]["uid"] != first["metadata"]["uid"]]
    before = _engine_requests(second)

    def new_engine_answered() -> bool:
        # consistent_hash puts each conversation (its first user message, 16 random hex digits here)
        # on the ring of the engines the router discovered: once the new engine is on it, about half
        # of the new conversations go there (4 miss it with probability 1/16 per try).
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: _chat_ok(served, secrets.token_hex(8)), range(4)))
        return _engine_requests(second) > before

    wait_until(new_engine_answered, 120, "a request answered by the new engine", interval=0.5)


class _Traffic:
    """Chat requests through the gateway, one after another, until stopped: every status kept."""

    def __init__(self, served: Served, key: str) -> None:
        self.served, self.key = served, key
        self.results: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, _ = serving.chat(self.served.url, self.key, "Count to three.", max_tokens=4, timeout=120)
            self.results.append(status)
            time.sleep(0.3)

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def failed(self) -> list[int]:
        assert self.results, "no request was sent"
        return [s for s in self.results if s != 200]


def test_autoscaling_turned_on_and_off_under_traffic_keeps_both_engines(served: Served) -> None:
    """Real engines, real requests: replicas 2 -> autoscaling {2, 3} -> replicas 2. The replicas field
    passes to the HPA at its value (the documented hand-off) and back: no engine stops, no request fails."""
    engines = {p["metadata"]["uid"] for p in served.pods(ENGINE_SELECTOR)}
    assert len(engines) == 2, "runs after the scale-out to two replicas"
    api = served.cluster.api_client()
    with (
        CapacityWatch(api, NAMESPACE, f"{NAME}-engine", f"{NAME}-engine") as seen,
        _Traffic(served, served.key) as t,
    ):
        start = time.time()
        served.patch({"replicas": None, "autoscaling": {"minReplicas": 2, "maxReplicas": 3}})
        wait_until(lambda: "autoscaling" in served.qwd()["status"], 60, "status.autoscaling")
        time.sleep(20)  # the HPA's first looks
        served.patch({"autoscaling": None, "replicas": 2})
        wait_until(lambda: "autoscaling" not in served.qwd()["status"], 60, "no status.autoscaling")
        time.sleep(10)
    assert t.failed() == [], f"{len(t.failed())} of {len(t.results)} requests failed"
    assert min(r or 0 for r in seen.replicas_seen(start)) >= 2, seen.replicas_seen(start)
    assert seen.lowest(start) >= (2, 2), f"capacity dropped: {seen.lowest(start)}"
    assert {p["metadata"]["uid"] for p in served.pods(ENGINE_SELECTOR)} == engines, "an engine was replaced"
    print(f"[transitions] autoscaling on/off: {len(t.results)} requests, 0 failed, capacity kept 2/2")


def _wait_answered(served: Served, key: str, status: int, what: str) -> None:
    """Until a request with `key` gets `status` (the gateway reloads keys once kubelet updates the
    Secret's volume: about a minute)."""
    wait_until(lambda: serving.chat(served.url, key, "Hi.", max_tokens=2)[0] == status, 180, what, interval=2)


def test_api_key_rotation_under_traffic_fails_no_request(served: Served) -> None:
    """A new key added to the Secret works once the gateway reloads, the old one keeps working meanwhile;
    removed, the old key is refused. No request with a valid key fails, no gateway pod restarts."""
    secret = served.qwd()["spec"]["gateway"]["apiKeysSecret"]
    gateways = {p["metadata"]["uid"] for p in served.pods(GATEWAY_SELECTOR)}
    new_key = f"sk-{secrets.token_urlsafe(24)}"
    with _Traffic(served, served.key) as old_traffic:
        served.cluster.kubectl(
            "-n", NAMESPACE, "patch", "secret", secret, "--type=merge",
            "-p", json.dumps({"stringData": {"rotated": new_key}}),
        )  # fmt: skip
        _wait_answered(served, new_key, 200, "new key")
    assert old_traffic.failed() == [], f"the old key failed during the rotation: {old_traffic.failed()}"
    with _Traffic(served, new_key) as new_traffic:
        old, served.key = served.key, new_key
        current = served.kubectl_json("-n", NAMESPACE, "get", "secret", secret)["data"]
        demo = next(k for k in current if k != "rotated")
        served.cluster.kubectl(
            "-n", NAMESPACE, "patch", "secret", secret, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": f"/data/{demo}"}]),
        )  # fmt: skip
        _wait_answered(served, old, 401, "old key refused")
    assert new_traffic.failed() == [], f"the new key failed: {new_traffic.failed()}"
    assert {p["metadata"]["uid"] for p in served.pods(GATEWAY_SELECTOR)} == gateways, (
        "a gateway pod restarted"
    )
    sent = len(old_traffic.results) + len(new_traffic.results)
    print(f"[transitions] key rotation: {sent} requests, 0 failed")


def test_gateway_pods_meet_restricted_engines_need_baseline(served: Served) -> None:
    """The server's own Pod Security check of every running pod against restricted."""
    dry_run = served.cluster.kubectl(
        "label", "--dry-run=server", "--overwrite", "namespace", NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted",
    )  # fmt: skip
    warnings = dry_run.stderr
    engines = [p["metadata"]["name"] for p in served.pods(ENGINE_SELECTOR)]
    gateways = [p["metadata"]["name"] for p in served.pods(GATEWAY_SELECTOR)]
    assert all(name in warnings for name in engines) or "pods" in warnings, warnings
    assert not any(name in warnings for name in gateways), warnings
    labels = served.kubectl_json("get", "namespace", serving.OPERATOR_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


#: The engines' scrapers as serving.install_operator configures the chart: Prometheus pods of the dev
#: cluster's monitoring namespace.
SCRAPER_NAMESPACE = "qwen-monitoring"
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}


def _probe_pod(served: Served, namespace: str, name: str, url: str) -> dict[str, Any]:
    """GET ``url`` from a new pod (the pause image's /probe, restricted, Prometheus's labels) in
    ``namespace``; its result: ``status`` when it connected, ``error`` when not (10 s timeout)."""
    container = {
        "name": "probe",
        "image": nodebuild.pause_image().ref,
        "imagePullPolicy": "Never",
        "command": ["/probe"],
        "args": ["-get", url],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": PROMETHEUS_LABELS},
        "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1},
    }
    served.cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def finished() -> str | None:
        phase = served.kubectl_json("-n", namespace, "get", "pod", name).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    wait_until(finished, 120, f"probe pod {namespace}/{name} to finish", interval=1)
    log = served.cluster.kubectl("-n", namespace, "logs", name).stdout
    served.cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
    return dict(json.loads(next(line for line in log.splitlines() if line.startswith("{"))))


def test_engines_are_reached_only_by_their_gateway_and_the_configured_scrapers(served: Served) -> None:
    """The engine NetworkPolicy as the real node enforces it (kube-network-policies): a pod that carries
    Prometheus's label outside the configured scrapers' namespace, in another namespace or the engines'
    own, gets no connection to the engine port (vLLM's /invocations answers without the engine key);
    a Prometheus pod of the configured namespace gets /metrics; the gateway serves a new chat."""
    engine_ip = next(
        pod["status"]["podIP"]
        for pod in served.pods(ENGINE_SELECTOR)
        if all(c["ready"] for c in pod["status"].get("containerStatuses") or [{"ready": False}])
    )
    created = served.cluster.kubectl("create", "namespace", SCRAPER_NAMESPACE, check=False).returncode == 0
    served.cluster.kubectl("create", "namespace", "e2e-stranger", check=False)
    probes = {
        "scraper": (SCRAPER_NAMESPACE, f"http://{engine_ip}:8000/metrics"),
        "stranger elsewhere": ("e2e-stranger", f"http://{engine_ip}:8000/invocations"),
        "stranger beside the engines": (NAMESPACE, f"http://{engine_ip}:8000/invocations"),
    }
    try:
        with ThreadPoolExecutor(len(probes)) as pool:
            futures = {
                who: pool.submit(_probe_pod, served, ns, f"probe-{i}", url)
                for i, (who, (ns, url)) in enumerate(probes.items())
            }
            results = {who: future.result() for who, future in futures.items()}
    finally:
        served.cluster.kubectl("delete", "namespace", "e2e-stranger", "--wait=false", check=False)
        if created:
            served.cluster.kubectl("delete", "namespace", SCRAPER_NAMESPACE, "--wait=false", check=False)
    print(f"[network policy] {json.dumps(results)}")
    assert results["scraper"].get("status") == 200, results
    for stranger in ("stranger elsewhere", "stranger beside the engines"):
        # dropped, not refused: the connection never opens (a refusal or an HTTP status would mean it did)
        assert "status" not in results[stranger] and "Timeout" in results[stranger]["error"], results
    _chat_ok(served, "Which pods may call the engines?")


def _ask(stack: Served, model: str, prompt: str = "Name three colours.") -> tuple[int, Any]:
    """One chat completion at temperature 0 for `model` (the base model or an adapter): (status, its
    text), or (status, the JSON error)."""
    status, body = serving.chat(stack.url, stack.key, prompt, max_tokens=12, model=model, temperature=0)
    if status != 200:
        return status, json.loads(body)
    message = body["choices"][0]["message"]
    # The tiny model's random text may land in the reasoning field (the qwen3 reasoning parser).
    return status, "".join(str(message.get(k) or "") for k in ("reasoning", "reasoning_content", "content"))


def _adapters_loaded(stack: Served, want: set[str]) -> bool:
    """AdaptersLoaded is True and status.lora lists exactly `want`, each loaded on every ready engine pod
    (as many as the tests before left: the deployment may have been scaled)."""
    status = stack.qwd().get("status", {})
    condition = next((c for c in status.get("conditions", []) if c["type"] == "AdaptersLoaded"), {})
    listed = {a["name"]: a["loaded"].split("/") for a in status.get("lora", {}).get("adapters", [])}
    everywhere = all(loaded == ready != "0" for loaded, ready in listed.values())
    return condition.get("status") == "True" and set(listed) == want and everywhere


def _settled_reconciles_write_nothing(served: Served) -> None:
    """Once the adapters are settled, the operator's reconciles (the events of its own status writes, the
    pods' watch, its timers) write nothing more: no status flapping between the sidecars' reports."""
    assert_settled_writes_nothing(served.cluster, [OPERATOR_USER])  # 16 s: three of its 5-s polls


def _limit_a_key_to_one_adapter(served: Served) -> None:
    """A second API key, limited to `sql` by spec.gateway.modelAccess (a gateway configuration edit: its
    pods roll): it gets 403 in OpenAI JSON for `poet` and the base model, 200 for `sql`; the unlimited key
    still reaches `poet`."""
    secret = serving.dev_qwendeployment(namespace=NAMESPACE)["spec"]["gateway"]["apiKeysSecret"]
    limited = f"sk-{secrets.token_urlsafe(24)}"
    served.cluster.kubectl(
        "-n", NAMESPACE, "patch", "secret", secret, "-p", json.dumps({"stringData": {"sql-team": limited}})
    )  # fmt: skip
    served.patch({"gateway": {"modelAccess": [{"apiKeys": ["sql-team"], "models": ["sql"]}]}})
    limited_key = replace(served, key=limited)
    # A new gateway pod answers; then the rollout finishes, so that no old pod (401) answers any more.
    wait_until(lambda: _ask(limited_key, "poet")[0] == 403, 300, "a gateway pod with the rule", interval=2)
    gateway = f"deployment/{NAME}-gateway"
    served.cluster.kubectl("-n", NAMESPACE, "rollout", "status", gateway, "--timeout=300s", timeout=320)
    assert _ask(limited_key, "sql")[0] == 200
    for model in ("poet", "Qwen/Qwen3-32B"):
        status, error = _ask(limited_key, model)
        assert status == 403 and error["error"]["code"] == "model_not_allowed", (model, status, error)
        assert error["error"]["message"].endswith("it may use: sql."), error
    assert _ask(served, "poet")[0] == 200
    assert _listed(served, limited) == {"sql"}
    assert _listed(served, served.key) == {"Qwen/Qwen3-32B", "sql", "poet"}
    print("[lora] a key limited to `sql` gets 403 for `poet` and the base model, 200 for `sql`")


def _listed(served: Served, key: str) -> set[str]:
    """The model ids the gateway's /v1/models lists for `key`."""
    headers = {"Authorization": f"Bearer {key}"}
    status, body = http_get(f"{served.url}/v1/models", 10, headers, serving.CLUSTER_NETWORKS)
    assert status == 200, body
    return {card["id"] for card in json.loads(body)["data"]}


def test_lora_adapters_are_loaded_and_removed_without_restarting_the_engine(served: Served) -> None:
    """LoRA slots on (an engine edit: one rollout), then two tiny random adapters (random A and B, so each
    really changes the output) written into the model cache PVC and added to the spec: the engine pod's
    lora-sync sidecar loads them without a restart (same pod UID), status.lora and AdaptersLoaded say so,
    and through the gateway each adapter answers differently from the base model at temperature 0, the
    same way twice. One removed: the engine answers it with its own 404 JSON, the other still serves."""
    cache = serving.cache_dir() / serving.MODEL_CACHE_DIR
    folder = f"loras/e2e-{secrets.token_hex(4)}"
    model_dir = serving.cache_dir() / "tiny-qwen3-model"
    for seed, name in enumerate(("sql", "poet")):
        write_random_lora(cache / folder / name, model_dir, rank=8, seed=seed + 1, scale=4.0)
    slots = {"maxLoras": 2, "maxLoraRank": 8}
    try:
        served.patch({"lora": {**slots, "adapters": []}})
        serving.wait_serving(served.cluster, NAMESPACE, NAME)
        wait_until(lambda: _adapters_loaded(served, set()), 300, "AdaptersLoaded with no adapter")
        before = sorted(p["metadata"]["uid"] for p in served.pods(ENGINE_SELECTOR))
        base = _ask(served, "Qwen/Qwen3-32B")
        assert base[0] == 200, base

        adapters = [{"name": n, "source": {"path": f"{folder}/{n}"}, "rank": 8} for n in ("sql", "poet")]
        started = time.monotonic()
        served.patch({"lora": {**slots, "adapters": adapters}})
        wait_until(lambda: _adapters_loaded(served, {"sql", "poet"}), 240, "both adapters")
        loaded_in = time.monotonic() - started
        assert sorted(p["metadata"]["uid"] for p in served.pods(ENGINE_SELECTOR)) == before
        answers = {name: _ask(served, name) for name in ("sql", "poet")}
        again = _ask(served, "sql")
        print(f"\n[lora] both adapters loaded {loaded_in:.0f} s after the edit; base {base[1]!r}, {answers}")
        assert all(status == 200 for status, _ in answers.values()), answers
        assert len({base[1], answers["sql"][1], answers["poet"][1]}) == 3, (base, answers)
        assert again == answers["sql"]

        _limit_a_key_to_one_adapter(served)

        started = time.monotonic()
        served.patch({"lora": {**slots, "adapters": adapters[:1]}})
        wait_until(lambda: _adapters_loaded(served, {"sql"}), 240, "poet to be unloaded")
        removed_in = time.monotonic() - started
        status, error = _ask(served, "poet")
        assert status == 404 and "poet" in error["error"]["message"], error
        assert _ask(served, "sql") == answers["sql"]
        assert sorted(p["metadata"]["uid"] for p in served.pods(ENGINE_SELECTOR)) == before
        print(f"[lora] one removed {removed_in:.0f} s after the edit; the other still answers the same")
        _settled_reconciles_write_nothing(served)
    finally:
        shutil.rmtree(cache / folder, ignore_errors=True)


# --- tiers: a second QwenDeployment behind this gateway ----------------------------------------------

TIER, TIER_DEPLOYMENT = "qwen3-8b", "small"
TIER_SELECTOR = f"app.kubernetes.io/instance={TIER_DEPLOYMENT},app.kubernetes.io/component=engine"
BASE = "Qwen/Qwen3-32B"
#: The alias rule's bound: a short chat body (about 150 bytes) is under it, LONG_PROMPT's (about 800,
#: some 160 tokens: within either engine's context) above it.
ALIAS_MAX_BYTES = 400
LONG_PROMPT = "word " * 160


def _small_tier(served: Served) -> dict[str, Any]:
    """The tier: the tiny model again, served as `qwen3-8b` by a QwenDeployment of its own (TP 1, eager,
    4 Gi: a second engine beside the base one on the 2-core node), with its own gateway on the
    same API-key Secret (it owns the tier's engine key and engine NetworkPolicy)."""
    body = serving.dev_qwendeployment(name=TIER_DEPLOYMENT, namespace=NAMESPACE)
    spec = body["spec"]
    spec["model"]["servedModelName"] = TIER
    spec["parallelism"]["tensor"] = 1
    spec["engine"]["extraArgs"] = ["--enforce-eager"]
    spec["engine"]["resources"]["memory"] = "4Gi"
    # The node's 2 CPUs are all requested when the base gateway, with the tier's router, rolls again
    # (its old and new pod 530m each, two gateways, two engines, the operator's two pods): the tier's
    # engine asks less than the dev default (it is idle but for a few requests).
    spec["engine"]["resources"]["cpu"] = "100m"
    spec["gateway"]["apiKeysSecret"] = served.qwd()["spec"]["gateway"]["apiKeysSecret"]
    return body


def _counts(served: Served) -> dict[str, float]:
    """Requests answered, from each engine's own vllm:request_success_total: the base engines summed."""
    return {
        BASE: sum(_engine_requests(p) for p in served.pods(ENGINE_SELECTOR)),
        TIER: sum(_engine_requests(p) for p in served.pods(TIER_SELECTOR)),
    }


def _tier_ask(served: Served, model: str, prompt: str = "Hi.", key: str | None = None) -> tuple[int, Any]:
    """`_ask`, 1.1 s after the previous one: the tier's router (maxConcurrentRequests 1) admits by a
    token bucket that refills one a second, so back-to-back requests would be refused for want of a token."""
    time.sleep(1.1)
    return _ask(replace(served, key=key or served.key), model, prompt)


def _answered_by(served: Served, model: str, engines: str, prompt: str = "Hi.") -> None:
    """A request for `model` is answered (200) by one more request on the `engines` set, none elsewhere."""
    before = _counts(served)
    status, text = _tier_ask(served, model, prompt)
    assert status == 200, (model, status, text)
    want = {name: count + (name == engines) for name, count in before.items()}
    wait_until(lambda: _counts(served) == want, 15, f"{model!r} answered by the {engines} engine set")


def _tiers_status(served: Served) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    status = served.qwd().get("status", {})
    condition = next((c for c in status.get("conditions", []) if c["type"] == "TiersReady"), None)
    return status.get("tiers"), condition


def _tier_reports(served: Served, ready: bool, reason: str, message: str, replicas: int) -> bool:
    tiers, condition = _tiers_status(served)
    entry = {"name": TIER, "deployment": TIER_DEPLOYMENT, "ready": ready, "readyReplicas": replicas,
             "reason": reason, "message": message}  # fmt: skip
    cond = condition and (condition["status"], condition["reason"])
    return tiers == [entry] and cond == (str(ready), reason)


def _two_at_once(served: Served) -> list[tuple[int, Any]]:
    """Two requests for the tier at once: its router (maxConcurrentRequests 1, queueSize 0, an empty
    bucket refilled a second later) admits one."""
    time.sleep(1.5)
    body = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(2) as pool:
        return list(
            pool.map(lambda _: serving.chat(served.url, served.key, "Go on.", model=TIER, **body), range(2))
        )


CONFIG_HASH = "qwenops.dev/config-hash"


def _config_hashes(served: Served) -> set[str]:
    """The config hash of each live gateway pod."""
    return {p["metadata"]["annotations"].get(CONFIG_HASH, "") for p in served.pods(GATEWAY_SELECTOR)}


def _roll_gateway(served: Served, gateway: dict[str, Any], changed: Any) -> None:
    """Patch spec.gateway under traffic to the base model; once `changed()` holds (a new gateway pod
    answers), the rollout finishes; no request fails. Prints the seconds from the edit to the end."""
    started = time.monotonic()
    with _Traffic(served, served.key) as traffic:
        served.patch({"gateway": gateway})
        wait_until(changed, 300, "a gateway pod with the edit", interval=2)
        served.cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{NAME}-gateway", "--timeout=300s", timeout=320
        )
        rolled = time.monotonic() - started
    assert traffic.failed() == [], f"{len(traffic.failed())} of {len(traffic.results)} requests failed"
    print(f"[tiers] gateway rolled in {rolled:.0f} s, {len(traffic.results)} requests meanwhile, 0 failed")


def test_a_second_deployment_served_as_a_tier_behind_this_gateway(served: Served) -> None:
    """Day 2: a second QwenDeployment (`small`, the tiny model served as `qwen3-8b`) becomes a tier of this
    gateway with the alias `auto` (short prompts to the tier, the rest to the base model) and a key limited
    to the tier; the gateway rolls under traffic without a failed request. Each model name is answered by
    its own engine pods (their own request counters), the limited key gets 403 for the base model,
    spill-over to the base model happens only while enabled and the tier is saturated. The tier deleted
    while serving: TiersReady False and a JSON 503 for its requests. The tiers removed: no status.tiers,
    no TiersReady, and the settled reconciles write nothing.

    The base deployment goes down to one engine first: the 2-core node has room for two engines of this
    module, not three (make test of 2026-12-04 and 2026-12-05 left the tier's engine Unschedulable)."""
    served.patch({"replicas": 1})
    wait_until(lambda: len(served.pods(ENGINE_SELECTOR)) == 1, 180, "one base engine")
    serving.wait_serving(served.cluster, NAMESPACE, NAME)
    secret = served.qwd()["spec"]["gateway"]["apiKeysSecret"]
    limited = f"sk-{secrets.token_urlsafe(24)}"
    served.cluster.kubectl(
        "-n", NAMESPACE, "patch", "secret", secret, "-p", json.dumps({"stringData": {"small-only": limited}})
    )  # fmt: skip
    started = time.monotonic()
    serving.apply(served.cluster, _small_tier(served))
    serving.wait_serving(served.cluster, NAMESPACE, TIER_DEPLOYMENT)
    print(f"\n[tiers] {TIER_DEPLOYMENT} serving {time.monotonic() - started:.0f} s after it was created")

    access = served.qwd()["spec"]["gateway"].get("modelAccess") or []  # the LoRA test's rule, if it ran
    tier = {"name": TIER, "deploymentRef": {"name": TIER_DEPLOYMENT}, "maxConcurrentRequests": 1}
    tiered = {
        "tiers": [tier],
        "aliases": [
            {"name": "auto", "rules": [{"model": TIER, "maxPromptBytes": ALIAS_MAX_BYTES}], "default": BASE}
        ],
        "modelAccess": [*access, {"apiKeys": ["small-only"], "models": [TIER, "auto"]}],
    }
    _roll_gateway(served, tiered, lambda: _tier_ask(served, TIER, key=limited)[0] == 200)
    ready_message = f"{TIER_DEPLOYMENT}: 1 ready engine replica(s)"
    wait_until(lambda: _tier_reports(served, True, "Ready", ready_message, 1), 60, "status.tiers Ready")
    assert (_tiers_status(served)[1] or {}).get("message") == "1 tier(s) serve"

    # Each name routes as declared, and the alias by the body's size.
    _answered_by(served, TIER, TIER)
    _answered_by(served, BASE, BASE)
    _answered_by(served, "auto", TIER)
    _answered_by(served, "auto", BASE, LONG_PROMPT)

    # The key limited to the tier: the tier and a short `auto`, nothing that reaches the base model.
    before = _counts(served)
    assert _tier_ask(served, TIER, key=limited)[0] == 200
    for model, prompt in ((BASE, "Hi."), ("auto", LONG_PROMPT)):
        status, error = _tier_ask(served, model, prompt, key=limited)
        assert status == 403 and error["error"]["code"] == "model_not_allowed", (model, status, error)
    assert _listed(served, limited) == {TIER, "auto"}
    wait_until(lambda: _counts(served) == {BASE: before[BASE], TIER: before[TIER] + 1}, 15, "one on the tier")

    # Saturated without spillTo: nothing reaches the base model. Each answer is the tier's 200 or its JSON
    # 503 `overloaded` (which of the two for the second request depends on the router's token bucket, so
    # the exact 503 is asserted on loopback in tests/test_gateway_tiers.py; here what must never happen
    # is a spill).
    before = _counts(served)
    answers = _two_at_once(served)
    for status, body in answers:
        assert (status, body.get("model") if status == 200 else json.loads(body)["error"]["code"]) in (
            (200, TIER), (503, "overloaded")
        ), answers  # fmt: skip
    answered = sum(status == 200 for status, _ in answers)
    wait_until(lambda: _counts(served) == {BASE: before[BASE], TIER: before[TIER] + answered}, 15, "no spill")
    print(f"[tiers] saturated without spillTo: statuses {[status for status, _ in answers]}, none spilled")

    # The same with spillTo (a roll): both answered, one by each engine set.
    tiered["tiers"] = [{**tier, "spillTo": BASE}]
    without_spill = _config_hashes(served)
    _roll_gateway(served, tiered, lambda: not _config_hashes(served) & without_spill)
    before = _counts(served)
    answers = _two_at_once(served)
    assert [status for status, _ in answers] == [200, 200], answers
    assert sorted(body["model"] for _, body in answers) == sorted([TIER, BASE]), answers
    wait_until(lambda: _counts(served) == {m: c + 1 for m, c in before.items()}, 15, "one on each engine set")

    # The tier's deployment deleted while serving: the condition at once; with spillTo its requests go on
    # to the base model, without it (a roll) they get a JSON 503, not nginx's HTML 502.
    served.cluster.kubectl("-n", NAMESPACE, "delete", "qwd", TIER_DEPLOYMENT, "--wait=false")
    gone = f"QwenDeployment {TIER_DEPLOYMENT} not found in this namespace"
    wait_until(lambda: _tier_reports(served, False, "DeploymentNotFound", gone, 0), 90, "DeploymentNotFound")
    assert (_tiers_status(served)[1] or {}).get("message", "").startswith(f"tier {TIER}: {gone}")
    wait_until(lambda: not served.pods(TIER_SELECTOR), 120, "the tier's engine pod gone")
    before = _counts(served)
    assert [_tier_ask(served, TIER)[0] for _ in range(2)] == [200, 200]
    wait_until(lambda: _counts(served) == {BASE: before[BASE] + 2, TIER: before[TIER]}, 15, "two spilled")
    tiered["tiers"] = [tier]
    _roll_gateway(served, tiered, lambda: _tier_ask(served, TIER)[0] == 503)
    seen = [_tier_ask(served, model) for model in (TIER, "auto", TIER)]
    for status, error in seen:
        assert status == 503 and error["error"]["code"] == "no_engine_available", seen
        assert f"No engine replica of {TIER} is ready" in error["error"]["message"], seen
    assert _tier_ask(served, BASE)[0] == 200

    # The tiers and the alias removed: status.tiers and TiersReady go, and then nothing is written.
    served.patch({"gateway": {"tiers": None, "aliases": None, "modelAccess": access or None}})
    wait_until(lambda: _tiers_status(served) == (None, None), 60, "no status.tiers, no TiersReady")
    serving.wait_serving(served.cluster, NAMESPACE, NAME)
    _settled_reconciles_write_nothing(served)
    print(f"[tiers] per engine set, requests answered: {_counts(served)}")


# --- deployments of their own ------------------------------------------------------------------------


def test_missing_api_key_secret_leaves_the_gateway_pod_waiting(served: Served) -> None:
    body = serving.dev_qwendeployment(name="no-keys", namespace=NAMESPACE)
    body["spec"]["replicas"] = 0  # no engine needed to see the gateway wait
    serving.apply(served.cluster, body)

    def waiting_for_the_secret() -> bool:
        pods = served.pods("app.kubernetes.io/instance=no-keys,app.kubernetes.io/component=gateway")
        if not pods:
            return False
        events = served.kubectl_json(
            "-n", NAMESPACE, "get", "events", "--field-selector",
            f"involvedObject.name={pods[0]['metadata']['name']},reason=FailedMount",
        )["items"]  # fmt: skip
        return pods[0]["status"]["phase"] == "Pending" and any(
            re.search(r'secret "no-keys-api-keys" not found', e["message"]) for e in events
        )

    wait_until(waiting_for_the_secret, 120, "the gateway pod waiting for its API-key Secret", interval=2)

    # The status names the Secret and the field (from kubelet's FailedMount event: no Secret is read).
    def reported() -> dict[str, Any] | None:
        qwd = served.kubectl_json("-n", NAMESPACE, "get", "qwd", "no-keys")
        conditions = {c["type"]: c for c in qwd.get("status", {}).get("conditions", [])}
        refs = conditions.get("ReferencesResolved", {})
        return conditions if refs.get("status") == "False" else None

    conditions = wait_until(reported, 90, "ReferencesResolved=False", interval=2)
    assert conditions["ReferencesResolved"]["message"] == (
        f"Secret {NAMESPACE}/no-keys-api-keys (spec.gateway.apiKeysSecret) does not exist: create it"
    )
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "MissingReference"), ready
    served.cluster.kubectl("-n", NAMESPACE, "delete", "qwd", "no-keys", "--wait=false")
