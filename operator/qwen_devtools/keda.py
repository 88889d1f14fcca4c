"""KEDA for the dev cluster: its operator (`keda`, cmd/operator) and metrics API server (`keda-adapter`,
cmd/adapter) built from the Go module github.com/kedacore/keda/v2 at the pinned tag, and the test-only
images at the upstream paths (images/keda, images/keda-metrics-apiserver) that the real node runs.

    python -m qwen_devtools.keda build                # both programs and both images (cached)
    python -m qwen_devtools.keda programs             # only the programs; prints their paths
    python -m qwen_devtools.keda load --name NAME     # the images into a dev cluster's real node

The programs are static (CGO off) and stamped as KEDA's Makefile stamps a release (`version.Version`
without the tag's "v", `version.GitCommit`); the keda.sh CRDs come from qwen_devtools.monitoringstack.
The Deployments, RBAC and APIService that run them are not here (see docs/autoscaling.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from qwen_operator.versions import KEDA, KEDA_MODULE

from .gotools import go_program

#: The cache directory's name: ``<cache>/keda-<tag>/{keda,keda-adapter}``.
CACHE_NAME = "keda"
#: Upstream's binaries and their main packages (KEDA's Makefile: `make manager`, `make adapter`).
OPERATOR_BINARY = "keda"
ADAPTER_BINARY = "keda-adapter"
PROGRAMS = {OPERATOR_BINARY: "./cmd/operator", ADAPTER_BINARY: "./cmd/adapter"}
#: The images (qwen_devtools.images names), the operator's first.
IMAGES = ("keda", "keda-metrics-apiserver")


def log(message: str) -> None:
    print(f"[keda] {message}", flush=True)


def version_stamp() -> str:
    """The -X flags of KEDA's Makefile (GO_LDFLAGS) for the pinned release.

    Its release workflow sets VERSION to the tag without its "v" (what `KEDA Version:` logs and the
    `keda_build_info` metric report). GitCommit is the tag itself: the module zip carries no commit.
    """
    values = {"GitCommit": KEDA, "Version": KEDA.removeprefix("v")}
    return " ".join(f"-X={KEDA_MODULE}/version.{k}={v}" for k, v in values.items())


def _program(binary: str) -> Path:
    """One of KEDA's programs, built once: both took 20 minutes here on 2 shared cores, the operator
    first (gotools checks that this Go is at least the release KEDA's go.mod asks for, `go 1.26.0`)."""
    return go_program(
        KEDA_MODULE,
        KEDA,
        CACHE_NAME,
        binary,
        package=PROGRAMS[binary],
        ldflags=f"-s -w {version_stamp()}",
    )


def operator_bin() -> Path:
    """KEDA's operator, `keda` (cmd/operator): controllers, scalers, the metrics gRPC server."""
    return _program(OPERATOR_BINARY)


def metrics_apiserver_bin() -> Path:
    """KEDA's metrics API server, `keda-adapter` (cmd/adapter): serves external.metrics.k8s.io."""
    return _program(ADAPTER_BINARY)


def build() -> None:
    """Both programs and both images, built once (cached)."""
    from . import images  # podman is only needed here

    started = time.monotonic()
    for name in IMAGES:
        images.ensure_image(name)
    log(f"built ({time.monotonic() - started:.0f}s)")


def load_images(cluster_name: str) -> None:
    """KEDA's images into the real node's containerd (built first when needed)."""
    from . import images
    from .devcluster import realnode

    for name in IMAGES:
        image = images.ensure_image(name)
        realnode.load_image(cluster_name, image.archive, image.ref)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen_devtools.keda",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="the two Go programs and their images (cached)")
    commands.add_parser("programs", help="only the two Go programs (cached); prints their paths")
    load = commands.add_parser("load", help="import the images into a dev cluster's real node")
    load.add_argument("--name", default="dev", help="dev cluster name (default: dev)")
    args = parser.parse_args(argv)
    try:
        if args.command == "programs":
            print(operator_bin())
            print(metrics_apiserver_bin())
        elif args.command == "build":
            build()
        else:
            load_images(args.name)
    except RuntimeError as error:  # GoMissing, PodmanMissing
        print(f"[keda] {error}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as error:
        print(
            f"[keda] {error.cmd[0]} failed with exit status {error.returncode} (output above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
