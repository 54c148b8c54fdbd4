"""drf-spectacular's settings for the API's OpenAPI schema and its docs (settings.SPECTACULAR_SETTINGS):
the API's title, its error shape, the enums' names and the ways a caller authenticates."""

from __future__ import annotations

from typing import Any

SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Waiting Room API",
    "DESCRIPTION": (
        "Virtual waiting room: visitors join and poll; protected sites verify access tokens; "
        "staff watch and steer queues. Errors always have the shape "
        '`{"error": {"code": "...", "message": "..."}}`.'
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "FinishReasonEnum": "queueing.api.responses.FINISH_REASONS",
        "QueueStateEnum": ["open", "paused", "closed"],
        "QueueModeEnum": "queueing.policy_table.Mode",
        "StatelessModeEnum": ["stateless"],
        "VerifyReasonEnum": ["expired", "superseded", "revoked", "full", "bound_elsewhere", "invalid"],
        "ErrorCodeEnum": "queueing.api.errors.ERROR_CODES",
    },
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "ticket": {"type": "http", "scheme": "bearer", "description": "A visitor's ticket (from join)."},
            "apiKey": {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "A protected site's key: `Api-Key <key>`.",
            },
            "staffJWT": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            "managementKey": {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "A management key (automation without a staff login): `Api-Key <key>`.",
            },
            "cookieAuth": {"type": "apiKey", "in": "cookie", "name": "sessionid"},
        }
    },
}
