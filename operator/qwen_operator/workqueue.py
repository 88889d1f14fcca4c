"""When reconciles run: one at a time per object, bursts of triggers coalesced, failures retried with
backoff, and a periodic resync.

A rollout produces dozens of child watch events per second; reconciling once per event would queue work
faster than it drains. The thread that finds an object idle runs it; others just mark it dirty and
return, and the running thread reruns it once with the newest version.

A reconcile that fails (an API conflict, throttling, a server error, a timeout, a child name taken by a
foreign object) is tried again after 1 s, 2 s, 4 s ... up to RETRY_MAX_SECONDS, each lengthened by 0 to
25 % at random, and never sooner than a 429's Retry-After; the failure is in the status (condition
Synced) meanwhile. While an object fails, only its timer or a new generation of its spec starts it (its
own status writes and its children's events would otherwise defeat the backoff); events during a run that
then succeeds still earn one rerun, and a good reconcile resets the backoff.

Retries and scheduled looks wait in one heap, watched by one timer thread, which hands each due key to a
pool of QWEN_OPERATOR_WORKERS threads: after an outage, a thousand failing objects cost neither a thousand
timer threads nor a thousand reconciles at once against an API server that has just come back.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import metrics
from .k8s import Cluster, Failure, describe_failure
from .metrics import FAILING_OBJECTS, RETRIES
from .reconcile import reconcile_and_report, report_failure
from .watchcache import Contact, unreachable

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a QwenDeployment

RETRY_FIRST_SECONDS = 1.0
#: The longest wait between two tries of a failing object: long enough not to load an API server that
#: is already struggling, short enough that a fixed cause (a stranger deleted) is noticed within a minute.
RETRY_MAX_SECONDS = float(os.environ.get("QWEN_OPERATOR_RETRY_MAX_SECONDS", "60"))
#: The most a delay is lengthened at random, as a share of it (see retry_delay).
RETRY_JITTER = 0.25
#: How long a child's or a pod's event waits for the others of its burst (WorkQueue.trigger_soon).
CHILD_EVENT_DELAY_SECONDS = float(os.environ.get("QWEN_OPERATOR_CHILD_EVENT_DELAY_SECONDS", "1"))
#: Threads that run the reconciles of due retries and looks: the most of those that run at once.
WORKERS = int(os.environ.get("QWEN_OPERATOR_WORKERS", "4"))


@dataclass
class _Backoff:
    failures: int = 0
    generation: int | None = None  # of the spec that failed


def _new_spec(generation: int | None, failed: int | None) -> bool:
    """A trigger of a spec other than the one that failed; unknown either side (a child's event, a
    failed GET of the object itself) is not."""
    return generation is not None and failed is not None and generation != failed


def retry_delay(
    failures: int, failure: Failure | None = None, jitter: Callable[[], float] = random.random
) -> float:
    """Seconds before the next try after `failures` failures in a row: exponential up to the cap, at
    least a 429's Retry-After, then lengthened by RETRY_JITTER * `jitter()` (a number in [0, 1)) of it.

    Jitter only lengthens ("full" or "equal" jitter would shorten): no retry comes sooner than the
    schedule or than what a throttling server asked for, and the spread grows with the delay, so the
    objects that failed together in an outage (at the cap by then) come back over a quarter of the cap
    instead of in the same instant, throttled ones included."""
    delay = min(RETRY_FIRST_SECONDS * 2 ** max(failures - 1, 0), RETRY_MAX_SECONDS)
    floor = max(delay, failure.retry_after if failure else 0.0)
    return floor * (1 + RETRY_JITTER * jitter())


class WorkQueue:
    """Runs one reconcile per object at a time; triggers that arrive meanwhile collapse into one rerun."""

    def __init__(self, cluster: Cluster, workers: int = WORKERS) -> None:
        self.cluster = cluster
        #: When kopf's watch or the resync's LIST of QwenDeployments last brought an answer (/healthz).
        self.qwd_contact = Contact()
        self._lock = threading.Lock()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._backoff: dict[Key, _Backoff] = {}
        self._stopped = False
        self._idle = threading.Condition(self._lock)
        # The schedule of retries (retry=True) and looks: the current token of each (key, retry), and a
        # heap of (due, token, key, retry) whose entries without a current token are skipped (cancelled
        # or replaced), cheaper than removing them from the middle of the heap.
        self._due: dict[tuple[Key, bool], int] = {}
        self._look_at: dict[Key, float] = {}  # when the scheduled look of a key is due
        self._heap: list[tuple[float, int, Key, bool]] = []
        self._tokens = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._timer: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")

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
            self._due.clear()
            self._look_at.clear()
            self._heap.clear()
            self._wake.notify_all()
        # Due but not started: dropped; one that has just started finds the queue stopped.
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._idle.wait_for(lambda: not self._running, timeout)

    def forget(self, key: Key) -> None:
        """The QwenDeployment was deleted: drop its retry, its scheduled look and its metrics."""
        self._succeeded(key)
        with self._lock:
            self._due.pop((key, False), None)
            self._look_at.pop(key, None)
            if key in self._running:
                # Its run would set its gauges again after this: the rerun finds it gone and drops them.
                self._dirty.add(key)
        metrics.forget(*key)

    def _run_once(self, key: Key) -> bool:
        """One reconcile of `key`; False when it failed (and its retry is scheduled)."""
        body = None
        try:
            body = self.cluster.get_qwendeployment(*key)  # the newest version, whoever triggered
            if body is None:  # deleted, perhaps unseen by the watch: nothing to retry or to report
                self._succeeded(key)
                metrics.forget(*key)
                return True
            result = reconcile_and_report(self.cluster, body)
        except Exception as exc:
            if body is not None and self._gone(key, exc):
                self._succeeded(key)
                metrics.forget(*key)
                return True
            failure = describe_failure(exc)
            delay = self._failed(key, failure, body)
            # In tenths: whole seconds would round a jittered 4.6 s up to 5, later than the retry comes
            # (e2e/test_api_faults.py holds the measured gaps to this number).
            log.warning(
                "%s/%s: reconcile failed (%s), retrying in %.1f s: %s",
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

    def trigger_soon(self, key: Key, delay: float = CHILD_EVENT_DELAY_SECONDS) -> None:
        """Reconcile `key` in `delay` s, once however many triggers arrive meanwhile: a child's or a
        pod's event. A new pod goes through created, scheduled, started and ready within a second or
        two, and a rollout sends dozens of events: each a reconcile, each a status of its own to write."""
        with self._lock:
            self._schedule(key, delay, retry=False)

    def _requeue(self, key: Key, delay: float) -> None:
        """Run `key` again in `delay` s unless a look is already scheduled."""
        with self._lock:
            self._schedule(key, delay, retry=False)

    def _schedule(self, key: Key, delay: float, retry: bool) -> None:
        """Have the pool run `key` in `delay` s: as its retry (replacing a scheduled one), or as a look
        (unless one is scheduled as soon or sooner: the earlier look replaces a later one). The caller
        holds the lock."""
        due = time.monotonic() + delay
        if self._stopped or (not retry and self._look_at.get(key, float("inf")) <= due):
            return
        token = next(self._tokens)
        self._due[(key, retry)] = token
        if not retry:
            self._look_at[key] = due
        heapq.heappush(self._heap, (due, token, key, retry))
        if self._timer is None:
            self._timer = threading.Thread(target=self._hand_out, name="workqueue timer", daemon=True)
            self._timer.start()
        self._wake.notify()

    def _hand_out(self) -> None:
        """The timer thread: sleep until the earliest entry is due, hand its key to the pool, repeat."""
        with self._lock:
            while not self._stopped:
                if not self._heap:
                    self._wake.wait()
                    continue
                due, token, key, retry = self._heap[0]
                if (left := due - time.monotonic()) > 0:
                    self._wake.wait(left)  # or an earlier entry arrives
                    continue
                heapq.heappop(self._heap)
                if self._due.get((key, retry)) == token:
                    del self._due[(key, retry)]
                    if not retry:
                        self._look_at.pop(key, None)
                    self._pool.submit(self._run_due, key, retry)

    def _run_due(self, key: Key, retry: bool) -> None:
        if retry:
            RETRIES.inc()
        try:
            self.trigger(key, retry=retry)
        except Exception:  # the pool would keep it in a future that nobody reads
            log.exception("%s/%s: scheduled reconcile failed", *key)

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
            self._schedule(key, delay, retry=True)
            FAILING_OBJECTS.set(len(self._backoff))
        return delay

    def _succeeded(self, key: Key) -> None:
        with self._lock:
            self._backoff.pop(key, None)
            self._due.pop((key, True), None)
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
                if unreachable(exc):
                    self.qwd_contact.unreachable()
                continue
            self.qwd_contact.heard()
            for item in items:
                key = (item["metadata"]["namespace"], item["metadata"]["name"])
                try:
                    await asyncio.to_thread(self.trigger, key)
                except Exception:  # one broken object must not stop the resync of the others
                    log.exception("resync of %s/%s failed", *key)
