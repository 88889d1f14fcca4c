"""Deliberately broken builds of behaviours the product promises, each of which the suite must catch.

Each Mutant replaces one exact piece of code (found exactly once, so a refactor that moves it fails
tests/test_mutants.py instead of leaving a mutant that changes nothing) and names the test files that
must then fail. `make mutants` runs them all in a scratch git worktree of the working tree (the
checkout itself is never edited): first the named files on the unbroken tree, which must pass, then
each mutant, which must fail at least one test; it prints the tests that caught each.

    python -m qwen_devtools.mutants              # every mutant
    python -m qwen_devtools.mutants NAME ...     # some of them
    python -m qwen_devtools.mutants --list
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .repo import REPO


@dataclass(frozen=True)
class Mutant:
    name: str
    behaviour: str
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "replicas-handoff",
        "turning autoscaling on hands spec.replicas to the HPA at its value (no drop to 1 replica)",
        "operator/qwen_operator/manifests/engine.py",
        '    return owner != "autoscaler" and live.get("spec", {}).get("replicas") is not None\n',
        "    return False\n",
        ("tests/test_edits.py",),
    ),
    Mutant(
        "zero-to-hpa-lift",
        "KEDA at zero -> driver hpa lifts the engines to minReplicas (an HPA at 0 never scales)",
        "operator/qwen_operator/manifests/engine.py",
        '    return a.min_replicas if live.get("spec", {}).get("replicas") == 0 else None\n',
        "    return None\n",
        ("tests/test_edits.py",),
    ),
    Mutant(
        "network-policy",
        "only the deployment's own gateway (and tier gateways, scrapers) may connect to its engines",
        "operator/qwen_operator/manifests/policy.py",
        '                {"podSelector": {"matchLabels": names.selector(qd, "gateway")}},\n',
        '                {"podSelector": {}},\n',
        ("tests/test_security.py",),
    ),
    Mutant(
        "wake-only-admitted",
        "only requests past the API key, model access and rate limit wake or keep a GPU replica",
        "operator/qwen_operator/recording.py",
        '''error=~"{admitted}"''',
        '''error=~".*"''',
        ("tests/test_scale_to_zero.py",),
    ),
    Mutant(
        "activator-declared-length",
        "the activator refuses a body whose Content-Length exceeds its memory budget before reading it",
        "operator/qwen_operator/activator.py",
        "                if declared > self.s.held_bytes_budget - self.held_bytes:\n",
        "                if False:\n",
        ("tests/test_activator.py",),
    ),
    Mutant(
        "status-stale-fields",
        "a status field that stops applying is removed from status (no stale fields after an edit)",
        "operator/qwen_operator/status.py",
        "    patch: dict[str, Any] = {k: None for k in old if k not in new}\n",
        "    patch: dict[str, Any] = {}\n",
        ("tests/test_edits.py",),
    ),
    Mutant(
        "yarn-threshold",
        "YaRN (factor 2 or 4) is applied above 40960 tokens, in the form vLLM 0.32 parses",
        "operator/qwen_operator/api/plan.py",
        "    if max_model_len <= model.max_position_embeddings:\n",
        "    if max_model_len <= 2 * model.max_position_embeddings:\n",
        ("tests/test_plan.py", "tests/test_engine_args.py"),
    ),
    Mutant(
        "fp8-kv-bytes",
        "the capacity plan counts 1 byte per KV element with kvCacheDtype fp8 (twice the tokens)",
        "operator/qwen_operator/api/plan.py",
        '    kv_dtype_bytes = 1 if plan.kv_cache_dtype == "fp8" else 2\n',
        "    kv_dtype_bytes = 2\n",
        ("tests/test_plan.py",),
    ),
    Mutant(
        "gpus-per-replica",
        "an engine pod requests tensor x pipeline GPUs",
        "operator/qwen_operator/api/plan.py",
        "    plan.tensor_parallel_size, plan.gpus_per_replica = tp, tp * par.pipeline\n",
        "    plan.tensor_parallel_size, plan.gpus_per_replica = tp, tp\n",
        ("tests/test_plan.py", "tests/test_manifests.py"),
    ),
    Mutant(
        "scale-from-zero-wake",
        "at minReplicas 0 the ScaledObject wakes the engines on the gateway's held requests",
        "operator/qwen_operator/manifests/scaling.py",
        "        *(_wake_triggers(review, a.prometheus_address) if a.min_replicas == 0 else []),\n",
        "        *([] if a.min_replicas == 0 else []),\n",
        ("tests/test_scale_to_zero.py",),
    ),
    Mutant(
        "surge-kept-while-terminating",
        "a Surge rollout keeps Surge while its new pod waits for a terminating engine pod's GPUs",
        "operator/qwen_operator/reconcile.py",
        "    if not waiting or len(running) < len(pods):\n",
        "    if not waiting:\n",
        ("tests/test_edits.py",),
    ),
    Mutant(
        "lora-unload",
        "an adapter removed from the spec is unloaded from the engine without a restart",
        "operator/qwen_operator/lorasync.py",
        "        unload=tuple(sorted(set(loaded) - set(desired))),\n",
        "        unload=(),\n",
        ("tests/test_lorasync.py",),
    ),
    Mutant(
        "gateway-config-roll",
        "a changed gateway configuration (keys, limits, routes) rolls the gateway pods",
        "operator/qwen_operator/manifests/gateway.py",
        '"annotations": {f"{names.LABEL_PREFIX}/config-hash": config.hash},',
        '"annotations": {},',
        ("tests/test_gateway_render.py",),
    ),
    Mutant(
        "anthropic-x-api-key",
        "Anthropic's clients authenticate with x-api-key (the same keys as Authorization: Bearer)",
        "operator/qwen_operator/gateway/templates/nginx.conf.j2",
        '        "" "Bearer $http_x_api_key";\n',
        '        "" "";\n',
        ("tests/test_gateway_apis.py",),
    ),
    Mutant(
        "anthropic-error-shape",
        "the gateway's own errors on /v1/messages are Anthropic's, so the SDK raises its own classes",
        "operator/qwen_operator/clientapis.py",
        '    if api == "anthropic":\n',
        "    if False:\n",
        ("tests/test_gateway_apis.py",),
    ),
    Mutant(
        "stored-responses-refused",
        "a Responses request that needs a stored response is refused by name, never sent to an engine",
        "operator/qwen_operator/gateway/templates/errors.js.j2",
        "            return STORED_FIELDS[i];\n",
        '            return "";\n',
        ("tests/test_gateway_apis.py",),
    ),
    Mutant(
        "router-engine-key",
        "vllm-router has the engine key its --api-key names (the Responses and Messages routes need it)",
        "operator/qwen_operator/manifests/gateway.py",
        "            *_router_engine_key(review, tier),\n",
        "",
        ("tests/test_manifest_invariants.py",),
    ),
)


def by_name(names: list[str]) -> list[Mutant]:
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; known: {sorted(known)}")
    return [known[n] for n in names] if names else list(MUTANTS)


def apply(mutant: Mutant, root: Path) -> None:
    """Replace the mutant's code in the tree at root; it must occur exactly once."""
    path = root / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.name}: {mutant.path} holds the code {count} times, not once")
    path.write_text(text.replace(mutant.old, mutant.new))


def _worktree(into: Path) -> None:
    """A detached worktree of the working tree as it is (uncommitted tracked changes included)."""
    snapshot = subprocess.run(
        ["git", "stash", "create"], cwd=REPO, capture_output=True, text=True, check=True
    )
    commit = snapshot.stdout.strip() or "HEAD"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(into), commit], cwd=REPO, check=True)


def _pytest(root: Path, tests: tuple[str, ...], report: Path) -> tuple[int, list[str]]:
    """Run the test files in the tree at root (its own operator/ first on the path); the failed tests."""
    env = {**os.environ, "PYTHONPATH": f"{root / 'operator'}{os.pathsep}{root / 'tests'}"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
            "-m", "not engine and not bench", f"--junitxml={report}", *tests]  # fmt: skip
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    failed = []
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}")
    return done.returncode, failed


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--list" in args:
        for m in MUTANTS:
            print(f"{m.name:<26} {m.behaviour}  [{', '.join(m.tests)}]")
        return 0
    chosen = by_name(args)
    with tempfile.TemporaryDirectory(prefix="qwen-mutants-") as scratch:
        root = Path(scratch) / "tree"
        _worktree(root)
        try:
            tests = tuple(sorted({t for m in chosen for t in m.tests}))
            code, failed = _pytest(root, tests, Path(scratch) / "baseline.xml")
            if code != 0:
                print(f"[mutants] the unbroken tree fails {failed or tests}: fix that first", flush=True)
                return 1
            survivors = []
            for m in chosen:
                subprocess.run(["git", "checkout", "-q", "--", "."], cwd=root, check=True)
                apply(m, root)
                start = time.monotonic()
                code, failed = _pytest(root, m.tests, Path(scratch) / f"{m.name}.xml")
                took = time.monotonic() - start
                if failed:
                    print(f"[mutants] caught    {m.name} ({took:.0f} s): {failed[0]}", flush=True)
                else:
                    survivors.append(m.name)
                    print(f"[mutants] SURVIVED  {m.name} ({took:.0f} s, pytest exit {code}): {m.behaviour}")
            print(f"[mutants] {len(chosen) - len(survivors)} of {len(chosen)} caught", flush=True)
            return 1 if survivors else 0
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=REPO, check=False)


if __name__ == "__main__":
    sys.exit(main())
