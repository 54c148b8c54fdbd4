"""The HTTP API for the protected site (SPEC 6): verify a visitor's access token, complete and revoke
sessions, report the site's own count of sessions in use and its health. Each call carries the queue's API
key."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors, services, tokens
from . import responses as r
from . import serializers as s
from .errors import ApiError
from .permissions import HasQueueApiKey
from .schema import JSON_BODY, error_responses
from .throttling import (
    ProtectedSiteThrottle,
)
from .views import API_KEY_AUTH, _validated


class _ProtectedSiteView(APIView):
    authentication_classes: list[Any] = []
    permission_classes = [HasQueueApiKey]
    throttle_classes = [ProtectedSiteThrottle]


class VerifyView(_ProtectedSiteView):
    @extend_schema(
        operation_id="session_verify",
        summary="Verify an access token (first use starts the session)",
        request=s.VerifyRequestSerializer,
        examples=[
            OpenApiExample(
                "Verify the token a visitor arrived with",
                value={"access_token": "<the visitor's access token>", "browser": "c2f1e0b7a4d94f0e8d3b"},
                request_only=True,
            ),
            OpenApiExample(
                "Check a token from the site's own server, with no browser behind it",
                value={"access_token": "<an access token>", "server": True},
                request_only=True,
            ),
        ],
        responses={200: r.VerifyResponseSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 429, 503)},
        auth=API_KEY_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        data = _validated(s.VerifyRequestSerializer, request.data)
        result = services.session_verify(
            slug=slug,
            raw_token=data["access_token"],
            browser=data.get("browser", ""),
            rebind=data["rebind"],
            server=data["server"],
        )
        if result.valid:
            return Response({"valid": True, "ticket_id": result.ticket_id, "expires_at": result.expires_at})
        return Response({"valid": False, "reason": result.reason})


class CompleteView(_ProtectedSiteView):
    @extend_schema(
        operation_id="session_complete",
        summary="End a session; frees its slot at once",
        request=s.AccessTokenSerializer,
        examples=[
            OpenApiExample(
                "End the visitor's session", value={"access_token": "<the visitor's access token>"}, request_only=True
            )
        ],
        responses={204: None, **error_responses(*JSON_BODY, 401, 403, 406, 409, 429, 503)},
        auth=API_KEY_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        data = _validated(s.AccessTokenSerializer, request.data)
        try:
            claims = tokens.access_token_decode(data["access_token"], slug=slug)
        except tokens.InvalidAccessToken as exc:
            if exc.expired:
                raise ApiError("session_not_active", "The session has already ended.", reason="expired") from exc
            raise ApiError("invalid_access_token", str(exc)) from exc
        result = services.session_complete(slug=slug, claims=claims)
        if result in ("completed", "already"):
            return Response(status=204)
        raise ApiError("session_not_active", f"The session is not live ({result}).", reason=result)


class RevokeView(_ProtectedSiteView):
    @extend_schema(
        operation_id="session_revoke",
        summary="Revoke a ticket or session",
        request=s.RevokeSerializer,
        responses={204: None, **error_responses(*JSON_BODY, 401, 403, 406, 409, 429, 503)},
        auth=API_KEY_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        data = _validated(s.RevokeSerializer, request.data)
        try:
            services.session_revoke(slug=slug, ticket_id=data["ticket_id"])
        except services.TicketNotFound as exc:
            raise ApiError("ticket_not_found", "This queue has no such ticket.") from exc
        except services.NotInStatelessMode as exc:
            raise ApiError("not_in_stateless_mode", str(exc)) from exc
        return Response(status=204)


class CapacityView(_ProtectedSiteView):
    @extend_schema(
        operation_id="capacity_report",
        summary="Report the site's own count of sessions in use (absolute)",
        request=s.CapacitySerializer,
        examples=[OpenApiExample("Three sessions in use", value={"in_use": 3}, request_only=True)],
        responses={200: r.CapacityResponseSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 429, 503)},
        auth=API_KEY_AUTH,
    )
    def put(self, request: Request, slug: str) -> Response:
        data = _validated(s.CapacitySerializer, request.data)
        capacity, in_use, source = services.capacity_report(slug=slug, in_use=data["in_use"])
        return Response({"capacity": capacity, "in_use": in_use, "capacity_source": source})


class HealthView(_ProtectedSiteView):
    @extend_schema(
        operation_id="site_health_report",
        summary="Report the site's recent responses: count, server errors, response times",
        description=(
            "For the adaptive outflow (a per-queue option): send every few seconds what the site served "
            "since its last report. `requests` responses, `errors` of them server errors (5xx), and "
            "`latency_ms`, their response times (all of them, or a random sample that stands for all). "
            "Reports from many web servers add up. The answer is the site's health as the admission tick "
            "now sees it, over the queue's adjustment interval. `require_queue_access` sends these by itself."
        ),
        request=s.HealthReportSerializer,
        examples=[
            OpenApiExample(
                "Three responses, one a server error",
                value={"requests": 3, "errors": 1, "latency_ms": [85.0, 120.5, 96.2]},
                request_only=True,
            )
        ],
        responses={200: r.SiteHealthSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 429, 503)},
        auth=API_KEY_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        data = _validated(s.HealthReportSerializer, request.data)
        services.site_health_report(
            slug=slug, requests=data["requests"], errors=data["errors"], latencies_ms=data.get("latency_ms", [])
        )
        return Response(selectors.site_health_get(slug=slug).payload())
