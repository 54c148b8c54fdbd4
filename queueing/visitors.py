"""Who a visitor is (SPEC 6.1): the signed-in user; else the signed visitor cookie; else an X-Visitor-Id
header; else a fresh identity, which the response sets as the cookie.

Whoever knows a visitor id gets that visitor's ticket back, so an X-Visitor-Id must be unguessable: an
opaque random value of at least 128 bits (a UUID4 qualifies). Shorter or patterned values are refused.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.http import HttpRequest
from django.utils.crypto import salted_hmac

from . import conf
from .tokens import former_visitor_keys, visitor_key

COOKIE_SALT = "waitingroom.visitor"
MIN_BITS = 128
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_B64URL = re.compile(r"^[A-Za-z0-9_-]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class InvalidVisitorId(ValueError):
    pass


RUN = 10
_REPEATED = re.compile(r"(.)\1{" + str(RUN - 1) + "}")
_ALPHABETS = ("0123456789abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_SEQUENCES = (*_ALPHABETS, *(alphabet[::-1] for alphabet in _ALPHABETS))


# Every RUN consecutive characters of an alphabet, up or down: one set lookup per place in a value.
_RUNS = frozenset(seq[i : i + RUN] for seq in _SEQUENCES for i in range(len(seq) - RUN + 1))


def _has_run(value: str) -> bool:
    """A character repeated RUN times, or RUN consecutive characters of an alphabet, up or down."""
    if _REPEATED.search(value):
        return True
    return any(value[i : i + RUN] in _RUNS for i in range(len(value) - RUN + 1))


def _is_periodic(value: str) -> bool:
    """True when the value is a shorter string repeated ("abcabc..."): it then recurs inside itself twice."""
    return value in (value + value)[1:-1]


def visitor_id_check(value: str) -> None:
    """Refuse an X-Visitor-Id that is too short or patterned to be a random 128-bit value."""
    if len(value) > 128:
        raise InvalidVisitorId("X-Visitor-Id must be at most 128 characters.")
    if _UUID.match(value):
        parsed = uuid.UUID(value)
        if parsed.version != 4 or parsed.variant != uuid.RFC_4122:
            raise InvalidVisitorId("A UUID X-Visitor-Id must be a random (version 4) UUID.")
        body = value.replace("-", "")
    elif _HEX.match(value):
        if len(value) * 4 < MIN_BITS:
            raise InvalidVisitorId("X-Visitor-Id needs at least 128 random bits (32 hex characters).")
        body = value
    elif _B64URL.match(value):
        if len(value) * 6 < MIN_BITS:
            raise InvalidVisitorId("X-Visitor-Id needs at least 128 random bits (22 base64url characters or a UUID4).")
        body = value
    else:
        raise InvalidVisitorId("X-Visitor-Id must be a UUID4, hex or base64url value.")
    lowered = body.lower() if _HEX.match(body) else body
    # A random value of 32 hex or 22 base64url characters shows none of these with probability above
    # 1e-9 (fewer than 6 distinct characters: 3e-13 for hex; a run of 10: 4e-10).
    if len(set(lowered)) < 6 or _is_periodic(lowered) or _has_run(lowered):
        raise InvalidVisitorId("X-Visitor-Id looks patterned; send an opaque random value (a UUID4).")


@dataclass(frozen=True)
class VisitorIdentity:
    key: str  # the visitor key used in Redis and tickets
    user: Any  # the signed-in user, or None
    new_cookie: str | None  # set this as the visitor cookie on the response
    former: tuple[str, ...] = ()  # its keys under SECRET_KEY_FALLBACKS (a ticket from before a rotation)


def _identity(identity: str, user: Any = None, new_cookie: str | None = None) -> VisitorIdentity:
    return VisitorIdentity(visitor_key(identity), user, new_cookie, former_visitor_keys(identity))


def visitor_identity(request: HttpRequest, user: Any = None) -> VisitorIdentity:
    """Resolve the visitor behind a request, in the order SPEC 6.1 gives. InvalidVisitorId on a bad header."""
    if user is not None and getattr(user, "is_authenticated", False):
        return _identity(f"user:{user.pk}", user)
    cookie = request.get_signed_cookie(conf.hot().WR_VISITOR_COOKIE, default=None, salt=COOKIE_SALT)
    if cookie:
        return _identity(f"cookie:{cookie}")
    header = request.META.get("HTTP_X_VISITOR_ID")
    if header is not None:
        visitor_id_check(header)
        return _identity(f"header:{header}")
    fresh = random_visitor_id()
    return VisitorIdentity(visitor_key(f"cookie:{fresh}"), None, fresh)


SEAL_SALT = "waitingroom.identity-seal"


def visitor_cookie_id(request: HttpRequest) -> str | None:
    """The visitor cookie's id, if the request carries a good one."""
    value = request.get_signed_cookie(settings.WR_VISITOR_COOKIE, default=None, salt=COOKIE_SALT)
    return str(value) if value else None


def _sealer() -> MultiFernet:
    """Fernet keys derived from SECRET_KEY (and its fallbacks, so a rotation keeps what was sealed)."""
    secrets_ = [settings.SECRET_KEY, *(settings.SECRET_KEY_FALLBACKS or ())]
    keys = [
        base64.urlsafe_b64encode(salted_hmac(SEAL_SALT, "fernet", secret=k, algorithm="sha256").digest())
        for k in secrets_
    ]
    return MultiFernet([Fernet(key) for key in keys])


def identity_seal(cookie_id: str) -> str:
    """A visitor cookie's id encrypted (a turn notice keeps it so until its e-mail's link is made, and the link
    until it is used): the database alone does not make anyone that visitor."""
    return _sealer().encrypt(cookie_id.encode()).decode()


def identity_unseal(sealed: str) -> str | None:
    """The cookie id identity_seal sealed, or None (not sealed here, or with a key no longer known)."""
    try:
        return _sealer().decrypt(sealed.encode()).decode() or None
    except (InvalidToken, ValueError):
        return None


def link_token_hash(token: str) -> str:
    """What is kept of a place link's token (256 random bits): its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()


def random_visitor_id() -> str:
    """A fresh identity: 128 random bits, base64url (what a client should send as X-Visitor-Id, too)."""
    return secrets.token_urlsafe(16)


def visitor_cookie_set(response: Any, value: str) -> None:
    response.set_signed_cookie(
        settings.WR_VISITOR_COOKIE,
        value,
        salt=COOKIE_SALT,
        max_age=30 * 24 * 3600,
        secure=settings.HTTPS,
        httponly=True,
        samesite="Lax",
    )


def position_cookie_name(slug: str) -> str:
    """A stateless queue's ticket, kept by the browser: its only dedupe (SPEC 4; the ticket is signed)."""
    return f"wr_pos_{slug}"


def position_cookie_set(response: Any, slug: str, ticket: str) -> None:
    response.set_cookie(
        position_cookie_name(slug),
        ticket,
        max_age=int(settings.WR_TICKET_LIFETIME.total_seconds()),
        secure=settings.HTTPS,
        httponly=True,
        samesite="Lax",
    )


# --- Client addresses ----------------------------------------------------------------------------------

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _trusted(address: str) -> bool:
    return _trusted_in(address, tuple(conf.hot().WR_TRUSTED_PROXIES))


# A crowd comes from a few addresses per visitor: each one's answers are worked out once (ipaddress's
# parsing was a join's costliest step after its signature), keyed by the settings they depend on too.
@lru_cache(maxsize=4096)
def _trusted_in(address: str, proxies: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _networks(proxies))


def address_group(address: str) -> str:
    """What per-address limits count: an IPv4 address as it is; an IPv6 one by its network of
    settings.WR_IPV6_PREFIX bits (default /64: one subscriber usually holds a whole /64, so counting single
    IPv6 addresses would give one person unlimited addresses)."""
    return _address_group(address, int(conf.hot().WR_IPV6_PREFIX))


@lru_cache(maxsize=4096)
def _address_group(address: str, prefix: int) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
    return str(ip)


def client_address(meta: Any) -> str:
    """Who a request came from, for per-client limits: its address, IPv6 grouped (`address_group`).

    X-Forwarded-For is believed only when the direct peer is a trusted proxy (settings
    WR_TRUSTED_PROXIES), and then only as far back as the chain stays trusted: the first untrusted hop
    from the right is the client. Anything else the header says could have been written by the client.
    """
    return address_group(_client_ip(meta))


def _client_ip(meta: Any) -> str:
    remote = str(meta.get("REMOTE_ADDR", ""))
    if not _trusted(remote):
        return remote
    hops = [hop.strip() for hop in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return remote  # garbage from beyond the proxies: the proxy is all we know
    return hops[0] if hops else remote
