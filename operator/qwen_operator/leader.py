"""Lease-based leader election (coordination.k8s.io/v1), so that of several operator replicas exactly one
writes: the leader runs the watches and the resync, the others serve /healthz and /metrics and wait.

Written here rather than taken from `kubernetes.leaderelection` (kubernetes 37), whose loop makes API
calls without a timeout (a renewal that hangs outlives the renew deadline, so the old leader keeps
writing after another replica took the Lease), lets connection errors other than ApiException escape
from the elector thread, and measures expiry with the wall clock. The rules follow client-go: a
candidate may take the Lease when it is free, its own, or unchanged for its full duration as measured on
the candidate's own monotonic clock since it first saw that version (no trust in other clocks); every
write carries the resourceVersion it read, so two candidates racing for one Lease cannot both win.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import urllib3
from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.rest import ApiException
from prometheus_client import Gauge

from .k8s import Leases
from .lease import LEASE_NAME, Timing

log = logging.getLogger(__name__)

LEADER = Gauge("qwen_operator_leader", "1 while this replica is the leader (runs the reconciles), else 0.")


@dataclass(frozen=True)
class Election:
    """Which Lease to contend for, as whom, and how fast."""

    namespace: str
    name: str = LEASE_NAME
    identity: str = ""
    timing: Timing = field(default_factory=Timing)


def default_identity() -> str:
    """The pod's name (POD_NAME from the downward API, else the hostname, which is the pod's name)."""
    return os.environ.get("POD_NAME") or socket.gethostname()


class Attempt(enum.Enum):
    """Outcome of one try to acquire or renew the Lease."""

    HELD = "held"  # this candidate holds the Lease now
    TAKEN = "taken"  # another candidate holds a valid Lease
    FAILED = "failed"  # the API did not answer as expected (unreachable, timeout, conflict, denied)


@dataclass(frozen=True)
class _Seen:
    """A version of the Lease as this candidate last read it, and when (monotonic) it first saw it."""

    version: str
    holder: str
    duration: float
    since: float


def may_take(seen: _Seen, identity: str, now: float) -> bool:
    """Free, ours, or not renewed for its whole duration since this candidate first saw it."""
    return seen.holder in ("", identity) or now >= seen.since + seen.duration


class Elector:
    """One candidate for one Lease; `acquire`, then `hold` until it returns (lost), or `release`."""

    def __init__(self, api: Leases, election: Election, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.election = election
        self.identity = election.identity or default_identity()
        self.timing = election.timing
        self.clock = clock
        self._seen: _Seen | None = None
        self._renewed = 0.0  # start (monotonic) of the last attempt that held the Lease
        # Threads of its own: the loop's default executor is shut down while the Lease is still held.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lease")

    @property
    def where(self) -> str:
        return f"Lease {self.election.namespace}/{self.election.name}"

    def try_acquire_or_renew(self, timeout: float | None = None) -> Attempt:
        """One read and at most one write of the Lease; never raises for API or network errors."""
        try:
            return self._attempt(timeout or self.timing.retry)
        except ApiException as exc:
            log.warning("%s: %s %s", self.where, exc.status, exc.reason)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("%s: API server unreachable: %s", self.where, exc)
        return Attempt.FAILED

    def _attempt(self, timeout: float) -> Attempt:
        ns, name = self.election.namespace, self.election.name
        try:
            lease = self.api.read(ns, name, timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(timeout)
        seen = self._observe(lease)
        if not may_take(seen, self.identity, self.clock()):
            return Attempt.TAKEN
        spec = lease.spec or V1LeaseSpec()
        now = datetime.now(UTC)
        if spec.holder_identity != self.identity:
            log.info("%s: taking over from %r", self.where, spec.holder_identity or "nobody")
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = math.ceil(self.timing.lease)
        spec.renew_time = now
        lease.spec = spec
        # The read resourceVersion goes with it: a write by anyone in between makes this a 409.
        written = self.api.replace(ns, name, lease, timeout)
        self._observe(written)
        return Attempt.HELD

    def _create(self, timeout: float) -> Attempt:
        now = datetime.now(UTC)
        lease = V1Lease(
            metadata=V1ObjectMeta(name=self.election.name, namespace=self.election.namespace),
            spec=V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=math.ceil(self.timing.lease),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        written = self.api.create(self.election.namespace, lease, timeout)
        log.info("%s: created", self.where)
        self._observe(written)
        return Attempt.HELD

    def _observe(self, lease: V1Lease) -> _Seen:
        """Remember the version read; a version seen before keeps the time it was first seen."""
        version = str(lease.metadata.resource_version if lease.metadata else "")
        if self._seen is None or self._seen.version != version:
            spec = lease.spec or V1LeaseSpec()
            holder = spec.holder_identity or ""
            if self._seen is not None and holder not in (self._seen.holder, self.identity):
                log.info("%s: now held by %r", self.where, holder)
            duration = float(spec.lease_duration_seconds or self.timing.lease)
            self._seen = _Seen(version, holder, duration, self.clock())
        return self._seen

    async def _try(self, budget: float) -> Attempt:
        """An attempt in a worker thread that gives up after `budget` s, whatever the HTTP stack does."""
        timeout = max(0.1, min(self.timing.retry, budget))
        try:
            attempt = asyncio.get_running_loop().run_in_executor(
                self._threads, self.try_acquire_or_renew, timeout
            )
            return await asyncio.wait_for(attempt, budget)
        except TimeoutError:
            log.warning("%s: no answer within %.1f s", self.where, budget)
            return Attempt.FAILED

    async def acquire(self) -> None:
        """Wait, as a follower, until this candidate holds the Lease."""
        log.info("%s: %s is a candidate", self.where, self.identity)
        while True:
            started = self.clock()
            if await self._try(self.timing.retry) is Attempt.HELD:
                break
            await asyncio.sleep(self.timing.retry)
        self._renewed = started
        log.info("%s: %s is the leader", self.where, self.identity)

    async def hold(self) -> None:
        """Renew every retry period; return as soon as the Lease is lost: another holder seen, or no
        renewal for the renew deadline (counted from the start of the last good attempt, which is
        before the API server stamped that version, so the deadline passes before any follower's
        lease duration can)."""
        while True:
            left = self._renewed + self.timing.renew_deadline - self.clock()
            await asyncio.sleep(min(self.timing.retry, max(0.0, left)))
            started = self.clock()
            budget = self._renewed + self.timing.renew_deadline - started
            if budget <= 0:
                log.error("%s: not renewed for %.1f s", self.where, started - self._renewed)
                return
            outcome = await self._try(budget)
            if outcome is Attempt.HELD:
                self._renewed = started
            elif outcome is Attempt.TAKEN:
                log.error("%s: taken by %r", self.where, self._seen.holder if self._seen else "?")
                return

    def release(self) -> bool:
        """Give the Lease up (holder cleared) so a follower takes over at its next attempt instead of
        after the lease duration; only if this candidate still holds it. Returns whether it did."""
        ns, name = self.election.namespace, self.election.name
        try:
            lease = self.api.read(ns, name, self.timing.retry)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = datetime.now(UTC)
            self.api.replace(ns, name, lease, self.timing.retry)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("%s: not released: %s", self.where, exc)
            return False
        log.info("%s: released", self.where)
        return True
