"""One error shape for the whole API: `{"error": {"code": "...", "message": "...", ...}}`.

Every failure a client can cause is a 4xx with a stable code; Redis being unreachable is a 503 with
Retry-After. Nothing a client sends should produce a 500.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import redis
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, JsonResponse
from django.utils import translation
from django.utils.translation import gettext, gettext_noop
from rest_framework import exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)

# Every code the API can return, with its HTTP status (documented in the README and the schema).
ERROR_CODES: dict[str, int] = {
    "malformed_json": 400,
    "invalid_request": 400,
    "unknown_fields": 400,
    "invalid_visitor_id": 400,
    "invalid_priority_code": 400,
    "invalid_access_token": 400,
    "invalid_ticket": 401,
    "authentication_required": 401,
    "invalid_credentials": 401,
    "invalid_api_key": 401,
    "permission_denied": 403,
    "cross_site_refused": 403,
    "not_found": 404,
    "queue_not_found": 404,
    "ticket_not_found": 404,
    "method_not_allowed": 405,
    "not_acceptable": 406,
    "queue_closed": 409,
    "queue_not_open": 409,
    "session_not_active": 409,
    "not_in_line": 409,
    "notices_full": 409,
    "not_in_stateless_mode": 409,
    "queue_exists": 409,
    "unsupported_media_type": 415,
    "request_too_large": 413,
    "rate_limited": 429,
    "ticket_cap_reached": 429,
    "proof_of_work_required": 428,
    "invalid_proof_of_work": 400,
    "proof_of_work_reused": 409,
    "queue_full": 503,
    "service_unavailable": 503,
    "server_error": 500,
}


class ApiError(exceptions.APIException):
    """An error with a code from ERROR_CODES; extra keyword arguments go into the error object."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message, code)
        self.status_code = ERROR_CODES[code]
        self.code = code
        self.message = message
        self.extra = extra
        self.headers = headers or {}


class Words(str):
    """An error message with values in it, in English (the string itself) and in the visitor's language
    (`said`): its message id and values are kept. A message without values is a plain str: `said` looks it
    up as it stands (the catalogs hold the ones a visitor may meet: locale/, README "Languages")."""

    template: str
    params: dict[str, Any]

    def __new__(cls, template: str, **params: Any) -> Words:
        words = super().__new__(cls, template % params)
        words.template, words.params = template, params
        return words


def said(message: str) -> str:
    """The message in the language active now (English where the catalogs have no words for it)."""
    if isinstance(message, Words):
        return gettext(message.template) % message.params
    return gettext(message) if message else message


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def error_said(body: dict[str, Any], language: str | None = None) -> dict[str, Any]:
    """An answer's body with its error message said in `language` (None: the language active now)."""
    error = body.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return body
    with translation.override(language) if language else contextlib.nullcontext():
        return {**body, "error": {**error, "message": said(error["message"])}}


def _response(code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    return Response(error_body(code, said(message), **extra), status=ERROR_CODES[code], headers=headers)


def retry_after(seconds: float | None) -> tuple[dict[str, str], dict[str, int]]:
    """The Retry-After header and the body's `retry_after_seconds` (whole seconds, at least 1)."""
    wait = max(1, math.ceil(seconds or 1))
    return {"Retry-After": str(wait)}, {"retry_after_seconds": wait}


def service_unavailable() -> tuple[int, dict[str, Any], dict[str, str]]:
    """What any caller answers when Redis cannot be reached: 503 with a short Retry-After."""
    headers, extra = retry_after(5)
    return (
        503,
        error_body("service_unavailable", gettext_noop("The queue is briefly unavailable; retry soon."), **extra),
        headers,
    )


def _validation_response(detail: Any) -> Response:
    if isinstance(detail, dict):
        unknown = sorted(k for k, v in detail.items() if _codes(v) == {"unknown_field"})
        if unknown and len(unknown) == len(detail):
            return _response("unknown_fields", unknown_fields(unknown), fields=unknown)
        return _response("invalid_request", gettext_noop("The request has invalid fields."), fields=detail)
    return _response("invalid_request", _first_message(detail))


def unknown_fields(names: list[str]) -> Words:
    return Words(gettext_noop("Unknown field(s): %(fields)s."), fields=", ".join(names))


def _codes(detail: Any) -> set[str]:
    if isinstance(detail, list):
        return {getattr(item, "code", "") for item in detail}
    return {getattr(detail, "code", "")}


def _first_message(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    if isinstance(detail, dict) and detail:
        return _first_message(next(iter(detail.values())))
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApiError):
        return _response(exc.code, exc.message, exc.headers or None, **exc.extra)
    if isinstance(exc, Http404):
        return _response("not_found", gettext_noop("Not found."))
    if isinstance(exc, DjangoPermissionDenied):
        return _response("permission_denied", "You do not have permission to do this.")
    if isinstance(exc, exceptions.ParseError):
        return _response("malformed_json", f"The body is not valid JSON: {exc.detail}")
    if isinstance(exc, exceptions.ValidationError):
        return _validation_response(exc.detail)
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return _response("unsupported_media_type", gettext_noop("Send the body as application/json."))
    if isinstance(exc, exceptions.MethodNotAllowed):
        return _response("method_not_allowed", str(exc.detail))
    if isinstance(exc, exceptions.NotAcceptable):
        return _response("not_acceptable", str(exc.detail))
    if isinstance(exc, exceptions.Throttled):
        headers, extra = retry_after(getattr(exc, "wait", None))
        return _response("rate_limited", gettext_noop("Too many requests; retry later."), headers, **extra)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        challenge = getattr(exc, "auth_header", None)
        if exc.status_code == 403:  # DRF's answer when no authenticator offers a challenge
            return _response("permission_denied", str(exc.detail))
        code = "authentication_required" if isinstance(exc, exceptions.NotAuthenticated) else "invalid_credentials"
        # simplejwt's details are dicts ({"detail": ..., "code": ...}): their message, not their repr.
        return _response(code, _first_message(exc.detail), {"WWW-Authenticate": challenge} if challenge else None)
    if isinstance(exc, exceptions.PermissionDenied):
        return _response("permission_denied", str(exc.detail))
    if isinstance(exc, exceptions.NotFound):
        return _response("not_found", str(exc.detail))
    if isinstance(exc, redis.RedisError):
        logger.error("redis unavailable: %s", exc)
        status, body, headers = service_unavailable()
        return Response(error_said(body), status=status, headers=headers)
    if isinstance(exc, exceptions.APIException):
        return Response(error_body(str(exc.default_code), str(exc.detail)), status=exc.status_code)
    return None


def json_bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """What Django refuses before a view runs (a body over DATA_UPLOAD_MAX_MEMORY_SIZE, too many fields, ...)."""
    if isinstance(exception, RequestDataTooBig):
        return JsonResponse(
            error_body("request_too_large", said(gettext_noop("The request body is too large."))), status=413
        )
    return JsonResponse(error_body("invalid_request", said(gettext_noop("The request could not be read."))), status=400)


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not_found", said(gettext_noop("Not found."))), status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(error_body("server_error", said(gettext_noop("Something went wrong on our side."))), status=500)
