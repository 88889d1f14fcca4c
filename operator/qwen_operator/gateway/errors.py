"""The errors nginx and vllm-router produce themselves, as the OpenAI-style JSON errors the gateway sends
instead of nginx's HTML pages and vllm-router's plain text (nginx.conf's error_page locations)."""

from __future__ import annotations

import json
from dataclasses import dataclass


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

    def text(self) -> str:
        """The JSON error, one line."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}, separators=(",", ":")) + "\n"

    def body(self) -> str:
        """The JSON error, ready for an nginx `return` in single quotes."""
        text = self.text()[:-1]
        # nginx would expand $ in a return text, and ' or \ would end or escape its quoting.
        assert not set("$'\\") & set(text), text
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
    401, 401, "invalid_api_key", "Missing or invalid API key. Send it as: Authorization: Bearer <key>."
)


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
    "Unknown route. This endpoint serves /v1/chat/completions, /v1/completions and /v1/models.",
)
