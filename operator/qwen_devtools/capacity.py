"""The serving capacity of an engine set, from watch events: every version of the engine Deployment
and of its Service's EndpointSlices the API server sends, so that a dip of a second cannot slip between
two polls. Tests of transitions (e2e/test_transitions.py, e2e/test_real_journey.py) start one before
an edit and read the lowest capacity it saw afterwards."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch


@dataclass
class Sample:
    """One watch event's view: when, what the Deployment says, and the ready endpoints."""

    at: float
    spec_replicas: int | None
    available: int | None
    ready_endpoints: int | None
    strategy: dict[str, Any] | None


@dataclass
class CapacityWatch:
    """Watches the Deployment `name` and the EndpointSlices of the Service `service` in `namespace`."""

    api: client.ApiClient
    namespace: str
    name: str
    service: str
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _deployment: dict[str, Any] = field(default_factory=dict)
    _slices: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _synced: threading.Barrier | None = None

    def __enter__(self) -> CapacityWatch:
        self._synced = threading.Barrier(3, timeout=30)
        for target in (self._watch_deployment, self._watch_slices):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._synced.wait()  # both watches have listed: every later change is seen
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _record(self) -> None:
        dep = self._deployment
        self.samples.append(
            Sample(
                at=time.time(),
                spec_replicas=(dep.get("spec") or {}).get("replicas"),
                available=(dep.get("status") or {}).get("availableReplicas", 0) if dep else None,
                ready_endpoints=sum(self._slices.values()),
                strategy=(dep.get("spec") or {}).get("strategy"),
            )
        )

    def _stream(self, list_call: Any, on_item: Any, **kwargs: Any) -> None:
        """LIST, then WATCH from its resourceVersion until stopped (restarted when the server ends it)."""
        listed = list_call(self.namespace, **kwargs)
        with self._lock:
            for item in listed.items:
                on_item("ADDED", self.api.sanitize_for_serialization(item))
            self._record()
        assert self._synced is not None
        self._synced.wait()
        version = listed.metadata.resource_version
        while not self._stop.is_set():
            w = watch.Watch()
            for event in w.stream(
                list_call, self.namespace, resource_version=version, timeout_seconds=5, **kwargs
            ):
                obj = self.api.sanitize_for_serialization(event["object"])
                version = obj["metadata"]["resourceVersion"]
                with self._lock:
                    on_item(event["type"], obj)
                    self._record()
                if self._stop.is_set():
                    w.stop()

    def _watch_deployment(self) -> None:
        apps = client.AppsV1Api(self.api)

        def on_item(kind: str, obj: dict[str, Any]) -> None:
            self._deployment = {} if kind == "DELETED" else obj

        self._stream(apps.list_namespaced_deployment, on_item, field_selector=f"metadata.name={self.name}")

    def _watch_slices(self) -> None:
        discovery = client.DiscoveryV1Api(self.api)

        def on_item(kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self._slices.pop(name, None)
                return
            endpoints = obj.get("endpoints") or []
            self._slices[name] = sum(1 for e in endpoints if (e.get("conditions") or {}).get("ready"))

        self._stream(
            discovery.list_namespaced_endpoint_slice,
            on_item,
            label_selector=f"kubernetes.io/service-name={self.service}",
        )

    def since(self, start: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.at >= start]

    def lowest(self, start: float = 0.0) -> tuple[int, int]:
        """(fewest available replicas, fewest ready endpoints) seen since `start`."""
        samples = self.since(start)
        assert samples, "no watch event seen"
        return (
            min(s.available or 0 for s in samples),
            min(s.ready_endpoints or 0 for s in samples),
        )

    def replicas_seen(self, start: float = 0.0) -> list[int | None]:
        """spec.replicas of every version of the Deployment since `start`, changes only."""
        out: list[int | None] = []
        for s in self.since(start):
            if not out or out[-1] != s.spec_replicas:
                out.append(s.spec_replicas)
        return out

    def strategies_seen(self, start: float = 0.0) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for s in self.since(start):
            if not out or out[-1] != s.strategy:
                out.append(s.strategy)
        return out
