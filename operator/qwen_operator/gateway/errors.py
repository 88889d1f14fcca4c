"""The errors nginx, vllm-router and the gateway's own checks produce, as the JSON errors of the API the
request was for, instead of nginx's HTML pages and vllm-router's plain text (nginx.conf's error_page
locations): OpenAI's `{"error": {...}}` on the OpenAI routes (chat, completions, responses, models) and
Anthropic's `{"type": "error", "error": {...}}` on /v1/messages, so that each API's SDK raises its own
exception class. The engines' own errors pass unchanged: vLLM writes each route's errors in its API's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..clientapis import Api, error_payload

#: The nginx variables a message may name (expanded when nginx answers): the 503 of a tier names its model.
NGINX_VARIABLES = ("$no_engine_message",)


@dataclass(frozen=True)
class GatewayError:
    """One status that nginx or vllm-router answers itself, and what the client gets instead."""

    #: The status nginx finalizes the request with (494 is nginx's own "header too large").
    status: int
    #: The status the client gets: a client's mistake is never a 5xx.
    sent: int
    code: str
    message: str
    type: str = "invalid_request_error"
    #: The request field at fault, if one is.
    param: str | None = None

    def payload(self, api: Api = "openai") -> dict[str, object]:
        """The error as `api`'s clients read it."""
        return error_payload(api, self.sent, self.code, self.message, self.type, self.param)

    def text(self, api: Api = "openai") -> str:
        """The JSON error, one line."""
        return json.dumps(self.payload(api), separators=(",", ":")) + "\n"

    def body(self, api: Api = "openai") -> str:
        """The JSON error, ready for an nginx `return` (or map value) in single quotes."""
        text = self.text(api)[:-1]
        # nginx would expand a $ other than the variables a message names on purpose, and ' or \ would
        # end or escape its quoting.
        plain = text
        for variable in NGINX_VARIABLES:
            plain = plain.replace(variable, "")
        assert not set("$'\\") & set(plain), text
        return text + "\\n"


def nginx_errors(max_body: str) -> tuple[GatewayError, ...]:
    """Requests nginx refuses itself: before any location runs, or while it reads the body."""
    malformed = "The request is malformed: its request line, a header or its framing is not valid HTTP/1.1."
    methods = "This route does not accept this method: GET /v1/models, POST the others."
    return (
        GatewayError(400, 400, "bad_request", malformed),
        GatewayError(405, 405, "method_not_allowed", methods),
        GatewayError(413, 413, "request_too_large", f"The request body is larger than {max_body}."),
        GatewayError(414, 414, "uri_too_long", "The request URI is too long."),
        GatewayError(494, 431, "request_header_too_large", "A request header, or all of them, too large."),
        # RFC 9112 suggests 501 for a transfer coding the server does not know: a client's mistake still.
        GatewayError(
            501, 400, "unsupported_transfer_encoding", "Only the chunked transfer coding is supported."
        ),
        # RFC 9110's answer would be 505; the client's mistake all the same.
        GatewayError(505, 400, "unsupported_http_version", "Use HTTP/1.0 or HTTP/1.1."),
    )


#: vllm-router's own refusals of a request body, plain text from its JSON parser, with the statuses the
#: engines answer too (their JSON errors pass unchanged: nginx.conf's @status_400 and @status_422).
ROUTER_BODY_ERRORS = (
    GatewayError(400, 400, "invalid_json", "The request body is not valid JSON."),
    GatewayError(
        422,
        422,
        "invalid_request_body",
        "The request body is JSON but not a valid request: "
        "a field has the wrong type, or a required one is missing.",
    ),
)
#: vllm-router's refusal of a body not declared as JSON; the engines never see such a request.
UNSUPPORTED_MEDIA_TYPE = GatewayError(
    415, 415, "unsupported_media_type", "Send the request body as JSON, with Content-Type: application/json."
)
#: A request without a key the API-key Secret holds.
INVALID_API_KEY = GatewayError(
    401,
    401,
    "invalid_api_key",
    "Missing or invalid API key. Send it as: Authorization: Bearer <key> (or x-api-key: <key>).",
)
#: The pod's in-flight cap, or vllm-router's full admission queue.
OVERLOADED = GatewayError(
    503, 503, "overloaded", "The server is overloaded; retry shortly.", type="server_error"
)
#: vllm-router without a ready engine (with tiers, the message names the model: nginx's $no_engine_message).
NO_ENGINE = GatewayError(
    503,
    503,
    "no_engine_available",
    "No engine replica is ready to serve this request; retry shortly.",
    type="server_error",
)
TIER_NO_ENGINE = GatewayError(503, 503, NO_ENGINE.code, "$no_engine_message", type="server_error")
#: autoscaling.minReplicas 0, the activator sidecar not answering (restarting).
ACTIVATOR_UNAVAILABLE = GatewayError(
    503,
    503,
    "no_engine_available",
    "No engine replica is ready, and the gateway could not hold this request; retry shortly.",
    type="server_error",
)
ROUTER_UNAVAILABLE = GatewayError(
    502, 502, "bad_gateway", "The gateway could not reach its router.", type="server_error"
)

#: Stored responses (OpenAI's Responses API) are off: vLLM keeps a stored response in the memory of the
#: one engine process that made it, which no other replica can read, a restart or a scale to zero loses,
#: and which grows without bound (its own warning); the router cannot tell which engine holds an id.
#: The engines never store (vLLM's VLLM_ENABLE_RESPONSES_API_STORE stays off: `store` is ignored), and
#: the gateway refuses what would need a stored response, naming the field (docs/gateway.md).
STORED_RESPONSES_HELP = "This gateway does not store responses"
STORED_RESPONSE_FIELDS = {
    "previous_response_id": (
        f"{STORED_RESPONSES_HELP}, so previous_response_id cannot be used: send the earlier turns in "
        "`input` instead (docs/gateway.md, Responses API)."
    ),
    "background": (
        f"{STORED_RESPONSES_HELP}, so background responses (which are stored to be fetched later) cannot "
        "be used: send the request without `background`, streamed if it is long."
    ),
}
#: GET, DELETE /v1/responses/{id}, .../cancel, .../input_items: no response is ever stored to find.
STORED_RESPONSE_ROUTE = GatewayError(
    404,
    404,
    "stored_responses_disabled",
    f"{STORED_RESPONSES_HELP}: there is no response to retrieve, cancel or delete "
    "(docs/gateway.md, Responses API).",
)


def stored_response_refusal(field: str) -> GatewayError:
    """The 400 of a Responses request whose `field` needs a stored response."""
    return GatewayError(400, 400, "stored_responses_disabled", STORED_RESPONSE_FIELDS[field], param=field)


def queue_timeout(seconds: int) -> GatewayError:
    """vllm-router's 408 for a request that waited `seconds` (queueTimeoutSeconds) for a free slot, which
    it sends with no body (templates/errors.js gives it this one)."""
    message = f"The request waited {seconds} s for a free slot and was not started; retry shortly."
    return GatewayError(408, 408, "queue_timeout", message, type="server_error")


#: A route outside the allow-list.
UNKNOWN_URL = GatewayError(
    404,
    404,
    "unknown_url",
    "Unknown route. This endpoint serves /v1/chat/completions, /v1/completions, /v1/responses, "
    "/v1/messages, /v1/messages/count_tokens and /v1/models.",
)
