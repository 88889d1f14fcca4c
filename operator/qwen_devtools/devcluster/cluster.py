"""Bringing a named dev cluster up and down (with or without this machine's real node), reporting its
status, and a handle for using it.

State lives in ``/dev/shm/qwen-devcluster-<name>/``: ``state.json`` (ports, pids, executables), ``pki/``,
``etcd/`` data, ``logs/<component>.log``, ``audit.log`` (JSON, metadata of every write) and
``kubeconfig``. The kubeconfig is also copied to ``<repo>/.devcluster/<name>/kubeconfig``, next to an
``audit.log`` symlink (that directory ignores itself in git).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config

from ..net import free_ports
from ..procs import clean_env, tail
from ..repo import REPO
from . import build, components, kubeconfig, network, nodebuild, nodecomponents, nodes, pki, procs, realnode
from .state import State, state_dir

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")
START_TIMEOUT = {"kube-apiserver": 90.0}
DEFAULT_START_TIMEOUT = 45.0
NODES_TIMEOUT = 60.0
LOG_TAIL_LINES = 40


def log(message: str) -> None:
    """One progress line on stdout."""
    print(f"[devcluster] {message}", flush=True)


@contextlib.contextmanager
def _step(label: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    log(f"{label} ({time.monotonic() - started:.1f}s)")


def repo_kubeconfig(name: str) -> Path:
    """Repository-relative copy of the kubeconfig of dev cluster ``name``."""
    return REPO / ".devcluster" / name / "kubeconfig"


def check_name(name: str) -> None:
    """Reject names that are not short DNS labels (they end up in paths and context names)."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"invalid cluster name {name!r}: use 1-32 of [a-z0-9-], starting/ending alphanumeric"
        )


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl run; unlike its base class, the message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


@dataclass(frozen=True)
class Cluster:
    """Handle of a cluster: its kubeconfig, a Python client, kubectl and the cached binaries."""

    kubeconfig: Path
    name: str | None = None

    def bin(self, name: str) -> Path:
        """Path of a cached binary (kubectl, helm, kwok, ...)."""
        return build.binary(name)

    def api_client(self) -> client.ApiClient:
        """A kubernetes ApiClient for this cluster; proxies from the environment are not used."""
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        configuration.proxy = None
        return client.ApiClient(configuration)

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; with ``check``, a failure raises KubectlError."""
        argv = [str(self.bin("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        env = clean_env({"KUBECONFIG": str(self.kubeconfig)})
        result = subprocess.run(argv, input=input, capture_output=True, text=True, env=env, timeout=timeout)
        if check and result.returncode:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result


def healthy(state: State) -> bool:
    """All components (those of the real node included) run and the apiserver is ready."""
    names = components.ORDER + (realnode.COMPONENTS if state.real_node else ())
    if not all(state.running(component) for component in names):
        return False
    return components.probe("kube-apiserver", state.layout()).ok()


def is_up(name: str) -> bool:
    """True if dev cluster ``name`` was started and is healthy."""
    state = State.load(name)
    return state is not None and healthy(state)


class StartedElsewhere(ValueError):
    """The cluster runs, but another checkout started it (and holds its kubeconfig and test state)."""

    def __init__(self, name: str, checkout: str) -> None:
        super().__init__(
            f"cluster {name!r} is up, started from another checkout ({checkout}), which may be using it;"
            f" stop it first (`python -m qwen_devtools.devcluster down --name {name}`) or use another name"
        )
        self.checkout = checkout


def up(name: str = "dev", real_node: bool = False) -> Cluster:
    """Start dev cluster ``name`` (building binaries if needed), or report it if it already runs.

    ``real_node`` adds this machine's real node (see realnode.py), where pods really run; before
    anything is touched it raises realnode.RealNodeBusy while another cluster holds it, and
    realnode.RealNodeError when this machine cannot run it; StartedElsewhere when it runs, started
    from another checkout of the project.
    """
    check_name(name)
    existing = State.load(name)
    if existing and healthy(existing):
        if existing.checkout and existing.checkout != str(REPO):
            raise StartedElsewhere(name, existing.checkout)
        if real_node and not existing.real_node:
            raise ValueError(
                f"cluster {name!r} is up without a real node; stop it first (down --name {name})"
            )
        log(f"cluster {name!r} is already up")
        return _report(existing)
    if real_node:
        realnode.preflight()
    lock_fd, previous = realnode.acquire(name) if real_node else (None, None)
    try:
        return _start_cluster(name, lock_fd, previous)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # the keeper holds the lock from here on (or nobody, after a failure)


def _start_cluster(name: str, lock_fd: int | None, previous: str | None) -> Cluster:
    if _leftovers(name):
        log(f"cluster {name!r} has stale state; removing it first")
        down(name)
    started = time.monotonic()
    with _step("binaries ready"):
        build.build()
        if lock_fd is not None:
            nodebuild.build()
    try:
        if lock_fd is not None:
            _prepare_real_node_network(name, previous)
        state = _prepare(name, real_node=lock_fd is not None)
        _start_components(state)
        _create_nodes(state)
        if lock_fd is not None:
            _start_real_node(state, lock_fd)
    except BaseException as error:
        _fail(name, error)
        raise
    log(f"cluster {name!r} is up in {time.monotonic() - started:.1f}s")
    return _report(state)


def _prepare_real_node_network(name: str, previous: str | None) -> None:
    """Clean what a killed run left, then create the bridge: the apiserver binds to its address."""
    with _step("real node's bridge and nft table ready"):
        realnode.clean_leftovers(State.load(previous) if previous and previous != name else None)
        network.create()


def _prepare(name: str, real_node: bool) -> State:
    """Create the state directory, PKI and kubeconfigs; choose ports."""
    with _step("PKI and kubeconfig generated"):
        directory = state_dir(name)
        directory.mkdir(parents=True, mode=0o700)
        names = components.PORT_NAMES + (nodecomponents.PORT_NAMES if real_node else ())
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        address = network.BRIDGE_ADDRESS if real_node else components.advertise_address()
        bind = network.BRIDGE_ADDRESS if real_node else "127.0.0.1"
        executables = {c: os.path.realpath(build.binary(c)) for c in components.ORDER}
        state = State(
            name, ports, address, executables, bind_address=bind, real_node=real_node, checkout=str(REPO)
        )
        state.save()
        node = nodecomponents.NODE_NAME if real_node else None
        keys = pki.generate(directory / "pki", [address], node=node)
        server = f"https://{bind}:{ports['kube-apiserver']}"
        ca_pem = (directory / "pki" / "ca.crt").read_bytes()
        for path in (directory / "kubeconfig", repo_kubeconfig(name)):
            kubeconfig.write(path, name, server, ca_pem, keys.admin_token)
        if real_node:  # the node's own identities (realnode.node_layout names the files)
            for user in ("kubelet", "kube-proxy"):
                cert, key = directory / "pki" / f"{user}.crt", directory / "pki" / f"{user}.key"
                kubeconfig.write_client_cert(
                    directory / f"{user}.kubeconfig", name, server, ca_pem, user, cert, key
                )
        repo_kubeconfig(name).with_name("audit.log").symlink_to(directory / "audit.log")
        (REPO / ".devcluster" / ".gitignore").write_text("*\n")
    return state


def _start(state: State, component: str) -> None:
    argv = components.argv(component, state.layout())
    state.pids[component] = procs.start(component, argv, state.dir / "logs")
    state.save()


def _wait(state: State, component: str) -> None:
    timeout = START_TIMEOUT.get(component, DEFAULT_START_TIMEOUT)
    probe = components.probe(component, state.layout())
    pid, executable = state.pids[component], state.executables[component]
    procs.wait_healthy(component, pid, executable, probe, state.log_file(component), timeout)


def _start_components(state: State) -> None:
    """etcd, then the apiserver, then the rest together; each waits for its health endpoint."""
    for group in (("etcd",), ("kube-apiserver",), components.ORDER[2:]):
        with _step(f"{', '.join(group)} healthy"):
            for component in group:
                _start(state, component)
            for component in group:
                _wait(state, component)


def _create_nodes(state: State) -> None:
    with _step("simulated nodes Ready"), Cluster(state.dir / "kubeconfig").api_client() as api_client:
        core = client.CoreV1Api(api_client)
        try:
            nodes.wait_ready(core, nodes.create_all(core, beside_real_node=state.real_node), NODES_TIMEOUT)
        except TimeoutError as error:
            raise procs.ComponentError("kwok", str(error), state.log_file("kwok")) from error


def _start_real_node(state: State, lock_fd: int) -> None:
    with _step("real node Ready"), Cluster(state.dir / "kubeconfig").api_client() as api_client:
        realnode.start(state, lock_fd, client.CoreV1Api(api_client))


def _fail(name: str, error: BaseException) -> None:
    """Show the failing component's log tail, then tear everything down."""
    log(f"FAILED: {error}")
    if isinstance(error, procs.ComponentError) and error.log:
        log(f"last {LOG_TAIL_LINES} lines of {error.log}:")
        print(tail(error.log, LOG_TAIL_LINES), flush=True)
    down(name)


def _report(state: State) -> Cluster:
    handle = Cluster(repo_kubeconfig(state.name), state.name)
    with handle.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        real = realnode.node_row(core) if state.real_node else None
        table = nodes.gpu_table(core, [real] if real else [])
    print(
        f"\nkubeconfig: {handle.kubeconfig}\nexport KUBECONFIG={handle.kubeconfig}\n\n{table}\n", flush=True
    )
    return handle


@contextlib.contextmanager
def _core_if_ready(state: State) -> Iterator[client.CoreV1Api | None]:
    """A client of the cluster while its apiserver answers, else None (a teardown goes on without it)."""
    if not (state.running("kube-apiserver") and components.probe("kube-apiserver", state.layout()).ok()):
        yield None
        return
    with Cluster(state.dir / "kubeconfig").api_client() as api_client:
        yield client.CoreV1Api(api_client)


def down(name: str = "dev", timeout: float = 10.0) -> None:
    """Stop the recorded processes of cluster ``name`` and remove its state; a no-op if nothing is there.

    A real node goes first (its pods and Node through the API), its bridge and lock last.
    """
    check_name(name)
    state = State.load(name)
    if state is None and not _leftovers(name):
        log(f"cluster {name!r} is not running")
        return
    with _step(f"cluster {name!r} is down"):
        if state and state.real_node:
            with _step("real node stopped"), _core_if_ready(state) as core:
                realnode.stop(state, core, timeout)
        if state:
            _stop_components(state, timeout)
        if state and state.real_node:
            realnode.release(state, timeout)
        for path in _leftovers(name):
            shutil.rmtree(path, ignore_errors=True)


def _leftovers(name: str) -> list[Path]:
    """Existing directories of cluster ``name``: its state directory and its kubeconfig directory."""
    return [path for path in (state_dir(name), repo_kubeconfig(name).parent) if path.exists()]


def _stop_components(state: State, timeout: float) -> None:
    """Stop in reverse start order, one at a time: the apiserver stops slowly once etcd is gone."""
    for component in reversed(components.ORDER):
        if component in state.pids:
            procs.stop(state.pids[component], state.executables[component], timeout)


def status(name: str = "dev") -> bool:
    """Print which components run and whether the apiserver is ready; True if the cluster is up."""
    check_name(name)
    state = State.load(name)
    if state is None:
        log(f"cluster {name!r} is not up (no {state_dir(name) / 'state.json'})")
        return False
    running = {component: state.running(component) for component in components.ORDER}
    for component, is_running in running.items():
        log(f"{component:<24} {'running' if is_running else 'STOPPED'} (pid {state.pids.get(component)})")
    url = f"{state.layout().api_server}/readyz"
    ready = components.probe("kube-apiserver", state.layout()).ok()
    log(f"apiserver {url}: {'ok' if ready else 'NOT READY'}")
    up = ready and all(running.values())
    if state.real_node:
        with _core_if_ready(state) as core:
            up = realnode.status(state, core) and up
    return up


def add_cluster_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], texts: dict[str, str]
) -> dict[str, argparse.ArgumentParser]:
    """Subcommands that act on one dev cluster, each with `--name` (default `dev`), by name, for the
    caller's own options."""
    parsers = {}
    for command, text in texts.items():
        parsers[command] = commands.add_parser(command, help=text)
        parsers[command].add_argument("--name", default="dev", help="dev cluster name (default: dev)")
    return parsers


def running_cluster(name: str, who: str) -> Cluster | None:
    """The dev cluster `name` when it is up; None after saying on stderr that it is not (`who`: the
    calling tool's log tag)."""
    if not is_up(name):
        print(f"[{who}] dev cluster {name!r} is not up", file=sys.stderr)
        return None
    return Cluster(repo_kubeconfig(name), name)
