"""Child processes of the tests: started in their own session with output to a log file, polled until
they answer on loopback, and always stopped by signalling their own process group.

A process that fails to become ready is stopped and reported with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .net import LOOPBACK, http_get
from .wait import Timeout, wait_until


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
        return tail(self.log, lines)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL it; only this process's own group is signalled."""
        stop_group(self.popen, timeout)


def tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without proxy settings (all traffic stays on 127.0.0.1), plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy")}
    return {**env, **(extra or {})}


def stop_group(popen: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process group led by ``popen``, SIGKILL what is left after ``timeout`` s."""
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


def temp_log_dir() -> Path:
    """A fresh directory for the logs of processes started without one."""
    return Path(tempfile.mkdtemp(prefix="qwen-realparts-"))


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

    def answers() -> bool:
        if not proc.alive():
            proc.stop()
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        return http_get(f"{proc.url}{path}")[0] == expect

    try:
        wait_until(answers, timeout, f"{proc.name} on {path}", interval=0.5)
    except Timeout:
        proc.stop()
        raise RuntimeError(f"{proc.name} not ready on {path} after {timeout:.0f} s:\n{proc.tail()}") from None


@contextlib.contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    """Stop ``proc`` when the block ends, however it ends."""
    try:
        yield proc
    finally:
        proc.stop()


def _process_table() -> dict[int, tuple[int, float]]:
    """Every live process's parent and CPU time (user + system, seconds), from /proc."""
    table: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command (which may hold spaces): state ppid ... utime(14) stime(15).
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def process_tree(pid: int) -> list[int]:
    """A live process and its live descendants."""
    table = _process_table()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(child for child, (parent, _) in table.items() if parent == current)
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system, seconds) of a live process and its live descendants, from /proc: what a
    benchmark charges to one server (nginx's master and workers, say) over a measurement."""
    table = _process_table()
    return sum(table[p][1] for p in process_tree(pid) if p in table)


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Bind every thread of one process to `cpus` (threads and children started later inherit it)."""
    with contextlib.suppress(OSError):  # gone meanwhile
        for thread in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(thread), cpus)


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Bind every thread of a process and of its descendants to `cpus`."""
    for process in process_tree(pid):
        pin_threads(process, cpus)
