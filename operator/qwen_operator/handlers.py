"""kopf wiring: watch QwenDeployments and their children, run the reconcile, write status on change.

Only watching handlers are used (no create/update handlers, timers or daemons), so kopf writes no
annotations and adds no finalizer: deleting a QwenDeployment never hangs on the operator, children
go with it through their ownerReferences, and a resync that finds nothing to do writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any, cast

import kopf
import kubernetes

from .api.spec import GROUP, PLURAL, VERSION
from .k8s import KINDS, Cluster
from .manifests.names import LABEL_PREFIX, MANAGED_BY
from .metrics import DEPLOYMENTS_READY, serve
from .reconcile import reconcile
from .status import transitions

log = logging.getLogger("qwen_operator")

RESYNC_SECONDS = float(os.environ.get("QWEN_OPERATOR_RESYNC_SECONDS", "300"))
_cluster: Cluster | None = None
_healthy = threading.Event()


def cluster() -> Cluster:
    global _cluster
    if _cluster is None:
        _cluster = Cluster()
    return _cluster


class Coalescer:
    """Runs one reconcile per object at a time; triggers that arrive meanwhile collapse into one rerun.

    A rollout produces dozens of child watch events per second; reconciling once per event would
    queue work faster than it drains. The thread that finds an object idle runs it; others just mark
    it dirty and return.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()

    def trigger(self, key: tuple[str, str]) -> None:
        with self._lock:
            if key in self._running:
                self._dirty.add(key)
                return
            self._running.add(key)
        try:
            while True:
                body = _fetch(*key)  # always the newest version, whoever triggered
                if body is not None:
                    reconcile_object(body)
                with self._lock:
                    if key not in self._dirty:
                        return
                    self._dirty.discard(key)
        finally:
            with self._lock:
                self._running.discard(key)
                self._dirty.discard(key)


_coalescer = Coalescer()


def reconcile_object(body: dict[str, Any]) -> None:
    """Reconcile one QwenDeployment body and write its status when it changed."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return
    key = (meta["namespace"], meta["name"])
    result = reconcile(cluster(), body)
    old = body.get("status")
    if old != result.status:
        cluster().patch_status(meta["namespace"], meta["name"], PLURAL, f"{GROUP}/{VERSION}", result.status)
        for cond in transitions(old, result.status):
            _event(body, cond)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")["status"] == "True"
    DEPLOYMENTS_READY.labels(*key).set(1 if ready else 0)
    for write in result.writes:
        log.info("%s/%s: %s", *key, write)


def _event(body: dict[str, Any], cond: dict[str, Any]) -> None:
    if cond["status"] == "Unknown":
        return
    good = (cond["status"] == "True") != (cond["type"] == "Progressing")
    kind = "Normal" if good or cond["type"] == "Progressing" else "Warning"
    kopf.event(
        cast(kopf.Body, body),
        type=kind,
        reason=cond["reason"],
        message=f"{cond['type']}={cond['status']}: {cond['message']}"[:1024],
    )


def _fetch(namespace: str, name: str) -> dict[str, Any] | None:
    return cluster().get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_qwendeployment(body: kopf.Body, type: str | None, **_: Any) -> None:
    if type != "DELETED":
        _coalescer.trigger((body["metadata"]["namespace"], body["metadata"]["name"]))


def _on_child(body: kopf.Body, **_: Any) -> None:
    """A child changed or vanished: reconcile its owner (reverts hand edits, recreates deletions)."""
    owner = body["metadata"].get("labels", {}).get(f"{LABEL_PREFIX}/deployment")
    if owner:
        _coalescer.trigger((body["metadata"]["namespace"], owner))


_CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}


def _register_child_watchers() -> None:
    for kind in KINDS.values():
        group, _, version = kind.api_version.rpartition("/")
        kopf.on.event(group, version, kind.plural, labels=_CHILD_LABELS, id=f"child-{kind.plural}")(_on_child)


async def _resync_forever(namespaces: list[str]) -> None:
    """Periodic level-based resync of every QwenDeployment, independent of watch events."""
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        paths = [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in namespaces] or [
            f"/apis/{GROUP}/{VERSION}/{PLURAL}"
        ]
        for path in paths:
            for item in await asyncio.to_thread(cluster().list_items, path):
                key = (item["metadata"]["namespace"], item["metadata"]["name"])
                try:
                    await asyncio.to_thread(_coalescer.trigger, key)
                except Exception:  # one broken object must not stop the resync of the others
                    log.exception(
                        "resync of %s/%s failed", item["metadata"]["namespace"], item["metadata"]["name"]
                    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=LABEL_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=LABEL_PREFIX)
    settings.posting.level = logging.INFO
    settings.peering.standalone = True
    settings.watching.server_timeout = 270
    settings.execution.max_workers = 4


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _load_kube_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


def run(namespaces: list[str], metrics_port: int, log_level: str = "info") -> int:
    """Run the operator until interrupted: cluster-wide when `namespaces` is empty."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    if log_level != "debug":  # kopf logs one "succeeded" line per watch event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    _load_kube_config()
    _register_child_watchers()

    async def main() -> None:
        runner = await serve(metrics_port, _healthy.is_set)
        resync = asyncio.create_task(_resync_forever(namespaces))
        _healthy.set()
        try:
            await kopf.operator(
                clusterwide=not namespaces, namespaces=namespaces, standalone=True, stop_flag=None
            )
        finally:
            resync.cancel()
            await runner.cleanup()

    asyncio.run(main())
    return 0
