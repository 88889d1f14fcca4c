"""Process start-up of `qwen-operator run`: JSON logging, API credentials, the metrics/health server,
leader election when asked for, the kopf watches and the resync loop, until interrupted."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, cast

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import handlers
from .k8s import Caches, Cluster, Leases, load_config
from .leader import LEADER, Election, Elector
from .lease import LOST_EXIT_CODE
from .watchcache import Contact, Informer
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

RESYNC_SECONDS = float(os.environ.get("QWEN_OPERATOR_RESYNC_SECONDS", "300"))
#: How long a watch may go without hearing from the API server before /healthz fails (and the kubelet
#: restarts the pod): an idle watch hears at least every watchcache.WATCH_SECONDS (300), when the server
#: ends it, so this leaves room for that, a relist, and a few failed tries of a restarting API server.
WATCH_STALL_SECONDS = float(os.environ.get("QWEN_OPERATOR_WATCH_STALL_SECONDS", "600"))
QWD_WATCH = "QwenDeployments (kopf's watch, the resync's LIST)"


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


def configure_logging(log_level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    if log_level != "debug":  # kopf logs one "succeeded" line per watch event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def stuck_watches(
    informers: Iterable[Informer], qwd: Contact, now: float, bound: float = WATCH_STALL_SECONDS
) -> dict[str, int]:
    """Seconds of silence of each watch that heard nothing from the API server for longer than `bound`.

    kopf's watch of QwenDeployments hands over no sign of its own restarts, only events, so with none
    changing its contact is the resync's LIST: it gets a resync period more."""
    watches = [(i.name, i.contact, bound) for i in informers]
    watches.append((QWD_WATCH, qwd, bound + RESYNC_SECONDS))
    return {
        name: round(contact.silent_for(now) or 0)
        for name, contact, limit in watches
        if contact.stalled(now, limit)
    }


def health(caches: Caches, queue: WorkQueue, bound: float = WATCH_STALL_SECONDS) -> dict[str, Any]:
    """The body of /healthz; "ok" false when a watch is stuck. A follower waiting for the Lease runs no
    watch (none has started), so it is healthy: waiting is its job."""
    stuck = stuck_watches(caches.all(), queue.qwd_contact, time.monotonic(), bound)
    if not stuck:
        return {"ok": True}
    # Said here too: the kubelet's restart for it leaves only this log to say why.
    log.warning("watches silent for over %.0f s (s of silence): %s", bound, stuck)
    return {"ok": False, "stuck": stuck, "boundSeconds": bound}


async def serve_metrics(port: int, healthy: Callable[[], dict[str, Any]]) -> web.AppRunner:
    """Serve /metrics and /healthz on all addresses; `healthy()` is the health answer ("ok": 200 or 503)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        answer = healthy()
        return web.json_response(answer, status=200 if answer["ok"] else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


def run(
    namespaces: list[str], metrics_port: int, log_level: str = "info", election: Election | None = None
) -> int:
    """Run the operator until interrupted: cluster-wide when `namespaces` is empty; with `election`,
    only while this replica holds the leader Lease (a follower serves /healthz and /metrics and waits)."""
    configure_logging(log_level)
    load_config()
    caches = Caches(namespaces)
    queue = WorkQueue(Cluster(caches=caches))
    handlers.install(queue)

    async def main() -> None:
        runner = await serve_metrics(metrics_port, lambda: health(caches, queue))
        try:
            if election is None:
                LEADER.set(1)
                await operate(queue, namespaces)
            else:
                await lead(Elector(Leases(), election), queue, namespaces)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return 0


async def operate(queue: WorkQueue, namespaces: list[str]) -> None:
    """Fill the caches, then run the kopf watches and the periodic resync until kopf stops (SIGINT,
    SIGTERM); returns once no handler runs any more (the resync's reconciles run in the loop's default
    executor, the informers' events in a pool of their own)."""
    caches = queue.cluster.caches
    assert caches is not None
    events = ThreadPoolExecutor(max_workers=4, thread_name_prefix="child-event")
    caches.on_change = lambda namespace, owner: events.submit(handlers.on_child, namespace, owner)
    await asyncio.to_thread(caches.start)
    settings = kopf.OperatorSettings()  # handlers.configure() fills it in at kopf's start-up
    resync = asyncio.create_task(queue.resync_forever(namespaces, RESYNC_SECONDS))
    queue.qwd_contact.heard()
    try:
        await kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            stop_flag=None,
            settings=settings,
            # kopf's default identity asks the passwd database for the user, which has no entry
            # for the image's uid 65532 (getpwuid fails and the pod crash-loops): the pod's name.
            identity=cast(Any, socket.gethostname()),  # kopf's Identity is a NewType of str
        )
    finally:
        resync.cancel()
        queue.qwd_contact.ended()
        caches.stop()
        # kopf leaves its handler threads running: queued work is dropped, running reconciles finish;
        # retries and scheduled looks are cancelled.
        for executor in (settings.execution.executor, events):
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        await asyncio.to_thread(queue.stop)


async def lead(elector: Elector, queue: WorkQueue, namespaces: list[str]) -> None:
    """Wait for the Lease, then operate while renewing it. Stopped (SIGTERM), the leader waits for its
    running reconciles, still renewing, then releases the Lease so that a follower takes over at once.
    Having lost the Lease, the process exits on the spot."""
    LEADER.set(0)
    await elector.acquire()
    LEADER.set(1)
    holding = asyncio.create_task(elector.hold())
    try:
        await _unless_lost(elector, holding, operate(queue, namespaces))
    finally:
        await _unless_lost(elector, holding, asyncio.get_running_loop().shutdown_default_executor())
        holding.cancel()
        elector.release()  # in this thread: the default executor is shut down


async def _unless_lost(elector: Elector, holding: asyncio.Task[None], work: Awaitable[None]) -> None:
    """Await `work`, exiting at once if `holding` ends first (the Lease is lost)."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, holding}, return_when=asyncio.FIRST_COMPLETED)
    if holding.done():
        _exit_lost(elector)
    task.result()


def _exit_lost(elector: Elector) -> NoReturn:
    """Exit without unwinding: reconciles running in threads cannot be cancelled, and another replica
    may hold the Lease now, so no write of this process may follow."""
    log.error(
        "%s: leadership lost; exiting with status %d to restart as a follower", elector.where, LOST_EXIT_CODE
    )
    LEADER.set(0)
    logging.shutdown()  # flush the log line above
    os._exit(LOST_EXIT_CODE)
