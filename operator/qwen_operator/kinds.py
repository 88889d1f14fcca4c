"""The kinds of object the operator manages, each once: API version, plural, the CRD an optional kind
needs, and the status condition that reports it when that CRD is missing.

The API client (k8s), the builders (skipped children), the status (which condition owns what), the
chart's RBAC rules (`python -m qwen_devtools.generate`) and the tests all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Conditions that report optional children whose CRD is not installed.
MONITORING = "MonitoringReady"
SCALING = "ScalingReady"
EXPOSURE = "ExposureReady"


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    #: CRD that must exist for an optional kind (None: built into Kubernetes).
    crd: str | None = None
    #: Condition reporting this kind when it is skipped (optional kinds only).
    condition: str | None = None

    @property
    def group(self) -> str:
        """API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


def _optional(api_version: str, kind: str, plural: str, condition: str) -> Kind:
    group = api_version.rpartition("/")[0]
    return Kind(api_version, kind, plural, f"{plural}.{group}", condition)


#: Every child kind, in no particular order (builders decide the apply order).
MANAGED: tuple[Kind, ...] = (
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("networking.k8s.io/v1", "Ingress", "ingresses"),
    _optional("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", EXPOSURE),
    _optional("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", MONITORING),
    _optional("monitoring.coreos.com/v1", "PodMonitor", "podmonitors", MONITORING),
    _optional("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", MONITORING),
    _optional("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", SCALING),
)

_BY_KEY = {(k.api_version, k.kind): k for k in MANAGED}

#: Kinds the operator reads but never writes (observation): engine pods and the GPU nodes.
POD = Kind("v1", "Pod", "pods")
NODE = Kind("v1", "Node", "nodes")
#: Created once, never applied, listed or read: the gateway's generated API-key Secret.
SECRET = Kind("v1", "Secret", "secrets")


def kind_of(api_version: str, kind: str) -> Kind:
    """The managed kind of an object's apiVersion and kind; KeyError for anything else."""
    return _BY_KEY[(api_version, kind)]


def optional() -> tuple[Kind, ...]:
    """Kinds that need a CRD of their own."""
    return tuple(k for k in MANAGED if k.crd)


@dataclass(frozen=True)
class Skipped:
    """A child the spec asks for that was not applied because its kind's CRD is not installed."""

    kind: Kind
    name: str

    @property
    def condition(self) -> str:
        """The status condition that reports it."""
        assert self.kind.condition, f"{self.kind.kind} is not an optional kind"
        return self.kind.condition

    def describe(self) -> str:
        return f"{self.kind.kind} {self.name} ({self.kind.crd} not installed)"
