"""Middleware: when Redis cannot be reached, every page and endpoint answers 503 with Retry-After (the API
in its error shape, pages with a styled page that retries by itself), never a 500. The visitor hot path
(fastpath.py) and the API's own views already answer so; this covers every other view, and a sign-out
the session cache could not record (sessions.py)."""

from __future__ import annotations

from collections.abc import Callable

import redis
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse

from queueing.api.answers import Answer

from .sessions import SessionNotEnded

RETRY_AFTER_SECONDS = 5


class RedisUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponseBase | None:
        if isinstance(exception, SessionNotEnded):
            return HttpResponse(
                "You could not be signed out just now; try again in a moment.",
                status=503,
                content_type="text/plain",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if not isinstance(exception, redis.RedisError):
            return None
        if request.path.startswith("/api/"):
            return Answer.unavailable().plain(request)
        response = TemplateResponse(request, "503.html", {"retry_after": RETRY_AFTER_SECONDS}, status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response.render()
