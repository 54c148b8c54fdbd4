"""DRF throttles backed by the Redis limiters of queueing/ratelimit.py, one per scope (settings
WR_RATE_LIMITS): joins per client address, status polls per ticket, protected-site calls per API key,
staff calls per user. Over the limit: 429 `rate_limited` with Retry-After and `retry_after_seconds`.

The visitor endpoints (join, status) also run outside DRF on the hot path (fastpath.py); they call
`limit` directly with the same scopes, so both paths count in the same buckets."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework_api_key.permissions import KeyParser

from .. import ratelimit
from .errors import ApiError, retry_after


def rate_limited(decision: ratelimit.Decision) -> ApiError:
    """The API's 429 for a refused request: Retry-After and retry_after_seconds."""
    headers, extra = retry_after(decision.retry_after)
    return ApiError(
        "rate_limited", f"Too many requests; retry in {extra['retry_after_seconds']} s.", headers=headers, **extra
    )


def limit(scope: str, ident: str) -> None:
    """Count a request of `ident` in `scope`; ApiError rate_limited (429) when it is over the limit."""
    decision = ratelimit.hit(scope, ident)
    if not decision.allowed:
        raise rate_limited(decision)


class ScopedRateThrottle(BaseThrottle):
    scope = ""

    def ident(self, request: Request, view: Any) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        ident = self.ident(request, view)
        if ident is None:
            return True
        limit(self.scope, ident)  # raises the API's own 429 (Retry-After, retry_after_seconds)
        return True


class ProtectedSiteThrottle(ScopedRateThrottle):
    """Per API key (its public prefix; the key itself is checked by the permission first)."""

    scope = "protected"
    key_parser = KeyParser()

    def ident(self, request: Request, view: Any) -> str | None:
        key = self.key_parser.get(request)
        return key.partition(".")[0] if key else None


class StaffThrottle(ScopedRateThrottle):
    """Per signed-in staff user."""

    scope = "staff"

    def ident(self, request: Request, view: Any) -> str | None:
        user = request.user
        return f"user-{user.pk}" if user and user.is_authenticated else None
