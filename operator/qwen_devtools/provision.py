"""`make setup`'s steps, in two lanes that run side by side, each step cached by the tool it runs.

From nothing, setup is about an hour of work on 2 cores, and it is of two kinds. Compiling Kubernetes
(the control plane, kubelet, kube-proxy, containerd, CoreDNS) keeps both cores busy for half of it;
the other half mostly waits on the network and the disk (the vLLM venv's 3.5 GB of wheels,
debootstrap, apt-get inside the image builds, writing 6 GB image archives), with Go builds of the
smaller programs in between. Run one after the other, the cores idle through the waiting; side by
side, the waiting hides under the compiling. Warm, every step is a no-op of a second or two.

    lane "cluster": devcluster build --real-node
    lane "images":  vllm_env; images operator, gateway, engine-cpu; exporters; their import into the
                    real node's image store (devcluster preload); monitoring stack; KEDA

`make demo` runs the lanes without the monitoring stack and KEDA (``--demo``): the demo serves no
Prometheus and does not scale to zero, and on 2 cores their Go builds would slow the Kubernetes compile
that the demo waits for. The tests
(`make setup`, which `make test` and `.ci/run` run) build it after the demo's parts, with the same lines.

The lanes share nothing a step writes (the Go module and build caches are safe for concurrent use,
podman's store locks itself). Each output line is prefixed with its lane; every step's time and both
lanes' totals are printed at the end. When a step fails, the other lane is stopped (its step's
partial output is in a `.tmp` directory that the next run replaces) and setup fails with that step's
name and exit status.

    python -m qwen_devtools.provision            # both lanes (what `make setup` runs)
    python -m qwen_devtools.provision --serial   # one step at a time, in lane order
    python -m qwen_devtools.provision --demo     # what `make demo` runs: no monitoring stack, no KEDA
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .procs import stop_group

DEVTOOLS = [sys.executable, "-m"]
Steps = tuple[tuple[str, list[str]], ...]

#: Only the tests use it (e2e/test_real_journey.py, e2e/test_monitoring_crds.py): not in DEMO_LANES.
MONITORING = (
    "monitoring stack: CRDs, programs, images",
    [*DEVTOOLS, "qwen_devtools.monitoringstack", "build"],
)
#: KEDA's operator, metrics API server and admission webhooks, built from its Go module: the scaler that
#: takes engines to zero and back on the dev cluster. Not in DEMO_LANES either.
KEDA = ("KEDA: operator, metrics API server, webhooks, images", [*DEVTOOLS, "qwen_devtools.keda", "build"])
#: Steps of the tests only: not in DEMO_LANES.
TESTS_ONLY = (MONITORING, KEDA)
#: Each lane's steps in order: (what, argv). Later steps of a lane may need earlier ones (the engine
#: image copies the vLLM venv; the exporters' images hold the exporters built just before).
LANES: dict[str, Steps] = {
    "cluster": (
        (
            "Kubernetes, kwok, helm, the real node",
            [*DEVTOOLS, "qwen_devtools.devcluster", "build", "--real-node"],
        ),
    ),
    "images": (
        ("vLLM CPU venv", [*DEVTOOLS, "qwen_devtools.vllm_env"]),
        (
            "operator, gateway and engine images",
            [*DEVTOOLS, "qwen_devtools.images", "build", "operator", "gateway", "engine-cpu"],
        ),
        ("the gateway's exporters", [*DEVTOOLS, "qwen_devtools.realparts.exporters"]),
        (
            "the exporters' images",
            [*DEVTOOLS, "qwen_devtools.images", "build", "nginxlog-exporter", "nginx-exporter"],
        ),
        # the images lane is done long before the Kubernetes compile: the import then costs no waiting
        (
            "containerd, the serving images into the real node's store",
            [*DEVTOOLS, "qwen_devtools.devcluster", "preload"],
        ),
        MONITORING,
        KEDA,
    ),
}
#: What `make demo` needs: the lanes without the monitoring stack and KEDA.
DEMO_LANES: dict[str, Steps] = {
    lane: tuple(step for step in steps if step not in TESTS_ONLY) for lane, steps in LANES.items()
}


@dataclass
class Lane:
    """One lane's steps, run in order in a thread; the first failure ends the lane."""

    name: str
    steps: Steps
    width: int
    output: threading.Lock
    stopping: threading.Event
    #: Stop the other lanes when a step fails (setup); False lets them finish (tests).
    fail_fast: bool = True
    #: Exit statuses that count as success besides 0 (pytest's 5: this lane selected no test).
    also_ok: frozenset[int] = frozenset()
    timings: list[tuple[str, float]] = field(default_factory=list)
    failed: str | None = None
    current: subprocess.Popen[bytes] | None = None

    def say(self, line: str) -> None:
        with self.output:
            print(f"{self.name:<{self.width}} | {line}", flush=True)

    def run(self) -> None:
        for what, argv in self.steps:
            if self.stopping.is_set():
                return
            started = time.monotonic()
            self.say(f"[{self.name}] {what}")
            code = self._step(argv)
            took = time.monotonic() - started
            self.timings.append((what, took))
            if code != 0 and code not in self.also_ok:
                if not self.stopping.is_set():
                    self.failed = f"{what}: `{' '.join(argv[2:])}` exited with status {code}"
                    if self.fail_fast:
                        self.stopping.set()
                return
            self.say(f"[{self.name}] {what}: done ({took:.0f} s)")

    def _step(self, argv: list[str]) -> int:
        popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.current = popen
        assert popen.stdout is not None
        for raw in popen.stdout:
            self.say(raw.decode(errors="replace").rstrip())
        return popen.wait()

    def stop(self) -> None:
        if self.current is not None:
            stop_group(self.current, timeout=30)


def run(
    lanes: dict[str, Steps],
    serial: bool = False,
    fail_fast: bool = True,
    also_ok: frozenset[int] = frozenset(),
    what: str = "setup",
) -> int:
    """Run the lanes (side by side, or one step at a time); 0 when every step succeeded. A failed
    step ends its lane, and with ``fail_fast`` the other lanes too."""
    started = time.monotonic()
    output, stopping = threading.Lock(), threading.Event()
    width = max(map(len, lanes))
    runners = [
        Lane(name, steps, width, output, stopping, fail_fast, also_ok) for name, steps in lanes.items()
    ]
    threads = [threading.Thread(target=lane.run, name=lane.name, daemon=True) for lane in runners]
    try:
        for thread in threads:
            thread.start()
            if serial:
                thread.join()
        while any(thread.is_alive() for thread in threads):
            if stopping.is_set():
                for lane in runners:
                    lane.stop()
            for thread in threads:
                thread.join(0.5)
    finally:  # Ctrl-C or SIGTERM (a CI timeout): the steps run in sessions of their own, stop them
        if any(thread.is_alive() for thread in threads):
            stopping.set()
            for lane in runners:
                lane.stop()
    total = time.monotonic() - started
    how = "one step at a time" if serial else f"{len(runners)} lanes side by side"
    print(f"[{what}] {how}: {total:.0f} s", flush=True)
    for lane in runners:
        spent = sum(took for _, took in lane.timings)
        steps = "; ".join(f"{step} {took:.0f} s" for step, took in lane.timings)
        print(f"[{what}]   {lane.name}: {spent:.0f} s ({steps})", flush=True)
    failures = [lane.failed for lane in runners if lane.failed]
    for failure in failures:
        print(
            f"[{what}] FAILED: {failure} (its output is above, lines prefixed with its lane)", file=sys.stderr
        )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen_devtools.provision",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--serial", action="store_true", help="one step at a time, in lane order")
    parser.add_argument(
        "--demo", action="store_true", help="only what `make demo` uses (no monitoring stack, no KEDA)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run's cleanup
    return run(
        DEMO_LANES if args.demo else LANES, serial=args.serial, what="setup --demo" if args.demo else "setup"
    )


if __name__ == "__main__":
    sys.exit(main())
