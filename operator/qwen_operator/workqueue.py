"""When reconciles run: one at a time per object, bursts of triggers coalesced, and a periodic resync.

A rollout produces dozens of child watch events per second; reconciling once per event would queue work
faster than it drains. The thread that finds an object idle runs it; others just mark it dirty and
return, and the running thread reruns it once with the newest version.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from .k8s import Cluster
from .reconcile import reconcile_and_report

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a QwenDeployment


class WorkQueue:
    """Runs one reconcile per object at a time; triggers that arrive meanwhile collapse into one rerun."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()

    def trigger(self, key: Key) -> None:
        """Reconcile `key` now in this thread, or mark it for a rerun by the thread already on it."""
        with self._lock:
            if key in self._running:
                self._dirty.add(key)
                return
            self._running.add(key)
        try:
            while True:
                body = self.cluster.get_qwendeployment(*key)  # the newest version, whoever triggered
                if body is not None:
                    reconcile_and_report(self.cluster, body)
                with self._lock:
                    if key not in self._dirty:
                        return
                    self._dirty.discard(key)
        finally:
            with self._lock:
                self._running.discard(key)
                self._dirty.discard(key)

    async def resync_forever(self, namespaces: list[str], interval: float) -> None:
        """Level-based resync of every QwenDeployment every `interval` s, independent of watch events."""
        while True:
            await asyncio.sleep(interval)
            for item in await asyncio.to_thread(self.cluster.list_qwendeployments, namespaces):
                key = (item["metadata"]["namespace"], item["metadata"]["name"])
                try:
                    await asyncio.to_thread(self.trigger, key)
                except Exception:  # one broken object must not stop the resync of the others
                    log.exception("resync of %s/%s failed", *key)
