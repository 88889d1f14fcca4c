"""Process start-up of `qwen-operator run`: JSON logging, API credentials, the metrics/health server,
the kopf watches and the resync loop, until interrupted."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, cast

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import handlers
from .k8s import Cluster, load_config
from .workqueue import WorkQueue

RESYNC_SECONDS = float(os.environ.get("QWEN_OPERATOR_RESYNC_SECONDS", "300"))


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


async def serve_metrics(port: int, healthy: Callable[[], bool]) -> web.AppRunner:
    """Serve /metrics and /healthz on all addresses; `healthy()` decides the health answer."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


def run(namespaces: list[str], metrics_port: int, log_level: str = "info") -> int:
    """Run the operator until interrupted: cluster-wide when `namespaces` is empty."""
    configure_logging(log_level)
    load_config()
    queue = WorkQueue(Cluster())
    handlers.install(queue)
    started = threading.Event()

    async def main() -> None:
        runner = await serve_metrics(metrics_port, started.is_set)
        resync = asyncio.create_task(queue.resync_forever(namespaces, RESYNC_SECONDS))
        started.set()
        try:
            await kopf.operator(
                clusterwide=not namespaces,
                namespaces=namespaces,
                standalone=True,
                stop_flag=None,
                # kopf's default identity asks the passwd database for the user, which has no entry
                # for the image's uid 65532 (getpwuid fails and the pod crash-loops): the pod's name.
                identity=cast(Any, socket.gethostname()),  # kopf's Identity is a NewType of str
            )
        finally:
            resync.cancel()
            await runner.cleanup()

    asyncio.run(main())
    return 0
