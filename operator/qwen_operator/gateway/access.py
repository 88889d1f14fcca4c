"""API keys limited to some models (spec.gateway.modelAccess), as nginx enforces them.

Each key named in a rule may use the union of its rules' models; keys with the same set share one
access group, which is what nginx.conf's maps name. A request's model is read from its body by njs
(templates/model-access.js), so nginx reads the body before it picks where to proxy (a `mirror`
subrequest does: proxy_pass evaluates its target before reading the body otherwise). A denied request
goes to a server on a Unix socket that answers the 403, whose message lists the models the key may use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.spec import QwenDeploymentSpec
from .errors import GatewayError

#: nginx.conf's client_body_buffer_size: larger bodies go to a file, which njs does not read.
BODY_BUFFER = "1m"
BODY_BUFFER_TEXT = "1 MiB"


@dataclass(frozen=True)
class AccessGroup:
    """Keys that may use the same models."""

    id: str  # m0, m1, ... in the order of their first rule
    keys: tuple[str, ...]
    models: tuple[str, ...]  # in the order the spec names them
    #: A request naming no model gets the base model (vLLM's default), so it counts as the base model.
    base_allowed: bool

    def denied(self) -> GatewayError:
        models = ", ".join(self.models)
        return GatewayError(
            403,
            403,
            "model_not_allowed",
            f"This API key may not use the requested model; it may use: {models}.",
            param="model",
        )


#: A limited key's request whose body the gateway cannot read a model from: refused rather than guessed,
#: since the engine's parser might read a model there that the key may not use.
UNREAD_BODY = GatewayError(
    403,
    403,
    "model_not_allowed",
    "This API key is limited to some models, and the gateway could not read the model of this request: "
    f"send a JSON object whose model is a string, of at most {BODY_BUFFER_TEXT}.",
    param="model",
)


def access_groups(spec: QwenDeploymentSpec) -> list[AccessGroup]:
    """The keys limited by spec.gateway.modelAccess, grouped by the models they may use."""
    allowed: dict[str, list[str]] = {}
    for rule in spec.gateway.model_access:
        for key in rule.api_keys:
            models = allowed.setdefault(key, [])
            models.extend(m for m in rule.models if m not in models)
    groups: dict[tuple[str, ...], list[str]] = {}
    for key, models in allowed.items():
        groups.setdefault(tuple(models), []).append(key)
    base = spec.served_model_name
    return [
        AccessGroup(id=f"m{i}", keys=tuple(keys), models=models, base_allowed=base in models)
        for i, (models, keys) in enumerate(groups.items())
    ]
