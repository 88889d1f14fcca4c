"""`make setup`'s two lanes (qwen_devtools.provision): what they build, and how they run and fail.

The lanes' real steps take an hour from nothing; here the runner is driven with small real processes
(Python one-liners), and the lanes' contents are checked against the images and tools they must cover.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen_devtools import keda, monitoringstack, provision
from qwen_devtools.images import NAMES, SERVING
from qwen_devtools.repo import REPO
from qwen_devtools.require import missing


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def steps_of(module: str) -> list[list[str]]:
    return [argv[2:] for steps in provision.LANES.values() for _, argv in steps if argv[2] == module]


def test_the_lanes_build_every_image_once() -> None:
    built = [name for argv in steps_of("qwen_devtools.images") for name in argv[2:]]
    built += list(monitoringstack.IMAGES)  # `monitoringstack build` builds its own four
    built += list(keda.IMAGES)  # and `keda build` its three
    assert sorted(built) == sorted(NAMES)


def test_the_demos_lanes_are_setups_without_the_monitoring_stack_and_keda() -> None:
    for lane, steps in provision.LANES.items():
        assert provision.DEMO_LANES[lane] == tuple(
            s for s in steps if s[1][2] not in {"qwen_devtools.monitoringstack", "qwen_devtools.keda"}
        )
    built = [
        name
        for steps in provision.DEMO_LANES.values()
        for _, argv in steps
        if argv[2] == "qwen_devtools.images"
        for name in argv[4:]
    ]
    # exactly what `make demo` loads into the real node (serving.load_images), nothing of the monitoring
    # stack or KEDA
    assert sorted(built) == sorted(SERVING)
    assert not set(SERVING) & {*monitoringstack.IMAGES, *keda.IMAGES}
    assert sorted([*SERVING, *monitoringstack.IMAGES, *keda.IMAGES]) == sorted(NAMES)


def test_the_lanes_run_every_setup_tool_and_the_engine_image_after_the_vllm_venv() -> None:
    modules = [argv[2] for steps in provision.LANES.values() for _, argv in steps]
    assert sorted(modules) == sorted(
        [
            "qwen_devtools.devcluster",
            "qwen_devtools.devcluster",
            "qwen_devtools.vllm_env",
            "qwen_devtools.images",
            "qwen_devtools.realparts.exporters",
            "qwen_devtools.images",
            "qwen_devtools.monitoringstack",
            "qwen_devtools.keda",
        ]
    )
    assert steps_of("qwen_devtools.devcluster") == [
        ["qwen_devtools.devcluster", "build", "--real-node"],
        ["qwen_devtools.devcluster", "preload"],
    ]
    lane = [argv[2:] for _, argv in provision.LANES["images"]]
    engine = next(i for i, argv in enumerate(lane) if "engine-cpu" in argv)
    exporter_images = next(i for i, argv in enumerate(lane) if "nginx-exporter" in argv)
    assert lane.index(["qwen_devtools.vllm_env"]) < engine  # the engine image copies the venv
    # the exporters' images hold the programs built by the step before them
    assert lane.index(["qwen_devtools.realparts.exporters"]) < exporter_images
    # the preload imports every serving image, so it follows the last of them
    assert lane.index(["qwen_devtools.devcluster", "preload"]) == exporter_images + 1


def test_lanes_run_side_by_side_with_prefixed_output_and_timings(capsys: pytest.CaptureFixture[str]) -> None:
    lanes = {
        "a": (("first", python("import time; time.sleep(1.5); print('one')")),),
        "bb": (
            ("second", python("import time; time.sleep(1.5); print('two')")),
            ("third", python("print('three')")),
        ),
    }
    started = time.monotonic()
    assert provision.run(lanes) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert took < 2.9, f"two 1.5 s steps side by side took {took:.1f} s"
    assert "a  | one" in out and "bb | two" in out and "bb | three" in out
    assert "[setup] 2 lanes side by side:" in out
    assert "[setup]   bb: " in out and "second " in out and "third " in out


def test_serial_runs_one_step_at_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    lanes = {
        "a": (("first", python("import time; time.sleep(1); print('one')")),),
        "b": (("second", python("import time; time.sleep(1); print('two')")),),
    }
    started = time.monotonic()
    assert provision.run(lanes, serial=True) == 0
    assert time.monotonic() - started >= 2.0
    out = capsys.readouterr().out
    assert out.index("a | one") < out.index("b | two")


def test_a_failed_step_stops_the_other_lane_and_names_itself(capsys: pytest.CaptureFixture[str]) -> None:
    lanes = {
        "slow": (
            ("long build", python("import time; time.sleep(60)")),
            ("never started", python("print('must not run')")),
        ),
        "quick": (("broken step", python("import sys; print('boom'); sys.exit(3)")),),
    }
    started = time.monotonic()
    assert provision.run(lanes) == 1
    assert time.monotonic() - started < 30, "the other lane's step was not stopped"
    captured = capsys.readouterr()
    assert "quick | boom" in captured.out
    assert "must not run" not in captured.out
    assert "[setup] FAILED: broken step:" in captured.err and "exited with status 3" in captured.err
    assert "long build" not in captured.err  # the stopped step is not reported as a failure


def test_without_fail_fast_every_lane_runs_to_its_end_and_listed_statuses_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lanes = {
        "a": (("fails", python("import sys; sys.exit(1)")),),
        "b": (
            ("selects nothing", python("import time, sys; time.sleep(1); sys.exit(5)")),
            ("after it", python("print('ran')")),
        ),
    }
    assert provision.run(lanes, fail_fast=False, also_ok=frozenset({5}), what="tests") == 1
    captured = capsys.readouterr()
    assert "b | ran" in captured.out
    assert "[tests] FAILED: fails:" in captured.err and "selects nothing" not in captured.err


def test_the_test_lanes_split_the_suite_and_together_select_all_of_it() -> None:
    """Each lane's own pytest command line, collected (four collections at once): no test in two
    lanes, every test of `pytest tests e2e -m "not bench"` in one; the real-node journey and the
    engines in one lane, the fault e2e on their own cluster; the pytest arguments reach every lane."""
    from concurrent.futures import ThreadPoolExecutor

    from qwen_devtools import testlanes

    lanes = {name: steps[0][1] for name, steps in testlanes.lanes(["-x"]).items()}
    assert all("-x" in argv and any(a.startswith("--junitxml=") for a in argv) for argv in lanes.values())
    assert f"QWEN_E2E_CLUSTER={testlanes.FAULTS_CLUSTER}" in lanes["kwok faults"]

    def collected(argv: list[str]) -> set[str]:
        pytest = argv.index("pytest")
        argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", *argv[pytest + 1 :]]
        argv = [a for a in argv if a != "-x" and not a.startswith("--junitxml=")]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        return {line for line in done.stdout.splitlines() if "::" in line}

    every_argv = ["pytest", "tests", "e2e", "-m", "not bench"]
    with ThreadPoolExecutor(5) as pool:
        every, *each = pool.map(collected, [every_argv, *lanes.values()])
    by_lane = dict(zip(lanes, each, strict=True))
    assert all(by_lane.values()), {name: len(tests) for name, tests in by_lane.items()}
    assert sum(map(len, by_lane.values())) == len(every)
    assert set().union(*by_lane.values()) == every
    assert any("test_real_journey" in t for t in by_lane["engines"])
    assert any("test_engine_live" in t for t in by_lane["engines"])
    assert any("test_crd" in t for t in by_lane["kwok"])
    assert any("test_faults" in t for t in by_lane["kwok faults"])
    assert not any("test_engine_live" in t for t in by_lane["unit"])


def test_the_slowest_tests_are_read_from_every_lanes_junit_report(tmp_path: Path) -> None:
    from qwen_devtools import testlanes

    (tmp_path / "unit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_a" name="test_x" time="1.5"/>'
        '<testcase classname="tests.test_a" name="test_y[p]" time="9"/></testsuite></testsuites>'
    )
    (tmp_path / "engines.xml").write_text(
        '<testsuites><testsuite><testcase classname="e2e.test_real_journey" name="test_z" time="120.25"/>'
        "</testsuite></testsuites>"
    )
    found = testlanes.slowest([tmp_path / "unit.xml", tmp_path / "engines.xml", tmp_path / "none.xml"], 2)
    assert found == [
        (120.25, "engines", "e2e/test_real_journey.py::test_z"),
        (9.0, "unit", "tests/test_a.py::test_y[p]"),
    ]


def test_failed_and_erred_tests_are_read_from_pytests_own_junit_report(tmp_path: Path) -> None:
    import subprocess
    import sys

    from qwen_devtools import testlanes

    (tmp_path / "test_mod.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken():\n    raise RuntimeError('no cluster')\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert 1 + 1 == 3, 'arithmetic'\n"
        "def test_setup(broken):\n    pass\n"
    )
    report = tmp_path / "kwok-faults.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         f"--junitxml={report}", "test_mod.py"],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    failed = testlanes.failures([report])
    found = {(lane, name.rsplit("::")[1], kind): text for lane, name, kind, text in failed}
    assert set(found) == {("kwok faults", "test_bad", "failed"), ("kwok faults", "test_setup", "error")}
    assert "arithmetic" in found["kwok faults", "test_bad", "failed"]
    assert "no cluster" in found["kwok faults", "test_setup", "error"]


def test_make_test_stops_a_demo_holding_the_real_node_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The decision on a real lock (a temporary file: this machine's may be held by the real-node tests);
    the demo's `down` is recorded, not run: a demo running on this machine must survive the test."""
    from qwen_devtools import demo, testlanes
    from qwen_devtools.devcluster import realnode

    monkeypatch.setattr(realnode, "LOCK_FILE", tmp_path / "real-node.lock")
    stopped: list[str] = []
    monkeypatch.setattr(testlanes.devcluster, "down", stopped.append)
    assert not testlanes.stop_the_demo() and not stopped  # nobody holds it
    fd, _ = realnode.acquire("test-real")
    try:
        assert not testlanes.stop_the_demo() and not stopped  # the tests' own cluster is left alone
    finally:
        os.close(fd)
    fd, _ = realnode.acquire(demo.NAME)
    try:
        assert testlanes.stop_the_demo() and stopped == [demo.NAME]
    finally:
        os.close(fd)
    out = capsys.readouterr().out
    assert f"the demo cluster {demo.NAME!r} holds this machine's real node" in out
    assert "`make demo` brings it back" in out


def test_the_preload_leaves_the_store_to_a_cluster_holding_the_real_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two containerds must never share the image store: while a cluster holds the real-node lock (a
    temporary one here), the preload starts none and says who imports instead."""
    from qwen_devtools.devcluster import preload, realnode
    from qwen_devtools.images import archive_path, image_key

    monkeypatch.setattr(realnode, "LOCK_FILE", tmp_path / "real-node.lock")
    archive = archive_path("operator", image_key("operator"))
    if not archive.is_file():
        missing(str(archive), "run `make setup` (it builds the images)")
    fd, _ = realnode.acquire("demo")
    try:
        assert preload.preload([(archive, "ghcr.io/qwenops/qwen-operator:test")]) == 0
    finally:
        os.close(fd)
    assert "dev cluster 'demo' holds the real node" in capsys.readouterr().out
