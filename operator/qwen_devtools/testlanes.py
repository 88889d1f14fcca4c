"""`make test`'s suite in four pytest processes side by side (qwen_devtools.provision's lanes).

Most of the suite's time is waiting: on vLLM engines to start and answer, on the clusters' controllers,
on the operator's retries, on fault windows. The kinds of waiting overlap well, so each gets a process:

* ``engines``: the tests that start real vLLM CPU engines (marker ``engine``: tests/test_engine_live.py,
  the gateway in front of one and the LoRA sidecar beside it) or use this machine's real node
  (``real_node``: the real-node journey, e2e/test_real_journey.py, and the node's own checks), one
  after another: engines started side by
  side on 2 cores starve each other's start past its bounds (a loopback engine's workers failed to
  start in 300 s beside the journey's, 2026-12-07), and the real node has one user. The test that
  stops its cluster runs last (e2e/conftest.py).
* ``kwok``: the kwok cluster's e2e, on the dev cluster ``test``.
* ``kwok faults``: the e2e that stop, cut off or throttle the API server (FAULT_MODULES), on a kwok
  cluster of their own (``test-faults``), so their fault windows overlap the other lanes' work.
* ``unit``: the rest of tests/: the pure tests and the real processes on loopback (nginx, njs,
  vllm-router, the simulator, promtool).

Each output line is prefixed with its lane; every lane runs to the end, and the run fails when any
fails. A lane that selects no test (``-k`` picking tests of other lanes only) is not a failure. At the
end the 20 slowest tests of the whole run are printed with their lane (from each lane's JUnit XML in
REPORTS), then each failed or erred test with the first lines of its message, last, so that the tail
of a CI log (often all that is kept) names what failed.

``QWEN_TEST_COVERAGE=1`` measures the line coverage of ``qwen_operator`` in every lane (pytest-cov, one
data file per lane, combined into ``.coverage`` and reported at the end): the issue-40 measure, before
and after a change of the suite, on the same tree.

The real-node tests need this machine's real node, which a running `make demo` holds (one per machine:
kubelet's port and paths are fixed), and the demo's TP-2 engine keeps both cores busy. So the demo is
stopped first, with a line that says so; `make demo` brings it back (about 2 minutes once built).

    python -m qwen_devtools.testlanes [PYTEST_ARGS ...]     # what `make test` runs
    python -m qwen_devtools.testlanes --quick [PYTEST_ARGS ...]   # `make test-quick`: tests/ only, no engine
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from . import demo
from .devcluster import cluster as devcluster
from .devcluster import realnode
from .provision import Steps, run
from .repo import REPO

#: The e2e modules of the ``kwok faults`` lane.
FAULT_MODULES = ("e2e/test_faults.py", "e2e/test_api_faults.py", "e2e/test_leader.py")
#: The kwok cluster of that lane (e2e/conftest.py reads QWEN_E2E_CLUSTER).
FAULTS_CLUSTER = "test-faults"
#: pytest's exit status when no test was selected.
NO_TESTS = 5
#: Where each lane writes its JUnit XML (and, with coverage, its data file).
REPORTS = REPO / ".devcluster" / "test-lanes"
SLOWEST = 20
#: How many lines of a failure's message the summary shows.
FAILURE_LINES = 6


def _pytest(
    lane: str, paths: list[str], marks: str, args: list[str], env: dict[str, str] | None = None
) -> list[str]:
    report = REPORTS / f"{lane.replace(' ', '-')}.xml"
    coverage: list[str] = []
    setting = dict(env or {})
    if os.environ.get("QWEN_TEST_COVERAGE") == "1":
        coverage = ["--cov=qwen_operator", "--cov-report="]
        setting["COVERAGE_FILE"] = str(report.with_suffix(".coverage"))
    prefix = ["env", *(f"{k}={v}" for k, v in setting.items())] if setting else []
    return [
        *prefix, sys.executable, "-m", "pytest", *paths, "-m", marks, f"--junitxml={report}", *coverage, *args
    ]  # fmt: skip


def lanes(args: list[str], quick: bool = False) -> dict[str, Steps]:
    if quick:
        pure = "not engine and not bench"
        return {
            "unit": (("pure and loopback tests", _pytest("unit", ["tests"], pure, args)),),
        }
    faults = list(FAULT_MODULES)
    ignored = [f"--ignore={path}" for path in faults]
    return {
        "engines": (
            (
                "engine and real-node tests",
                _pytest("engines", ["tests", "e2e"], "(engine or real_node) and not bench", args),
            ),
        ),
        "kwok": (
            ("kwok-cluster e2e", _pytest("kwok", ["e2e", *ignored], "not real_node and not bench", args)),
        ),
        "kwok faults": (
            (
                "kwok-cluster fault e2e",
                _pytest(
                    "kwok faults",
                    faults,
                    "not real_node and not bench",
                    args,
                    {"QWEN_E2E_CLUSTER": FAULTS_CLUSTER},
                ),
            ),
        ),
        "unit": (("pure and loopback tests", _pytest("unit", ["tests"], "not engine and not bench", args)),),
    }


def slowest(reports: list[Path], count: int = SLOWEST) -> list[tuple[float, str, str]]:
    """(seconds, lane, test) of the slowest test cases in the lanes' JUnit XML files, slowest first."""
    cases = []
    for report in reports:
        if not report.exists():
            continue
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), report.stem.replace("-", " "), name))
    return sorted(cases, reverse=True)[:count]


def failures(reports: list[Path], lines: int = FAILURE_LINES) -> list[tuple[str, str, str, str]]:
    """(lane, test, "failed" or "error", the message's first lines) of each failed or erred test case."""
    found = []
    for report in reports:
        if not report.exists():
            continue
        for case in ET.parse(report).iter("testcase"):
            for kind in ("failure", "error"):
                for element in case.iter(kind):
                    text = (element.get("message") or element.text or "").strip().splitlines()[:lines]
                    name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"
                    lane = report.stem.replace("-", " ")
                    found.append((lane, name, "failed" if kind == "failure" else "error", "\n".join(text)))
    return found


def _report(names: list[str]) -> None:
    reports = [REPORTS / f"{name.replace(' ', '-')}.xml" for name in names]
    print(f"[tests] the {SLOWEST} slowest tests (setup and teardown included):", flush=True)
    for took, lane, name in slowest(reports):
        print(f"[tests] {took:7.1f} s  {lane:<11}  {name}", flush=True)
    data = [str(r.with_suffix(".coverage")) for r in reports if r.with_suffix(".coverage").exists()]
    if data:
        python = [sys.executable, "-m", "coverage"]
        subprocess.run([*python, "combine", "--keep", *data], cwd=REPO, check=False)
        subprocess.run([*python, "report", "--format=total", "--precision=2"], cwd=REPO, check=False)
    for lane, name, kind, message in failures(reports):
        print(f"[tests] {kind} ({lane}): {name}", flush=True)
        for line in message.splitlines():
            print(f"[tests]     {line}", flush=True)


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
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run's cleanup
    if not quick:
        stop_the_demo()
    REPORTS.mkdir(parents=True, exist_ok=True)
    for old in REPORTS.iterdir():
        old.unlink()
    chosen = lanes(args, quick)
    code = run(chosen, fail_fast=False, also_ok=frozenset({NO_TESTS}), what="tests")
    _report(list(chosen))
    return code


if __name__ == "__main__":
    sys.exit(main())
