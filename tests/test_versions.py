"""Every pinned version stated in a file that cannot import qwen_operator.versions agrees with it.

Python code imports the versions module. pyproject.toml, the Makefile, Dockerfiles, requirements files,
the chart, the docs, shell scripts and go.mod state versions as text, so this test reads them: every
mention of a pinned component's version must be the pin (prose may shorten `0.32.0` to `0.32`), and
the files that must state a pin still do, so a reworded line cannot slip past the scan unnoticed.
Generated files (images/README.md, the requirements files) are scanned too; CHANGES.md is history.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwen_operator import versions

REPO = Path(__file__).resolve().parents[1]
#: Where files stating versions live; tests/ is left out (its Python imports the module, its data is
#: made from what the builders render).
ROOTS = (
    "README.md",
    "pyproject.toml",
    "Makefile",
    "docs",
    "images",
    "charts",
    "tools",
    "gitops",
    "e2e",
    "bench",
)
DEVTOOLS = REPO / "operator" / "qwen_devtools"
SUFFIXES = {".md", ".yaml", ".yml", ".txt", ".toml", ".sh", ".tpl"}
NAMES = {"Dockerfile", "Makefile", "go.mod"}
SKIP_DIRS = {".git", ".venv", ".devcluster", "__pycache__", "node_modules"}
#: Files that name other versions on purpose: the planner's calibration against start-up logs of older
#: vLLM releases, the raw outputs of measurements made with the GPU machine's own PyTorch, and the
#: GPU runs' README and results, which name that machine's PyTorch beside the one carried to it.
OTHER_VERSIONS_ON_PURPOSE = {
    "docs/capacity-planning.md",
    "tools/measure/gpu/README.md",
    *(str(p.relative_to(REPO)) for p in (REPO / "tools" / "measure" / "gpu" / "results").rglob("*")),
    *(str(p.relative_to(REPO)) for p in (REPO / "tools" / "measure").glob("*.out.txt")),
}


def _tag(image: str) -> str:
    return image.rpartition(":")[2]


@dataclass(frozen=True)
class Mention:
    """One way a file names a pinned version: a pattern whose one group is the version as written."""

    what: str
    pattern: str
    pin: str
    #: A line stating the version, `{}` where it goes: the pattern must find it there.
    example: str
    #: Prose may name the release series only (`vLLM 0.32` for 0.32.0, `Kubernetes 1.36` for v1.36.3).
    shortened: bool = False

    def agrees(self, written: str) -> bool:
        pin, written = self.pin.removeprefix("v"), written.removeprefix("v")
        return written == pin or (self.shortened and pin.startswith(written + "."))


MENTIONS = (
    Mention(
        "engine image tag",
        r"vllm/vllm-openai:(v?\d[\w.]*)",
        _tag(versions.ENGINE_IMAGE),
        "vllm/vllm-openai:{}",
    ),
    Mention("vLLM", r"\bvLLM v?(\d+\.\d+(?:\.\d+)?)\b", versions.VLLM, "the real vLLM {} parser", True),
    Mention("vllm requirement", r"\bvllm(?:-cpu)?==(\d[\w.]*)", versions.VLLM, 'engine = ["vllm=={}"]'),
    Mention(
        "Make variable VLLM_VERSION", r"^VLLM_VERSION\s*:?=\s*(\S+)", versions.VLLM, "VLLM_VERSION := {}"
    ),
    Mention(
        "vllm-router",
        r"\bvllm-router(?: v?|==)(\d+\.\d+\.\d+)",
        versions.VLLM_ROUTER,
        "vllm-router {} from PyPI",
    ),
    Mention(
        "Make variable ROUTER_VERSION",
        r"^ROUTER_VERSION\s*:?=\s*(\S+)",
        versions.VLLM_ROUTER,
        "ROUTER_VERSION := {}",
    ),
    Mention(
        "gateway image tag", r"qwen-gateway:(\d[\w.+-]*\w)", _tag(versions.GATEWAY_IMAGE), "`qwen-gateway:{}`"
    ),
    Mention("nginx", r"\bnginx v?(\d+\.\d+\.\d+)\b", versions.NGINX, "Debian bookworm's nginx {} and"),
    Mention(
        "nginx Debian package",
        r"\bNGINX_VERSION=(\d+\.\d+\.\d+)-",
        versions.NGINX,
        "ARG NGINX_VERSION={}-9+deb12u*",
    ),
    Mention(
        "nginxlog exporter image tag",
        r"prometheus-nginxlog-exporter:(v?\d[\w.]*\w)",
        _tag(versions.LOG_EXPORTER_IMAGE),
        "`quay.io/martinhelmich/prometheus-nginxlog-exporter:{}` and",
    ),
    Mention(
        "nginx exporter image tag",
        r"nginx/nginx-prometheus-exporter:(v?\d[\w.]*\w)",
        _tag(versions.NGINX_EXPORTER_IMAGE),
        "`docker.io/nginx/nginx-prometheus-exporter:{}`:",
    ),
    # "Kubernetes 1.29 or newer" states the oldest supported version, not the pin
    Mention(
        "Kubernetes",
        r"\b(?:Kubernetes|kube-apiserver|tested against) v?(\d+\.\d+(?:\.\d+)?)\b(?! or newer)",
        versions.KUBERNETES,
        "(a real kube-apiserver {}) in a",
        True,
    ),
    Mention(
        "Kubernetes Go module",
        r"\bk8s\.io/kubernetes (v\d[\w.]*)",
        versions.KUBERNETES,
        "\tk8s.io/kubernetes {}",
    ),
    Mention("kwok", r"\bkwok (v\d+\.\d+\.\d+)\b", versions.KWOK, "copied unchanged from kwok {} (Apache-2.0"),
    Mention("helm", r"\bhelm (v\d+\.\d+\.\d+)\b", versions.HELM, "built with helm {}"),
    Mention("torch", r"\btorch(?: |==)(\d+\.\d+\.\d+)", versions.TORCH, "installing torch {} and"),
    Mention("containerd", r"\bcontainerd (v?\d+\.\d+\.\d+)\b", versions.CONTAINERD, "containerd {} from"),
    Mention("CoreDNS", r"\bCoreDNS (v?\d+\.\d+\.\d+)\b", versions.COREDNS, "CoreDNS {} from"),
    Mention(
        "prometheus-operator",
        r"\b(?:prometheus-operator|prometheus-config-reloader)[/:@ ]+(?:[a-z/.-]*:)?(v\d+\.\d+\.\d+)\b",
        versions.PROMETHEUS_OPERATOR,
        "prometheus-operator {} from",
    ),
    Mention(
        "controller-tools",
        r"\bcontroller-(?:tools|gen)`?,? (v\d+\.\d+\.\d+)\b",
        versions.CONTROLLER_TOOLS,
        "controller-gen {} from",
    ),
    Mention("KEDA module", r"\bkedacore/keda/v2`? (v\d+\.\d+\.\d+)\b", versions.KEDA, "kedacore/keda/v2 {} "),
    Mention("Prometheus", r"\bPrometheus (\d+\.\d+\.\d+)\b", versions.PROMETHEUS, "running Prometheus {} ("),
    Mention(
        "prometheus-adapter",
        r"\bprometheus-adapter[: ]+(v\d+\.\d+\.\d+)\b",
        versions.PROMETHEUS_ADAPTER,
        "prometheus-adapter {} from",
    ),
    Mention(
        "llm-d-inference-sim",
        r"\bllm-d-inference-sim\b(?:\]\([^)]*\))? (v\d+\.\d+\.\d+)\b",
        versions.INFERENCE_SIM,
        "llm-d-inference-sim {} replicas",
    ),
    Mention("LiteLLM", r"\b(?:LiteLLM|litellm)(?: |==)(\d+\.\d+\.\d+)\b", versions.LITELLM, "LiteLLM {} in"),
)

#: Files (globs) that must state these pins exactly, each matched by at least one file.
REQUIRED: dict[str, tuple[str, ...]] = {
    "pyproject.toml": (f'engine = ["vllm=={versions.VLLM}"]',),
    "images/gateway/Dockerfile": (
        f"ARG NGINX_VERSION={versions.NGINX}-",
        f"-t {versions.GATEWAY_IMAGE} .",
        f"nginx {versions.NGINX} and vllm-router {versions.VLLM_ROUTER}",
    ),
    "images/gateway/requirements.txt": (f"\nvllm-router=={versions.VLLM_ROUTER}\n",),
    "images/README.md": (versions.ENGINE_IMAGE, versions.GATEWAY_IMAGE),
    "docs/install.md": (versions.ENGINE_IMAGE,),
    "docs/gateway.md": (versions.GATEWAY_IMAGE, versions.LOG_EXPORTER_IMAGE, versions.NGINX_EXPORTER_IMAGE),
    "**/devcluster/gobuild/go.mod": (f"k8s.io/kubernetes {versions.KUBERNETES}\n",),
    "**/devcluster/gobuild/coredns/go.mod": (f"require github.com/coredns/coredns {versions.COREDNS}\n",),
}


def _scanned() -> list[Path]:
    found: list[Path] = []
    for root in [*(REPO / name for name in ROOTS), DEVTOOLS]:
        if root.is_file():
            found.append(root)
            continue
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS)
            found += [
                Path(directory) / name
                for name in sorted(names)
                if (Path(name).suffix in SUFFIXES or name in NAMES)
                and str((Path(directory) / name).relative_to(REPO)) not in OTHER_VERSIONS_ON_PURPOSE
            ]
    return found


SCANNED = _scanned()


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _stale(mention: Mention, text: str) -> list[str]:
    return [
        f"{_line(text, match.start())}: {mention.what} {match.group(1)!r}, "
        f"but qwen_operator/versions.py pins {mention.pin!r}"
        for match in re.finditer(mention.pattern, text, flags=re.MULTILINE)
        if not mention.agrees(match.group(1))
    ]


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_version_a_file_states_is_the_pinned_one(path: Path) -> None:
    text = path.read_text(errors="replace")
    stale = [f"{path.relative_to(REPO)}:{found}" for mention in MENTIONS for found in _stale(mention, text)]
    assert not stale, "stale versions (update the file, or versions.py):\n" + "\n".join(stale)


@pytest.mark.parametrize("pattern", REQUIRED)
def test_files_that_must_state_a_pin_do(pattern: str) -> None:
    paths = sorted(p for p in REPO.glob(pattern) if not SKIP_DIRS & set(p.relative_to(REPO).parts))
    assert paths, f"no file matches {pattern}"
    for path in paths:
        text = path.read_text()
        for needed in REQUIRED[pattern]:
            assert needed in text, f"{path.relative_to(REPO)} no longer states {needed.strip()!r}"


@pytest.mark.parametrize("mention", MENTIONS, ids=lambda m: m.what)
def test_each_pattern_finds_the_pin_and_reports_another_version(mention: Mention) -> None:
    """The scan itself: a pattern that found nothing would check nothing."""
    written = ".".join(mention.pin.removeprefix("v").split(".")[:2]) if mention.shortened else mention.pin
    assert re.search(mention.pattern, mention.example.format(written), flags=re.MULTILINE), mention.pattern
    assert _stale(mention, mention.example.format(written)) == []
    other = "v9.9.9" if mention.pin.startswith("v") else "9.9.9"
    (report,) = _stale(mention, mention.example.format(other))
    assert report.startswith(f"1: {mention.what} ") and "9.9.9" in report and repr(mention.pin) in report


def test_a_minimum_version_is_not_a_pin() -> None:
    (kubernetes,) = [m for m in MENTIONS if m.what == "Kubernetes"]
    text = f"Requirements: Kubernetes 1.29 or newer (tested against {versions.kubernetes_minor()})"
    assert _stale(kubernetes, text) == []
