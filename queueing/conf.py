"""The settings the visitor hot path reads on every request, copied once.

Django's `settings` costs about a microsecond an attribute (LazyObject.__getattribute__ probes every value
it returns for `_mask_wrapped`, an AttributeError each time), and a status poll read a dozen of them (a join
twenty):
several percent of its Python. `hot()` is a plain copy of those few, dropped whenever a setting changes
(Django's setting_changed: override_settings, the tests' settings fixture), so it never goes stale.
Anything read once, or rarely, reads `settings` as usual.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

HOT = (
    "REDIS_URL",
    "REDIS_CLUSTER_NODES",
    "WR_REDIS_PREFIX",
    "WR_RATE_LIMITS",
    "WR_TICKET_SIGNING_KEY",
    "WR_TICKET_LIFETIME",
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "ALLOWED_HOSTS",
    "DEBUG",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
    "USE_X_FORWARDED_HOST",
    # a join's
    "SESSION_COOKIE_NAME",
    "WR_VISITOR_COOKIE",
    "WR_TRUSTED_PROXIES",
    "WR_IPV6_PREFIX",
    "WR_WS_BASE_URL",
)

_copy: SimpleNamespace | None = None


def hot() -> Any:
    """The hot settings, as attributes (`hot().REDIS_URL`)."""
    global _copy
    found = _copy
    if found is None:
        found = _copy = SimpleNamespace(**{name: getattr(settings, name) for name in HOT})
    return found


def _forget(**kwargs: Any) -> None:
    global _copy
    _copy = None


setting_changed.connect(_forget, dispatch_uid="queueing.conf")
