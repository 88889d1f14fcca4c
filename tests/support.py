"""Helpers of the API tests: paths, example and bad resources, running the `qwen-operator` CLI (in this
process, or as the installed console script)."""

from __future__ import annotations

import contextlib
import copy
import io
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BAD_CRS = sorted((REPO / "tests" / "bad-crs").glob("*.yaml"))
GOLDEN = REPO / "tests" / "golden"
CRD_FILE = REPO / "crds" / "inference.qwenops.dev_qwendeployments.yaml"


def cli_path() -> Path:
    """The installed console script of the Python running the tests (the project venv's)."""
    here = Path(sys.executable).parent / "qwen-operator"
    return here if here.exists() else REPO / ".venv" / "bin" / "qwen-operator"


def run_cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `qwen-operator ARGS` as a user would, a fresh process of the console script (seconds: it
    imports pydantic and the catalogs); never raises on a non-zero exit. For the entry point itself;
    everything else, cli_in_process."""
    return subprocess.run(
        [str(cli_path()), *args], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


#: Commands that serve until stopped and configure logging for the process: subprocesses only.
_SERVERS = {"run", "lora-sync", "activator"}


def cli_in_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`qwen_operator.cli.main(ARGS)` in this process, with stdin, stdout and stderr of its own; the same
    result as run_cli (an argparse exit becomes its status). Not thread-safe (it swaps sys.std*); paths
    are taken from the test's working directory, so pass absolute ones."""
    from qwen_operator import cli

    assert not _SERVERS & set(args[:1]), f"{args[0]} serves until stopped: use run_cli"
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(["qwen-operator", *args], code, out.getvalue(), err.getvalue())


def load(path: Path) -> dict[str, Any]:
    """The first document of a YAML file."""
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def example(name: str) -> dict[str, Any]:
    """A fresh copy of examples/<name>.yaml, safe to mutate."""
    return copy.deepcopy(load(REPO / "examples" / f"{name}.yaml"))


@dataclass(frozen=True)
class BadCr:
    """One file of the bad-resource corpus and what must be said about it."""

    path: Path
    field: str  # field path the CLI must name
    message: str  # substring of the CLI's message
    server: tuple[str, str] | None  # (field path, message substring) the API server must answer, if any

    @property
    def id(self) -> str:
        return self.path.stem


_EXPECT = re.compile(r"^# expect: (?P<field>\S+): (?P<message>.+)$")
_SERVER = re.compile(r"^# server: rejects: (?P<field>\S+): (?P<message>.+)$")


def bad_cr(path: Path) -> BadCr:
    """Read the leading `# expect: FIELD: MESSAGE` (and optional `# server: rejects: FIELD: MESSAGE`)."""
    lines = path.read_text().splitlines()
    expect = _EXPECT.match(lines[0])
    assert expect, f"{path.name}: the first line must be '# expect: <field path>: <message substring>'"
    server = next((m for m in map(_SERVER.match, lines[1:4]) if m), None)
    return BadCr(
        path=path,
        field=expect["field"],
        message=expect["message"].strip(),
        server=(server["field"], server["message"].strip()) if server else None,
    )


#: spec.autoscaling of a deployment that scales to zero (KEDA, a Prometheus of the cluster).
KEDA_AT_ZERO = {
    "minReplicas": 0,
    "maxReplicas": 2,
    "driver": "keda",
    "prometheusAddress": "http://prometheus.monitoring:9090",
}
