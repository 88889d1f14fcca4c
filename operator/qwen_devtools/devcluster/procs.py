"""Starting, probing and stopping the control plane processes.

Every component runs in its own session (so its process group id equals its pid) with stdout and stderr
in ``<state dir>/logs/<component>.log``. Stopping only ever signals the recorded process groups, and only
after checking that the pid still runs the recorded executable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..procs import clean_env
from ..wait import Timeout, wait_until


class ComponentError(RuntimeError):
    """A component failed to start or become healthy; ``log`` is its log file."""

    def __init__(self, component: str, message: str, log: Path | None = None) -> None:
        super().__init__(f"{component}: {message}")
        self.component = component
        self.log = log


@dataclass(frozen=True)
class Probe:
    """An HTTP(S) health endpoint on 127.0.0.1 that must answer 200 (HTTPS verified against ``ca_file``)."""

    url: str
    ca_file: str | None = None
    token: str | None = None

    def ok(self) -> bool:
        """One probe attempt; False on any connection or HTTP error."""
        request = urllib.request.Request(self.url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with _opener(self._context()).open(request, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https:") else None


def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """A urllib opener that never uses a proxy."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )


def start(
    name: str,
    argv: list[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> int:
    """Start ``argv`` detached in a new session with output to ``log_dir/name.log``; returns the pid.

    ``env`` is added to the (proxy-free) environment; ``pass_fds`` stay open in the child.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=clean_env(env),
            pass_fds=tuple(pass_fds),
        )
    return process.pid


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def running(pid: int, executable: str) -> bool:
    """True if ``pid`` is alive (not a zombie) and runs ``executable``."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and exe.removesuffix(" (deleted)") == executable


def wait_healthy(name: str, pid: int, executable: str, probe: Probe, log: Path, timeout: float) -> None:
    """Poll ``probe`` until it answers 200; fail early if the process exits."""

    def healthy() -> bool:
        if not running(pid, executable):
            raise ComponentError(name, "exited during start-up", log)
        return probe.ok()

    try:
        wait_until(healthy, timeout, probe.url, interval=0.2)
    except Timeout:
        raise ComponentError(name, f"not healthy after {timeout:.0f}s ({probe.url})", log) from None


def stop(pid: int, executable: str, timeout: float = 10.0) -> None:
    """SIGTERM the process group of ``pid`` if it still runs ``executable``; SIGKILL it after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not running(pid, executable):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        with contextlib.suppress(Timeout):
            wait_until(lambda: not running(pid, executable), wait, f"pid {pid} to exit", interval=0.05)
