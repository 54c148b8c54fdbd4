"""How a protected site verifies an access token (require_queue_access; settings.WR_VERIFY_MODE):

* ``local``   — the site runs in this project: checks Redis directly (fencing, revocation, first use).
* ``remote``  — another Django project: POSTs to the waiting room's verify endpoint with its API key
  (WR_API_URL, WR_API_KEY); answers are kept in the site's Django cache (WR_CACHE_ALIAS) for
  WR_VERIFY_CACHE_SECONDS (5) at most, shared by the site's processes: a revoked token is refused within
  that time.
* ``offline`` — signature and expiry only, against the published JWKS (no revocation check), kept in
  the site's cache for five minutes; a key it does not know has the JWKS fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
from django.conf import settings
from django.core.cache import BaseCache, caches

from . import services, signing_keys, tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reason: str
    ticket_id: str = ""
    expires_at: int = 0


def _verify_local(slug: str, token: str, browser: str = "") -> Verdict:
    result = services.session_verify(slug=slug, raw_token=token, browser=browser)
    return Verdict(result.valid, result.reason, result.ticket_id, result.expires_at)


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


def _verify_remote(slug: str, token: str, browser: str = "") -> Verdict:
    # The verdict is the token's in this browser: another browser's asks again (and is refused, if bound).
    key = f"wr:verdict:{slug}:{_digest(token)}:{_digest(browser)}"
    cached = _cached(key)
    if isinstance(cached, list | tuple) and len(cached) == 4:
        return Verdict(*cached)
    verdict = _ask_remote(slug, token, browser)
    if verdict.reason != "unavailable":
        seconds = float(getattr(settings, "WR_VERIFY_CACHE_SECONDS", VERIFY_CACHE_SECONDS))
        if verdict.valid:
            seconds = min(seconds, verdict.expires_at - time.time())
        _remember(key, (verdict.valid, verdict.reason, verdict.ticket_id, verdict.expires_at), seconds)
    return verdict


def _ask_remote(slug: str, token: str, browser: str) -> Verdict:
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return Verdict(False, "unavailable")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{settings.WR_API_URL.rstrip('/')}/api/v1/queues/{slug}/sessions/verify",
        data=json.dumps({"access_token": token, **({"browser": browser} if browser else {})}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Api-Key {settings.WR_API_KEY}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=3) as response:  # noqa: S310
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            logger.error("the waiting room refused WR_API_KEY for queue %s (HTTP %s)", slug, exc.code)
        return Verdict(False, "unavailable")
    except (urllib.error.URLError, TimeoutError, ValueError):
        return Verdict(False, "unavailable")
    return Verdict(
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


def _verify_offline(slug: str, token: str, browser: str = "") -> Verdict:
    # Signature and expiry only: no state, so a token is not bound to a browser here (README, security).
    if not settings.WR_API_URL:
        try:
            claims = tokens.access_token_decode(token, slug=slug)
        except tokens.InvalidAccessToken as exc:
            return Verdict(False, "expired" if exc.expired else "invalid")
        return Verdict(True, "", claims.ticket_id, claims.expires_at)
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return Verdict(False, "unavailable")
    url = f"{settings.WR_API_URL.rstrip('/')}/.well-known/jwks.json"
    try:
        kid = jwt.get_unverified_header(token).get("kid")
        key = published_keys.key(url, str(kid)) if isinstance(kid, str) else None
        if key is None:
            return Verdict(False, "invalid")
        algorithms = [signing_keys.ACCESS_ALGORITHM]
        payload = jwt.decode(token, key.key, algorithms=algorithms, audience=slug, issuer=tokens.ISSUER)
    except JWKSUnavailable:
        return Verdict(False, "unavailable")
    except jwt.ExpiredSignatureError:
        return Verdict(False, "expired")
    except (jwt.PyJWTError, UnicodeError):
        return Verdict(False, "invalid")
    return Verdict(True, "", str(payload["sub"]), int(payload["exp"]))


class Verifier(Protocol):
    def __call__(self, slug: str, token: str, browser: str = "") -> Verdict: ...


VERIFIERS: dict[str, Verifier] = {
    "local": _verify_local,
    "remote": _verify_remote,
    "offline": _verify_offline,
}
