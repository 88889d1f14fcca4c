"""The benchmarks' process helpers (qwen_devtools.procs), on real processes: a shell whose child burns
CPU, then sleeps; the helpers must see and bind the whole tree, children included."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from qwen_devtools.procs import pin_tree, process_tree, tree_cpu_seconds

BURN_THEN_SLEEP = (
    "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(60)"
)


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    # sh -c "python ... ; true": the shell stays the parent of the Python child.
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; true', BURN_THEN_SLEEP])
    try:
        yield shell
    finally:
        for pid in reversed(process_tree(shell.pid)):
            os.kill(pid, 9)
        shell.wait()


def _child(shell: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tree = process_tree(shell.pid)
        if len(tree) == 2:
            return tree[1]
        time.sleep(0.02)
    raise AssertionError(f"no child of the shell: {process_tree(shell.pid)}")


def test_the_tree_and_its_cpu_time(tree: subprocess.Popen[bytes]) -> None:
    child = _child(tree)
    assert process_tree(tree.pid) == [tree.pid, child]
    deadline = time.monotonic() + 10
    while tree_cpu_seconds(tree.pid) < 0.25 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tree_cpu_seconds(tree.pid) >= 0.25  # the child's burn, charged to the shell's tree
    assert tree_cpu_seconds(tree.pid) - tree_cpu_seconds(child) < 0.1  # the shell itself idles


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to bind to")
def test_pin_tree_binds_every_process_and_thread(tree: subprocess.Popen[bytes]) -> None:
    child = _child(tree)
    core = min(os.sched_getaffinity(0))
    pin_tree(tree.pid, {core})
    for pid in (tree.pid, child):
        for thread in os.listdir(f"/proc/{pid}/task"):
            assert os.sched_getaffinity(int(thread)) == {core}
    assert os.sched_getaffinity(0) != {core}  # the caller is not in the tree
