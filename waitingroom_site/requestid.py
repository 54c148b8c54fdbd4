"""Every request gets an id (README "Logs"): the client's or proxy's X-Request-ID when it is a fit one,
else a new one. It is in every log line written while the request is served, with the queue the path
names, and goes back in the response's X-Request-ID; Celery tasks published meanwhile carry it too
(waitingroom_site/celery.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.core.signals import request_finished
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from queueing import logcontext

# The queue a path is about: the API's, the waiting page's, the dashboard's.
_QUEUE_PATH = re.compile(r"^/(?:api/v1/queues|q|dashboard)/(?P<slug>[-a-zA-Z0-9_]+)(?:/|$)")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request_id = logcontext.request_id(request.headers.get("X-Request-ID"))
        found = _QUEUE_PATH.match(request.path_info)
        # Bound until the response is closed (request_finished), not only for this call: Django logs a 4xx
        # or 5xx answer (django.request) after the middleware has returned it.
        logcontext.bind(request_id=request_id, queue=found["slug"] if found else "", ticket="")
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response


def _unbind(**_: Any) -> None:
    logcontext.bind(request_id="", queue="", ticket="")


request_finished.connect(_unbind, dispatch_uid="waitingroom_site.requestid")
