"""The gateway exactly as the operator renders it (run-nginx.sh with nginx.conf, vllm-router's command
line, both exporters' configuration) on loopback, in front of running engines; only ports, paths and the
static engine URLs are the test's."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen_operator import gateway
from qwen_operator.api.review import Review
from qwen_operator.gateway import Wiring
from qwen_operator.gateway.router import ENGINE_KEY_ENV, tier_engine_key_env

from ..net import LOOPBACK, free_ports, http_post, metric_sum
from ..procs import Proc, spawn, wait_ready
from ..vllm_env import vllm_router_bin
from ..wait import wait_until
from .exporters import nginx_exporter_bin, nginxlog_exporter_bin
from .nginx import nginx_bin


def write_secret_volume(directory: Path, data: Mapping[str, str]) -> None:
    """Write `data` the way kubelet updates a mounted Secret: files are symlinks through `..data`,
    which is swapped atomically to a new timestamped directory on every update."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for key, value in data.items():
        (stamp / key).write_text(value)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp_link = directory / "..data_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(stamp.name)
    tmp_link.rename(directory / "..data")
    for entry in directory.iterdir():
        if not entry.name.startswith("..") and entry.name not in data:
            entry.unlink()
    for key in data:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    if old:
        shutil.rmtree(directory / old, ignore_errors=True)


@dataclass
class GatewayStack:
    """A running gateway: run-nginx.sh (nginx), vllm-router and both exporters, on loopback."""

    wiring: Wiring
    root: Path
    procs: dict[str, Proc]

    def _url(self, port: int) -> str:
        return f"http://{LOOPBACK}:{port}"

    @property
    def url(self) -> str:
        """The client endpoint (what the Service exposes)."""
        return self._url(self.wiring.http_port)

    @property
    def status_url(self) -> str:
        return self._url(self.wiring.status_port)

    @property
    def router_url(self) -> str:
        """vllm-router itself (loopback-only in the pod: admin routes live here)."""
        return self._url(self.wiring.router_port)

    @property
    def router_metrics_url(self) -> str:
        return self._url(self.wiring.router_metrics_port) + "/metrics"

    @property
    def log_metrics_url(self) -> str:
        return self._url(self.wiring.log_metrics_port) + "/metrics"

    @property
    def nginx_metrics_url(self) -> str:
        return self._url(self.wiring.nginx_metrics_port) + "/metrics"

    @property
    def activator_url(self) -> str:
        """The activator's metrics port (/metrics, /scale), present with autoscaling.minReplicas 0."""
        return self._url(self.wiring.activator_metrics_port)

    def add_worker(self, engine_url: str, timeout: float = 30.0) -> None:
        """What vllm-router's Kubernetes discovery does when an engine pod turns Ready (its own
        add_worker); back once the router's health check has passed the engine."""
        self._worker_call("add_worker", engine_url, timeout)
        wait_until(
            lambda: metric_sum(self.router_metrics_url, "vllm_router_worker_health", worker=engine_url) == 1,
            timeout,
            f"the router to health-check {engine_url}",
        )

    def remove_worker(self, engine_url: str) -> None:
        """What the discovery does when an engine pod goes away."""
        self._worker_call("remove_worker", engine_url, 30.0)

    def _worker_call(self, route: str, engine_url: str, timeout: float) -> None:
        query = urllib.parse.urlencode({"url": engine_url})
        status, body = http_post(f"{self.router_url}/{route}?{query}", timeout)
        assert status == 200, f"{route} {engine_url}: {status} {body}"

    def set_api_keys(self, keys: Mapping[str, str]) -> None:
        """Replace the API-key Secret's content, as kubelet does when the Secret changes."""
        write_secret_volume(Path(self.wiring.api_keys_dir), keys)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()


def loopback_wiring(
    root: Path, worker_urls: Sequence[str], tier_worker_urls: Sequence[Sequence[str]] = ()
) -> Wiring:
    """The pod's wiring with free loopback ports, directories under root and static engine URLs (per
    tier of spec.gateway.tiers too; a tier without any has no engine)."""
    tiers = len(tier_worker_urls)
    ports = free_ports(9 + 2 * tiers)
    return Wiring(
        bind_host=LOOPBACK,
        http_port=ports[0],
        status_port=ports[1],
        router_port=ports[2],
        router_metrics_port=ports[3],
        log_metrics_port=ports[4],
        nginx_metrics_port=ports[5],
        activator_port=ports[6],
        activator_metrics_port=ports[7],
        config_dir=str(root / "config"),
        api_keys_dir=str(root / "secrets" / "api-keys"),
        engine_key_file=str(root / "secrets" / "engine-key" / "token"),
        state_dir=str(root / "state"),
        temp_dir=str(root / "tmp"),
        log_dir=str(root / "log"),
        worker_urls=tuple(worker_urls),
        tier_router_ports=tuple(ports[9 : 9 + tiers]),
        tier_metrics_ports=tuple(ports[9 + tiers :]),
        tier_worker_urls=tuple(tuple(urls) for urls in tier_worker_urls),
        # No engine at start (a deployment scaled to zero): engines join later through add_worker.
        discover_engines=False,
    )


def start_gateway_stack(
    review: Review,
    worker_urls: Sequence[str],
    api_keys: Mapping[str, str] | None = None,
    engine_key: str | None = None,
    root: Path | None = None,
    timeout: float = 60.0,
    edit: Callable[[str, str], str] | None = None,
    tier_worker_urls: Sequence[Sequence[str]] = (),
) -> GatewayStack:
    """Start the gateway for `review` in front of running engines (none: engines join through
    add_worker, as Kubernetes discovery adds them); the caller must call stop().

    Runs exactly the rendered files (nginx.conf, run-nginx.sh, nginxlog-exporter.yml) and command lines
    (vllm-router, nginx-prometheus-exporter); only ports, paths and the engine URLs are the test's.
    `edit(name, text)` changes a rendered file first: the benchmarks' variants of one setting, never a test.
    `tier_worker_urls`: the engines of each tier of spec.gateway.tiers, in order, each behind its router.
    """
    root = root or Path(tempfile.mkdtemp(prefix="qwen-gateway-"))
    root.chmod(0o755)  # nginx's workers drop root (tests run as root): they must reach temp_dir below
    wiring = loopback_wiring(root, worker_urls, tier_worker_urls)
    config = Path(wiring.config_dir)
    config.mkdir(parents=True, exist_ok=True)
    for name, text in gateway.config_files(review, wiring).items():
        (config / name).write_text(edit(name, text) if edit else text)
    if api_keys is not None:
        write_secret_volume(Path(wiring.api_keys_dir), api_keys)
    if engine_key is not None:
        write_secret_volume(Path(wiring.engine_key_file).parent, {"token": engine_key})
    # nginx's workers drop root when the tests run as root: let them use the temp directory.
    for shared in (wiring.temp_dir, wiring.log_dir):  # the pod's emptyDirs are world-writable too
        Path(shared).mkdir(parents=True, exist_ok=True)
        Path(shared).chmod(0o777)
    logs = root / "logs"
    stack = GatewayStack(wiring=wiring, root=root, procs={})
    try:
        _start_gateway_parts(stack, review, logs, timeout)
    except BaseException:
        stack.stop()
        raise
    return stack


def _secret_env(name: str, key_file: str) -> dict[str, str]:
    """The variable the pod takes from a Secret (manifests/gateway.py), from the file the test wrote
    for the same Secret; none where the test wrote none (an optional Secret that does not exist)."""
    path = Path(key_file)
    return {name: path.read_text()} if path.is_file() else {}


def kubelet_args(args: list[str], env: Mapping[str, str]) -> list[str]:
    """`args` as the kubelet passes them: each $(NAME) of the container's environment expanded, others
    left as written."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in args]


def _start_router(name: str, args: list[str], env: dict[str, str], logs: Path, port: int) -> Proc:
    env = gateway.router_env() | env
    return spawn(name, [str(vllm_router_bin()), *kubelet_args(args, env)], logs, env=env, port=port)


def _start_gateway_parts(stack: GatewayStack, review: Review, logs: Path, timeout: float) -> None:
    w = stack.wiring
    key_env = _secret_env(ENGINE_KEY_ENV, w.engine_key_file)
    router = _start_router("router", gateway.router_args(review, w), key_env, logs, w.router_port)
    stack.procs["router"] = router
    tier_routers = []
    for i in range(len(w.tier_worker_urls)):
        key_env = _secret_env(tier_engine_key_env(i), w.tier_engine_key_file(i))
        args = gateway.tier_router_args(review, i, w)
        tier_routers.append(_start_router(f"router-tier{i}", args, key_env, logs, w.tier_router_port(i)))
        stack.procs[f"router-tier{i}"] = tier_routers[-1]
    exporter = spawn(
        "log-exporter",
        [str(nginxlog_exporter_bin()), "-config-file", f"{w.config_dir}/nginxlog-exporter.yml"],
        logs,
        port=w.log_metrics_port,
    )
    stack.procs["log-exporter"] = exporter
    path = f"{nginx_bin().parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    nginx = spawn(
        "nginx", ["/bin/sh", f"{w.config_dir}/run-nginx.sh"], logs, env={"PATH": path}, port=w.status_port
    )
    stack.procs["nginx"] = nginx
    stack.procs["nginx-exporter"] = spawn(
        "nginx-exporter",
        [str(nginx_exporter_bin()), *gateway.nginx_exporter_args(w)],
        logs,
        port=w.nginx_metrics_port,
    )
    activator_argv = gateway.activator_args(review, w)
    if activator_argv is not None:
        # What the pod runs as `qwen-operator activator ...` (the operator's image).
        cli = [sys.executable, "-m", "qwen_operator.cli", *activator_argv]
        stack.procs["activator"] = spawn("activator", cli, logs, port=w.activator_metrics_port)
        wait_ready(stack.procs["activator"], "/healthz", timeout)
    wait_ready(router, "/liveness", timeout)  # --worker-urls: only after every engine is healthy
    for tier_router in tier_routers:
        wait_ready(tier_router, "/liveness", timeout)
    wait_ready(exporter, "/metrics", timeout)
    wait_ready(nginx, "/ready", timeout)
    wait_ready(stack.procs["nginx-exporter"], "/metrics", timeout)


@contextlib.contextmanager
def start_gateway(
    review: Review,
    worker_urls: Sequence[str],
    api_keys: Mapping[str, str] | None = None,
    engine_key: str | None = None,
    edit: Callable[[str, str], str] | None = None,
    tier_worker_urls: Sequence[Sequence[str]] = (),
) -> Iterator[GatewayStack]:
    """Context-managed start_gateway_stack."""
    stack = start_gateway_stack(
        review, worker_urls, api_keys, engine_key, edit=edit, tier_worker_urls=tier_worker_urls
    )
    try:
        yield stack
    finally:
        stack.stop()
