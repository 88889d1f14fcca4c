"""End-to-end tests against a real local control plane (qwen_devtools.devcluster): a session-wide
cluster and a fresh namespace per test.

Which cluster ``cluster`` gives:

* ``QWEN_E2E_KUBECONFIG=/path/kubeconfig``: that cluster, but only if its current context is a local
  test cluster (``qwen-devcluster-*``, ``kind-*``, ``k3d-*``, ``minikube``, ``docker-desktop``) with
  its server on 127.0.0.1/localhost; otherwise the tests fail with the reason. ``KUBECONFIG`` is
  deliberately ignored, so the tests never touch whatever cluster the shell happens to point at.
* otherwise the dev cluster ``$QWEN_E2E_CLUSTER`` (default ``test``), started if needed and stopped at
  the end of the session, unless it was already running or ``QWEN_E2E_KEEP=1`` (then a later run
  reuses it in about a second).

``real_cluster`` (tests marked ``real_node``) is a dev cluster of its own, ``$QWEN_E2E_REAL_CLUSTER``
(default ``test-real``), with this machine's real node, where pods run; the same start/stop rules
apply. One cluster per machine can have the real node: while another holds it (a running ``make demo``),
its tests are skipped, or fail under QWEN_REQUIRE_REAL_PARTS. ``real_api_client`` and
``real_namespace`` are ``api_client`` and ``namespace`` for it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from qwen_devtools.devcluster import build, containerd, kubeconfig, network, nodebuild, procs, realnode
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.require import missing
from qwen_devtools.wait import wait_until

E2E_LABEL = {"qwenops.dev/e2e": "true"}


def _external(path: Path) -> devcluster.Cluster:
    try:
        context = kubeconfig.check_local(path)
    except (OSError, ValueError) as error:
        pytest.fail(f"refusing QWEN_E2E_KUBECONFIG: {error}", pytrace=False)
    return devcluster.Cluster(path, context)


def _build_output_shown(
    config: pytest.Config, real_node: bool = False
) -> contextlib.AbstractContextManager[object]:
    """Let a first (long) build stream its progress to the terminal instead of pytest's capture."""
    capture = config.pluginmanager.getplugin("capturemanager")
    built = build.is_built() and (nodebuild.is_built() or not real_node)
    if built or capture is None:
        return contextlib.nullcontext()
    return capture.global_and_fixture_disabled()


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Iterator[devcluster.Cluster]:
    """The local cluster for this test session (see the module docstring for which one)."""
    external = os.environ.get("QWEN_E2E_KUBECONFIG")
    if external:
        yield _external(Path(external))
        return
    name = os.environ.get("QWEN_E2E_CLUSTER", "test")
    was_up = devcluster.is_up(name)
    try:
        with _build_output_shown(pytestconfig):
            handle = devcluster.up(name)
    except (procs.ComponentError, build.BuildError, devcluster.StartedElsewhere) as error:
        pytest.fail(f"dev cluster {name!r} did not start: {error}", pytrace=False)
    yield handle
    if not was_up and os.environ.get("QWEN_E2E_KEEP") != "1":
        devcluster.down(name)


@pytest.fixture(scope="module")
def own_cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    """A dev cluster for one module alone (it stops the API server, or counts writes in its audit log,
    where another module's operator would blur them), always brought down at the end."""
    name = f"{request.module.__name__.rpartition('.')[2].removeprefix('test_')}-{secrets.token_hex(3)}"
    try:
        handle = devcluster.up(name)
    except (procs.ComponentError, build.BuildError) as error:
        pytest.fail(f"dev cluster {name!r} did not start: {error}", pytrace=False)
    try:
        yield handle
    finally:
        devcluster.down(name)


@pytest.fixture(scope="session")
def api_client(cluster: devcluster.Cluster) -> Iterator[client.ApiClient]:
    """A kubernetes ApiClient (admin) for the session's cluster."""
    with cluster.api_client() as api:
        yield api


def _show(config: pytest.Config, line: str) -> None:
    """Print past pytest's capture (the real node's start-up time belongs in the test log)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{line}", flush=True)


def _real_node_held(holder: str) -> None:
    message = (
        f"this machine's real node is held by dev cluster {holder!r}: run `make demo-down` (or"
        f" `python -m qwen_devtools.devcluster down --name {holder}`) to run the real-node tests"
    )
    if os.environ.get("QWEN_REQUIRE_REAL_PARTS"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def real_cluster(pytestconfig: pytest.Config) -> Iterator[devcluster.Cluster]:
    """A dev cluster of its own with this machine's real node ``qwen-real-0`` (see the module docstring)."""
    name = os.environ.get("QWEN_E2E_REAL_CLUSTER", realnode.TESTS_CLUSTER)
    was_up = devcluster.is_up(name)
    started = time.monotonic()
    try:
        with _build_output_shown(pytestconfig, real_node=True):
            handle = devcluster.up(name, real_node=True)
    except realnode.RealNodeBusy as busy:
        _real_node_held(busy.holder)
    except realnode.RealNodeError as error:
        missing("this machine's real node", str(error))
    except (
        procs.ComponentError,
        build.BuildError,
        network.NetworkError,
        containerd.CtrError,
        ValueError,
    ) as error:
        pytest.fail(f"dev cluster {name!r} with the real node did not start: {error}", pytrace=False)
    _show(pytestconfig, f"[real node] up --real-node of {name!r}: {time.monotonic() - started:.1f} s")
    yield handle
    if not was_up and os.environ.get("QWEN_E2E_KEEP") != "1":
        devcluster.down(name)


@pytest.fixture(scope="session")
def real_api_client(real_cluster: devcluster.Cluster) -> Iterator[client.ApiClient]:
    """A kubernetes ApiClient (admin) for the real-node cluster."""
    with real_cluster.api_client() as api:
        yield api


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"e2e-{slug}-{secrets.token_hex(3)}"


def _print_events(core: client.CoreV1Api, namespace: str) -> None:
    events = core.api_client.sanitize_for_serialization(core.list_namespaced_event(namespace))["items"]
    print(f"\n--- events in namespace {namespace} ---")
    for event in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
        obj = event["involvedObject"]
        what = f"{event.get('type', ''):<8} {event.get('reason', ''):<24} {obj['kind']}/{obj['name']}"
        print(f"{what}: {event.get('message')}")


@pytest.fixture
def namespace(api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount; deleted afterwards, its events shown on failure."""
    yield from _fresh_namespace(api_client, request)


@pytest.fixture
def real_namespace(real_api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """``namespace`` in the real-node cluster."""
    yield from _fresh_namespace(real_api_client, request)


def _fresh_namespace(api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    name = _namespace_name(request.node.name)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=E2E_LABEL)))

    def default_service_account() -> bool:
        accounts = core.list_namespaced_service_account(name, field_selector="metadata.name=default")
        return bool(accounts.items)

    wait_until(default_service_account, 30, f"ServiceAccount {name}/default")
    yield name
    report = getattr(request.node, "devcluster_call_report", None)
    if report is not None and report.failed:
        _print_events(core, name)
    core.delete_namespace(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Keep the call-phase report on the item, so ``namespace`` can tell whether the test failed."""
    report = yield
    if report.when == "call":
        item.devcluster_call_report = report  # type: ignore[attr-defined]
    if report.failed and item.get_closest_marker("journey") is not None:
        item.module.journey_stopped_at = item.name  # type: ignore[union-attr]
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The steps of a journey (marker ``journey``) build on each other: once one failed, the later ones
    are skipped with its name instead of each waiting out its bounds on a state it did not expect."""
    stopped = getattr(getattr(item, "module", None), "journey_stopped_at", None)
    if stopped and item.get_closest_marker("journey") is not None:
        pytest.skip(f"the journey stopped at {stopped}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that stop the session's real-node cluster run last, whatever module they are in."""
    items.sort(key=lambda item: item.get_closest_marker("stops_real_cluster") is not None)
