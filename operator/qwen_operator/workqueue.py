"""When reconciles run: one at a time per object, bursts of triggers coalesced, failures retried with
backoff, and a periodic resync.

A rollout produces dozens of child watch events per second; reconciling once per event would queue work
faster than it drains. The thread that finds an object idle runs it; others just mark it dirty and
return, and the running thread reruns it once with the newest version.

A reconcile that fails (an API conflict, throttling, a server error, a timeout, a child name taken by a
foreign object) is tried again after 1 s, 2 s, 4 s ... up to RETRY_MAX_SECONDS, and never sooner than a
429's Retry-After; the failure is in the status (condition Synced) meanwhile. While an object fails,
only its timer or a new generation of its spec starts it (its own status writes and its children's events
would otherwise defeat the backoff); events during a run that then succeeds still earn one rerun, and a
good reconcile resets the backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from .k8s import Cluster, Failure, describe_failure
from .metrics import FAILING_OBJECTS, RETRIES
from .reconcile import reconcile_and_report, report_failure

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a QwenDeployment

RETRY_FIRST_SECONDS = 1.0
#: The longest wait between two tries of a failing object: long enough not to load an API server that
#: is already struggling, short enough that a fixed cause (a stranger deleted) is noticed within a minute.
RETRY_MAX_SECONDS = float(os.environ.get("QWEN_OPERATOR_RETRY_MAX_SECONDS", "60"))


@dataclass
class _Backoff:
    failures: int = 0
    timer: threading.Timer | None = None
    generation: int | None = None  # of the spec that failed


def _new_spec(generation: int | None, failed: int | None) -> bool:
    """A trigger of a spec other than the one that failed; unknown either side (a child's event, a
    failed GET of the object itself) is not."""
    return generation is not None and failed is not None and generation != failed


def retry_delay(failures: int, failure: Failure | None = None) -> float:
    """Seconds before the next try after `failures` failures in a row (exponential, capped)."""
    delay = min(RETRY_FIRST_SECONDS * 2 ** max(failures - 1, 0), RETRY_MAX_SECONDS)
    return max(delay, failure.retry_after if failure else 0.0)


class WorkQueue:
    """Runs one reconcile per object at a time; triggers that arrive meanwhile collapse into one rerun."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._backoff: dict[Key, _Backoff] = {}
        self._requeues: dict[Key, threading.Timer] = {}
        self._stopped = False
        self._idle = threading.Condition(self._lock)

    def trigger(self, key: Key, generation: int | None = None, retry: bool = False) -> None:
        """Reconcile `key` now in this thread, or mark it for a rerun by the thread already on it.

        `generation`: of the QwenDeployment whose event triggers (None: a child's event or the resync).
        """
        with self._lock:
            if self._stopped:
                return
            if key in self._running:
                # Kept for a rerun if this run succeeds (a failed run drops it: its timer runs next). A
                # retry that succeeds must still see what changed while it ran (pods became ready).
                self._dirty.add(key)
                return
            failing = self._backoff.get(key)
            if failing and not retry and not _new_spec(generation, failing.generation):
                return  # the retry timer runs it
            self._running.add(key)
        try:
            while True:
                ok = self._run_once(key)
                with self._lock:
                    # After a failure the timer runs it next: the events of its own partial writes (and
                    # the timer firing meanwhile) must not turn into an immediate rerun.
                    if not ok or key not in self._dirty:
                        self._dirty.discard(key)
                        return
                    self._dirty.discard(key)
        finally:
            with self._lock:
                self._running.discard(key)
                self._dirty.discard(key)
                self._idle.notify_all()

    def stop(self, timeout: float = 60.0) -> None:
        """No more reconciles: pending retries and looks are cancelled, new triggers ignored, and this
        returns once the running ones finished (or after `timeout` s). Called before the Lease is released."""
        with self._lock:
            self._stopped = True
            timers = [b.timer for b in self._backoff.values() if b.timer] + list(self._requeues.values())
            for timer in timers:
                timer.cancel()
            self._idle.wait_for(lambda: not self._running, timeout)

    def forget(self, key: Key) -> None:
        """The QwenDeployment was deleted: drop its retry and its scheduled look."""
        self._succeeded(key)
        with self._lock:
            timer = self._requeues.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _run_once(self, key: Key) -> bool:
        """One reconcile of `key`; False when it failed (and its retry is scheduled)."""
        body = None
        try:
            body = self.cluster.get_qwendeployment(*key)  # the newest version, whoever triggered
            if body is None:  # deleted: nothing to retry
                self._succeeded(key)
                return True
            result = reconcile_and_report(self.cluster, body)
        except Exception as exc:
            if body is not None and self._gone(key, exc):
                self._succeeded(key)
                return True
            failure = describe_failure(exc)
            delay = self._failed(key, failure, body)
            log.warning(
                "%s/%s: reconcile failed (%s), retrying in %.0f s: %s",
                *key,
                failure.reason,
                delay,
                failure.message,
            )
            log.debug("%s/%s: reconcile failure", *key, exc_info=True)
            if body is not None:
                message = f"{failure.message}; retrying in {delay:.0f} s"
                report_failure(self.cluster, body, (failure.reason, message))
            return False
        if result is not None and result.retry:
            self._failed(key, None, body)
            return False
        self._succeeded(key)
        if result is not None and result.requeue_after:
            self._requeue(key, result.requeue_after)
        return True

    def _requeue(self, key: Key, delay: float) -> None:
        """Run `key` again in `delay` s unless a look is already scheduled."""
        with self._lock:
            if key in self._requeues:
                return
            timer = threading.Timer(delay, self._requeued, args=(key,))
            timer.daemon = True
            self._requeues[key] = timer
            timer.start()

    def _requeued(self, key: Key) -> None:
        with self._lock:
            self._requeues.pop(key, None)
        self.trigger(key)

    def _gone(self, key: Key, exc: Exception) -> bool:
        """True when a 404 came from the QwenDeployment (or its namespace) being deleted meanwhile."""
        if getattr(exc, "status", None) != 404:
            return False
        try:
            gone = self.cluster.get_qwendeployment(*key) is None
        except Exception:  # the API server is what failed: retry as usual
            return False
        if gone:
            log.info("%s/%s: deleted during its reconcile", *key)
        return gone

    def _failed(self, key: Key, failure: Failure | None, body: dict[str, Any] | None) -> float:
        """Count a failure of `key` and schedule its next try; returns the delay."""
        with self._lock:
            state = self._backoff.setdefault(key, _Backoff())
            state.failures += 1
            state.generation = (body or {}).get("metadata", {}).get("generation")
            delay = retry_delay(state.failures, failure)
            if state.timer is not None:
                state.timer.cancel()
            state.timer = threading.Timer(delay, self._retry, args=(key,))
            state.timer.daemon = True
            state.timer.start()
            FAILING_OBJECTS.set(len(self._backoff))
        return delay

    def _retry(self, key: Key) -> None:
        RETRIES.inc()
        self.trigger(key, retry=True)

    def _succeeded(self, key: Key) -> None:
        with self._lock:
            state = self._backoff.pop(key, None)
            if state is not None and state.timer is not None:
                state.timer.cancel()
            FAILING_OBJECTS.set(len(self._backoff))

    async def resync_forever(self, namespaces: list[str], interval: float) -> None:
        """Level-based resync of every QwenDeployment every `interval` s, independent of watch events.

        A failed LIST (the API server restarting, a timeout) is logged and tried again next period."""
        while True:
            await asyncio.sleep(interval)
            try:
                items = await asyncio.to_thread(self.cluster.list_qwendeployments, namespaces)
            except Exception as exc:
                log.warning("resync: listing QwenDeployments failed, next try in %.0f s: %s", interval, exc)
                continue
            for item in items:
                key = (item["metadata"]["namespace"], item["metadata"]["name"])
                try:
                    await asyncio.to_thread(self.trigger, key)
                except Exception:  # one broken object must not stop the resync of the others
                    log.exception("resync of %s/%s failed", *key)
