"""What a Django protected site installs to let in only visitors the waiting room admitted.

Use the decorator on views::

    @require_queue_access("demo")
    def checkout(request): ...

or the middleware for whole path prefixes (settings.WR_PROTECTED_PATHS = {"/shop/": "demo"}).

The waiting room sends an admitted visitor to the site with `?wr_access=<access token>`. The first
request verifies it, keeps it in an HttpOnly cookie and redirects to the same URL without it (so the
token stays out of history and Referer headers); later requests verify the cookie. Verification modes
(settings.WR_VERIFY_MODE):

* ``local``   — the site runs in this project: checks Redis directly (fencing, revocation, first use).
* ``remote``  — another Django project: POSTs to the waiting room's verify endpoint with its API key
  (WR_API_URL, WR_API_KEY); answers are cached for a few seconds.
* ``offline`` — signature and expiry only, against the published JWKS (no revocation check).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any
from urllib.parse import urlencode

import jwt
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme

from . import services, tokens

REMOTE_CACHE_SECONDS = 5.0
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueAccess:
    slug: str
    ticket_id: str
    expires_at: int
    token: str


@dataclass(frozen=True)
class _Verdict:
    valid: bool
    reason: str
    ticket_id: str = ""
    expires_at: int = 0


def _verify_local(slug: str, token: str) -> _Verdict:
    result = services.session_verify(slug=slug, raw_token=token)
    return _Verdict(result.valid, result.reason, result.ticket_id, result.expires_at)


_remote_cache: dict[tuple[str, str], tuple[float, _Verdict]] = {}
_remote_lock = threading.Lock()


def _verify_remote(slug: str, token: str) -> _Verdict:
    now = time.monotonic()
    with _remote_lock:
        cached = _remote_cache.get((slug, token))
        if cached and now - cached[0] < REMOTE_CACHE_SECONDS:
            return cached[1]
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return _Verdict(False, "unavailable")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{settings.WR_API_URL.rstrip('/')}/api/v1/queues/{slug}/sessions/verify",
        data=json.dumps({"access_token": token}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Api-Key {settings.WR_API_KEY}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=3) as response:  # noqa: S310
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            logger.error("the waiting room refused WR_API_KEY for queue %s (HTTP %s)", slug, exc.code)
        return _Verdict(False, "unavailable")
    except (urllib.error.URLError, TimeoutError, ValueError):
        return _Verdict(False, "unavailable")
    verdict = _Verdict(
        bool(body.get("valid")),
        str(body.get("reason", "")),
        str(body.get("ticket_id", "")),
        int(body.get("expires_at", 0) or 0),
    )
    with _remote_lock:
        if len(_remote_cache) > 10_000:
            _remote_cache.clear()
        _remote_cache[(slug, token)] = (now, verdict)
    return verdict


_jwks_clients: dict[str, jwt.PyJWKClient] = {}


def _verify_offline(slug: str, token: str) -> _Verdict:
    if not settings.WR_API_URL:
        try:
            claims = tokens.access_token_decode(token, slug=slug)
        except tokens.InvalidAccessToken as exc:
            return _Verdict(False, "expired" if exc.expired else "invalid")
        return _Verdict(True, "", claims.ticket_id, claims.expires_at)
    url = f"{settings.WR_API_URL.rstrip('/')}/.well-known/jwks.json"
    client = _jwks_clients.setdefault(url, jwt.PyJWKClient(url, cache_keys=True, lifespan=300))
    try:
        key = client.get_signing_key_from_jwt(token)
        payload = jwt.decode(token, key.key, algorithms=[tokens.ACCESS_ALGORITHM], audience=slug, issuer=tokens.ISSUER)
    except jwt.ExpiredSignatureError:
        return _Verdict(False, "expired")
    except jwt.PyJWTError:
        return _Verdict(False, "invalid")
    return _Verdict(True, "", str(payload["sub"]), int(payload["exp"]))


VERIFIERS: dict[str, Callable[[str, str], _Verdict]] = {
    "local": _verify_local,
    "remote": _verify_remote,
    "offline": _verify_offline,
}


def access_cookie_name(slug: str) -> str:
    return f"{settings.WR_ACCESS_COOKIE_PREFIX}{slug}"


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
    reason = ""
    if from_query:
        verdict = verify(slug, from_query)
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
            return response
        if verdict.reason == "unavailable":
            return _unavailable()
        reason = verdict.reason
    from_cookie = request.COOKIES.get(cookie)
    if not from_cookie:
        return HttpResponseRedirect(waiting_page_url(slug, reason))
    verdict = verify(slug, from_cookie)
    if verdict.reason == "unavailable":
        return _unavailable()
    if not verdict.valid:
        response = HttpResponseRedirect(waiting_page_url(slug, verdict.reason))
        response.delete_cookie(cookie)
        return response
    return QueueAccess(slug, verdict.ticket_id, verdict.expires_at, from_cookie)


def require_queue_access(slug: str) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Decorator: the view runs only for visitors admitted through queue `slug` (request.queue_access)."""

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            access = queue_access_check(request, slug)
            if not isinstance(access, QueueAccess):
                return access
            request.queue_access = access  # type: ignore[attr-defined]
            return view(request, *args, **kwargs)

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
                access = queue_access_check(request, slug)
                if not isinstance(access, QueueAccess):
                    return access
                request.queue_access = access  # type: ignore[attr-defined]
                break
        return self.get_response(request)
