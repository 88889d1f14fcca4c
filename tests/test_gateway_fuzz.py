"""The gateway under abuse, with real processes: an llm-d-inference-sim replica (a simulated vLLM engine)
behind the gateway exactly as the operator renders it (start_gateway_stack: nginx, vllm-router, both
exporters).

Raw sockets send what no well-behaved client would: malformed JSON, bodies over the limit, headers a
byte at a time, header injection and request smuggling, unknown and encoded routes, odd API keys, and
API-key Secret entries that try to inject nginx configuration. Every answer is a client error with the
right status and an OpenAI-style JSON body, never nginx's HTML pages or vllm-router's plain text (nothing
reaches the engine that should not); errors leave the connection usable; nginx's and vllm-router's
resident memory stays bounded, and a normal request is served afterwards. (That vLLM's own JSON errors
pass unchanged: test_engine_live.py.) The tests share one engine and one gateway, in file order; the
last one checks memory and serving.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwen_devtools.net import LOOPBACK
from qwen_devtools.procs import Proc
from qwen_devtools.realparts.engine import SERVED_MODEL, cpu_qwendeployment
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway_stack
from qwen_devtools.realparts.sim import fixed_pace, start_sims
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.gateway.nginx import MAX_BODY, RELOAD_INTERVAL_SECONDS

ENGINE_KEY = "engine-0123456789abcdef"
KEY = "sk-team-a-0123456789abcdef"
KEYS = {"team-a": KEY}
MIB = 2**20
#: How much resident memory nginx (master and workers together) and vllm-router may gain over the
#: whole file: generous against the requests' own buffers (1 MiB bodies in memory, 8 KiB header
#: buffers per connection), far below a leak of what passed through (tens of MiB of bodies).
RSS_GROWTH_LIMIT = {"nginx": 32 * MIB, "router": 64 * MIB}
#: Slow clients at once (nginx has 2 workers of 4096 connections).
SLOW_CLIENTS = 200
#: nginx's client_header_timeout when nginx.conf does not set one.
NGINX_HEADER_TIMEOUT_DEFAULT = 60.0


def _body() -> dict[str, object]:
    """A QwenDeployment with an engine key and client keys."""
    return cpu_qwendeployment(
        engine={"apiKeySecret": {"name": "chat-engine-key"}},
        gateway={"apiKeysSecret": "chat-api-keys", "replicas": 1},
    )


@dataclass
class Fuzzed:
    stack: GatewayStack
    engine: Proc
    rss_before: dict[str, int]


def _session_rss(leader: int, command: str | None = None) -> int:
    """VmRSS (bytes) summed over the processes of `leader`'s session (spawn starts one per part), only
    those named `command` when given (run-nginx.sh's shell and its sleeps are not nginx)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            status = (stat.parent / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(fields[3]) != leader or (command and name != command):  # fields[3]: the session id
            continue
        rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(rss.group(1)) * 1024 if rss else 0
    return total


def rss(stack: GatewayStack) -> dict[str, int]:
    return {
        "nginx": _session_rss(stack.procs["nginx"].pid, "nginx"),
        "router": _session_rss(stack.procs["router"].pid),
    }


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    rev = review(_body())
    root = Path(tempfile.mkdtemp(prefix="qwen-gateway-fuzz-"))
    # nginx's workers drop root when the tests run as root: they must reach the body temp directory
    # under the stack's root (a body over client_body_buffer_size goes there), as in the pod's /tmp.
    root.chmod(0o755)
    # The rendered context (1024 tokens) and batch size (8); 2 ms per token.
    with start_sims(1, 1000, 8, 1024, fixed_pace(2)) as (engine,):
        stack = start_gateway_stack(rev, [engine.url], KEYS, ENGINE_KEY, root=root)
        try:
            assert completion(stack).status == 200  # warm: first-request allocations are not growth
            yield Fuzzed(stack=stack, engine=engine, rss_before=rss(stack))
        finally:
            stack.stop()
            shutil.rmtree(root, ignore_errors=True)


# --- raw HTTP ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    head: str
    body: bytes


def exchange(stack: GatewayStack, data: bytes, timeout: float = 30) -> Answer:
    """Send raw bytes to the gateway's client port and read the answer until nginx closes."""
    return exchange_with(stack.wiring.http_port, data, timeout)


def exchange_with(port: int, data: bytes, timeout: float = 30) -> Answer:
    """Send raw bytes to a loopback port and read the answer until the server closes."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
        # nginx may answer and close before reading everything (an oversized request)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    head, _, body = received.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", head)
    assert match, f"no HTTP answer: {received[:200]!r}"
    return Answer(int(match.group(1)), head.decode("latin-1"), body)


def assert_openai_error(answer: Answer, status: int, code: str) -> None:
    """`answer` is an OpenAI-style JSON error with this status and code, declared as JSON."""
    assert answer.status == status, (answer.status, answer.body[:200])
    content_type = re.search(r"(?im)^content-type: *([^;\r]*)", answer.head)
    assert content_type and content_type.group(1) == "application/json", answer.head
    error = json.loads(answer.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == code and error["message"] and error["type"], error


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str | None] | None = None,
    raw_lines: bytes = b"",
) -> bytes:
    """An HTTP/1.1 request with the team-a key, JSON content and Connection: close; `headers` replace
    (None: leave out) those defaults, `raw_lines` are appended to the header block as they are."""
    fields: dict[str, str | None] = {
        "Host": "gateway",
        "Authorization": f"Bearer {KEY}",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Connection": "close",
        **(headers or {}),
    }
    lines = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in fields.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n".encode() + lines + raw_lines + b"\r\n" + body


def completion(stack: GatewayStack, authorization: str = f"Bearer {KEY}") -> Answer:
    payload = json.dumps({"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": 4}).encode()
    return exchange(stack, request("POST", "/v1/completions", payload, {"Authorization": authorization}), 60)


def models(stack: GatewayStack, authorization: str) -> Answer:
    return exchange(stack, request("GET", "/v1/models", headers={"Authorization": authorization}))


def _bytes(size: str) -> int:
    """nginx's size syntax: 16m -> 16 MiB."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].isalpha() else int(size)


# --- malformed JSON ------------------------------------------------------------------------------------

#: Bodies of a chat completion request, and what the gateway answers for vllm-router, which parses the
#: body (its plain text becomes JSON in nginx): syntax errors 400, JSON of the wrong shape 422.
MALFORMED = {
    "not-json": (b"{not json", 400, "invalid_json"),
    "truncated": (b'{"model":', 400, "invalid_json"),
    "empty": (b"", 400, "invalid_json"),
    "binary": (bytes(range(256)), 400, "invalid_json"),
    "invalid-utf8": (b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}', 400, "invalid_json"),
    "number-out-of-range": (b'{"model":"m","messages":[],"max_tokens":1e999}', 400, "invalid_json"),
    "array": (b"[]", 422, "invalid_request_body"),
    "null": (b"null", 422, "invalid_request_body"),
    "wrong-type": (b'{"model":"m","messages":"hello"}', 422, "invalid_request_body"),
    "nested-100k-deep": (b"[" * 100_000 + b"]" * 100_000, 422, "invalid_request_body"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_json_is_a_client_error(fuzzed: Fuzzed, case: str) -> None:
    body, status, code = MALFORMED[case]
    answer = exchange(fuzzed.stack, request("POST", "/v1/chat/completions", body))
    assert_openai_error(answer, status, code)


def test_a_body_that_is_not_json_by_content_type_is_refused(fuzzed: Fuzzed) -> None:
    answer = exchange(
        fuzzed.stack, request("POST", "/v1/chat/completions", b"{", {"Content-Type": "text/plain"})
    )
    assert_openai_error(answer, 415, "unsupported_media_type")


def test_a_route_asked_with_another_method_gets_405_naming_the_allowed_one(fuzzed: Fuzzed) -> None:
    """vllm-router answers these with an empty body; TRACE nginx refuses itself."""
    for method, path, allowed in (("GET", "/v1/chat/completions", "POST"), ("DELETE", "/v1/models", "GET")):
        answer = exchange(fuzzed.stack, request(method, path))
        assert_openai_error(answer, 405, "method_not_allowed")
        assert re.search(rf"(?im)^allow: .*{allowed}", answer.head), answer.head
    assert_openai_error(exchange(fuzzed.stack, request("TRACE", "/v1/models")), 405, "method_not_allowed")


#: A request the engine itself refuses (a 400 of its own, in JSON): more tokens than its context (1024).
TOO_LONG = {"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": 100_000}


def test_errors_keep_the_connection_open(fuzzed: Fuzzed) -> None:
    """Errors answered by nginx's error pages and by the engine (asked again) leave a keepalive
    connection usable: the next request on it is served."""
    conn = http.client.HTTPConnection(LOOPBACK, fuzzed.stack.wiring.http_port, timeout=60)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    try:
        for body, status in ((b"{not json", 400), (json.dumps(TOO_LONG).encode(), 400), (b"[]", 422)):
            conn.request("POST", "/v1/completions", body, headers)
            response = conn.getresponse()
            assert response.status == status and "error" in json.loads(response.read())
            conn.request("GET", "/v1/models", headers=headers)
            with conn.getresponse() as models_response:
                assert models_response.status == 200 and models_response.read()
    finally:
        conn.close()


# --- bodies over the limit -----------------------------------------------------------------------------


def test_a_declared_body_over_the_limit_gets_413_before_it_is_sent(fuzzed: Fuzzed) -> None:
    too_big = _bytes(MAX_BODY) + 1
    head = request("POST", "/v1/completions", headers={"Content-Length": str(too_big)})
    answer = exchange(fuzzed.stack, head + b"x" * 4096)  # the rest of the body is never sent
    assert_openai_error(answer, 413, "request_too_large")


def test_a_chunked_body_over_the_limit_gets_413(fuzzed: Fuzzed) -> None:
    chunk = b"a" * MIB
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(_bytes(MAX_BODY) // MIB + 1))
    head = request(
        "POST", "/v1/completions", headers={"Content-Length": None, "Transfer-Encoding": "chunked"}
    )
    assert_openai_error(
        exchange(fuzzed.stack, head + chunks + b"0\r\n\r\n", timeout=60), 413, "request_too_large"
    )


def test_a_large_body_under_the_limit_reaches_the_router(fuzzed: Fuzzed) -> None:
    """2 MiB (past nginx's 1 MiB in-memory buffer, into its temp file): the router parses it."""
    body = b'{"model":"m","prompt":"' + b"a" * (2 * MIB)  # unterminated: the router says 400
    answer = exchange(fuzzed.stack, request("POST", "/v1/completions", body), timeout=60)
    assert_openai_error(answer, 400, "invalid_json")


# --- slow clients --------------------------------------------------------------------------------------


def _header_timeout(stack: GatewayStack) -> float:
    conf = (Path(stack.wiring.config_dir) / "nginx.conf").read_text()
    found = re.search(r"^\s*client_header_timeout\s+(\d+)s;", conf, re.M)
    return float(found.group(1)) if found else NGINX_HEADER_TIMEOUT_DEFAULT


def test_slow_clients_are_timed_out_while_others_are_served(fuzzed: Fuzzed) -> None:
    """Slowloris: SLOW_CLIENTS connections send a request head one byte per second and never finish it.
    nginx serves normal requests meanwhile, and closes each slow one at its header timeout."""
    stack = fuzzed.stack
    timeout = _header_timeout(stack)
    slow, opened = [], time.monotonic()
    for _ in range(SLOW_CLIENTS):
        sock = socket.create_connection((LOOPBACK, stack.wiring.http_port), timeout=5)
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n")
        sock.setblocking(False)
        slow.append(sock)
    closed_after: dict[int, float] = {}
    served: list[float] = []
    deadline = opened + timeout + 15
    while len(closed_after) < len(slow) and time.monotonic() < deadline:
        for i, sock in enumerate(slow):
            if i in closed_after:
                continue
            try:
                sock.send(b"X")  # one more byte of an endless header line
                if sock.recv(4096) == b"":
                    closed_after[i] = time.monotonic() - opened
            except BlockingIOError:
                pass
            except OSError:  # reset or broken pipe: closed by nginx
                closed_after[i] = time.monotonic() - opened
        start = time.monotonic()
        assert models(stack, f"Bearer {KEY}").status == 200
        served.append(time.monotonic() - start)
        time.sleep(1)
    for sock in slow:
        sock.close()
    assert len(closed_after) == len(slow), f"{len(slow) - len(closed_after)} slow clients still open"
    assert min(closed_after.values()) >= timeout * 0.9  # held until the timeout, not refused at once
    assert max(closed_after.values()) <= timeout + 10
    assert max(served) < 2.0, served  # the others were served at once all along
    print(f"\n[fuzz] {len(slow)} slow clients closed after {min(closed_after.values()):.0f}-"
          f"{max(closed_after.values()):.0f} s; {len(served)} requests served meanwhile, slowest "
          f"{max(served) * 1000:.0f} ms")  # fmt: skip


# --- header injection, smuggling, oversized headers ----------------------------------------------------


def with_lines(lines: bytes) -> bytes:
    """A request of /v1/models with `lines` added to its header block as they are."""
    return request("GET", "/v1/models", raw_lines=lines)


#: A request with one defect -> the status and code nginx answers (neither the router nor the engine sees
#: it). Never a 5xx: HTTP/9.9 and an unknown transfer coding (RFC 9110 and 9112 suggest 505 and 501) are
#: the client's mistakes; nginx's 494 (header too large) goes out as 431, the status RFC 6585 gives it.
BAD_HEADERS = {
    "CR in a value": (with_lines(b"X-Note: a\rInjected: b\r\n"), 400, "bad_request"),
    "NUL in a value": (with_lines(b"X-Note: a\x00b\r\n"), 400, "bad_request"),
    "space in a name": (with_lines(b"X Note: 1\r\n"), 400, "bad_request"),
    "duplicate Authorization": (with_lines(f"Authorization: Bearer {KEY}\r\n".encode()), 400, "bad_request"),
    "CR in Host": (request("GET", "/v1/models", headers={"Host": "a\rb"}), 400, "bad_request"),
    "no Host": (request("GET", "/v1/models", headers={"Host": None}), 400, "bad_request"),
    "Content-Length and Transfer-Encoding": (
        request("POST", "/v1/completions", b"0\r\n\r\n", {"Transfer-Encoding": "chunked"}),
        400,
        "bad_request",
    ),
    "two Content-Lengths": (
        request("POST", "/v1/completions", b"{}", raw_lines=b"Content-Length: 2\r\n"),
        400,
        "bad_request",
    ),
    "an unknown transfer coding": (
        request("POST", "/v1/completions", b"{}", {"Transfer-Encoding": "gzip", "Content-Length": None}),
        400,
        "unsupported_transfer_encoding",
    ),
    "a 16 KiB header": (with_lines(b"X-Big: " + b"a" * 16384 + b"\r\n"), 431, "request_header_too_large"),
    "48 KiB of headers": (
        with_lines(b"".join(b"X-%d: %s\r\n" % (i, b"a" * 4000) for i in range(12))),
        431,
        "request_header_too_large",
    ),
    "a 20 KiB URI": (request("GET", "/v1/models?q=" + "a" * 20480), 414, "uri_too_long"),
    "an HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "bad_request"),
    "control bytes": (bytes(range(1, 32)) + b"\r\n\r\n", 400, "bad_request"),
    "HTTP/9.9": (b"GET /v1/models HTTP/9.9\r\nHost: gateway\r\n\r\n", 400, "unsupported_http_version"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_headers_are_refused(fuzzed: Fuzzed, case: str) -> None:
    data, status, code = BAD_HEADERS[case]
    assert_openai_error(exchange(fuzzed.stack, data), status, code)


def test_the_client_cannot_set_the_request_id(fuzzed: Fuzzed) -> None:
    """The id in the access log and the engine's logs is nginx's own, whatever the client sends."""
    answer = exchange(fuzzed.stack, request("GET", "/v1/models", headers={"X-Request-Id": "forged\tid"}))
    assert answer.status == 200
    ids = re.findall(r"(?im)^x-request-id: *(\S+)", answer.head)
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids[0]), answer.head


# --- routes --------------------------------------------------------------------------------------------

UNKNOWN_ROUTES = [
    "/v1/%2e%2e/metrics",
    "/v1/models%2F..%2F..%2Fhealth",
    "/v1/completions/..%2f..%2fmetrics",
    "/v1/models/../../metrics",
    "/v1/models\\..\\metrics",
    "/V1/MODELS",
    "/v1/models/",
    "/v1/embeddings",
    "/metrics",
    "/errors/400",  # nginx.conf's own error pages are internal
]


@pytest.mark.parametrize("path", UNKNOWN_ROUTES)
def test_unknown_and_encoded_routes_get_404(fuzzed: Fuzzed, path: str) -> None:
    for method in ("GET", "POST"):
        assert_openai_error(exchange(fuzzed.stack, request(method, path, b"{}")), 404, "unknown_url")


@pytest.mark.parametrize("path", ["/%2e%2e/%2e%2e/etc/passwd", "/v1/models%00", "*"])
def test_paths_nginx_cannot_normalize_get_400(fuzzed: Fuzzed, path: str) -> None:
    assert_openai_error(exchange(fuzzed.stack, request("GET", path)), 400, "bad_request")


# --- odd API keys --------------------------------------------------------------------------------------

ODD_AUTHORIZATION = [
    "Bearer .*",  # a regular expression, not a key
    "Bearer (.*)",
    'Bearer "; default team-a',  # nginx syntax
    "Bearer $key_id",  # an nginx variable
    f"Bearer {KEY[:-1]}.",  # a key with its last character as a regex wildcard
    f"Bearer {KEY[:-1]}*",
    f"Bearer {KEY}|x",
    f"Bearer {KEY}\\",
    "Bearer \u00e9\u00ff",  # bytes outside ASCII (sent as latin-1)
    "Bearer " + "k" * 6000,  # long, yet within nginx's header buffer
    f"Bearer\t{KEY}",  # a tab instead of the space
    "Bearer",
    "Bearer ",
]


@pytest.mark.parametrize("authorization", ODD_AUTHORIZATION)
def test_odd_keys_get_401_never_a_server_error(fuzzed: Fuzzed, authorization: str) -> None:
    assert_openai_error(models(fuzzed.stack, authorization), 401, "invalid_api_key")


def test_secret_entries_cannot_inject_nginx_configuration(fuzzed: Fuzzed) -> None:
    """API-key Secret entries with characters that mean something to nginx or to a regular expression:
    run-nginx.sh leaves out those it cannot write safely, escapes the rest, and nginx reloads fine."""
    stack = fuzzed.stack
    stack.set_api_keys(
        {
            "team-a": KEY,
            "dots": "........",  # '.' escaped: only these eight dots, not any eight characters
            "plus": "ab+",  # '+' escaped: not "abbb"
            "quote": 'sk-x"; default "team-a',  # nginx syntax: left out
            "dollar": "sk-$http_host",  # an nginx variable: left out
            "star": "sk-.*",  # left out ('*')
            "long": "k" * 201,  # longer than 200 characters: left out
            "bad id!": "sk-bad-id-0123456789",  # a key id nginx could not log safely: left out
        }
    )
    # Both new keys: kubelet (and write_secret_volume) link a new key's file after swapping ..data, so
    # run-nginx.sh may render once between the two links and pick the second up one interval later.
    wait_until(
        lambda: models(stack, "Bearer ........").status == 200 and models(stack, "Bearer ab+").status == 200,
        RELOAD_INTERVAL_SECONDS * 4 + 10,
        "nginx reloaded with the new keys",
    )
    assert models(stack, f"Bearer {KEY}").status == 200
    refused = [
        "Bearer 12345678",
        "Bearer abbb",
        'Bearer sk-x"; default "team-a',
        "Bearer sk-$http_host",
        "Bearer sk-.*",
        "Bearer sk-anything",
        "Bearer " + "k" * 201,
        "Bearer sk-bad-id-0123456789",
    ]
    for authorization in refused:
        assert models(stack, authorization).status == 401, authorization
    log = stack.procs["nginx"].log.read_text()
    for left_out in ("quote", "dollar", "star", "long", "bad id!"):
        assert f"'{left_out}'" in log, f"run-nginx.sh did not say it left out {left_out}"


# --- afterwards ----------------------------------------------------------------------------------------


def test_memory_stayed_bounded_and_requests_are_still_served(fuzzed: Fuzzed) -> None:
    after = rss(fuzzed.stack)
    growth = {part: after[part] - fuzzed.rss_before[part] for part in after}
    print(f"\n[fuzz] RSS before {fuzzed.rss_before}, after {after} (bytes)")
    for part, limit in RSS_GROWTH_LIMIT.items():
        assert growth[part] <= limit, f"{part} grew by {growth[part] / MIB:.1f} MiB"
    answer = completion(fuzzed.stack)
    assert answer.status == 200, answer.body[:200]
    assert json.loads(answer.body)["usage"]["completion_tokens"] > 0
    assert fuzzed.engine.alive() and all(p.alive() for p in fuzzed.stack.procs.values())
