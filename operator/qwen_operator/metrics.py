"""The operator's own Prometheus metrics, and the HTTP endpoint serving them with /healthz."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

RECONCILES = Counter("qwen_operator_reconciles_total", "Reconciles run, by result.", ["result"])
RECONCILE_SECONDS = Histogram(
    "qwen_operator_reconcile_duration_seconds",
    "Duration of one reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_WRITES = Counter("qwen_operator_api_writes_total", "Write requests sent to the API server.", ["method"])
MANAGED_OBJECTS = Gauge(
    "qwen_operator_managed_objects", "Child objects per QwenDeployment.", ["namespace", "name"]
)
DEPLOYMENTS_READY = Gauge(
    "qwen_operator_deployment_ready", "1 when the QwenDeployment is Ready.", ["namespace", "name"]
)


async def serve(port: int, healthy: object) -> web.AppRunner:
    """Serve /metrics and /healthz on all addresses; `healthy()` decides the health answer."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = bool(healthy())  # type: ignore[operator]
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
