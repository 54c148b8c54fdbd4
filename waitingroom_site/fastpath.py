"""The visitor hot paths: status polls and joins, served without machinery they do not need.

Every waiting visitor polls, and a sale's opening minute brings thousands of joins a second.

* **Status polls** are authenticated by their ticket alone and touch no database. `HotPathWSGI` (the WSGI
  application gunicorn serves, see wsgi.py) answers them before Django's request handling starts: no
  request object, middleware chain or request signals (about a fifth of a poll's cost, bench/RESULTS.md).
  It keeps what matters from the skipped layers: the Host header is checked against ALLOWED_HOSTS,
  requests due an SSL redirect go to Django, and responses carry the headers SecurityMiddleware adds
  (taken from SecurityMiddleware itself at startup, so they cannot drift apart).
* **Joins** without a session cookie cannot come from a signed-in user, so `FastPathMiddleware` sends
  them straight to `join_fast`, past sessions, authentication, CSRF, messages and DRF's dispatch. They
  stay inside Django's request handling because a join may use the database (priority codes). Joins
  with a session cookie take the full stack, so a signed-in user joins as themselves (CSRF checked).
  The middleware also serves status polls that reach Django (the test client, an ASGI server).

Both run the same code as the DRF views at those URLs (documented in the schema).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import split_domain_port, validate_host
from django.middleware.security import SecurityMiddleware

from queueing.api.answers import Answer, join_fast, status_answer, status_fast, window_answer, window_fast

_SLUG = r"([a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?)"
STATUS_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/status$")
JOIN_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/join$")
WINDOW_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/window$")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class FastPathMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method == "GET" and (match := STATUS_PATH.match(request.path_info)):
            request.get_host()  # raises DisallowedHost (a 400) as CommonMiddleware would
            return status_fast(request, match.group(1))
        if request.method == "GET" and (match := WINDOW_PATH.match(request.path_info)):
            request.get_host()
            return window_fast(request, match.group(1))
        if (
            request.method == "POST"
            and settings.SESSION_COOKIE_NAME not in request.COOKIES
            and (match := JOIN_PATH.match(request.path_info))
        ):
            request.get_host()
            return join_fast(request, match.group(1))
        return self.get_response(request)


class _SecureProbe:
    def __init__(self, secure: bool) -> None:
        self.secure = secure

    def is_secure(self) -> bool:
        return self.secure


def _security_headers(secure: bool) -> list[tuple[str, str]]:
    """The headers SecurityMiddleware adds to a JSON response, for a secure or a plain request."""
    response = HttpResponse(content_type="application/json")
    before = set(response.headers)
    SecurityMiddleware(lambda request: response).process_response(_SecureProbe(secure), response)  # type: ignore[arg-type]
    return [(name, value) for name, value in response.headers.items() if name not in before]


class HotPathWSGI:
    """Answers GET status polls (and stateless queues' window reads) itself; everything else goes to
    Django's WSGI handler."""

    def __init__(self, django_app: WSGIApp) -> None:
        self.django_app = django_app
        self.headers = {secure: _security_headers(secure) for secure in (False, True)}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        get = environ["REQUEST_METHOD"] == "GET"
        status_match = STATUS_PATH.match(path) if get else None
        window_match = WINDOW_PATH.match(path) if get and status_match is None else None
        if status_match is None and window_match is None:
            return self.django_app(environ, start_response)
        secure = _is_secure(environ)
        if (settings.SECURE_SSL_REDIRECT and not secure) or not _host_allowed(environ):
            return self.django_app(environ, start_response)  # Django redirects, or refuses the host
        try:
            if status_match is not None:
                answer = status_answer(environ.get("HTTP_AUTHORIZATION", ""), status_match.group(1))
            else:
                answer = window_answer(window_match.group(1))  # type: ignore[union-attr]
        except redis.RedisError:
            answer = Answer.unavailable()
        body = json.dumps(answer.body, separators=(",", ":")).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *answer.headers.items(),
            *self.headers[secure],
        ]
        start_response(f"{answer.status} {HTTPStatus(answer.status).phrase}", headers)
        return [body]


def _is_secure(environ: dict[str, Any]) -> bool:
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        header, secure_value = proxy_header
        forwarded = environ.get(header)
        if forwarded is not None:
            return bool(forwarded.split(",")[0].strip() == secure_value)
    return bool(environ.get("wsgi.url_scheme") == "https")


def _host_allowed(environ: dict[str, Any]) -> bool:
    """As HttpRequest.get_host() decides (forwarded host if trusted, else Host, else the server's name)."""
    if settings.USE_X_FORWARDED_HOST and "HTTP_X_FORWARDED_HOST" in environ:
        host = environ["HTTP_X_FORWARDED_HOST"]
    elif "HTTP_HOST" in environ:
        host = environ["HTTP_HOST"]
    else:
        host = environ.get("SERVER_NAME", "")
        port = str(environ.get("SERVER_PORT", ""))
        if port and port != ("443" if environ.get("wsgi.url_scheme") == "https" else "80"):
            host = f"{host}:{port}"
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)
