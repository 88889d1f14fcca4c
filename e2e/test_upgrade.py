"""Upgrade from the previous release (tag v0.1.0) to the working tree's operator on the dev cluster.

v0.1.0 runs from a `git worktree` of the tagged commit, pinned by hash because a clone may lack the tags
(its own install.yaml, its code on PYTHONPATH, this venv's packages), converges the examples that fit the
dev cluster's kwok GPU pools, and stops; the working tree's install.yaml is applied and its operator
started. Which children change form is computed by rendering the same QwenDeployments with both versions
(`qwen-operator render`); the apiserver's audit log then shows that every child whose rendered form did
not change got no write at all after the switch, and the engine Deployments whose pod template did not
change kept their ReplicaSets and pods (no engine restart). The test prints which children changed form
and why (the paths that differ).

Engine and gateway pods here are SIMULATED (kwok nodes run no containers): a Ready status in these
tests is kwok's, not a real engine's (e2e/test_real_journey.py serves for real).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.operator_proc import (
    OPERATOR_ACCOUNT,
    OPERATOR_NAMESPACE,
    OPERATOR_USER,
    OperatorProcess,
    audit_writes,
    install,
    service_account_kubeconfig,
)
from qwen_devtools.procs import clean_env
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.kinds import MANAGED, kind_of
from qwen_operator.names import MANAGED_BY

pytestmark = pytest.mark.cluster

PREVIOUS = "v0.1.0"
#: The commit tagged v0.1.0: CI's clone of main has the history but not the tags.
PREVIOUS_COMMIT = "6ac933ba330d3ae9764ef79ba8fd01b1aae84076"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
Key = tuple[str, str]  # (resource plural, name) of a child, as the audit log's objectRef names it
_ABSENT = object()


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A worktree of the previous release in a temp dir, removed at the end (however the test ends)."""
    try:
        git("rev-parse", "--verify", f"{PREVIOUS_COMMIT}^{{commit}}")
    except subprocess.CalledProcessError:
        pytest.fail(f"commit {PREVIOUS_COMMIT} ({PREVIOUS}) is missing: a shallow clone?", pytrace=False)
    path = tmp_path_factory.mktemp("previous") / PREVIOUS
    git("worktree", "add", "--detach", str(path), PREVIOUS_COMMIT)
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))


def operator_env(source: Path) -> dict[str, str]:
    """The environment that makes this venv's `qwen-operator` run the code under `source`."""
    return {"PYTHONPATH": str(source / "operator")}


def running_code(env: dict[str, str]) -> Path:
    """Where `qwen_operator` is imported from with `env` (proof of which version runs)."""
    code = "import qwen_operator; print(qwen_operator.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(env),
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def render(source: Path, crs: Path) -> dict[Key, dict[str, Any]]:
    """The children `qwen-operator render` of the version under `source` makes for the CRs in `crs`."""
    exe = Path(sys.executable).with_name("qwen-operator")
    out = subprocess.run(
        [str(exe), "render", "-f", str(crs)],
        env=clean_env(operator_env(source)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {_key(obj): obj for obj in yaml.safe_load_all(out) if obj}


def _key(obj: dict[str, Any]) -> Key:
    return kind_of(obj["apiVersion"], obj["kind"]).plural, obj["metadata"]["name"]


def diff_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """The paths at which two rendered objects differ (a list of other length: its path and what came
    and went)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [p for k in keys for p in diff_paths(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{path}.{k}")]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new):
            return [
                p
                for i, (a, b) in enumerate(zip(old, new, strict=True))
                for p in diff_paths(a, b, f"{path}[{i}]")
            ]
        gone = [json.dumps(x) for x in old if x not in new]
        came = [json.dumps(x) for x in new if x not in old]
        return [f"{path} (+{', '.join(came)}; -{', '.join(gone)})"]
    if old is _ABSENT:
        return [f"{path or 'the object'} (added)"]
    if new is _ABSENT:
        return [f"{path or 'the object'} (removed)"]
    return [] if old == new else [path]


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def converged(cluster: Any, ns: str, names: list[str]) -> bool:
    """Every QwenDeployment's status is of its generation, Ready, and its rollout is complete."""
    items = {o["metadata"]["name"]: o for o in kubectl_json(cluster, "-n", ns, "get", "qwd")["items"]}
    return all(
        name in items
        and items[name].get("status", {}).get("observedGeneration") == items[name]["metadata"]["generation"]
        and condition(items[name], "Ready").get("status") == "True"
        and condition(items[name], "Progressing").get("status") == "False"
        for name in names
    )


def settle(cluster: Any, operator: OperatorProcess, ns: str, names: list[str], reconciles: int) -> None:
    """Wait until `operator` ran `reconciles` reconciles, everything converged and its writes stopped."""
    wait_until(lambda: operator.metric("qwen_operator_reconciles_total") >= reconciles, 60, "reconciles")
    wait_until(lambda: converged(cluster, ns, names), 120, f"{names} converged")
    wait_until(lambda: not audit_writes(cluster, [OPERATOR_USER], time.time() - 5), 60, "writes to stop")


def replica_sets(cluster: Any, ns: str) -> dict[str, set[str]]:
    """ReplicaSet uids by owning Deployment."""
    owned: dict[str, set[str]] = {}
    for rs in kubectl_json(cluster, "-n", ns, "get", "replicasets")["items"]:
        for ref in rs["metadata"].get("ownerReferences", []):
            owned.setdefault(ref["name"], set()).add(rs["metadata"]["uid"])
    return owned


def engine_pods(cluster: Any, ns: str) -> set[str]:
    pods = kubectl_json(cluster, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=engine")
    return {p["metadata"]["uid"] for p in pods["items"]}


def child_writes(cluster: Any, ns: str, since: float) -> Counter[Key]:
    """Writes of the operator's account after `since` to objects in `ns`, by (resource, name); the
    QwenDeployments' status and the Events the operator posts are counted under their own resource."""
    counts: Counter[Key] = Counter()
    for event in audit_writes(cluster, [OPERATOR_USER], since):
        ref = event.get("objectRef", {})
        if ref.get("namespace") == ns:
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            counts[(resource, ref.get("name", ""))] += 1
    return counts


@dataclass(frozen=True)
class Snapshot:
    """What runs in the test's namespace at one moment."""

    replica_sets: dict[str, set[str]]  # ReplicaSet uids by owning Deployment
    engine_pods: set[str]  # uids
    children: set[Key]  # the operator's children that exist


def snapshot(cluster: Any, ns: str) -> Snapshot:
    return Snapshot(replica_sets(cluster, ns), engine_pods(cluster, ns), children(cluster, ns))


def children(cluster: Any, ns: str) -> set[Key]:
    """The objects of the operator's kinds in `ns` that it labels as its own (optional kinds whose CRD
    the cluster lacks are skipped)."""
    found = set()
    for kind in MANAGED:
        listed = kubectl_json(
            cluster,
            "-n",
            ns,
            "get",
            f"{kind.plural}.{kind.group}".rstrip("."),
            "-l",
            f"app.kubernetes.io/managed-by={MANAGED_BY}",
        )
        found |= {(kind.plural, o["metadata"]["name"]) for o in (listed or {"items": []})["items"]}
    return found


def example_crs(ns: str) -> list[dict[str, Any]]:
    crs = []
    for example in EXAMPLES:
        body = yaml.safe_load(example.read_text())
        body["metadata"]["namespace"] = ns
        crs.append(body)
    return crs


def changed_form(previous: Path, crs: list[dict[str, Any]], tmp: Path) -> dict[Key, list[str]]:
    """The children whose rendered form differs between the two versions, with the paths that differ."""
    crs_file = tmp / "crs.yaml"
    crs_file.write_text(yaml.safe_dump_all(crs))
    old, new = render(previous, crs_file), render(REPO, crs_file)
    diffs = {
        key: diff_paths(old.get(key, _ABSENT), new.get(key, _ABSENT)) for key in sorted(set(old) | set(new))
    }
    return {key: paths for key, paths in diffs.items() if paths}


#: What a v0.1.0 user on a cluster with OwnerReferencesPermissionEnforcement added to its RBAC.
FINALIZERS_GRANT = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "qwen-operator-v0.1.0-finalizers"},
        "rules": [
            {
                "apiGroups": ["inference.qwenops.dev"],
                "resources": ["qwendeployments/finalizers"],
                "verbs": ["update"],
            }
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "qwen-operator-v0.1.0-finalizers"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "qwen-operator-v0.1.0-finalizers",
        },
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": OPERATOR_NAMESPACE}],
    },
]


def run_previous(cluster: Any, previous: Path, crs: list[dict[str, Any]], tmp: Path) -> Path:
    """Install and run the previous release until `crs` converged; returns the operator's kubeconfig."""
    install_yaml = previous / "manifests" / "install.yaml"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(install_yaml))
    # v0.1.0's RBAC lacks update on qwendeployments/finalizers, which the dev cluster's
    # OwnerReferencesPermissionEnforcement requires for its children's owner references: its users on
    # such clusters had to grant it themselves, as here (this release's install.yaml has it).
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(FINALIZERS_GRANT))
    kubeconfig = service_account_kubeconfig(cluster, tmp / "kubeconfig")
    old = OperatorProcess(kubeconfig, tmp / f"{PREVIOUS}.log", env=operator_env(previous)).start()
    try:
        for cr in crs:
            ns, keys = cr["metadata"]["namespace"], cr["spec"]["gateway"]["apiKeysSecret"]
            cluster.kubectl("-n", ns, "create", "secret", "generic", keys, "--from-literal=a=sk-a")
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        settle(cluster, old, ns, [cr["metadata"]["name"] for cr in crs], reconciles=len(crs))
    finally:
        old.stop()
        print(f"\n--- {PREVIOUS} operator log (tail) ---\n{old.tail(15)}")
    return kubeconfig


def test_upgrade_writes_only_what_changed_form(
    cluster: Any, namespace: str, previous_release: Path, tmp_path: Path
) -> None:
    if not (Path(cluster.kubeconfig).parent / "audit.log").exists():
        pytest.skip("this cluster keeps no audit log (only the dev cluster does)")
    assert running_code(operator_env(previous_release)).is_relative_to(previous_release)
    assert running_code(operator_env(REPO)).is_relative_to(REPO / "operator")
    crs = example_crs(namespace)
    names = [cr["metadata"]["name"] for cr in crs]
    changed = changed_form(previous_release, crs, tmp_path)
    try:
        kubeconfig = run_previous(cluster, previous_release, crs, tmp_path)
        before = snapshot(cluster, namespace)
    finally:
        install(cluster)  # the working tree's CRD and RBAC, also when the previous release failed
    switched = time.time()
    new = OperatorProcess(kubeconfig, tmp_path / "new.log").start()
    try:
        settle(cluster, new, namespace, names, reconciles=len(crs))
        writes = child_writes(cluster, namespace, switched)
        after = snapshot(cluster, namespace)
    finally:
        new.stop()
        print(f"\n--- working-tree operator log (tail) ---\n{new.tail(15)}")

    print(f"\n[upgrade] {PREVIOUS} -> working tree: children that changed form (render diff):")
    for (resource, name), paths in changed.items():
        print(f"  {resource}/{name}: {writes[(resource, name)]} write(s); " + "; ".join(paths))
    print("[upgrade] writes per object after the switch:", dict(writes) or "none")
    restarted = [
        n for n in names if after.replica_sets.get(f"{n}-engine") != before.replica_sets.get(f"{n}-engine")
    ]
    print(f"[upgrade] engines with a new ReplicaSet: {restarted or 'none'}")
    # Operator upgrades never restart engines on their own (manifests/upgrade.py): a pod template this
    # version renders otherwise is held, and the status says so.
    assert not restarted, f"the upgrade restarted engines: {restarted}"
    assert after.engine_pods == before.engine_pods, "engine pods were replaced"
    for name in names:
        paths = changed.get(("deployments", f"{name}-engine"), [])
        update = kubectl_json(cluster, "-n", namespace, "get", "qwd", name)["status"].get("engineUpdate")
        if any(p.startswith(".spec.template") for p in paths):
            assert update and update["available"], f"{name}: engine pod held but no status.engineUpdate"
            print(f"[upgrade] {name}: status.engineUpdate {update['changes']}")
        else:
            assert update is None, f"{name}: status.engineUpdate without a changed pod: {update}"

    unchanged = sorted(before.children - set(changed))
    print(
        f"[upgrade] {len(unchanged)} children kept their form, with writes: {[writes[k] for k in unchanged]}"
    )
    assert unchanged, "no child kept its form: nothing to check"
    wrote = {key: writes[key] for key in unchanged if writes[key]}
    assert not wrote, f"children whose rendered form did not change were written: {wrote}"


#: The next release, simulated: the working tree's operator with one more default engine flag.
NEXT_DEFAULT = ("--max-logprobs", "8")


def next_release(tmp: Path) -> Path:
    """A copy of the working tree's operator code whose engine command line has NEXT_DEFAULT appended
    to the flags every spec gets (what a release that changes a default does)."""
    source = tmp / "next"
    shutil.copytree(REPO / "operator", source / "operator", ignore=shutil.ignore_patterns("__pycache__"))
    engine = source / "operator" / "qwen_operator" / "api" / "engine.py"
    text = engine.read_text()
    anchor = '"--kv-cache-dtype", e.kv_cache_dtype,\n'
    assert anchor in text, "the anchor of the simulated default moved: update NEXT_DEFAULT's edit"
    flag, value = NEXT_DEFAULT
    engine.write_text(text.replace(anchor, f'{anchor}        "{flag}", "{value}",\n', 1))
    return source


def _template(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    """The engine Deployment's pod template (its strategy may change with the free GPUs: no restart)."""
    dep = kubectl_json(cluster, "-n", ns, "get", "deployment", f"{name}-engine")
    return dict(dep["spec"]["template"])


def _args(cluster: Any, ns: str, name: str) -> list[str]:
    dep = kubectl_json(cluster, "-n", ns, "get", "deployment", f"{name}-engine")
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_changed_default_engine_flag_restarts_no_engine_until_the_user_opts_in(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    """This version's operator converges the examples; the next release (this one with another default
    flag) takes over: no engine restarts, each status says an update is available; then an edit and
    upgradePolicy Immediate each roll their engine to the new form, and the third stays held."""
    crs = example_crs(namespace)
    names = [cr["metadata"]["name"] for cr in crs]
    nxt = next_release(tmp_path)
    assert running_code(operator_env(nxt)).is_relative_to(nxt)
    install(cluster)
    kubeconfig = service_account_kubeconfig(cluster, tmp_path / "kubeconfig")
    current = OperatorProcess(kubeconfig, tmp_path / "current.log").start()
    try:
        for cr in crs:
            keys = cr["spec"]["gateway"]["apiKeysSecret"]
            cluster.kubectl("-n", namespace, "create", "secret", "generic", keys, "--from-literal=a=sk-a")
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        settle(cluster, current, namespace, names, reconciles=len(crs))
    finally:
        current.stop()
    before = snapshot(cluster, namespace)
    templates = {n: _template(cluster, namespace, n) for n in names}
    upgraded = OperatorProcess(kubeconfig, tmp_path / "next.log", env=operator_env(nxt)).start()
    try:
        settle(cluster, upgraded, namespace, names, reconciles=len(crs))
        after = snapshot(cluster, namespace)
        assert after.engine_pods == before.engine_pods, "the upgrade replaced engine pods"
        assert after.replica_sets == before.replica_sets
        for name in names:
            assert _template(cluster, namespace, name) == templates[name], f"{name}: pod template changed"
            assert NEXT_DEFAULT[0] not in _args(cluster, namespace, name)
            update = kubectl_json(cluster, "-n", namespace, "get", "qwd", name)["status"]["engineUpdate"]
            assert update["changes"] == [".spec.containers[0].args"], update
            assert "upgradePolicy: Immediate" in update["message"]

        opted, edited, held = names[0], names[1], names[2:]
        cluster.kubectl(
            "-n", namespace, "patch", "qwd", opted, "--type=merge",
            "-p", '{"spec":{"engine":{"upgradePolicy":"Immediate"}}}',
        )  # fmt: skip
        cluster.kubectl(
            "-n", namespace, "patch", "qwd", edited, "--type=merge",
            "-p", '{"spec":{"gateway":{"rateLimit":{"requestsPerMinute":77}}}}',
        )  # fmt: skip
        for name in (opted, edited):
            wait_until(lambda n=name: NEXT_DEFAULT[0] in _args(cluster, namespace, n), 60, f"{name} rolled")
        settle(cluster, upgraded, namespace, names, reconciles=len(crs) + 2)
        final = snapshot(cluster, namespace)
        for name in (opted, edited):
            qwd = kubectl_json(cluster, "-n", namespace, "get", "qwd", name)
            assert "engineUpdate" not in qwd["status"], f"{name}: stale engineUpdate"
            assert final.replica_sets[f"{name}-engine"] != before.replica_sets[f"{name}-engine"]
        for name in held:
            assert final.replica_sets[f"{name}-engine"] == before.replica_sets[f"{name}-engine"]
            assert NEXT_DEFAULT[0] not in _args(cluster, namespace, name)
    finally:
        upgraded.stop()
        print(f"\n--- next-release operator log (tail) ---\n{upgraded.tail(15)}")
