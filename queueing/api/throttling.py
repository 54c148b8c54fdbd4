"""DRF throttles backed by the Redis limiters of queueing/ratelimit.py (settings WR_RATE_LIMITS names the
limiter of each scope; any of the five algorithms). Over the limit: 429 `rate_limited` with Retry-After
and `retry_after_seconds`.

Reusable per what a request is counted against, with the scope from the view's `throttle_scope` (as
DRF's own ScopedRateThrottle) or the class's `scope`:

    class MyView(APIView):
        throttle_classes = [ClientAddressThrottle]  # or TicketThrottle
        throttle_scope = "my_scope"                  # WR_RATE_LIMITS["my_scope"]; absent: unlimited
                                                     # (or selectors.DEFAULT_LIMITS["my_scope"])

* ClientAddressThrottle: per client address (X-Forwarded-For believed only from WR_TRUSTED_PROXIES);
  DatabaseAnswerThrottle: the same for an answer that needs no Redis (not refused while Redis is away);
* TicketThrottle: per ticket holder (the visitor of the request's Bearer ticket for the view's queue);
* ProtectedSiteThrottle: per API key; StaffThrottle: per signed-in user; StaffLoginThrottle: the staff
  token endpoint, per client address.

The visitor endpoints (join, status) also run outside DRF on the hot path (fastpath.py); they call
`limit` directly with the same scopes, so both paths count in the same buckets."""

from __future__ import annotations

from typing import Any

import redis
from django.utils.translation import gettext_noop
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework_api_key.permissions import KeyParser

from .. import instruments, modes, ratelimit, selectors, tokens
from ..visitors import client_address
from .errors import ApiError, Words, retry_after


def rate_limited(decision: ratelimit.Decision, scope: str) -> ApiError:
    """The API's 429 for a request refused in `scope`: Retry-After and retry_after_seconds (and counted,
    README "Metrics")."""
    instruments.rate_limited.labels(scope).inc()
    headers, extra = retry_after(decision.retry_after)
    message = Words(gettext_noop("Too many requests; retry in %(seconds)s s."), seconds=extra["retry_after_seconds"])
    return ApiError("rate_limited", message, headers=headers, **extra)


def limit(scope: str, ident: str, *, queue: str = "") -> None:
    """Count a request of `ident` in `scope` (with `queue`: counted for that queue alone, its key under the
    queue's hash tag); ApiError rate_limited (429) when it is over the limit. A few scopes have a default
    limit in code (selectors.DEFAULT_LIMITS) while settings name none."""
    decision = selectors.limit_hit(scope, ident, queue=queue)
    if not decision.allowed:
        raise rate_limited(decision, scope)


class ScopedRateThrottle(BaseThrottle):
    """Counts a request against `ident` in the view's `throttle_scope`, else the class's `scope`."""

    scope = ""

    def ident(self, request: Request, view: Any) -> str | None:
        """What the request counts against; None: not counted here."""
        raise NotImplementedError

    def scope_for(self, view: Any) -> str:
        return str(getattr(view, "throttle_scope", "") or self.scope)

    def allow_request(self, request: Request, view: Any) -> bool:
        ident = self.ident(request, view)
        if ident is None:
            return True
        limit(self.scope_for(view), ident)  # raises the API's own 429 (Retry-After, retry_after_seconds)
        return True


class ClientAddressThrottle(ScopedRateThrottle):
    """Per client address."""

    def ident(self, request: Request, view: Any) -> str | None:
        return client_address(request.META)


class DatabaseAnswerThrottle(ClientAddressThrottle):
    """Per client address, for an answer that needs no Redis (it comes from the database): with Redis away
    the limiter cannot count, and the request is answered rather than refused with a 503."""

    def allow_request(self, request: Request, view: Any) -> bool:
        try:
            return super().allow_request(request, view)
        except redis.RedisError:
            return True


class TicketThrottle(ScopedRateThrottle):
    """Per ticket holder (the visitor key, as the status scope counts polls). A request without a valid
    ticket for the view's queue is not counted: the view refuses it with 401 without touching Redis."""

    def ident(self, request: Request, view: Any) -> str | None:
        scheme, _, credentials = str(request.META.get("HTTP_AUTHORIZATION", "")).partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return None
        try:
            claims = tokens.visitor_ticket_decode(credentials.strip(), slug=str(view.kwargs.get("slug", "")))
        except tokens.InvalidTicket:
            return None
        return modes.of_claims(claims).holder(claims)


class StaffLoginThrottle(ClientAddressThrottle):
    """The staff token endpoint (a password login), per client address."""

    scope = "auth"


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
