"""What a Django protected site installs to let in only visitors the waiting room admitted.

Use the decorator on views::

    @require_queue_access("demo")
    def checkout(request): ...

or the middleware for whole path prefixes (settings.WR_PROTECTED_PATHS = {"/shop/": "demo"}).

The waiting room sends an admitted visitor to the site with `?wr_access=<access token>`. The first
request verifies it, keeps it in an HttpOnly cookie and redirects to the same URL without it (so the
token stays out of history and Referer headers); later requests verify the cookie, in the way
settings.WR_VERIFY_MODE says (local, remote or offline: verifiers.py).

Every verify also carries this browser's secret (a random value in its own HttpOnly cookie, made on the
first visit with a token): the waiting room binds the session to the first browser that redeems the link,
so the same link opened in another browser is refused with a page that says why (reason
`bound_elsewhere`). Offline mode checks signatures only and cannot bind.

Every protected response is also timed, and counted as an error when it is a 5xx (or the view raised),
for the queue's adaptive outflow (site_reports.py).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme

from . import services
from .site_reports import HealthReporter, health_report_mode
from .verifiers import VERIFIERS

logger = logging.getLogger(__name__)

BROWSER_COOKIE_SECONDS = 365 * 24 * 3600


@dataclass(frozen=True)
class QueueAccess:
    slug: str
    ticket_id: str
    expires_at: int
    token: str


__all__ = [
    "VERIFIERS",
    "HealthReporter",
    "QueueAccess",
    "QueueAccessMiddleware",
    "health_report_mode",
    "require_queue_access",
]


def access_cookie_name(slug: str) -> str:
    return f"{settings.WR_ACCESS_COOKIE_PREFIX}{slug}"


def _browser_secret(request: HttpRequest) -> tuple[str, bool]:
    """This browser's secret, and whether it is new (to be set as a cookie with the response)."""
    secret = request.COOKIES.get(settings.WR_BROWSER_COOKIE, "")
    if 20 <= len(secret) <= services.BROWSER_SECRET_MAX and secret.isascii():
        return secret, False
    return secrets.token_urlsafe(32), True


def waiting_page_url(slug: str, reason: str = "") -> str:
    url = settings.WR_WAITING_PAGE_URL.format(slug=slug)
    return f"{url}?{urlencode({'reason': reason})}" if reason else url


def _url_without_token(request: HttpRequest) -> str:
    """The same page without the token, as a path on this site (never "//elsewhere": no open redirect)."""
    query = request.GET.copy()
    query.pop(settings.WR_ACCESS_QUERY_PARAM, None)
    encoded = query.urlencode()
    url = "/" + request.path.lstrip("/") + (f"?{encoded}" if encoded else "")
    if not url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}):
        return "/"
    return url


def _unavailable() -> HttpResponse:
    return HttpResponse(
        "The waiting room cannot be reached right now; this page will work again in a moment.",
        status=503,
        content_type="text/plain",
        headers={"Retry-After": "5"},
    )


def queue_access_check(request: HttpRequest, slug: str) -> QueueAccess | HttpResponseBase:
    """The visitor's access to the queue's protected pages, or the response that sends them elsewhere.

    A token in the URL that does not verify never costs the visitor a valid cookie (a crafted link must
    not log anyone out), and an unreachable waiting room (remote mode) keeps the cookie and answers 503.
    """
    verify = VERIFIERS[settings.WR_VERIFY_MODE]
    cookie = access_cookie_name(slug)
    from_query = request.GET.get(settings.WR_ACCESS_QUERY_PARAM)
    browser, new_browser = _browser_secret(request)
    reason = ""
    if from_query:
        verdict = verify(slug, from_query, browser)
        if verdict.valid:
            response = HttpResponseRedirect(_url_without_token(request))
            response.set_cookie(
                cookie,
                from_query,
                max_age=max(1, verdict.expires_at - int(time.time())),
                secure=settings.HTTPS,
                httponly=True,
                samesite="Lax",
            )
            if new_browser:
                response.set_cookie(
                    settings.WR_BROWSER_COOKIE,
                    browser,
                    max_age=BROWSER_COOKIE_SECONDS,
                    secure=settings.HTTPS,
                    httponly=True,
                    samesite="Lax",
                )
            return response
        if verdict.reason == "unavailable":
            return _unavailable()
        reason = verdict.reason
    from_cookie = request.COOKIES.get(cookie)
    if not from_cookie:
        return HttpResponseRedirect(waiting_page_url(slug, reason))
    verdict = verify(slug, from_cookie, browser)  # a new secret here: a copied cookie, refused if bound
    if verdict.reason == "unavailable":
        return _unavailable()
    if not verdict.valid:
        response = HttpResponseRedirect(waiting_page_url(slug, verdict.reason))
        response.delete_cookie(cookie)
        return response
    return QueueAccess(slug, verdict.ticket_id, verdict.expires_at, from_cookie)


# --- The site's health, for the adaptive outflow -----------------------------------------------------------

health_reporter = HealthReporter()  # remote mode: this process's batches


class _Sources:
    """When each admitted visitor's request last counted towards its queue's health (this process): one
    visitor reloading a page as fast as they can counts at most once per WR_HEALTH_SOURCE_SECONDS, so the
    figures the adaptive outflow follows are the site's, not one visitor's. Its server errors are judged
    apart, the same way (issue 50: one visitor's 20 errors an interval cut the outflow to its minimum): an
    error after its success, or a success after its error, still counts."""

    def __init__(self, size: int = 50_000) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[tuple[str, str, bool], float] = OrderedDict()
        self._size = size

    def counts(self, slug: str, source: str, now: float, error: bool = False) -> bool:
        key = (slug, source, error)
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < settings.WR_HEALTH_SOURCE_SECONDS:
                return False
            self._last[key] = now
            self._last.move_to_end(key)
            while len(self._last) > self._size:
                self._last.popitem(last=False)
            return True


health_sources = _Sources()


def _health_record(slug: str, seconds: float, error: bool, source: str = "") -> None:
    if source and not health_sources.counts(slug, source, time.monotonic(), error):
        return
    mode = health_report_mode()
    latency_ms = seconds * 1000
    try:
        if mode == "local":
            services.site_health_report(slug=slug, requests=1, errors=int(error), latencies_ms=[latency_ms])
        elif mode == "remote":
            health_reporter.add(slug, latency_ms, error)
    except Exception:  # the page matters more than its figures
        logger.warning("health report for queue %s failed", slug, exc_info=True)


CLIENT_ERRORS = (Http404, PermissionDenied, SuspiciousOperation, BadRequest)


def queue_access_serve(request: HttpRequest, slug: str, view: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """Run `view` for a visitor admitted through queue `slug` (request.queue_access tells who), timing it
    for the site's health (until the response is returned: a streamed body is not waited for); anyone
    else gets the response that sends them elsewhere."""
    access = queue_access_check(request, slug)
    if not isinstance(access, QueueAccess):
        return access
    request.queue_access = access  # type: ignore[attr-defined]
    started = time.perf_counter()
    try:
        response = view()
    except BaseException as exc:
        # Django answers these with a 4xx: the visitor's mistake, not the site failing.
        _health_record(slug, time.perf_counter() - started, not isinstance(exc, CLIENT_ERRORS), access.ticket_id)
        raise
    _health_record(slug, time.perf_counter() - started, response.status_code >= 500, access.ticket_id)
    return response


def require_queue_access(slug: str) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Decorator: the view runs only for visitors admitted through queue `slug` (request.queue_access)."""

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return queue_access_serve(request, slug, lambda: view(request, *args, **kwargs))

        wrapper.queue_access_slug = slug  # type: ignore[attr-defined]  # whose tokens it takes (admin checks targets)
        return wrapper

    return decorator


class QueueAccessMiddleware:
    """Protects path prefixes: settings.WR_PROTECTED_PATHS = {"/shop/": "demo", ...}."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.prefixes = sorted(getattr(settings, "WR_PROTECTED_PATHS", {}).items(), key=lambda kv: -len(kv[0]))

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        for prefix, slug in self.prefixes:
            if request.path_info.startswith(prefix):
                return queue_access_serve(request, slug, lambda: self.get_response(request))
        return self.get_response(request)
