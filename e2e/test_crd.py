"""The generated CRD on a real API server: accepted, examples pass, the schema/CEL-catchable bad CRs fail.

The offline half (the CLI refusing all of tests/bad-crs/) is tests/test_cli.py; here each corpus file
with a `# server: rejects: <field>: <message>` line must be refused by the API server (server-side dry
run), with a message naming that field, and every other corpus file must be accepted by it: those are
the mistakes only the operator's planner catches (it then reports them in the status).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_operator.api.crd import crd
from support import BAD_CRS, CRD_FILE, EXAMPLES, bad_cr  # tests/ is on the path (pyproject)

pytestmark = pytest.mark.cluster

CRD_NAME = "qwendeployments.inference.qwenops.dev"
FIELD_MANAGER = "qwen-e2e-crd"


@pytest.fixture(scope="module")
def installed(cluster: Any) -> Any:
    """The checked-in CRD, applied server-side and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                    "-f", str(CRD_FILE))  # fmt: skip
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    return cluster


@pytest.fixture(scope="module")
def llm_namespace(installed: Any) -> Iterator[str]:
    """The examples' namespace `llm` (created for the dry runs if missing, then removed again)."""
    exists = installed.kubectl("get", "namespace", "llm", check=False).returncode == 0
    if not exists:
        installed.kubectl("create", "namespace", "llm")
    yield "llm"
    if not exists:
        installed.kubectl("delete", "namespace", "llm", "--wait=false", check=False)


def test_crd_is_accepted_unchanged(installed: Any) -> None:
    stored = json.loads(installed.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert conditions.get("NonStructuralSchema", "False") == "False"
    ours = crd()["spec"]
    # the server kept every part of the schema, the CEL rules included (nothing was pruned or rejected)
    assert stored["spec"]["versions"][0]["schema"] == ours["versions"][0]["schema"]
    assert stored["spec"]["names"]["shortNames"] == ["qwd"]
    assert stored["spec"]["versions"][0]["subresources"] == ours["versions"][0]["subresources"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_accepted(installed: Any, llm_namespace: str, path: Path) -> None:
    assert yaml.safe_load(path.read_text())["metadata"]["namespace"] == llm_namespace
    result = installed.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr
    assert "created (server dry run)" in result.stdout


def _dry_run(cluster: Any, path: Path) -> Any:
    return cluster.kubectl("apply", "--dry-run=server", "--namespace=default", "-f", str(path), check=False)


SERVER_CATCHES = [p for p in BAD_CRS if bad_cr(p).server]
ONLY_THE_OPERATOR_CATCHES = [p for p in BAD_CRS if not bad_cr(p).server]


def test_corpus_split() -> None:
    # unknown fields, required fields, types, enums, bounds, list item types, the name's length and
    # form, pinned images, env entries and the cross-field CEL rules
    assert len(SERVER_CATCHES) >= 30
    assert ONLY_THE_OPERATOR_CATCHES


@pytest.mark.parametrize("path", SERVER_CATCHES, ids=lambda p: p.stem)
def test_server_refuses(installed: Any, path: Path) -> None:
    case = bad_cr(path)
    assert case.server
    field, message = case.server
    result = _dry_run(installed, path)
    assert result.returncode != 0, f"the API server accepted {path.name}"
    # e.g. `spec.replicas: Invalid value: "object": set either replicas or autoscaling, not both` or
    # `strict decoding error: unknown field "spec.engine.speculative.foo"`
    named = re.search(rf'(^|[\s"]){re.escape(field)}([:"]|$)', result.stderr, re.MULTILINE)
    assert named, f"the server's message does not name {field}:\n{result.stderr}"
    assert message in result.stderr, f"want {message!r} in:\n{result.stderr}"


@pytest.mark.parametrize("path", ONLY_THE_OPERATOR_CATCHES, ids=lambda p: p.stem)
def test_server_accepts_what_only_the_planner_catches(installed: Any, path: Path) -> None:
    result = _dry_run(installed, path)
    assert result.returncode == 0, (
        f"the API server refuses {path.name} too: add a '# server: rejects: ...' line\n{result.stderr}"
    )
