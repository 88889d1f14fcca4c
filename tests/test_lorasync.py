"""The lora-sync sidecar without an engine: the desired-file format, the pure logic (plan, backoff, the
engine's model list and errors), the sync loop against a stand-in of vLLM's LoRA routes on loopback, its
/status and /metrics, the CLI process, and the tiny random adapters. With the real engine:
test_engine_live.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qwen_devtools.net import LOOPBACK, free_port, http_get, metric_sum
from qwen_devtools.procs import running, spawn, wait_ready
from qwen_devtools.realparts.lora import ALL_MODULES, adapter_config, tensor_shapes, write_random_lora
from qwen_devtools.wait import wait_until
from qwen_operator import lorasync
from qwen_operator.api.lorafile import Adapter, DesiredFileError, HubSource, parse, render
from qwen_operator.lorasync import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Engine,
    Plan,
    Syncer,
    adapter_path,
    backoff_seconds,
    engine_adapters,
    error_message,
    hub_snapshot,
    plan,
    serve,
)
from support import cli_path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
KEY = "engine-key-0123456789"


# --- the desired file ---------------------------------------------------------------------------


def test_render_and_parse_round_trip() -> None:
    adapters = [Adapter("sql-expert", path="loras/sql"), Adapter("x", hub=HubSource("org/name", COMMIT))]
    text = render(adapters)
    assert json.loads(text) == {
        "adapters": [
            {"name": "sql-expert", "path": "loras/sql"},
            {"name": "x", "huggingFace": {"repo": "org/name", "revision": COMMIT}},
        ]
    }
    assert parse(text) == adapters
    assert parse(render([])) == []


def _one(entry: dict[str, Any]) -> str:
    return json.dumps({"adapters": [entry]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not valid JSON"),
        ('{"adapters": [', "not valid JSON"),
        ("[]", '{"adapters": [...]}'),
        ('{"adapters": {}}', '{"adapters": [...]}'),
        ('{"adapters": ["a"]}', "adapters[0] is not an object"),
        ('{"adapters": [{"name": "a", "path": "p", "rank": 8}]}', "unknown fields ['rank']"),
        ('{"adapters": [{"name": "a"}]}', "exactly one of path or huggingFace"),
        (_one({"name": "a", "path": "p", "huggingFace": {"repo": "o/n", "revision": COMMIT}}), "exactly one"),
        ('{"adapters": [{"name": "", "path": "p"}]}', "non-empty"),
        ('{"adapters": [{"name": 3, "path": "p"}]}', "must be strings"),
        ('{"adapters": [{"name": "a", "path": "/abs"}]}', "relative"),
        ('{"adapters": [{"name": "a", "path": "x/../../etc"}]}', "stay inside"),
        ('{"adapters": [{"name": "a", "huggingFace": {"repo": "o/n", "revision": "main"}}]}', "40-hex"),
        (_one({"name": "a", "huggingFace": {"repo": "noslash", "revision": COMMIT}}), "owner/name"),
        ('{"adapters": [{"name": "a", "huggingFace": {"repo": "o/n"}}]}', "exactly repo and revision"),
        ('{"adapters": [{"name": "a", "path": "p"}, {"name": "a", "path": "q"}]}', "more than once"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(DesiredFileError) as caught:
        parse(text)
    assert message in str(caught.value)


def test_render_refuses_what_parse_would() -> None:
    with pytest.raises(DesiredFileError, match="more than once"):
        render([Adapter("a", path="p"), Adapter("a", path="q")])


# --- pure logic -----------------------------------------------------------------------------------


def test_plan() -> None:
    assert plan({}, {}) == Plan((), ())
    assert plan({"a": "/m/a", "b": "/m/b"}, {"b": "/m/b", "c": "/m/c"}) == Plan(load=("a",), unload=("c",))
    # another path (a new revision) is loaded again, in place
    assert plan({"a": "/m/a2"}, {"a": "/m/a"}) == Plan(load=("a",), unload=())


def test_backoff_doubles_up_to_the_cap() -> None:
    waits = [backoff_seconds(n) for n in range(0, 12)]
    assert waits[:4] == [0.0, BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST]
    assert waits == sorted(waits)
    assert waits[-1] == BACKOFF_MAX


def test_engine_adapters_are_the_cards_with_a_parent() -> None:
    models = {
        "object": "list",
        "data": [
            {"id": "Qwen/Qwen3-32B", "root": "/models/x", "parent": None},
            {"id": "sql", "root": "/models/loras/sql", "parent": "Qwen/Qwen3-32B"},
        ],
    }
    assert engine_adapters(models) == {"sql": "/models/loras/sql"}
    with pytest.raises(ValueError, match="no data list"):
        engine_adapters({"detail": "nope"})


def test_error_message_is_the_engines() -> None:
    body = json.dumps({"error": {"message": "LoRA rank 16 is greater than max_lora_rank 8.", "code": 500}})
    assert error_message(500, body) == "HTTP 500: LoRA rank 16 is greater than max_lora_rank 8."
    assert error_message(502, "bad gateway\n") == "HTTP 502: bad gateway"
    assert error_message(503, "") == "HTTP 503: no body"


def test_adapter_paths(tmp_path: Path) -> None:
    hub = HubSource("my-org/sql-lora", COMMIT)
    assert adapter_path(Adapter("a", path="loras/a"), tmp_path) == str(tmp_path / "loras/a")
    snapshot = tmp_path / "hub" / "models--my-org--sql-lora" / "snapshots" / COMMIT
    assert hub_snapshot(hub, tmp_path) == snapshot
    assert adapter_path(Adapter("b", hub=hub), tmp_path) == str(snapshot)


# --- a stand-in for vLLM's LoRA routes -------------------------------------------------------------


class FakeVllm:
    """vLLM 0.32's /v1/models and runtime LoRA routes as its serving layer answers them
    (entrypoints/openai/models/serving.py), with the checks its loader makes first: adapter_config.json
    in the directory (else 404 "No adapter found"), rank at most max_lora_rank (else 500). The real
    engine is in test_engine_live.py."""

    def __init__(self, key: str | None = KEY, max_rank: int = 8) -> None:
        self.key, self.max_rank = key, max_rank
        #: While cleared, a load is received and never answered (an engine whose core has stopped).
        self.answering_loads = threading.Event()
        self.answering_loads.set()
        self.loras: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer((LOOPBACK, 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}"

    def _answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/models":
            cards = [{"id": "Qwen/Qwen3-32B", "root": "/models/base", "parent": None}]
            cards += [{"id": n, "root": p, "parent": "Qwen/Qwen3-32B"} for n, p in self.loras.items()]
            return 200, {"object": "list", "data": cards}
        name = body.get("lora_name", "")
        self.calls.append((path, name))
        if path == "/v1/unload_lora_adapter":
            if self.loras.pop(name, None) is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.")
            return 200, {}
        if path == "/v1/load_lora_adapter":
            self.answering_loads.wait()
            lora_path = body["lora_path"]
            if name in self.loras and not body.get("load_inplace"):
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            config = Path(lora_path) / "adapter_config.json"
            if not config.is_file():
                return _error(404, f"Loading lora {name} failed: No adapter found for {lora_path}")
            rank = json.loads(config.read_text())["r"]
            if rank > self.max_rank:
                return _error(500, f"LoRA rank {rank} is greater than max_lora_rank {self.max_rank}.")
            self.loras[name] = lora_path
            return 200, {}
        return 404, {"detail": "Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if fake.key and self.headers.get("Authorization") != f"Bearer {fake.key}":
                    code, answer = 401, {"error": "Unauthorized"}
                else:
                    code, answer = fake._answer(method, self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def loads(self, name: str) -> int:
        return self.calls.count(("/v1/load_lora_adapter", name))


def _error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"message": message, "type": "Error", "param": None, "code": code}}


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    engine = FakeVllm()
    yield engine
    engine.server.shutdown()


class Clock:
    """A monotonic clock the test moves by hand (backoff without sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _adapter_dir(root: Path, rel: str, rank: int = 8) -> str:
    (root / rel).mkdir(parents=True, exist_ok=True)
    (root / rel / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": rank}))
    return rel


def _write(path: Path, *adapters: Adapter) -> None:
    path.write_text(render(adapters))


def _syncer(fake: FakeVllm, tmp_path: Path, **kw: Any) -> tuple[Syncer, Path, Clock]:
    clock = Clock()
    desired = tmp_path / "adapters.json"
    return Syncer(desired, Engine(fake.url, KEY), tmp_path, clock=clock, **kw), desired, clock


# --- the sync loop --------------------------------------------------------------------------------


def test_loads_what_is_missing_and_unloads_what_is_no_longer_wanted(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    _write(
        desired,
        Adapter("a", path=_adapter_dir(tmp_path, "loras/a")),
        Adapter("b", path=_adapter_dir(tmp_path, "loras/b")),
    )
    fake.loras["by-hand"] = "/elsewhere"
    report = syncer.sync_once()
    assert fake.loras == {"a": str(tmp_path / "loras/a"), "b": str(tmp_path / "loras/b")}
    assert report.status()["adapters"] == {
        "a": {"loaded": True, "error": None},
        "b": {"loaded": True, "error": None},
    }
    assert report.engine_reachable and report.last_sync is not None

    syncer.sync_once()  # nothing to do: no calls
    assert fake.loads("a") == 1

    _write(desired, Adapter("b", path="loras/b"))
    assert syncer.sync_once().status()["adapters"] == {"b": {"loaded": True, "error": None}}
    assert fake.loras == {"b": str(tmp_path / "loras/b")}


def test_a_failing_adapter_backs_off_and_holds_up_no_other(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, clock = _syncer(fake, tmp_path)
    _write(
        desired,
        Adapter("big", path=_adapter_dir(tmp_path, "loras/big", rank=16)),
        Adapter("gone", path="loras/missing"),
        Adapter("good", path=_adapter_dir(tmp_path, "loras/good")),
    )
    status = syncer.sync_once().status()["adapters"]
    assert status["good"] == {"loaded": True, "error": None}
    assert status["big"] == {
        "loaded": False,
        "error": f"load from {tmp_path}/loras/big: HTTP 500: LoRA rank 16 is greater than max_lora_rank 8.",
    }
    assert status["gone"]["loaded"] is False
    assert "No adapter found" in status["gone"]["error"]

    for _ in range(3):  # within the first backoff: not retried
        syncer.sync_once()
    assert (fake.loads("big"), fake.loads("gone"), fake.loads("good")) == (1, 1, 1)
    clock.now += BACKOFF_FIRST
    syncer.sync_once()
    assert (fake.loads("big"), fake.loads("gone")) == (2, 2)
    clock.now += BACKOFF_FIRST  # the second wait is twice as long
    syncer.sync_once()
    assert fake.loads("big") == 2
    assert syncer.report.adapters["big"].load_failures == 2

    # the cause fixed underneath (files copied into the cache): loaded at the next due attempt
    _adapter_dir(tmp_path, "loras/missing")
    clock.now += BACKOFF_FIRST
    assert syncer.sync_once().status()["adapters"]["gone"] == {"loaded": True, "error": None}

    # a changed entry starts afresh, without waiting for the backoff
    _write(
        desired, Adapter("big", path=_adapter_dir(tmp_path, "loras/big8")), Adapter("good", path="loras/good")
    )
    status = syncer.sync_once().status()["adapters"]
    assert status == {"big": {"loaded": True, "error": None}, "good": {"loaded": True, "error": None}}
    assert "gone" not in syncer.load_failures


def test_desired_file_missing_or_invalid_keeps_the_last_good_list(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    fake.loras["a"] = str(tmp_path / "loras/a")
    report = syncer.sync_once()  # never read: nothing is unloaded
    assert "No such file" in (report.file_error or "")
    assert fake.loras == {"a": str(tmp_path / "loras/a")}
    assert report.status()["adapters"] == {"a": {"loaded": True, "error": None}}

    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a")))
    assert syncer.sync_once().file_error is None
    desired.write_text('{"adapters": [{"name": "a"')  # half-written
    report = syncer.sync_once()
    assert "not valid JSON" in (report.file_error or "")
    assert report.status()["adapters"] == {"a": {"loaded": True, "error": None}}
    desired.unlink()
    assert "No such file" in (syncer.sync_once().file_error or "")
    assert fake.loras == {"a": str(tmp_path / "loras/a")}


def test_configmap_symlink_swap(fake: FakeVllm, tmp_path: Path) -> None:
    """The kubelet updates a ConfigMap volume by writing a new timestamped directory and renaming the
    `..data` symlink onto it; the file name is a symlink through `..data`."""
    mount = tmp_path / "mount"
    mount.mkdir()
    for version, adapters in (("..v1", [Adapter("a", path=_adapter_dir(tmp_path, "loras/a"))]),
                              ("..v2", [Adapter("b", path=_adapter_dir(tmp_path, "loras/b"))])):  # fmt: skip
        (mount / version).mkdir()
        _write(mount / version / "adapters.json", *adapters)
    (mount / "..data").symlink_to("..v1")
    (mount / "adapters.json").symlink_to("..data/adapters.json")
    syncer = Syncer(mount / "adapters.json", Engine(fake.url, KEY), tmp_path, clock=Clock())
    syncer.sync_once()
    assert set(fake.loras) == {"a"}
    (mount / "..data_tmp").symlink_to("..v2")
    os.replace(mount / "..data_tmp", mount / "..data")
    syncer.sync_once()
    assert set(fake.loras) == {"b"}


def test_engine_unreachable_then_restarted(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a")))
    syncer.sync_once()
    first = syncer.report.last_sync
    syncer.engine = Engine(f"http://{LOOPBACK}:{free_port()}", KEY)  # nothing listens there
    report = syncer.sync_once()
    assert not report.engine_reachable and report.engine_error
    assert report.status()["adapters"] == {"a": {"loaded": False, "error": None}}
    assert report.last_sync == first

    fake.loras.clear()  # a new engine process: no adapters
    syncer.engine = Engine(fake.url, KEY)
    assert syncer.sync_once().status()["adapters"] == {"a": {"loaded": True, "error": None}}


def test_wrong_api_key_is_reported(fake: FakeVllm, tmp_path: Path) -> None:
    syncer = Syncer(tmp_path / "adapters.json", Engine(fake.url, "wrong"), tmp_path, clock=Clock())
    report = syncer.sync_once()
    assert not report.engine_reachable
    assert "HTTP 401" in (report.engine_error or "")


def test_new_path_reloads_in_place(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a1")))
    syncer.sync_once()
    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a2")))
    syncer.sync_once()
    assert fake.loras == {"a": str(tmp_path / "loras/a2")}
    assert fake.loads("a") == 2  # the stand-in, like vLLM, refuses a second load unless in place


def test_hub_adapter_is_downloaded_in_the_background(fake: FakeVllm, tmp_path: Path) -> None:
    hub = HubSource("my-org/sql-lora", COMMIT)
    release = threading.Event()
    fetched: list[HubSource] = []

    def download(source: HubSource, cache_dir: Path) -> Path:
        release.wait(10)
        fetched.append(source)
        if source.repo == "my-org/broken":
            raise OSError("403 Forbidden")
        assert cache_dir == tmp_path / "hub"
        snapshot = hub_snapshot(source, tmp_path)
        _adapter_dir(tmp_path, str(snapshot.relative_to(tmp_path)))
        return snapshot

    syncer, desired, clock = _syncer(fake, tmp_path, download=download)
    _write(desired, Adapter("sql", hub=hub), Adapter("broken", hub=HubSource("my-org/broken", COMMIT)),
           Adapter("local", path=_adapter_dir(tmp_path, "loras/local")))  # fmt: skip
    status = syncer.sync_once().status()["adapters"]  # the downloads wait: the local adapter does not
    assert status["local"]["loaded"] and not status["sql"]["loaded"]
    release.set()
    wait_until(lambda: all(f.done() for f in syncer.downloads.values()), 10, "the downloads")
    status = syncer.sync_once().status()["adapters"]
    assert status["sql"] == {"loaded": True, "error": None}
    assert fake.loras["sql"] == str(hub_snapshot(hub, tmp_path))
    assert status["broken"] == {
        "loaded": False,
        "error": f"load from {hub_snapshot(HubSource('my-org/broken', COMMIT), tmp_path)}: "
        f"download of my-org/broken@{COMMIT} failed: 403 Forbidden",
    }
    assert syncer.report.adapters["broken"].load_failures == 1

    syncer.sync_once()  # in backoff: no new download; the downloaded commit is not fetched again
    assert sorted(s.repo for s in fetched) == ["my-org/broken", "my-org/sql-lora"]
    fake.loras.clear()  # engine restarted
    syncer.sync_once()
    assert "sql" in fake.loras and fetched.count(hub) == 1
    clock.now += BACKOFF_FIRST
    syncer.sync_once()
    wait_until(lambda: all(f.done() for f in syncer.downloads.values()), 10, "the retried download")
    assert [s.repo for s in fetched].count("my-org/broken") == 2


def test_hub_adapter_already_in_the_cache_is_not_downloaded(fake: FakeVllm, tmp_path: Path) -> None:
    hub = HubSource("my-org/sql-lora", COMMIT)
    snapshot = hub_snapshot(hub, tmp_path)
    _adapter_dir(tmp_path, str(snapshot.relative_to(tmp_path)))
    (snapshot / "adapter_model.safetensors").write_bytes(b"")

    def download(source: HubSource, cache_dir: Path) -> Path:
        raise AssertionError("no Hub call for a commit already in the cache")

    syncer, desired, _ = _syncer(fake, tmp_path, download=download)
    _write(desired, Adapter("sql", hub=hub))
    assert syncer.sync_once().status()["adapters"] == {"sql": {"loaded": True, "error": None}}


def test_hub_download_finds_a_cached_commit_offline(tmp_path: Path) -> None:
    """The real huggingface_hub (no internet here): a commit already in the cache is found offline, at
    the path hub_snapshot computes. A download from the Hub itself is not tested here."""
    pytest.importorskip("huggingface_hub")
    hub = HubSource("my-org/sql-lora", COMMIT)
    snapshot = hub_snapshot(hub, tmp_path)
    _adapter_dir(tmp_path, str(snapshot.relative_to(tmp_path)))
    code = (
        "import sys; from pathlib import Path; from qwen_operator.lorasync import hub_download, HubSource; "
        f"print(hub_download(HubSource('my-org/sql-lora', '{COMMIT}'), Path(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "hub")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(snapshot)


# --- readiness: the pod serves once it holds its adapters ----------------------------------------


class Served:
    """A syncer's HTTP endpoints on loopback (serve), for the test's duration."""

    def __init__(self, syncer: Syncer) -> None:
        port = free_port()
        self.server = serve(LOOPBACK, port, lambda: syncer.report)
        self.base = f"http://{LOOPBACK}:{port}"

    def ready(self) -> tuple[int, dict[str, Any]]:
        code, body = http_get(f"{self.base}/ready")
        return code, json.loads(body) if body.startswith("{") else {"body": body}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Callable[[Syncer], Served]]:
    """Serves a syncer's endpoints until the test ends."""
    opened: list[Served] = []

    def open_for(syncer: Syncer) -> Served:
        opened.append(Served(syncer))
        return opened[-1]

    yield open_for
    for one in opened:
        one.close()


def _held_download(tmp_path: Path) -> tuple[threading.Event, Any]:
    """A Hub download that waits for the event, then writes the adapter (or fails for my-org/broken)."""
    release = threading.Event()

    def download(source: HubSource, cache_dir: Path) -> Path:
        release.wait(10)
        if source.repo == "my-org/broken":
            raise OSError("403 Forbidden")
        snapshot = hub_snapshot(source, tmp_path)
        _adapter_dir(tmp_path, str(snapshot.relative_to(tmp_path)))
        return snapshot

    return release, download


def _downloads_done(syncer: Syncer) -> None:
    wait_until(lambda: all(f.done() for f in syncer.downloads.values()), 10, "the downloads")


def test_ready_only_once_the_first_rounds_adapters_are_loaded(
    fake: FakeVllm, tmp_path: Path, served: Callable[[Syncer], Served]
) -> None:
    release, download = _held_download(tmp_path)
    syncer, desired, _ = _syncer(fake, tmp_path, download=download)
    _write(desired, Adapter("sql", hub=HubSource("my-org/sql-lora", COMMIT)),
           Adapter("local", path=_adapter_dir(tmp_path, "loras/local")))  # fmt: skip
    ready = served(syncer).ready
    code, body = ready()
    assert code == 503 and body["ready"] is False  # no round yet
    syncer.sync_once()  # local loaded, sql still downloading
    code, body = ready()
    assert (code, body["ready"], body["waitingFor"]) == (503, False, ["sql"])
    assert syncer.report.status()["ready"] is False
    release.set()
    _downloads_done(syncer)
    syncer.sync_once()
    code, body = ready()
    assert (code, body["ready"], body["waitingFor"]) == (200, True, [])
    assert syncer.report.status()["ready"] is True


def test_not_ready_while_the_engine_does_not_answer(
    fake: FakeVllm, tmp_path: Path, served: Callable[[Syncer], Served]
) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    _write(desired)  # no adapters: ready as soon as a round reaches the engine
    syncer.engine = Engine(f"http://{LOOPBACK}:{free_port()}", KEY)  # the engine still starting
    ready = served(syncer).ready
    syncer.sync_once()
    code, body = ready()
    assert code == 503 and "engine" in body["reason"]
    syncer.engine = Engine(fake.url, KEY)
    syncer.sync_once()
    assert ready()[0] == 200


def test_a_failing_adapter_does_not_keep_the_pod_unready(
    fake: FakeVllm, tmp_path: Path, served: Callable[[Syncer], Served]
) -> None:
    """A broken adapter must not keep the base model (and the other adapters) from serving: after its
    first failed attempt (load refused, files missing, Hub download failed) it no longer holds up
    readiness, and it keeps being retried with backoff."""
    release, download = _held_download(tmp_path)
    syncer, desired, clock = _syncer(fake, tmp_path, download=download)
    _write(desired, Adapter("big", path=_adapter_dir(tmp_path, "loras/big", rank=16)),
           Adapter("gone", path="loras/missing"),
           Adapter("broken", hub=HubSource("my-org/broken", COMMIT)),
           Adapter("good", path=_adapter_dir(tmp_path, "loras/good")))  # fmt: skip
    ready = served(syncer).ready
    syncer.sync_once()  # big and gone failed once; broken still downloading
    code, body = ready()
    assert (code, body["waitingFor"]) == (503, ["broken"])
    release.set()
    _downloads_done(syncer)
    syncer.sync_once()  # the download failed: nothing left to wait for
    code, body = ready()
    assert (code, body["waitingFor"]) == (200, [])
    assert sorted(body["failing"]) == ["big", "broken", "gone"]
    clock.now += BACKOFF_FIRST
    syncer.sync_once()  # retried, still failing: still ready
    assert fake.loads("big") == 2 and ready()[0] == 200


def test_an_adapter_added_after_ready_keeps_the_pod_ready(
    fake: FakeVllm, tmp_path: Path, served: Callable[[Syncer], Served]
) -> None:
    """Only the adapters wanted before the pod was first ready gate it: an adapter added to a serving
    deployment (the ConfigMap changes, not the pod) loads while the pod keeps serving the others."""
    release, download = _held_download(tmp_path)
    syncer, desired, _ = _syncer(fake, tmp_path, download=download)
    _write(desired, Adapter("local", path=_adapter_dir(tmp_path, "loras/local")))
    ready = served(syncer).ready
    syncer.sync_once()
    assert ready()[0] == 200
    _write(
        desired,
        Adapter("local", path="loras/local"),
        Adapter("sql", hub=HubSource("my-org/sql-lora", COMMIT)),
    )
    syncer.sync_once()
    assert syncer.downloads and ready()[0] == 200
    assert syncer.report.status()["adapters"]["sql"] == {"loaded": False, "error": None}
    fake.loras.clear()  # even an engine that lost its adapters (restarted in place) stays ready here:
    syncer.sync_once()  # the engine's own probes decide while it restarts
    assert ready()[0] == 200
    release.set()
    _downloads_done(syncer)
    syncer.sync_once()
    assert set(fake.loras) == {"local", "sql"}


# --- what is downloaded from the Hub ----------------------------------------------------------------


class FakeHub:
    """The Hugging Face Hub's routes that huggingface_hub's snapshot_download uses for a pinned commit
    (the recursive tree listing, and HEAD and GET of /<repo>/resolve/<commit>/<file>), serving each
    repository from {repo: {path: bytes}}; it records the files fetched."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.fetched: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _files(self) -> tuple[dict[str, bytes], list[str]] | None:
                """The repository's files and the rest of /api/models/<repo>/... or /<repo>/..."""
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                for repo, files in hub.repos.items():
                    owner, name = repo.split("/")
                    if parts[:4] == ["api", "models", owner, name]:
                        return files, parts[4:]
                    if parts[:2] == [owner, name]:
                        return files, parts[2:]
                return None

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, body: bool) -> None:
                found = self._files()
                if found is None:
                    return self._send(404, b'{"error": "Repository not found"}', {})
                files, rest = found
                if rest[:2] == ["tree", COMMIT]:
                    tree = [{"type": "file", "path": p, "size": len(data), "oid": _sha1(data)}
                            for p, data in files.items()]  # fmt: skip
                    return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
                if rest[:2] == ["resolve", COMMIT] and "/".join(rest[2:]) in files:
                    path = "/".join(rest[2:])
                    if body:
                        hub.fetched.append(path)
                    data = files[path]
                    headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_sha1(data)}"'}
                    return self._send(200, data, headers, body)
                return self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})

            def _send(self, code: int, data: bytes, headers: dict[str, str], body: bool = True) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body and self.command != "HEAD":
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}"


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _hub_download(hub: FakeHub, repo: str, cache_dir: Path) -> Path:
    """lorasync.hub_download with the real huggingface_hub against the fake Hub (a process of its own:
    huggingface_hub reads HF_ENDPOINT when it is imported)."""
    code = (
        "import sys; from pathlib import Path; from qwen_operator.lorasync import hub_download, HubSource; "
        f"print(hub_download(HubSource('{repo}', '{COMMIT}'), Path(sys.argv[1])))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(cache_dir.parent / "hf-home"), "NO_PROXY": "*", "no_proxy": "*"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(cache_dir)],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def test_hub_download_fetches_only_what_vllm_loads(tmp_path: Path) -> None:
    """vLLM 0.32 reads adapter_config.json and one weights file, adapter_model.safetensors, else .bin,
    else .pt (lora/peft_helper.py, lora/lora_model.py from_local_checkpoint), and the base model's
    tokenizer: a repository's other files (checkpoints, optimizer states, images, a second copy of the
    weights) would fill the model cache's emptyDir, sized for the model, and get the pod evicted."""
    pytest.importorskip("huggingface_hub")
    config = json.dumps({"r": 8, "lora_alpha": 8}).encode()
    hub = FakeHub({
        "my-org/sql-lora": {
            "adapter_config.json": config,
            "adapter_model.safetensors": b"s" * 64,
            "adapter_model.bin": b"b" * 64,
            "README.md": b"# sql",
            "images/loss.png": b"png" * 100,
            "checkpoint-500/adapter_config.json": config,
            "checkpoint-500/adapter_model.safetensors": b"c" * 64,
            "checkpoint-500/optimizer.pt": b"o" * 256,
            "tokenizer.json": b"{}",
        },
        "my-org/old-lora": {"adapter_config.json": config, "adapter_model.bin": b"b" * 64,
                            "training_args.bin": b"t" * 64},
    })  # fmt: skip
    try:
        snapshot = _hub_download(hub, "my-org/sql-lora", tmp_path / "hub")
        assert snapshot == hub_snapshot(HubSource("my-org/sql-lora", COMMIT), tmp_path)
        files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if not p.is_dir())
        assert files == ["adapter_config.json", "adapter_model.safetensors"]
        assert sorted(hub.fetched) == files
        hub.fetched.clear()
        snapshot = _hub_download(hub, "my-org/old-lora", tmp_path / "hub")
        files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if not p.is_dir())
        assert files == ["adapter_config.json", "adapter_model.bin"]  # no safetensors: the .bin
        assert sorted(hub.fetched) == files
    finally:
        hub.server.shutdown()


# --- /status, /metrics, the process ---------------------------------------------------------------


def test_status_and_metrics(fake: FakeVllm, tmp_path: Path) -> None:
    syncer, desired, _ = _syncer(fake, tmp_path)
    _write(
        desired, Adapter("good", path=_adapter_dir(tmp_path, "loras/good")), Adapter("gone", path="nothing")
    )
    syncer.sync_once()
    port = free_port()
    server = serve(LOOPBACK, port, lambda: syncer.report)
    try:
        base = f"http://{LOOPBACK}:{port}"
        code, body = http_get(f"{base}/status")
        status = json.loads(body)
        assert code == 200
        assert status["adapters"]["good"] == {"loaded": True, "error": None}
        assert "No adapter found" in status["adapters"]["gone"]["error"]
        assert status["engineReachable"] is True and status["lastSync"] == syncer.report.last_sync
        assert status["fileError"] is None
        metrics = f"{base}/metrics"
        assert metric_sum(metrics, "qwen_lora_adapter_loaded", adapter="good") == 1
        assert metric_sum(metrics, "qwen_lora_adapter_loaded", adapter="gone") == 0
        assert metric_sum(metrics, "qwen_lora_adapter_load_failures_total", adapter="gone") == 1
        assert metric_sum(metrics, "qwen_lora_adapter_load_failures_total", adapter="good") == 0
        assert metric_sum(metrics, "qwen_lora_sync_last_sync_timestamp_seconds") == pytest.approx(
            syncer.report.last_sync
        )
        assert metric_sum(metrics, "qwen_lora_sync_engine_reachable") == 1
        assert http_get(f"{base}/healthz")[0] == 200
        assert http_get(f"{base}/nope")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_cli_process_syncs_and_serves(fake: FakeVllm, tmp_path: Path) -> None:
    desired = tmp_path / "adapters.json"
    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a")))
    port = free_port()
    argv = [str(cli_path()), "lora-sync", "--desired-file", str(desired), "--engine", fake.url,
            "--model-cache", str(tmp_path), "--interval", "0.2", "--host", LOOPBACK,
            "--port", str(port)]  # fmt: skip
    proc = spawn("lora-sync", argv, tmp_path / "logs", env={"VLLM_API_KEY": KEY}, port=port)
    with running(proc):
        wait_ready(proc, "/healthz", 30)
        wait_until(lambda: fake.loras.get("a") == str(tmp_path / "loras/a"), 10, "adapter a loaded")
        _write(desired)
        wait_until(lambda: not fake.loras, 10, "adapter a unloaded")
        proc.popen.terminate()
        assert proc.popen.wait(10) == 0, proc.tail()


def test_sigterm_ends_the_sidecar_at_once_with_a_load_unanswered(fake: FakeVllm, tmp_path: Path) -> None:
    """The pod's containers get SIGTERM together; an engine whose core stopped never answers a load, and
    its HTTP server waits for that connection to close: the sidecar must not wait out its read timeout."""
    desired = tmp_path / "adapters.json"
    _write(desired, Adapter("a", path=_adapter_dir(tmp_path, "loras/a")))
    fake.answering_loads.clear()
    port = free_port()
    argv = [str(cli_path()), "lora-sync", "--desired-file", str(desired), "--engine", fake.url,
            "--model-cache", str(tmp_path), "--host", LOOPBACK, "--port", str(port)]  # fmt: skip
    proc = spawn("lora-sync", argv, tmp_path / "logs", env={"VLLM_API_KEY": KEY}, port=port)
    try:
        with running(proc):
            wait_ready(proc, "/healthz", 30)
            wait_until(lambda: fake.loads("a") == 1, 10, "a load in flight")
            start = time.monotonic()
            proc.popen.terminate()
            assert proc.popen.wait(10) == 0, proc.tail()
            assert time.monotonic() - start < lorasync.STOP_GRACE_SECONDS + 2, proc.tail()
    finally:
        fake.answering_loads.set()


def test_cli_refuses_a_bad_interval() -> None:
    done = subprocess.run([str(cli_path()), "lora-sync", "--interval", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--interval must be positive" in done.stderr


# --- tiny random adapters -------------------------------------------------------------------------

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 64, "num_hidden_layers": 2}  # fmt: skip


def test_tensor_names_and_shapes() -> None:
    shapes = tensor_shapes(TINY, rank=8)
    assert len(shapes) == 2 * len(ALL_MODULES) * 2
    layer = "base_model.model.model.layers.1"
    assert shapes[f"{layer}.self_attn.q_proj.lora_A.weight"] == (8, 128)
    assert shapes[f"{layer}.self_attn.q_proj.lora_B.weight"] == (128, 8)
    assert shapes[f"{layer}.self_attn.k_proj.lora_B.weight"] == (64, 8)
    assert shapes[f"{layer}.self_attn.o_proj.lora_A.weight"] == (8, 128)
    assert shapes[f"{layer}.mlp.gate_proj.lora_B.weight"] == (256, 8)
    assert shapes[f"{layer}.mlp.down_proj.lora_A.weight"] == (8, 256)
    assert set(tensor_shapes(TINY, 4, ["q_proj"])) == {
        f"base_model.model.model.layers.{n}.self_attn.q_proj.lora_{m}.weight" for n in (0, 1) for m in "AB"
    }
    with pytest.raises(ValueError, match="lm_head"):
        tensor_shapes(TINY, 8, ["lm_head"])
    config = adapter_config(16, ALL_MODULES, 2.0, "tiny")
    assert (
        config["r"] == 16 and config["lora_alpha"] == 32.0 and config["target_modules"] == list(ALL_MODULES)
    )


def test_write_random_lora(tiny_model: Path, tmp_path: Path) -> None:
    """Written by the vLLM venv's torch and safetensors, read back there: random A and B (B is not
    zero, as PEFT's init would leave it), the names and shapes above, and a seed that decides them."""
    one = write_random_lora(tmp_path / "one", tiny_model, rank=8, seed=1)
    two = write_random_lora(tmp_path / "two", tiny_model, rank=8, seed=2)
    again = write_random_lora(tmp_path / "again", tiny_model, rank=8, seed=1)
    assert json.loads((one / "adapter_config.json").read_text())["r"] == 8
    from qwen_devtools.vllm_env import TOOL_ENV, vllm_python

    code = r"""
import json, sys
from safetensors.torch import load_file
a, b, c = (load_file(p + "/adapter_model.safetensors") for p in sys.argv[1:4])
name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
print(json.dumps({"shapes": {k: list(v.shape) for k, v in a.items()}, "b_std": a[name].float().std().item(),
                  "same_seed": all((a[k] == c[k]).all().item() for k in a),
                  "other_seed": any((a[k] != b[k]).any().item() for k in a)}))
"""
    argv = [str(vllm_python()), "-c", code, str(one), str(two), str(again)]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **TOOL_ENV}, check=True)
    facts = json.loads(done.stdout)
    config = json.loads((tiny_model / "config.json").read_text())
    assert facts["shapes"] == {k: list(v) for k, v in tensor_shapes(config, 8).items()}
    assert facts["b_std"] > 0.1  # 1/sqrt(rank) = 0.35
    assert facts["same_seed"] and facts["other_seed"]
