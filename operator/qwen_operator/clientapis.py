"""The APIs clients call through the gateway: their routes, and the shape of their errors.

OpenAI's (chat completions, completions, the Responses API, the model list) and Anthropic's Messages API,
all served by vLLM itself. An error the gateway answers itself (nginx.conf, the activator) takes the shape
of the request's API, so that each API's SDK raises its own exception class: OpenAI's `{"error": {...}}`,
Anthropic's `{"type": "error", "error": {...}}`.
"""

from __future__ import annotations

from typing import Literal

#: The APIs, by the shape of their errors (nginx.conf's $api).
Api = Literal["openai", "anthropic"]
APIS: tuple[Api, ...] = ("openai", "anthropic")
#: Routes of Anthropic's Messages API; every other route's errors are OpenAI's.
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
#: Routes clients may call, each its own `route` label of the gateway's metrics; everything else gets a
#: JSON 404, stored responses (/v1/responses/{id}...) the gateway's own (gateway/errors.py).
ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    *ANTHROPIC_ROUTES,
    "/v1/models",
)
#: Routes whose requests need an engine, so wake and keep engines (listing the models wakes nothing).
TRAFFIC_ROUTES = tuple(r for r in ROUTES if r != "/v1/models")

#: The `error.type` of an Anthropic error by HTTP status (Anthropic's API reference, "Errors"); the
#: Anthropic SDK picks its exception class by the status, its users read the type.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_type(status: int) -> str:
    """The Anthropic `error.type` of an error answered with `status`."""
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def api_of(path: str) -> Api:
    """The API whose error shape a request for `path` gets."""
    return "anthropic" if path in ANTHROPIC_ROUTES else "openai"


def error_payload(
    api: Api, status: int, code: str, message: str, type: str = "server_error", param: str | None = None
) -> dict[str, object]:
    """One error as the API's clients read it. OpenAI's `code` and `param` have no place in Anthropic's
    shape, whose type follows from the status."""
    if api == "anthropic":
        return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
