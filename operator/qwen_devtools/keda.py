"""KEDA for the dev cluster: its operator (`keda`, cmd/operator) and metrics API server (`keda-adapter`,
cmd/adapter) built from the Go module github.com/kedacore/keda/v2 at the pinned tag, and the test-only
images at the upstream paths (images/keda, images/keda-metrics-apiserver) for the real node.

    python -m qwen_devtools.keda build                # programs, images, roles, eventing CRDs (cached)
    python -m qwen_devtools.keda programs             # only the programs; prints their paths
    python -m qwen_devtools.keda generate             # only the roles and eventing CRDs; prints their dir
    python -m qwen_devtools.keda load --name NAME     # the images into a dev cluster's real node

The programs are static (CGO off) and stamped as KEDA's Makefile stamps a release (`version.Version`
without the tag's "v", `version.GitCommit`); the keda.sh CRDs come from qwen_devtools.monitoringstack.
The operator's ClusterRole and Role are generated from the `+kubebuilder:rbac` markers of that Go
source, and the eventing.keda.sh CRDs the operator also watches from its API types; the Deployments, the
adapter's RBAC and the APIService that run them are not here (docs/autoscaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from qwen_operator.versions import CONTROLLER_TOOLS, KEDA, KEDA_MODULE

from .cache import cache_dir
from .gotools import GoMissing, find_go, go_program, module_source, writable_copy

#: The cache directory's name: ``<cache>/keda-<tag>/{keda,keda-adapter}``.
CACHE_NAME = "keda"
#: Upstream's binaries and their main packages (KEDA's Makefile: `make manager`, `make adapter`).
OPERATOR_BINARY = "keda"
ADAPTER_BINARY = "keda-adapter"
PROGRAMS = {OPERATOR_BINARY: "./cmd/operator", ADAPTER_BINARY: "./cmd/adapter"}
#: The images (qwen_devtools.images names), the operator's first.
IMAGES = ("keda", "keda-metrics-apiserver")
#: The operator's roles as KEDA's `make manifests` generates them (its CONTROLLER_GEN_PATHS), and its
#: eventing CRDs with the options of that target.
OPERATOR_ROLE = "keda-operator"
RBAC_PATHS = ("./apis/...", "./controllers/...", "./pkg/...")
EVENTING_APIS = "./apis/eventing/v1alpha1/."
EVENTING_CRD_OPTIONS = "crd:crdVersions=v1,generateEmbeddedObjectMeta=true"
#: Bump when the generation changes in a way the versions do not show.
GENERATED_RECIPE = 1


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


def generated_dir() -> Path:
    """Where the roles and CRDs generated for the pinned versions are (a MANIFEST file marks them done)."""
    return cache_dir() / f"keda-generated-{KEDA}-cg{CONTROLLER_TOOLS}-r{GENERATED_RECIPE}"


def generate() -> Path:
    """What KEDA's `make manifests` generates with controller-gen from its Go source and the keda.sh CRDs
    of qwen_devtools.monitoringstack leave out, once (about 10 s; cached):

    - ``role.yaml``: the operator's ClusterRole `keda-operator` and its Role in namespace `keda` (leases,
      Secrets), from the `+kubebuilder:rbac` markers (``rbac:roleName=keda-operator`` over
      CONTROLLER_GEN_PATHS; the same file as the module's config/rbac/role.yaml);
    - the eventing.keda.sh CRDs (CloudEventSource, ClusterCloudEventSource) of ./apis/eventing/v1alpha1:
      the operator starts their controllers unconditionally, so a cluster that runs it needs them.
    """
    out = generated_dir()
    if (out / "MANIFEST").is_file():
        return out
    go = find_go()
    if not go:
        raise GoMissing("Go (to generate KEDA's roles and eventing CRDs)")
    from .monitoringstack import controller_gen_bin  # the CRDs' controller-gen, built once

    controller_gen = str(controller_gen_bin())
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(go).parent), os.environ.get("PATH", "")]),  # go/packages runs go
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=mod".strip(),
        "CGO_ENABLED": "0",
        "GOWORK": "off",
    }
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = writable_copy(module_source(go, KEDA_MODULE, KEDA), Path(tmp) / "src")
        for argv in (
            [
                f"rbac:roleName={OPERATOR_ROLE}",
                *(f"paths={p}" for p in RBAC_PATHS),
                f"output:rbac:dir={partial}",
            ],
            [EVENTING_CRD_OPTIONS, f"paths={EVENTING_APIS}", f"output:crd:dir={partial}"],
        ):
            subprocess.run([controller_gen, *argv], cwd=work, check=True, env=env)
    files = sorted(path.name for path in partial.glob("*.yaml"))
    manifest = {"keda": KEDA, "controller-tools": CONTROLLER_TOOLS, "files": files}
    (partial / "MANIFEST").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log(f"roles and eventing CRDs generated from KEDA's Go source: {out}")
    return out


def operator_roles() -> list[dict[str, Any]]:
    """The generated ClusterRole `keda-operator` and the Role of the same name in namespace `keda`."""
    return [dict(doc) for doc in yaml.safe_load_all((generate() / "role.yaml").read_text()) if doc]


def eventing_crd_files() -> list[Path]:
    """The generated eventing.keda.sh CRDs (`<group>_<plural>.yaml`, as controller-gen names them)."""
    return sorted(generate().glob("eventing.keda.sh_*.yaml"))


def build() -> None:
    """Both programs, both images, the operator's roles and the eventing CRDs, built once (cached)."""
    from . import images  # podman is only needed here

    started = time.monotonic()
    for name in IMAGES:
        images.ensure_image(name)
    generate()
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
    commands.add_parser(
        "build", help="the two Go programs, their images, the roles and eventing CRDs (cached)"
    )
    commands.add_parser("programs", help="only the two Go programs (cached); prints their paths")
    commands.add_parser("generate", help="only the operator's roles and the eventing CRDs (cached)")
    load = commands.add_parser("load", help="import the images into a dev cluster's real node")
    load.add_argument("--name", default="dev", help="dev cluster name (default: dev)")
    args = parser.parse_args(argv)
    try:
        if args.command == "programs":
            print(operator_bin())
            print(metrics_apiserver_bin())
        elif args.command == "generate":
            print(generate())
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
