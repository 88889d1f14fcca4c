"""The CustomResourceDefinition, generated from the pydantic models (`make generate` writes crds/).

pydantic's JSON Schema is turned into a structural OpenAPI v3 schema the API server accepts: $refs
inlined, Optional[X] as plain X (absence means unset), discriminated unions as one object with the
union of the members' properties plus a CEL rule per member, no defaults (they are applied by the
operator, never stored, so GitOps sees no drift).
"""

from __future__ import annotations

from typing import Any

from .spec import GROUP, KIND, NAME_RULES, PLURAL, VERSION, QwenDeploymentSpec, cel_rules

_DROP = {"title", "default", "discriminator", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {
        # A `properties` mapping's keys are field names, not schema keywords: an alias's field
        # `default` must stay (the API server refused every alias when it was dropped).
        k: {f: _resolve(s, defs) for f, s in v.items()} if k == "properties" else _resolve(v, defs)
        for k, v in node.items()
        if k not in _DROP
    }


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:  # Optional[X]: pydantic writes anyOf [X, null]
        members = [m for m in node.pop("anyOf") if m.get("type") != "null"]
        if len(members) == 1:
            node = {**members[0], **node}
    if "oneOf" in node:
        node = _merge_union(node)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(exclusive), int | float) and not isinstance(node[exclusive], bool):
            node[bound], node[exclusive] = node[exclusive], True  # OpenAPI v3.0 form
    if node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string"):
        node.pop("additionalProperties", None)
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node.pop("pattern", None)
    if "properties" in node:
        node.pop("additionalProperties", None)  # unknown fields are pruned / refused by the API server
        node["type"] = "object"
    out = {k: _structural(v) for k, v in node.items()}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    return out


def _merge_union(node: dict[str, Any]) -> dict[str, Any]:
    """A discriminated union as one object: all members' properties, CEL keeps members apart."""
    members = node.pop("oneOf")
    properties: dict[str, Any] = {}
    rules = []
    methods = []
    for member in members:
        method = member["properties"]["method"]["const"]
        methods.append(method)
        properties.update(member["properties"])
        for own_rule in member.get("x-kubernetes-validations", []):  # a member's rules hold for it only
            rules.append({**own_rule, "rule": f"self.method != '{method}' || ({own_rule['rule']})"})
        own = set(member["properties"])
        foreign = sorted({p for m in members for p in m["properties"]} - own)
        if foreign:
            present = " || ".join(f"has(self.{f})" for f in foreign)
            rules.append(
                {
                    "rule": f"self.method != '{method}' || !({present})",
                    "message": f"method {method} accepts only: {', '.join(sorted(own))}",
                }
            )
        for req in member.get("required", []):
            if req != "method":
                rules.append(
                    {
                        "rule": f"self.method != '{method}' || has(self.{req})",
                        "message": f"method {method} needs {req}",
                    }
                )
    properties["method"] = {"type": "string", "enum": methods, "description": "Speculation method."}
    return {
        **node,
        "type": "object",
        "properties": properties,
        "required": ["method"],
        "x-kubernetes-validations": rules,
    }


def spec_schema() -> dict[str, Any]:
    raw = QwenDeploymentSpec.model_json_schema(by_alias=True)
    return _structural(_resolve(raw, raw.get("$defs", {})))


def metadata_schema() -> dict[str, Any]:
    """metadata.name's own rules (the only part of metadata a CRD may restrict): children's names are
    built from it, so it must be a DNS-1035 label short enough for the longest of them."""
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "x-kubernetes-validations": cel_rules(NAME_RULES)}},
    }


def _condition_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    }


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Observed state, written by the operator.",
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "metadata.generation of the spec this status describes.",
            },
            "phase": {"type": "string", "description": "Ready, Progressing, Degraded or Invalid."},
            "replicas": {"type": "integer", "description": "Engine pods that exist."},
            "readyReplicas": {"type": "integer", "description": "Engine pods that are ready."},
            "desiredReplicas": {"type": "integer", "description": "Replicas wanted (by spec or HPA)."},
            "replicasSummary": {"type": "string", "description": "ready/desired, for kubectl get."},
            "selector": {"type": "string", "description": "Label selector of the engine pods."},
            "gpu": {"type": "string", "description": "GPU type in effect."},
            "tensorParallelSize": {"type": "integer", "description": "Tensor parallel size in effect."},
            "maxModelLen": {"type": "integer", "description": "Context length in effect (YaRN above 40960)."},
            "endpoint": {"type": "string", "description": "In-cluster URL of the OpenAI API."},
            "rolloutStrategy": {"type": "string", "description": "Surge or InPlace, with the reason."},
            "plan": {
                "type": "object",
                "description": "Capacity plan (see `qwen-operator plan`).",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "autoscaling": {
                "type": "object",
                "description": "Queue-depth autoscaling: what it aims for and what the HPA last read.",
                "properties": {
                    "driver": {"type": "string", "description": "hpa or keda."},
                    "metric": {
                        "type": "string",
                        "description": "The HPA's custom metric (hpa) or the trigger's query (keda).",
                    },
                    "targetQueueDepth": {
                        "type": "integer",
                        "description": "Average waiting requests per engine pod aimed for.",
                    },
                    "targetQueueDepthSource": {
                        "type": "string",
                        "description": "spec (autoscaling.targetQueueDepth) or plan (derived).",
                    },
                    "concurrencyPerReplica": {
                        "type": "integer",
                        "description": "Requests one replica runs at once, in the plan.",
                    },
                    "currentQueueDepth": {
                        "type": "number",
                        "description": "Average waiting requests per engine pod, as the HPA last read it.",
                    },
                },
            },
            "gateway": {
                "type": "object",
                "description": "Client authentication of the gateway.",
                "properties": {
                    "auth": {"type": "string", "description": "apiKeys or none (spec.gateway.auth)."},
                    "apiKeysSecret": {
                        "type": "string",
                        "description": "The Secret whose keys the gateway accepts.",
                    },
                    "apiKeysSecretGenerated": {
                        "type": "boolean",
                        "description": "True when the operator created that Secret (no apiKeysSecret set).",
                    },
                },
            },
            "engineUpdate": {
                "type": "object",
                "description": "Present while the engines run a pod an earlier operator version rendered "
                "for this spec, held until the spec is next edited (spec.engine.upgradePolicy).",
                "properties": {
                    "available": {"type": "boolean", "description": "Always true when present."},
                    "changes": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Paths of the pod template a rollout to the new form would change.",
                    },
                    "message": {"type": "string", "description": "What runs, and how to take the update."},
                },
            },
            "lora": {
                "type": "object",
                "description": "Where each adapter of spec.lora is loaded (the engines' lora-sync sidecars).",
                "properties": {
                    "adapters": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "description": "The adapter (its model name)."},
                                "loaded": {
                                    "type": "string",
                                    "description": "Ready engine pods that have it loaded / ready ones.",
                                },
                                "error": {"type": "string", "description": "Why it failed to load, per pod."},
                            },
                        },
                    }
                },
            },
            "tiers": {
                "type": "array",
                "description": "Each tier of spec.gateway.tiers: whether its deployment serves (TiersReady).",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The tier's model name."},
                        "deployment": {"type": "string", "description": "Its QwenDeployment."},
                        "ready": {
                            "type": "boolean",
                            "description": "Its engines serve under the tier's name.",
                        },
                        "readyReplicas": {"type": "integer", "description": "Its ready engine replicas."},
                        "reason": {
                            "type": "string",
                            "description": "Ready, DeploymentNotFound, ModelNameMismatch or NoReadyReplicas.",
                        },
                        "message": {"type": "string", "description": "Details, for people."},
                    },
                },
            },
            "conditions": {
                "type": "array",
                "description": "Typed conditions: Ready, ConfigValid, CapacityFit, Scheduled, Progressing, "
                "ScalingReady, MonitoringReady, ExposureReady, ReferencesResolved, Synced, "
                "AdaptersLoaded with spec.lora, ScaledToZero with autoscaling.minReplicas 0, TiersReady "
                "with spec.gateway.tiers, and SecurityUpdateHeld while the engines run a pod an earlier "
                "operator version rendered without this version's security settings.",
                "items": _condition_schema(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        },
    }


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicasSummary"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.gpu"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.tensorParallelSize"},
    {"name": "Context", "type": "integer", "jsonPath": ".status.maxModelLen"},
    {
        "name": "Reason",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {"name": "Endpoint", "type": "string", "priority": 1, "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The QwenDeployment CRD manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["qwd"],
                "categories": ["all", "qwenops"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A Qwen3-32B serving deployment on vLLM.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": metadata_schema(),
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }
