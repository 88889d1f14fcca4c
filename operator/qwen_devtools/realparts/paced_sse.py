"""A fake engine on loopback that streams server-sent events at a fixed pace, for the gateway's streaming
tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ..net import free_port
from ..procs import Proc, running, spawn, temp_log_dir, wait_ready

#: An upstream that sends one server-sent event every `interval` seconds: it shows whether everything
#: between it and the client forwards each event at once, independently of a busy engine's own pacing.
_PACED_SSE_SCRIPT = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, count, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and events are separate small writes: without this, Nagle's algorithm holds each one until
    # the reader's delayed ACK (40 ms), longer than the pace of a fast source.
    disable_nagle_algorithm = True

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
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"):
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
    proc = spawn(f"paced-sse-{port}", argv, temp_log_dir(), port=port)
    with running(proc):
        wait_ready(proc, "/health", 20)
        yield proc
