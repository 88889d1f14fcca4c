"""What each image built here is made of (Dockerfile, the files its COPY lines read, base, pinned
versions, wheels, the vLLM venv) and the content key: a hash of all of it, which names its archive.

An image is rebuilt exactly when its key changes: editing a Dockerfile or a copied file, a pin, the
base recipe or the vLLM venv's installed distributions does; a file's mtime or a __pycache__ does not.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qwen_operator import versions

from ..keda import metrics_apiserver_bin, operator_bin, webhooks_bin
from ..realparts.exporters import nginx_exporter_bin, nginxlog_exporter_bin
from ..repo import REPO
from ..vllm_env import vllm_venv
from . import podman

#: Inside build steps, where the downloaded wheels are mounted: a directory every Debian base has, so
#: that the mount leaves no empty mount point behind in the image (and not the operator's /wheels).
WHEELS_MOUNT = "/mnt"
#: The operator's Dockerfile builds its wheel with pip, whose build isolation then needs the build
#: backend (pyproject.toml: setuptools>=69) among the offline wheels.
OPERATOR_BUILD_BACKEND = "setuptools==84.2.1"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its name on the command line, the reference it is tagged with and how it is built."""

    name: str
    ref: str
    dockerfile: Path  # relative to the repository
    #: The Dockerfile's build argument naming its base image (set to the base made here); None for
    #: images FROM scratch.
    base_arg: str | None
    #: Pinned versions the image carries (part of the key).
    pins: dict[str, str]
    #: Requirements file (relative) whose wheels are downloaded on the host and installed offline.
    requirements: Path | None = None
    extra_wheels: tuple[str, ...] = ()
    #: Named build contexts (`COPY --from=NAME`): the vLLM venv for the engine.
    needs_vllm_venv: bool = False
    #: Keep the image in podman's store after saving (the engine's 6 GB are dropped: the archive stays).
    keep_in_store: bool = True
    build_args: dict[str, str] = field(default_factory=dict)
    #: A program built here whose directory is the named build context `program` (the exporters).
    program: Callable[[], Path] | None = None


def _monitoring(function: str) -> Callable[[], Path]:
    """A program of the monitoring stack, looked up when built (monitoringstack imports this package)."""

    def program() -> Path:
        from .. import monitoringstack

        return Path(getattr(monitoringstack, function)())

    return program


def _go_program_image(
    name: str, ref: str, module: str, version: str, program: Callable[[], Path]
) -> ImageSpec:
    """An image FROM scratch holding one Go program built here (images/<name>/Dockerfile)."""
    return ImageSpec(
        name=name,
        ref=ref,
        dockerfile=Path(f"images/{name}/Dockerfile"),
        base_arg=None,
        pins={"MODULE": module, "VERSION": version},
        program=program,
    )


SPECS: dict[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec(
            name="operator",
            ref=versions.OPERATOR_IMAGE,
            dockerfile=Path("images/operator/Dockerfile"),
            base_arg="PYTHON_IMAGE",
            pins={},
            requirements=Path("images/operator/requirements.txt"),
            extra_wheels=(OPERATOR_BUILD_BACKEND,),
        ),
        ImageSpec(
            name="gateway",
            ref=versions.GATEWAY_IMAGE,
            dockerfile=Path("images/gateway/Dockerfile"),
            base_arg="PYTHON_IMAGE",
            pins={"NGINX": versions.NGINX, "VLLM_ROUTER": versions.VLLM_ROUTER},
            requirements=Path("images/gateway/requirements.txt"),
        ),
        ImageSpec(
            name="engine-cpu",
            ref=versions.ENGINE_CPU_IMAGE,
            dockerfile=Path("images/engine-cpu/Dockerfile"),
            base_arg="BASE_IMAGE",
            pins={"VLLM": versions.VLLM, "TORCH": versions.TORCH},
            needs_vllm_venv=True,
            keep_in_store=False,
            build_args={"VLLM_VERSION": versions.VLLM},
        ),
        _go_program_image(
            "nginxlog-exporter",
            versions.LOG_EXPORTER_IMAGE,
            versions.NGINXLOG_EXPORTER_MODULE,
            versions.NGINXLOG_EXPORTER,
            nginxlog_exporter_bin,
        ),
        _go_program_image(
            "nginx-exporter",
            versions.NGINX_EXPORTER_IMAGE,
            versions.NGINX_EXPORTER_MODULE,
            versions.NGINX_EXPORTER,
            nginx_exporter_bin,
        ),
        # The dev cluster's monitoring stack (qwen_devtools.monitoringstack).
        _go_program_image(
            "prometheus-server",
            versions.PROMETHEUS_IMAGE,
            versions.PROMETHEUS_MODULE,
            versions.PROMETHEUS_MODULE_VERSION,
            _monitoring("prometheus_bin"),
        ),
        _go_program_image(
            "prometheus-operator",
            versions.PROMETHEUS_OPERATOR_IMAGE,
            versions.PROMETHEUS_OPERATOR_MODULE,
            versions.PROMETHEUS_OPERATOR,
            _monitoring("prometheus_operator_bin"),
        ),
        _go_program_image(
            "prometheus-config-reloader",
            versions.PROMETHEUS_CONFIG_RELOADER_IMAGE,
            versions.PROMETHEUS_OPERATOR_MODULE,
            versions.PROMETHEUS_OPERATOR,
            _monitoring("config_reloader_bin"),
        ),
        _go_program_image(
            "prometheus-adapter",
            versions.PROMETHEUS_ADAPTER_IMAGE,
            versions.PROMETHEUS_ADAPTER_MODULE,
            versions.PROMETHEUS_ADAPTER,
            _monitoring("adapter_bin"),
        ),
        # KEDA, the scaler that wakes engines from zero (qwen_devtools.keda).
        _go_program_image("keda", versions.KEDA_IMAGE, versions.KEDA_MODULE, versions.KEDA, operator_bin),
        _go_program_image(
            "keda-metrics-apiserver",
            versions.KEDA_METRICS_APISERVER_IMAGE,
            versions.KEDA_MODULE,
            versions.KEDA,
            metrics_apiserver_bin,
        ),
        _go_program_image(
            "keda-admission-webhooks",
            versions.KEDA_WEBHOOKS_IMAGE,
            versions.KEDA_MODULE,
            versions.KEDA,
            webhooks_bin,
        ),
    )
}
NAMES = tuple(SPECS)
#: The images of a served QwenDeployment (what `make demo` and the real-node tests load); the others are
#: the monitoring stack's and KEDA's, built when first used (qwen_devtools.monitoringstack, .keda).
SERVING = ("operator", "gateway", "engine-cpu", "nginxlog-exporter", "nginx-exporter")


def dockerfile_lines(text: str) -> Iterator[str]:
    """The Dockerfile's instructions, continuation lines joined, comments and blank lines dropped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued RUN
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def arg_defaults(text: str) -> dict[str, str | None]:
    """Every `ARG NAME[=default]` of a Dockerfile: name -> default (None when it has none)."""
    defaults: dict[str, str | None] = {}
    for line in dockerfile_lines(text):
        if line.upper().startswith("ARG "):
            for item in shlex.split(line[4:]):
                name, eq, value = item.partition("=")
                defaults.setdefault(name, value if eq else None)
    return defaults


def copy_sources(text: str) -> list[str]:
    """The build-context paths COPY/ADD lines read (not `--from=` stages or contexts)."""
    sources: list[str] = []
    for line in dockerfile_lines(text):
        word = line.split(maxsplit=1)[0].upper()
        if word not in {"COPY", "ADD"}:
            continue
        args = shlex.split(line)[1:]
        if any(a.startswith("--from=") for a in args):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources.extend(paths[:-1])
    return sources


def context_files(root: Path, sources: list[str]) -> list[Path]:
    """The files those sources name under ``root`` (directories walked; caches left out), sorted."""
    files: set[Path] = set()
    for source in sources:
        for match in root.glob(source.rstrip("/")) if any(c in source for c in "*?[") else [root / source]:
            if match.is_dir():
                files.update(p for p in match.rglob("*") if p.is_file() and not _is_cache(p))
            elif match.is_file():
                files.add(match)
            else:
                raise FileNotFoundError(f"COPY source {source} is not in {root}")
    return sorted(files)


def _is_cache(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix in {".pyc", ".pyo"}


def vllm_venv_identity(venv: Path | None = None) -> list[str]:
    """The vLLM venv as an image sees it: the distributions installed in its site-packages (name and
    version), read from the dist-info directory names; [] when the venv is not made."""
    site = (venv or vllm_venv()) / "lib" / "python3.11" / "site-packages"
    if not site.is_dir():
        return []
    return sorted(p.name for p in site.iterdir() if p.name.endswith(".dist-info"))


def content_key(
    spec: ImageSpec, base_key: str, root: Path = REPO, venv_identity: list[str] | None = None
) -> str:
    """The hash of everything ``spec`` is built from (16 hex digits), the files read under ``root``."""
    dockerfile = (root / spec.dockerfile).read_text()
    digest = hashlib.sha256()
    inputs = {
        "name": spec.name,
        "ref": spec.ref,
        "base": base_key,
        "pins": spec.pins,
        "extra_wheels": spec.extra_wheels,
        "build_args": spec.build_args,
        "podman": [*podman.BUILD_OPTIONS, *podman.runtime_options()],
        "dockerfile": hashlib.sha256(dockerfile.encode()).hexdigest(),
        "venv": (venv_identity if venv_identity is not None else vllm_venv_identity())
        if spec.needs_vllm_venv
        else None,
    }
    if spec.requirements:
        inputs["wheels_mount"] = WHEELS_MOUNT
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    sources = copy_sources(dockerfile)
    if spec.requirements and str(spec.requirements) not in sources:
        sources.append(str(spec.requirements))
    for path in context_files(root, sources):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file (comments and blanks dropped)."""
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
