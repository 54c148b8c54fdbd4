"""What the OpenAPI schema says beyond what drf-spectacular reads off the views: every error response an
operation really gives (in the API's one error shape), request bodies that refuse unknown fields, and
the same for the staff token endpoints, which are simplejwt's views.

Found by asking the running app (tests/test_schema.py and tests/test_schemathesis.py keep checking it):
every operation is 404 `not_found` for a path that is none (a malformed slug); all but the shuffle are
503 `service_unavailable` while Redis is away (the rate limiters live there); every JSON body can be
malformed (400), too large (413) or not JSON (415); every answer DRF negotiates is 406 for an Accept
header that allows no JSON.
"""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiViewExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view

from . import responses as r

ERRORS = {
    code: OpenApiResponse(r.ErrorSerializer, description=desc)
    for code, desc in {
        400: "Bad request: malformed_json, invalid_request (with `fields`), unknown_fields (with `fields`), "
        "invalid_visitor_id, invalid_priority_code, invalid_access_token, invalid_proof_of_work",
        401: "Not authenticated: invalid_ticket, authentication_required, invalid_credentials, invalid_api_key",
        403: "permission_denied (another queue's API key, a missing permission, or a signed-in session "
        "without its CSRF token)",
        404: "not_found (no such path, e.g. a malformed slug; no such queue), queue_not_found, ticket_not_found",
        406: "not_acceptable: the Accept header allows no application/json",
        409: "Conflict: queue_closed, queue_not_open, session_not_active, proof_of_work_reused, not_in_stateless_mode, "
        "queue_exists",
        413: "request_too_large: the body is over the upload limit",
        415: "unsupported_media_type: send the body as application/json",
        428: "proof_of_work_required: the error object carries a challenge to solve",
        429: "rate_limited or ticket_cap_reached (with Retry-After)",
        503: "queue_full or service_unavailable (Redis unreachable; with Retry-After)",
    }.items()
}

# What every operation can answer (404: a path that is none, such as a malformed slug), and what every
# operation with a JSON body adds.
ANY_OPERATION = (404,)
JSON_BODY = (400, 413, 415)


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """The error responses of an operation: `codes` plus those every operation gives."""
    return {code: ERRORS[code] for code in sorted({*codes, *ANY_OPERATION})}


class StrictSerializerExtension(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]
    """A body that refuses unknown fields (400 unknown_fields) says so: additionalProperties is false."""

    target_class = "queueing.api.serializers.RefusesUnknownFields"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


def _staff_token_view(view: type, operation_id: str, summary: str) -> type:
    serializer = view().get_serializer_class()

    @extend_schema_view(
        post=extend_schema(
            operation_id=operation_id,
            summary=summary,
            responses={200: serializer, **error_responses(*JSON_BODY, 401, 406, 429, 503)},
            auth=[],
        )
    )
    class Documented(view):
        pass

    return Documented


class StaffTokenObtainView(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    target_class = "rest_framework_simplejwt.views.TokenObtainPairView"

    def view_replacement(self) -> type:
        return _staff_token_view(
            cast(type, self.target_class), "staff_token_obtain", "A staff JWT pair for a username and password"
        )


class StaffTokenRefreshView(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    target_class = "rest_framework_simplejwt.views.TokenRefreshView"

    def view_replacement(self) -> type:
        return _staff_token_view(
            cast(type, self.target_class), "staff_token_refresh", "A new staff access token for a refresh token"
        )
