"""`qwen-operator lora-sync`: the sidecar that keeps a running vLLM engine's LoRA adapters equal to the
desired-adapters file (api/lorafile.py, mounted from a ConfigMap) through vLLM's runtime LoRA API, so
that adding or removing an adapter never restarts the engine.

The operator may not read the Secret with the engines' API key, so it never calls the engines: this loop
runs beside each one with the key in its environment, and reports what the engine itself lists on
/status (the operator reads it from each pod to count where each adapter is loaded) and /metrics.

/ready is the sidecar's readiness probe, so that the pod (whose readiness is every container's) is
routed to only once it holds its adapters: 503 until a round has reached the engine and each adapter
wanted then is loaded or has failed once (a broken adapter must not keep the base model from serving),
200 from then on, whatever is added later (the pod keeps serving while a new adapter loads).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .api.lorafile import SIDECAR_PORT, Adapter, DesiredFileError, HubSource, parse

log = logging.getLogger("qwen_operator.lorasync")

#: First wait after a failed load or unload, doubled per failure up to BACKOFF_MAX: a bad adapter is
#: retried (the cause may be fixed underneath it, e.g. files copied into the cache) but not every round.
BACKOFF_FIRST = 4.0
BACKOFF_MAX = 300.0
#: (connect, read) seconds; loading reads the adapter's files, which takes a while for a large one.
TIMEOUT = (5.0, 120.0)


# --- pure logic -----------------------------------------------------------------------------------


def hub_snapshot(hub: HubSource, model_cache: Path) -> Path:
    """Where huggingface_hub's snapshot_download(cache_dir=<model cache>/hub) puts a commit: the same
    layout the engine's HF_HOME uses for the model."""
    return model_cache / "hub" / f"models--{hub.repo.replace('/', '--')}" / "snapshots" / hub.revision


def adapter_path(adapter: Adapter, model_cache: Path) -> str:
    """The directory the engine is told to load (the engine mounts the cache at the same path)."""
    if adapter.hub is not None:
        return str(hub_snapshot(adapter.hub, model_cache))
    return str(model_cache / (adapter.path or ""))


def engine_adapters(models: Any) -> dict[str, str]:
    """{name: path it was loaded from} of the LoRA adapters in a /v1/models answer. vLLM 0.32 lists the
    base model with `parent` null and each adapter with `parent` set to the base model and `root` to the
    path it was loaded from (entrypoints/openai/models/serving.py, show_available_models)."""
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list):
        raise ValueError("the engine's /v1/models answer has no data list")
    return {
        str(card["id"]): str(card.get("root") or "")
        for card in cards
        if isinstance(card, dict) and card.get("parent")
    }


@dataclass(frozen=True)
class Plan:
    load: tuple[str, ...]
    unload: tuple[str, ...]


def plan(desired: Mapping[str, str], loaded: Mapping[str, str]) -> Plan:
    """What to do, from {name: path} wanted and {name: path} the engine has: load what is missing or
    loaded from another path (a new revision: reloaded in place), unload what is no longer wanted. The
    sidecar owns every adapter of its engine, so one loaded by hand is unloaded too."""
    return Plan(
        load=tuple(sorted(n for n, path in desired.items() if loaded.get(n) != path)),
        unload=tuple(sorted(set(loaded) - set(desired))),
    )


def backoff_seconds(failures: int, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX) -> float:
    """Seconds to wait before the next attempt after `failures` failures in a row."""
    return 0.0 if failures <= 0 else min(most, first * 2 ** (failures - 1))


def error_message(status: int, body: str) -> str:
    """The engine's own message from an error answer (vLLM: {"error": {"message": ...}}), else the body."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.strip()[:500] or "no body"
    return f"HTTP {status}: {message}"


# --- the engine -----------------------------------------------------------------------------------


class Engine:
    """vLLM's OpenAI server: its model list and the runtime LoRA routes (the engine must run with
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, or they answer 404). Network errors raise RequestException."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.trust_env = False  # the engine is on the pod's loopback: never through a proxy
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def adapters(self) -> dict[str, str]:
        answer = self.session.get(f"{self.url}/v1/models", timeout=TIMEOUT)
        if answer.status_code != 200:
            raise requests.HTTPError(f"GET /v1/models: {error_message(answer.status_code, answer.text)}")
        try:
            return engine_adapters(answer.json())
        except ValueError as error:  # not JSON, or not a model list: not the engine we expect
            raise requests.RequestException(f"GET /v1/models: {error}") from None

    def load(self, name: str, path: str, inplace: bool) -> str | None:
        """None when loaded, else the engine's error."""
        body = {"lora_name": name, "lora_path": path, "load_inplace": inplace}
        answer = self.session.post(f"{self.url}/v1/load_lora_adapter", json=body, timeout=TIMEOUT)
        return None if answer.status_code == 200 else error_message(answer.status_code, answer.text)

    def unload(self, name: str) -> str | None:
        """None when unloaded or already gone (404), else the engine's error."""
        body = {"lora_name": name}
        answer = self.session.post(f"{self.url}/v1/unload_lora_adapter", json=body, timeout=TIMEOUT)
        return None if answer.status_code in (200, 404) else error_message(answer.status_code, answer.text)


#: The adapter's weights files in the order vLLM 0.32 looks for them (lora/lora_model.py,
#: from_local_checkpoint): it reads the first one present, and adapter_config.json (lora/peft_helper.py).
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
CONFIG_FILE = "adapter_config.json"


def complete_snapshot(snapshot: Path) -> bool:
    """Whether a Hub snapshot holds a loadable adapter. huggingface_hub links a file into the snapshot
    only once it is whole, so a present file is complete; an interrupted download lacks some."""
    return (snapshot / CONFIG_FILE).is_file() and any((snapshot / f).is_file() for f in WEIGHTS_FILES)


def hub_download(hub: HubSource, cache_dir: Path) -> Path:
    """Download into cache_dir (or find there) what vLLM loads of an adapter at a commit of a Hugging Face
    repository: adapter_config.json and the first weights file of WEIGHTS_FILES the repository has. Its
    other files (checkpoints, optimizer states, images, the weights in a second format) would fill the
    model cache, an emptyDir sized for the model, and get the pod evicted; vLLM 0.32 reads no tokenizer
    of an adapter (the base model's serves). HF_TOKEN in the environment is used for private ones."""
    from huggingface_hub import snapshot_download  # only Hub sources need it, and it is slow to import

    for weights in WEIGHTS_FILES:  # huggingface_hub caches the commit's listing: one Hub listing in all
        snapshot = Path(
            snapshot_download(
                repo_id=hub.repo,
                revision=hub.revision,
                cache_dir=cache_dir,
                allow_patterns=[CONFIG_FILE, weights],
            )
        )
        if (snapshot / weights).is_file():
            break
    return snapshot  # without any weights file the engine refuses the load, and says why


# --- the loop -------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """A failing load or unload of one adapter, kept until it succeeds or what is wanted changes."""

    want: str  # the path to load, or "" to unload
    failures: int = 0
    retry_at: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class AdapterReport:
    loaded: bool
    error: str | None
    load_failures: int


@dataclass(frozen=True)
class Readiness:
    """Whether the pod may be routed to (/ready), and while not, what it waits for."""

    ready: bool = False
    #: Adapters of the first round neither loaded nor failed yet (downloading, or not tried yet).
    waiting_for: tuple[str, ...] = ()
    reason: str = "no sync round yet"


@dataclass(frozen=True)
class Report:
    """One round's outcome, replaced whole after each round (the HTTP thread reads it without a lock)."""

    adapters: Mapping[str, AdapterReport]
    engine_reachable: bool
    last_sync: float | None  # unix time of the last round that reached the engine
    file_error: str | None = None
    engine_error: str | None = None
    readiness: Readiness = Readiness()

    def status(self) -> dict[str, Any]:
        return {
            "adapters": {n: {"loaded": a.loaded, "error": a.error} for n, a in self.adapters.items()},
            "engineReachable": self.engine_reachable,
            "lastSync": self.last_sync,
            "fileError": self.file_error,
            "engineError": self.engine_error,
            "ready": self.readiness.ready,
        }

    def ready_answer(self) -> dict[str, Any]:
        """/ready's body (its code: 200 when ready, else 503)."""
        r = self.readiness
        failing = sorted(n for n, a in self.adapters.items() if a.error and not a.loaded)
        return {"ready": r.ready, "reason": r.reason, "waitingFor": list(r.waiting_for), "failing": failing}


Download = Callable[[HubSource, Path], Path]


class Syncer:
    """Compares the desired file with the engine's adapters once per `sync_once` and acts on the
    difference; a failing adapter is retried with backoff and never holds up the others, and Hub
    downloads run in the background."""

    def __init__(
        self,
        desired_file: Path,
        engine: Engine,
        model_cache: Path,
        download: Download = hub_download,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desired_file = desired_file
        self.engine = engine
        self.model_cache = model_cache
        self.download = download
        self.clock = clock
        self.desired: list[Adapter] | None = None  # the last good list; None until one was read
        self.attempts: dict[str, Attempt] = {}
        self.load_failures: dict[str, int] = {}
        self.downloads: dict[HubSource, Future[Path]] = {}
        self.downloaded: set[HubSource] = set()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hub-download")
        self.report = Report({}, engine_reachable=False, last_sync=None)
        self.readiness = Readiness()

    def sync_once(self) -> Report:
        file_error = self._read_desired()
        try:
            loaded = self.engine.adapters()
            if self.desired is not None and self._apply(loaded):
                loaded = self.engine.adapters()  # report what the engine lists, not what we asked for
        except requests.RequestException as error:
            if self.report.engine_reachable:
                log.warning("engine %s unreachable: %s", self.engine.url, error)
            if not self.readiness.ready:
                self.readiness = Readiness(reason=f"the engine does not answer yet: {error}")
            self.report = Report(
                self._reports({}), False, self.report.last_sync, file_error, str(error), self.readiness
            )
            return self.report
        if not self.report.engine_reachable:
            log.info("engine %s reachable, %d adapters loaded", self.engine.url, len(loaded))
        self._forget(loaded)
        if not self.readiness.ready:
            self.readiness = self._readiness(loaded, file_error)
        self.report = Report(self._reports(loaded), True, time.time(), file_error, None, self.readiness)
        return self.report

    def _readiness(self, loaded: Mapping[str, str], file_error: str | None) -> Readiness:
        """Before the pod is first ready: ready once every wanted adapter is loaded from its path, or has
        failed at least once (it is retried with backoff, and the pod serves the base model and the other
        adapters meanwhile). Once ready it stays so: what is added later loads on a serving pod."""
        if self.desired is None:
            return Readiness(reason=f"no usable desired file yet: {file_error}")
        waiting = tuple(a.name for a in self.desired if not self._settled(a, loaded))
        if waiting:
            return Readiness(False, waiting, "loading " + ", ".join(waiting))
        log.info("ready: %d of %d adapters loaded", len(set(loaded) & {a.name for a in self.desired}),
                 len(self.desired))  # fmt: skip
        return Readiness(True, (), "the first round's adapters are loaded or failed")

    def _settled(self, adapter: Adapter, loaded: Mapping[str, str]) -> bool:
        """Loaded from the path wanted, or failed at least once to load (or download) from it."""
        path = adapter_path(adapter, self.model_cache)
        attempt = self.attempts.get(adapter.name)
        failed = attempt is not None and attempt.want == path and attempt.failures > 0
        return loaded.get(adapter.name) == path or failed

    def _read_desired(self) -> str | None:
        """Read the file; on failure keep the last good list (the kubelet swaps the file through a
        `..data` symlink, and it may be missing or half-written for a moment) and return the error."""
        try:
            desired = parse(self.desired_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, DesiredFileError) as error:
            message = f"{self.desired_file}: {error}"
            if message != self.report.file_error:
                log.warning("desired file unusable, keeping the last good list: %s", message)
            return message
        if desired != self.desired:
            log.info("desired adapters: %s", ", ".join(a.name for a in desired) or "none")
        self.desired = desired
        return None

    def _apply(self, loaded: Mapping[str, str]) -> bool:
        """Load and unload what the plan says, each when its backoff allows; True if anything changed."""
        wanted = {a.name: a for a in self.desired or ()}
        paths = {name: adapter_path(a, self.model_cache) for name, a in wanted.items()}
        todo = plan(paths, loaded)
        changed = False
        for name in todo.unload:
            if self._due(name, ""):
                changed |= self._record(name, "", self.engine.unload(name))
        for name in todo.load:
            hub = wanted[name].hub
            if self._due(name, paths[name]) and (hub is None or self._fetched(name, hub, paths[name])):
                changed |= self._record(
                    name, paths[name], self.engine.load(name, paths[name], name in loaded)
                )
        return changed

    def _due(self, name: str, want: str) -> bool:
        attempt = self.attempts.get(name)
        if attempt is not None and attempt.want != want:  # wanted otherwise now: start afresh
            del self.attempts[name]
            return True
        return attempt is None or self.clock() >= attempt.retry_at

    def _record(self, name: str, want: str, error: str | None) -> bool:
        """Note the outcome of an action; True when it succeeded."""
        action = f"load {name} from {want}" if want else f"unload {name}"
        if error is None:
            log.info("%s: done", action)
            self.attempts.pop(name, None)
            return True
        attempt = self.attempts.setdefault(name, Attempt(want))
        attempt.failures += 1
        attempt.error = f"load from {want}: {error}" if want else f"unload: {error}"  # vLLM hides paths
        attempt.retry_at = self.clock() + backoff_seconds(attempt.failures)
        if want:
            self.load_failures[name] = self.load_failures.get(name, 0) + 1
        log.warning("%s failed (%d in a row, next try in %.0f s): %s", action, attempt.failures,
                    backoff_seconds(attempt.failures), error)  # fmt: skip
        return False

    def _fetched(self, name: str, hub: HubSource, want: str) -> bool:
        """True once the commit is in the cache; otherwise start (or check on) its download in the
        background, so that a large adapter never holds up the others."""
        if hub in self.downloaded:
            return True
        future = self.downloads.get(hub)
        if future is not None:
            if not future.done():
                return False
            del self.downloads[hub]
            error = future.exception()
            if error is not None:
                self._record(name, want, f"download of {hub.repo}@{hub.revision} failed: {error}")
                return False
        elif not complete_snapshot(Path(want)):  # else a restart, or a cache filled beforehand
            log.info("downloading %s@%s for %s", hub.repo, hub.revision, name)
            self.downloads[hub] = self.executor.submit(self.download, hub, self.model_cache / "hub")
            return False
        self.downloaded.add(hub)
        return True

    def _forget(self, loaded: Mapping[str, str]) -> None:
        """Drop the state of adapters that are neither wanted nor loaded any more."""
        keep = {a.name for a in self.desired or ()} | set(loaded)
        for table in (self.attempts, self.load_failures):
            for name in set(table) - keep:
                del table[name]

    def _reports(self, loaded: Mapping[str, str]) -> dict[str, AdapterReport]:
        names = {a.name for a in self.desired or ()} | set(loaded)
        return {
            name: AdapterReport(
                loaded=name in loaded,
                error=attempt.error if (attempt := self.attempts.get(name)) else None,
                load_failures=self.load_failures.get(name, 0),
            )
            for name in sorted(names)
        }


# --- serving --------------------------------------------------------------------------------------


class ReportCollector(Collector):
    """The metrics of the latest report, computed at scrape time (no series outlive their adapter)."""

    def __init__(self, report: Callable[[], Report]) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        report = self.report()
        loaded = GaugeMetricFamily(
            "qwen_lora_adapter_loaded",
            "1 when the engine lists the adapter in /v1/models.",
            labels=["adapter"],
        )
        failures = CounterMetricFamily(
            "qwen_lora_adapter_load_failures",
            "Failed loads (or Hub downloads) of the adapter since the sidecar started.",
            labels=["adapter"],
        )
        for name, adapter in report.adapters.items():
            loaded.add_metric([name], 1.0 if adapter.loaded else 0.0)
            failures.add_metric([name], adapter.load_failures)
        yield loaded
        yield failures
        yield GaugeMetricFamily(
            "qwen_lora_sync_last_sync_timestamp_seconds",
            "Unix time of the last sync round that reached the engine (0: none yet).",
            value=report.last_sync or 0.0,
        )
        yield GaugeMetricFamily(
            "qwen_lora_sync_engine_reachable", "1 when the last round reached the engine.",
            value=1.0 if report.engine_reachable else 0.0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "qwen_lora_sync_desired_file_error",
            "1 while the desired file cannot be used (the last good list is kept).",
            value=1.0 if report.file_error else 0.0,
        )


def serve(host: str, port: int, report: Callable[[], Report]) -> ThreadingHTTPServer:
    """/metrics, /status, /ready and /healthz on a background thread; returns the server (shutdown() stops
    it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(report))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/status":
                self._send(200, json.dumps(report().status()).encode(), "application/json")
            elif path == "/ready":
                answer = report().ready_answer()
                self._send(200 if answer["ready"] else 503, json.dumps(answer).encode(), "application/json")
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no line per scrape

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


@dataclass(frozen=True)
class Settings:
    desired_file: Path
    engine_url: str
    model_cache: Path
    api_key: str | None
    interval: float
    host: str = "0.0.0.0"
    port: int = SIDECAR_PORT


#: Seconds a sync round in flight at SIGTERM may take to finish before the sidecar exits without it.
STOP_GRACE_SECONDS = 2.0


def run(settings: Settings) -> int:
    """Sync every `interval` seconds until SIGTERM or SIGINT.

    The rounds run in a thread of their own, so that SIGTERM ends the sidecar at once even while a
    request to the engine is in flight: the pod's containers get SIGTERM together, and an engine whose
    core has stopped never answers a LoRA load, while its HTTP server waits for that connection to close
    (vLLM 0.32, seen 2026-12-07): a sidecar that waited out its 120 s read timeout would hold the engine
    up for as long, up to the pod's grace period."""
    engine = Engine(settings.engine_url, settings.api_key)
    syncer = Syncer(settings.desired_file, engine, settings.model_cache)
    server = serve(settings.host, settings.port, lambda: syncer.report)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("syncing %s into %s every %g s; serving on %s:%d", settings.desired_file, engine.url,
             settings.interval, settings.host, settings.port)  # fmt: skip

    def rounds() -> None:
        while not stop.is_set():
            try:
                syncer.sync_once()
            except Exception:  # a bug must not end the sidecar: the next round starts from the engine's state
                log.exception("sync round failed")
            stop.wait(settings.interval)

    worker = threading.Thread(target=rounds, name="lora-sync-rounds", daemon=True)
    worker.start()
    while not stop.wait(1.0):  # the main thread keeps the signal handlers' turn
        pass
    worker.join(STOP_GRACE_SECONDS)
    if worker.is_alive():
        log.info("stopping with a request to the engine in flight")
    server.shutdown()
    syncer.executor.shutdown(wait=False, cancel_futures=True)
    return 0
