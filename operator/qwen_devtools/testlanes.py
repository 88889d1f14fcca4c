"""`make test`'s suite in two pytest processes side by side (qwen_devtools.provision's lanes).

Most of the suite's time is waiting: on vLLM engines to start and answer, and on the kwok cluster's
controllers and the operator's retries. The two kinds of waiting overlap well, so each gets a process:

* ``engines``: the tests that start real vLLM CPU engines (marker ``engine``) or use this machine's real
  node (``real_node``), one after another: the machine keeps to the three real engines it has memory
  for, and the real node has one user. The test that stops the real-node cluster runs last
  (e2e/conftest.py).
* ``others``: everything else: the pure tests and the kwok cluster's e2e.

Each output line is prefixed with its lane; both lanes run to the end, and the run fails when either
fails. A lane that selects no test (``-k`` picking tests of one lane only) is not a failure.

The real-node tests need this machine's real node, which a running `make demo` holds (one per machine:
kubelet's port and paths are fixed), and the demo's TP-2 engine keeps both cores busy. So the demo is
stopped first, with a line that says so; `make demo` brings it back (about 2 minutes once built).

    python -m qwen_devtools.testlanes [PYTEST_ARGS ...]     # what `make test` runs
"""

from __future__ import annotations

import signal
import sys

from . import demo
from .devcluster import cluster as devcluster
from .devcluster import realnode
from .provision import Steps, run

#: The tests of the `engines` lane, as a marker expression.
ENGINES = "engine or real_node"
#: pytest's exit status when no test was selected.
NO_TESTS = 5


def lanes(args: list[str]) -> dict[str, Steps]:
    pytest = [sys.executable, "-m", "pytest", "tests", "e2e", "--durations=15", *args]
    return {
        "engines": (("engine and real-node tests", [*pytest, "-m", f"({ENGINES}) and not bench"]),),
        "others": (("pure and kwok-cluster tests", [*pytest, "-m", f"not ({ENGINES}) and not bench"]),),
    }


def stop_the_demo() -> bool:
    """Stop the demo cluster when it holds the real node (see the module docstring); True if it did."""
    if realnode.holder() != demo.NAME:
        return False
    print(
        f"[tests] the demo cluster {demo.NAME!r} holds this machine's real node, which the real-node tests"
        " need: stopping it. `make demo` brings it back afterwards (about 2 minutes once built).",
        flush=True,
    )
    devcluster.down(demo.NAME)
    return True


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run's cleanup
    stop_the_demo()
    return run(lanes(args), fail_fast=False, also_ok=frozenset({NO_TESTS}), what="tests")


if __name__ == "__main__":
    sys.exit(main())
