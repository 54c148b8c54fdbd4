"""The visitor hot paths: status polls and joins, served without machinery they do not need.

Every waiting visitor polls, and a sale's opening minute brings thousands of joins a second.

* **Status polls** (and a stateless queue's window) are authenticated by their ticket alone and touch no
  database. `HotPathASGI`, the application the web server runs (granian, ASGI; see web.py), answers them
  on its event loop: the ticket check, then one script in Redis through redis.asyncio, while other polls
  of the same process wait on theirs (bench/RESULTS.md: a thread per request spent a third of the time
  handing the GIL around). It keeps what matters from the layers it skips: the Host header is checked
  against ALLOWED_HOSTS, requests due an SSL redirect go to Django, and responses carry the headers
  SecurityMiddleware adds (taken from SecurityMiddleware itself at startup, so they cannot drift apart).
  The code is the API view's: one flow per use-case (queueing/flows.py), which Django's path drives in
  its thread and this application drives on the loop, running only what may read the database (a queue's
  policy lost from Redis and synced from its row, signing keys not loaded yet) in a thread.
* **Joins** without a session cookie cannot come from a signed-in user: answered on the event loop too
  (answers.join_flow), the join's rate limiter in the join's own script. Joins with a session cookie go to
  Django's full stack, so a signed-in user joins as themselves (CSRF checked). `FastPathMiddleware` serves
  status polls, window reads and joins without a session that reach Django (the test client, gunicorn)
  past sessions, authentication, CSRF, messages and DRF's dispatch.
* **Everything else** goes to Django's WSGI handler in a pool of threads (a2wsgi), its body read in full
  on the event loop first: a body that trickles in costs a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import io
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from a2wsgi import WSGIMiddleware
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import split_domain_port, validate_host
from django.middleware.security import SecurityMiddleware
from django.utils import translation

from queueing import conf, instruments, modes, signing_keys
from queueing.api.answers import (
    Answer,
    ajoin_answer,
    astatus_answer,
    awindow_answer,
    join_fast,
    status_fast,
    window_fast,
)
from queueing.api.errors import error_body, error_said
from queueing.visitors import client_address

_SLUG = r"([a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?)"
STATUS_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/status$")
JOIN_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/join$")
WINDOW_PATH = re.compile(rf"^/api/v1/queues/{_SLUG}/window$")
# The routes' names as the metrics give them (README "Metrics"): the URL pattern names of the API's views.
STATUS_ROUTE, JOIN_ROUTE, WINDOW_ROUTE = "queue-status", "queue-join", "queue-window"
Answered = tuple[str, str, int]  # what the hot path answered: route, method, status

logger = logging.getLogger(__name__)
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class FastPathMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method == "GET" and (match := STATUS_PATH.match(request.path_info)):
            request.route_name = STATUS_ROUTE  # type: ignore[attr-defined]  # for the metrics (no URL resolved)
            request.get_host()  # raises DisallowedHost (a 400) as CommonMiddleware would
            return status_fast(request, match.group(1))
        if request.method == "GET" and (match := WINDOW_PATH.match(request.path_info)):
            request.route_name = WINDOW_ROUTE  # type: ignore[attr-defined]
            request.get_host()
            return window_fast(request, match.group(1))
        if (
            request.method == "POST"
            and settings.SESSION_COOKIE_NAME not in request.COOKIES
            and (match := JOIN_PATH.match(request.path_info))
        ):
            request.route_name = JOIN_ROUTE  # type: ignore[attr-defined]
            request.get_host()
            return join_fast(request, match.group(1))
        return self.get_response(request)


class _SecureProbe:
    def __init__(self, secure: bool) -> None:
        self.secure = secure

    def is_secure(self) -> bool:
        return self.secure


def _security_headers(secure: bool) -> list[tuple[bytes, bytes]]:
    """The headers SecurityMiddleware adds to a JSON response, for a secure or a plain request."""
    response = HttpResponse(content_type="application/json")
    before = set(response.headers)
    SecurityMiddleware(lambda request: response).process_response(_SecureProbe(secure), response)  # type: ignore[arg-type]
    return [(name.encode(), value.encode()) for name, value in response.headers.items() if name not in before]


# A request body is read in full before Django sees it; one bigger than this, or slower than that, is
# refused (nothing the product accepts comes near either: a join's body is a few hundred bytes).
BODY_MAX_BYTES = 4 * 1024 * 1024
BODY_SECONDS = 30.0


class HotPathASGI:
    """Answers status polls, stateless queues' window reads and joins without a session on the event loop;
    everything else goes to Django's WSGI handler, in a pool of `threads` threads."""

    def __init__(self, django_app: WSGIApp, *, threads: int = 32) -> None:
        self.django_app = django_app
        self.threads = threads
        self.django = WSGIMiddleware(django_app, workers=threads)  # type: ignore[arg-type]
        self.headers = {secure: _security_headers(secure) for secure in (False, True)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send, self.threads)
        if scope["type"] != "http":
            return None  # websockets are the websocket server's (asgi.py)
        started = time.perf_counter()
        if scope["method"] == "GET" and (answered := await self._hot(scope, send)):
            return instruments.http_answered_on_loop(*answered, time.perf_counter() - started)
        body = await _body(receive)
        if isinstance(body, int):
            return await _respond(send, _refusal(body), [])
        if scope["method"] == "POST" and (answered := await self._join(scope, body, send)):
            return instruments.http_answered_on_loop(*answered, time.perf_counter() - started)
        return await self.django(scope, _replay(body, receive), send)  # type: ignore[arg-type]

    async def _join(self, scope: Scope, body: bytes, send: Send) -> Answered | None:
        """Answer a join here; None to leave it to Django (a session, a host it refuses, an SSL redirect)."""
        match = JOIN_PATH.match(scope["path"])
        if match is None:
            return None
        request = ASGIRequest(scope, io.BytesIO(body))
        if conf.hot().SESSION_COOKIE_NAME in request.COOKIES:
            return None  # perhaps a signed-in user: Django's full stack (CSRF, the user's identity)
        secure = request.is_secure()
        try:
            request.get_host()
        except DisallowedHost:
            return None  # Django refuses it
        if conf.hot().SECURE_SSL_REDIRECT and not secure:
            return None
        answer = await ajoin_answer(request, match.group(1))
        await _respond(send, answer, self.headers[secure], scope)
        return JOIN_ROUTE, "POST", answer.status

    async def _hot(self, scope: Scope, send: Send) -> Answered | None:
        """Answer a status poll or a window read here; None to leave the request to Django."""
        path = scope["path"]
        status_match = STATUS_PATH.match(path)
        window_match = WINDOW_PATH.match(path) if status_match is None else None
        if status_match is None and window_match is None:
            return None
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        secure = _is_secure(scope, headers)
        if (conf.hot().SECURE_SSL_REDIRECT and not secure) or not _host_allowed(scope, headers):
            return None  # Django redirects, or refuses the host
        if status_match is not None:
            route = STATUS_ROUTE
            answer = await astatus_answer(headers.get("authorization", ""), status_match.group(1))
        else:
            route = WINDOW_ROUTE
            address = functools.partial(_client_address, scope)
            answer = await awindow_answer(window_match.group(1), address)  # type: ignore[union-attr]
        await _respond(send, answer, self.headers[secure], scope)
        return route, "GET", answer.status


def _client_address(scope: Scope) -> str:
    """The client's address as Django's path reads it from a request's META (visitors.client_address; the
    lines of a repeated X-Forwarded-For joined as Django joins them)."""
    remote = (scope.get("client") or ("",))[0]
    forwarded = ",".join(value.decode("latin-1") for name, value in scope["headers"] if name == b"x-forwarded-for")
    return client_address({"REMOTE_ADDR": remote, "HTTP_X_FORWARDED_FOR": forwarded})


async def _respond(send: Send, answer: Answer, extra: list[tuple[bytes, bytes]], scope: Scope | None = None) -> None:
    content = answer.body
    if answer.status >= 400 and scope is not None:  # an error, in the visitor's language (as Django's path says it)
        content = error_said(content, translation.get_language_from_request(ASGIRequest(scope, io.BytesIO(b""))))
    body = json.dumps(content, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((name.encode(), value.encode()) for name, value in answer.headers.items()),
        *((b"set-cookie", cookie.encode()) for cookie in answer.set_cookies()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send, threads: int) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # What the flows on the loop run in a thread (what may read the database: a policy Redis lost,
            # signing keys, a priority code) gets as many threads as Django's own requests, not asyncio's
            # default (the cores plus four).
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="blocking"))
            # Admitted visitors' polls sign access tokens on the event loop, which never reads the database.
            try:
                await asyncio.to_thread(_keys_load)
            except Exception:  # the database is not there yet: the first polls that sign load them in a thread
                logger.exception("Loading the signing keys at startup failed")
            # What startup built (Django, its apps, URL patterns, the scripts) lives as long as the process:
            # out of the collector's sight, a full collection no longer walks it in the middle of a crowd's
            # requests (the p99's tail, bench/RESULTS.md).
            gc.collect()
            gc.freeze()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            with contextlib.suppress(redis.RedisError):
                await modes.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _body(receive: Receive) -> bytes | int:
    """The request's body, read in full; or the status to refuse it with (413 too big, 408 too slow, 400
    the client went away)."""
    chunks: list[bytes] = []
    size = 0

    async def read() -> bytes | int:
        nonlocal size
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return 400
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > BODY_MAX_BYTES:
                return 413
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), BODY_SECONDS)
    except TimeoutError:
        return 408


def _refusal(status: int) -> Answer:
    codes = {408: "request_timeout", 413: "request_too_large", 400: "bad_request"}
    messages = {
        408: "The request's body did not arrive in time.",
        413: "The request's body is too large.",
        400: "The request ended before its body.",
    }
    return Answer(status, error_body(codes[status], messages[status]))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that gives the body read ahead as one message, then waits on the client (a disconnect)."""
    given = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _keys_load() -> None:
    try:
        signing_keys.key_ring()
    finally:
        connection.close()


def _is_secure(scope: Scope, headers: dict[str, str]) -> bool:
    """As HttpRequest.is_secure() decides (the proxy's header if one is trusted, else the scheme)."""
    proxy_header = conf.hot().SECURE_PROXY_SSL_HEADER
    if proxy_header:
        header, secure_value = proxy_header
        forwarded = headers.get(header.removeprefix("HTTP_").replace("_", "-").lower())
        if forwarded is not None:
            return bool(forwarded.split(",")[0].strip() == secure_value)
    return bool(scope.get("scheme") == "https")


def _host_allowed(scope: Scope, headers: dict[str, str]) -> bool:
    """As HttpRequest.get_host() decides (forwarded host if trusted, else Host, else the server's name)."""
    hot = conf.hot()
    if hot.USE_X_FORWARDED_HOST and "x-forwarded-host" in headers:
        host = headers["x-forwarded-host"]
    elif "host" in headers:
        host = headers["host"]
    else:
        server = scope.get("server") or ("", None)
        host, port = str(server[0]), str(server[1] or "")
        if port and port != ("443" if scope.get("scheme") == "https" else "80"):
            host = f"{host}:{port}"
    allowed = hot.ALLOWED_HOSTS
    if hot.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return _allowed(host, tuple(allowed))


@functools.lru_cache(maxsize=256)
def _allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """A crowd sends a handful of Host values: each checked once (a client's made-up ones push out the
    least recent, not the real ones)."""
    domain, _ = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)
