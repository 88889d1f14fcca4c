"""Command line of the dev cluster: ``python -m qwen_devtools.devcluster <command> [--name NAME]``.

Commands: ``build`` (binaries only), ``preload`` (the serving images into the real node's image store,
before any cluster runs: preload.py), ``up``, ``down``, ``status`` (exit 1 unless up), ``kubeconfig``
(print its path), ``env`` (print an ``export KUBECONFIG=...`` line). ``build --real-node`` and
``up --real-node`` add this machine's real node (kubelet, containerd, kube-proxy, CoreDNS), where pods
really run; one cluster per machine may have it.
"""

from __future__ import annotations

import argparse
import sys

from . import build, cluster, containerd, network, nodebuild, procs, realnode

DESCRIPTION = "A local Kubernetes control plane with simulated GPU node pools, for e2e tests and the demo."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m qwen_devtools.devcluster", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser(
        "build", help="build and cache the pinned binaries (no-op when cached)"
    )
    build_command.add_argument("--real-node", action="store_true", help="also the real node's parts")
    commands.add_parser(
        "preload", help="build containerd and import the serving images into the real node's image store"
    )
    subs = cluster.add_cluster_commands(
        commands,
        {
            "up": "start the cluster (idempotent) and create the simulated node pools",
            "down": "stop the cluster and remove its state (idempotent)",
            "status": "show components and apiserver health; exit 1 unless up",
            "kubeconfig": "print the kubeconfig path",
            "env": "print an export KUBECONFIG=... line",
        },
    )
    subs["up"].add_argument(
        "--real-node",
        action="store_true",
        help="add this machine's real node (qwen-real-0), where pods run; one cluster per machine",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            print(build.build())
            if args.real_node:
                nodebuild.build()
        elif args.command == "preload":
            from .. import images  # podman is only needed here
            from . import preload

            nodebuild.build_containerd()
            preload.preload((image.archive, image.ref) for image in images.ensure_serving())
        elif args.command == "up":
            cluster.up(args.name, real_node=args.real_node)
        elif args.command == "down":
            cluster.down(args.name)
        elif args.command == "status":
            return 0 if cluster.status(args.name) else 1
        elif args.command == "kubeconfig":
            print(cluster.repo_kubeconfig(args.name))
        else:
            print(f"export KUBECONFIG={cluster.repo_kubeconfig(args.name)}")
    except (
        procs.ComponentError,
        build.BuildError,
        realnode.RealNodeError,
        network.NetworkError,
        containerd.CtrError,
        ValueError,
    ) as error:
        print(f"[devcluster] error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
