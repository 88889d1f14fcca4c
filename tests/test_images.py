"""The operator image definition: pinned base, non-root, the dependency versions the tests ran with."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from qwen_devtools.generate.image_requirements import runtime_closure
from qwen_operator.api.catalog import DEFAULT_ENGINE_IMAGE

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
DOCKERFILE = IMAGES / "operator" / "Dockerfile"
REQUIREMENTS = IMAGES / "operator" / "requirements.txt"


def _stages(text: str) -> list[list[str]]:
    stages: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_base_image_is_pinned_by_digest() -> None:
    text = DOCKERFILE.read_text()
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert default, "PYTHON_IMAGE default missing"
    assert re.fullmatch(r"python:3\.11\.\d+-slim@sha256:[0-9a-f]{64}", default.group(1))
    assert all(
        line.startswith("FROM ${PYTHON_IMAGE}") for line in re.findall(r"^FROM .*$", text, re.MULTILINE)
    )


def test_runtime_stage_is_non_root_and_runs_the_operator() -> None:
    stages = _stages(DOCKERFILE.read_text())
    assert len(stages) == 2, "build and runtime stages"
    runtime = "\n".join(stages[-1])
    assert "USER 65532:65532" in runtime
    assert 'ENTRYPOINT ["qwen-operator"]' in runtime
    assert "RUN " not in runtime, "the runtime stage only copies the built venv"


def test_chart_runs_the_image_as_the_same_user() -> None:
    values = yaml.safe_load((REPO / "charts" / "qwen-operator" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 65532
    assert values["image"]["repository"] in DOCKERFILE.read_text()


def test_requirements_pin_the_versions_the_tests_use() -> None:
    pinned = dict(
        line.split("==")
        for line in REQUIREMENTS.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pinned == runtime_closure(), (
        "images/operator/requirements.txt differs from the test venv: run `make generate`"
    )


def test_engine_image_default_is_documented() -> None:
    assert DEFAULT_ENGINE_IMAGE in (IMAGES / "README.md").read_text()
