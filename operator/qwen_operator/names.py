"""Names and labels of every child object, in one place."""

from __future__ import annotations

from .api.spec import GatewayTier, QwenDeployment, SecretKeyRef

LABEL_PREFIX = "qwenops.dev"
FIELD_MANAGER = "qwen-operator"
MANAGED_BY = "qwen-operator"
#: The label selector of every object the operator manages (what its informers list and watch).
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
#: The field manager that holds an engine Deployment's spec.replicas for the moment the operator stops
#: sending it (autoscaling turned on), so that the field passes to the HPA at its value instead of being
#: removed and defaulted to 1: "transferring ownership" in the server-side apply documentation.
HANDOVER_FIELD_MANAGER = "qwen-operator-handover-to-autoscaler"
#: Annotation of the engine Deployment: "autoscaler" while the HPA (or KEDA's) owns spec.replicas.
REPLICAS_OWNER_ANNOTATION = f"{LABEL_PREFIX}/replicas-owner"


def engine(qd: QwenDeployment) -> str:
    return engine_of(qd.metadata.name)


def engine_of(name: str) -> str:
    """The engine Deployment of the QwenDeployment `name` (also when its spec does not parse)."""
    return f"{name}-engine"


def gateway(qd: QwenDeployment) -> str:
    return gateway_of(qd.metadata.name)


def gateway_of(name: str) -> str:
    return f"{name}-gateway"


def generated_api_keys(qd: QwenDeployment) -> str:
    """The API-key Secret the operator creates when auth is on and spec.gateway.apiKeysSecret is unset."""
    return f"{qd.metadata.name}-gateway-api-keys"


def api_keys_secret(qd: QwenDeployment) -> str | None:
    """The Secret whose keys the gateway accepts; None when the spec turns auth off."""
    g = qd.spec.gateway
    if g.auth == "none":
        return None
    return g.api_keys_secret or generated_api_keys(qd)


#: The key of a generated engine-key Secret.
GENERATED_ENGINE_KEY = "token"


def generated_engine_key(qd: QwenDeployment) -> str:
    """The engine-key Secret the operator creates (gateway on, spec.engine.apiKeySecret unset)."""
    return generated_engine_key_of(qd.metadata.name)


def generated_engine_key_of(name: str) -> str:
    return f"{name}-engine-key"


def engine_key(qd: QwenDeployment) -> SecretKeyRef | None:
    """The key the engines require and the gateway sends: spec.engine.apiKeySecret, else (gateway on) a
    generated one that only the gateway holds; None when the gateway is off and the spec names none
    (clients then call the engines directly, so a key only the operator knows would lock them out)."""
    if qd.spec.engine.api_key_secret:
        return qd.spec.engine.api_key_secret
    if not qd.spec.gateway.enabled:
        return None
    return SecretKeyRef(name=generated_engine_key(qd), key=GENERATED_ENGINE_KEY)


def tier_engine_key(tier: GatewayTier) -> SecretKeyRef:
    """The key a tier's engines require (spec.gateway.tiers[].engineKeySecret, else the tier deployment's
    generated one); a tier whose engines require none has no such Secret."""
    return tier.engine_key_secret or SecretKeyRef(
        name=generated_engine_key_of(tier.deployment_ref.name), key=GENERATED_ENGINE_KEY
    )


def lora(qd: QwenDeployment) -> str:
    """The ConfigMap of the adapters the engines' lora-sync sidecars load."""
    return f"{qd.metadata.name}-lora"


def client_service(qd: QwenDeployment) -> str:
    """The Service clients call: the gateway, or the engines when the gateway is off."""
    return qd.metadata.name


def selector(qd: QwenDeployment, component: str) -> dict[str, str]:
    """Labels that select one component's pods; immutable once a Deployment exists."""
    return selector_of(qd.metadata.name, component)


def selector_of(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/name": "qwen",
    }


def labels(qd: QwenDeployment, component: str) -> dict[str, str]:
    return {
        **selector(qd, component),
        "app.kubernetes.io/part-of": "qwen-operator",
        **owner_labels(qd.metadata.name),
    }


#: Label prefix of the gateway pods that serve another deployment as a tier: `<prefix>/<its name>`.
FRONTS_PREFIX = f"fronts.{LABEL_PREFIX}"


def fronting_labels(qd: QwenDeployment) -> dict[str, str]:
    """Labels of a gateway pod that serves the deployments of spec.gateway.tiers: their engines'
    NetworkPolicy admits gateway pods carrying their name (fronted_by)."""
    return {f"{FRONTS_PREFIX}/{t.deployment_ref.name}": "gateway" for t in qd.spec.gateway.tiers}


def fronted_by(name: str) -> dict[str, str]:
    """The gateway pods, in the namespace, of the deployments that serve `name` as a tier."""
    return {
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/name": "qwen",
        f"{FRONTS_PREFIX}/{name}": "gateway",
    }


def owner_labels(owner: str) -> dict[str, str]:
    """Labels every child of the QwenDeployment `owner` carries, used to list children for pruning."""
    return {"app.kubernetes.io/managed-by": MANAGED_BY, f"{LABEL_PREFIX}/deployment": owner}


def endpoint(qd: QwenDeployment, port: int) -> str:
    suffix = "" if port == 80 else f":{port}"
    return f"http://{client_service(qd)}.{qd.metadata.namespace}.svc{suffix}/v1"
