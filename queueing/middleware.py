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
  (WR_API_URL, WR_API_KEY); answers are kept in the site's Django cache (WR_CACHE_ALIAS) for
  WR_VERIFY_CACHE_SECONDS (5) at most, shared by the site's processes: a revoked token is refused within
  that time.
* ``offline`` — signature and expiry only, against the published JWKS (no revocation check), kept in
  the site's cache for five minutes; a key it does not know has the JWKS fetched again.

Every protected response is also timed, and counted as an error when it is a 5xx (or the view raised),
for the queue's adaptive outflow (settings.WR_HEALTH_REPORT): in ``local`` mode straight into Redis,
in ``remote`` mode batched per process and sent to the health endpoint by a background thread. Reporting
never slows or breaks the page: a failed report is logged and dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any
from urllib.parse import urlencode

import jwt
from django.conf import settings
from django.core.cache import BaseCache, caches
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme

from . import services, signing_keys, tokens

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


# What a protected site remembers, in its own Django cache (settings.WR_CACHE_ALIAS, default "default"), so
# that every process of the site shares it: the waiting room's verdicts on access tokens (remote mode) for
# WR_VERIFY_CACHE_SECONDS at most, never past the token's expiry (a revoked token is refused within that
# time), and the waiting room's JWKS (offline mode). A cache that fails is a miss: the site asks again.
VERIFY_CACHE_SECONDS = 5
JWKS_CACHE_SECONDS = 300
JWKS_REFETCH_SECONDS = 30  # an unknown kid fetches the JWKS again at most this often (per process)


def _cache() -> BaseCache:
    return caches[getattr(settings, "WR_CACHE_ALIAS", "default")]


def _cached(key: str) -> Any:
    try:
        return _cache().get(key)
    except Exception:  # the site's cache may not ignore its errors: a miss
        logger.warning("the cache failed to read %s", key, exc_info=True)
        return None


def _remember(key: str, value: Any, seconds: float) -> None:
    if seconds < 1:
        return
    try:
        _cache().set(key, value, int(seconds))
    except Exception:
        logger.warning("the cache failed to keep %s", key, exc_info=True)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def _verify_remote(slug: str, token: str) -> _Verdict:
    key = f"wr:verdict:{slug}:{_digest(token)}"
    cached = _cached(key)
    if isinstance(cached, list | tuple) and len(cached) == 4:
        return _Verdict(*cached)
    verdict = _ask_remote(slug, token)
    if verdict.reason != "unavailable":
        seconds = float(getattr(settings, "WR_VERIFY_CACHE_SECONDS", VERIFY_CACHE_SECONDS))
        if verdict.valid:
            seconds = min(seconds, verdict.expires_at - time.time())
        _remember(key, (verdict.valid, verdict.reason, verdict.ticket_id, verdict.expires_at), seconds)
    return verdict


def _ask_remote(slug: str, token: str) -> _Verdict:
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
    return _Verdict(
        bool(body.get("valid")),
        str(body.get("reason", "")),
        str(body.get("ticket_id", "")),
        int(body.get("expires_at", 0) or 0),
    )


class JWKSUnavailable(Exception):
    pass


class _PublishedKeys:
    """The waiting room's JWKS: the document shared through the cache, parsed once per process per version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[str, tuple[str, jwt.PyJWKSet]] = {}
        self._refetched: dict[str, float] = {}

    def key(self, url: str, kid: str) -> jwt.PyJWK | None:
        """The published key `kid`; an unknown kid has the JWKS fetched again (at most every
        JWKS_REFETCH_SECONDS). JWKSUnavailable when the JWKS cannot be had."""
        found = self._find(url, self._document(url), kid)
        if found is None and self._may_refetch(url):
            found = self._find(url, self._document(url, fresh=True), kid)
        return found

    def _may_refetch(self, url: str) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._refetched.get(url, -1e9) < JWKS_REFETCH_SECONDS:
                return False
            self._refetched[url] = now
            return True

    def _document(self, url: str, *, fresh: bool = False) -> str:
        key = f"wr:jwks:{_digest(url)}"
        text = None if fresh else _cached(key)
        if isinstance(text, str):
            return text
        try:
            with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 (WR_API_URL, http(s))
                text = str(response.read().decode())
            json.loads(text)
        except (urllib.error.URLError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            raise JWKSUnavailable(url) from exc
        _remember(key, text, JWKS_CACHE_SECONDS)
        return text

    def _find(self, url: str, text: str, kid: str) -> jwt.PyJWK | None:
        with self._lock:
            parsed = self._parsed.get(url)
            if parsed is None or parsed[0] != text:
                try:
                    parsed = (text, jwt.PyJWKSet.from_json(text))
                except jwt.PyJWTError:
                    return None
                self._parsed[url] = parsed
        return next((key for key in parsed[1].keys if key.key_id == kid), None)


published_keys = _PublishedKeys()


def _verify_offline(slug: str, token: str) -> _Verdict:
    if not settings.WR_API_URL:
        try:
            claims = tokens.access_token_decode(token, slug=slug)
        except tokens.InvalidAccessToken as exc:
            return _Verdict(False, "expired" if exc.expired else "invalid")
        return _Verdict(True, "", claims.ticket_id, claims.expires_at)
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return _Verdict(False, "unavailable")
    url = f"{settings.WR_API_URL.rstrip('/')}/.well-known/jwks.json"
    try:
        kid = jwt.get_unverified_header(token).get("kid")
        key = published_keys.key(url, str(kid)) if isinstance(kid, str) else None
        if key is None:
            return _Verdict(False, "invalid")
        algorithms = [signing_keys.ACCESS_ALGORITHM]
        payload = jwt.decode(token, key.key, algorithms=algorithms, audience=slug, issuer=tokens.ISSUER)
    except JWKSUnavailable:
        return _Verdict(False, "unavailable")
    except jwt.ExpiredSignatureError:
        return _Verdict(False, "expired")
    except (jwt.PyJWTError, UnicodeError):
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


# --- The site's health, for the adaptive outflow -----------------------------------------------------------


@dataclass
class _Batch:
    requests: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class HealthReporter:
    """Remote mode: this process's protected responses, sent to the waiting room's health endpoint every
    WR_HEALTH_FLUSH_SECONDS, or sooner once WR_HEALTH_FLUSH_REQUESTS are waiting, by a background thread
    (the request only appends to a list). A batch that cannot be sent is dropped: the adaptation judges
    the last few seconds, and stale figures would mislead it. Past SAMPLE_CAP response times a batch keeps
    a uniform random sample of them (the report says it stands for all its requests)."""

    SAMPLE_CAP = 2000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._batches: dict[str, _Batch] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._random = random.Random()

    def add(self, slug: str, latency_ms: float, error: bool) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child (gunicorn): its own batches and thread
                self._pid, self._batches, self._thread, self._wake = os.getpid(), {}, None, threading.Event()
            batch = self._batches.setdefault(slug, _Batch())
            batch.requests += 1
            batch.errors += int(error)
            if len(batch.latencies_ms) < self.SAMPLE_CAP:
                batch.latencies_ms.append(latency_ms)
            else:  # reservoir sampling: every response time so far has the same chance to be kept
                slot = self._random.randrange(batch.requests)
                if slot < self.SAMPLE_CAP:
                    batch.latencies_ms[slot] = latency_ms
            if batch.requests >= settings.WR_HEALTH_FLUSH_REQUESTS:
                self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, args=(self._wake,), name="wr-health", daemon=True)
                self._thread.start()

    def _run(self, wake: threading.Event) -> None:
        while True:
            wake.wait(settings.WR_HEALTH_FLUSH_SECONDS)
            wake.clear()
            try:
                self.flush()
            except Exception:  # never let the thread die: the next round tries again
                logger.exception("health report failed")

    def flush(self) -> int:
        """Send every waiting batch now; returns how many were accepted."""
        with self._lock:
            batches, self._batches = self._batches, {}
        return sum(_health_send(slug, batch) for slug, batch in batches.items())


def _health_send(slug: str, batch: _Batch) -> bool:
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return False
    body = {
        "requests": batch.requests,
        "errors": batch.errors,
        "latency_ms": [round(ms, 2) for ms in batch.latencies_ms],
    }
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{settings.WR_API_URL.rstrip('/')}/api/v1/queues/{slug}/health",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Api-Key {settings.WR_API_KEY}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=3):  # noqa: S310
            return True
    except urllib.error.HTTPError as exc:
        level = logging.ERROR if exc.code in (401, 403) else logging.WARNING
        logger.log(level, "the waiting room refused a health report for queue %s (HTTP %s)", slug, exc.code)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        logger.warning("health report for queue %s not sent: %s", slug, exc)
    return False


health_reporter = HealthReporter()


def health_report_mode() -> str:
    """Where protected responses are reported: local | remote | off (WR_HEALTH_REPORT, default "auto":
    local when verifying locally, else remote when WR_API_URL and WR_API_KEY are set, else off)."""
    mode = settings.WR_HEALTH_REPORT
    if mode != "auto":
        return mode
    if settings.WR_VERIFY_MODE == "local":
        return "local"
    return "remote" if settings.WR_API_URL and settings.WR_API_KEY else "off"


def _health_record(slug: str, seconds: float, error: bool) -> None:
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
        _health_record(slug, time.perf_counter() - started, not isinstance(exc, CLIENT_ERRORS))
        raise
    _health_record(slug, time.perf_counter() - started, response.status_code >= 500)
    return response


def require_queue_access(slug: str) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Decorator: the view runs only for visitors admitted through queue `slug` (request.queue_access)."""

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return queue_access_serve(request, slug, lambda: view(request, *args, **kwargs))

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
