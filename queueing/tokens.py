"""Tickets, access tokens, signing keys and the JWKS (SPEC 5).

* A **ticket** is what a waiting visitor holds: a simplejwt token of its own type, HS256 with a key of
  its own, audience = the queue's slug. It is checked on every poll, so it must be cheap.
* An **access token** is what an admitted visitor shows the protected site: EdDSA (Ed25519) with a `kid`
  header, so a site can verify it offline against `/.well-known/jwks.json`. It carries the session's
  fencing token; the verify endpoint rejects it once a newer session supersedes it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import Any

import jwt
from django.conf import settings
from django.utils.translation import gettext_noop
from rest_framework_simplejwt.backends import TokenBackend
from rest_framework_simplejwt.exceptions import (
    TokenBackendError,
    TokenBackendExpiredToken,
    TokenError,
)
from rest_framework_simplejwt.tokens import Token

from . import conf, store
from .signing_keys import (
    ACCESS_ALGORITHM,
    key_ring,
)

ISSUER = "waitingroom"


class InvalidTicket(Exception):
    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


class InvalidAccessToken(Exception):
    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


def _derived_secret(purpose: str) -> bytes:
    return _derive(settings.SECRET_KEY, purpose)


@lru_cache(maxsize=16)
def _derive(secret_key: str, purpose: str) -> bytes:
    return hmac.new(secret_key.encode(), purpose.encode(), hashlib.sha256).digest()


# --- Visitors -----------------------------------------------------------------------------------------


def visitor_key(identity: str) -> str:
    """The key a visitor is known by in Redis: 96 bits of a keyed hash of its identity.

    Keyed, so the key in a ticket (which the visitor can read) does not reveal who it is, and nobody can
    derive a key that claims someone else's ticket without the server's secret.
    """
    return _visitor_key(conf.hot().SECRET_KEY, identity)


def former_visitor_keys(identity: str) -> tuple[str, ...]:
    """The keys the same visitor had under each of SECRET_KEY_FALLBACKS (before a rotation of the secret):
    a visitor who comes back with only their cookie is found by them (modes.Tracked)."""
    return tuple(_visitor_key(old, identity) for old in conf.hot().SECRET_KEY_FALLBACKS or ())


def _visitor_key(secret_key: str, identity: str) -> str:
    digest = hmac.new(_derive(secret_key, "waitingroom.visitor"), identity.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:12]).decode()


# --- Tickets ------------------------------------------------------------------------------------------


def _ticket_signing_key() -> str:
    return _ticket_keys()[0]


def _ticket_keys() -> tuple[str, ...]:
    """The key tickets are signed with, then the keys a ticket signed before a rotation of SECRET_KEY may
    carry (derived from each of SECRET_KEY_FALLBACKS): waiting visitors keep their places."""
    hot = conf.hot()
    if hot.WR_TICKET_SIGNING_KEY:
        return (hot.WR_TICKET_SIGNING_KEY,)
    secret_keys = (hot.SECRET_KEY, *hot.SECRET_KEY_FALLBACKS)
    return tuple(_derive(secret, "waitingroom.ticket").hex() for secret in secret_keys)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


# The one header tickets are issued with (PyJWT's own encoding of it, so the two always agree).
TICKET_HEADER = jwt.encode({}, "k" * 32, algorithm="HS256").split(".")[0]


class TicketBackend(TokenBackend):
    """HS256 for tickets, signed and verified strictly and cheaply: every waiting visitor's poll checks one.

    Only the exact header we issue is accepted, so no token can pick its own algorithm (`none`, or HS256
    keyed with a public key); the signature is compared in constant time before the payload is parsed;
    then issuer, audience (the queue) and expiry. PyJWT's general-purpose decode does the same work in
    about three times the time (bench/RESULTS.md).
    """

    def encode(self, payload: dict[str, Any]) -> str:
        claims = {**payload, "aud": self.audience, "iss": self.issuer}
        body = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
        signature = hmac.new(self._key, f"{TICKET_HEADER}.{body}".encode("ascii"), hashlib.sha256).digest()
        return f"{TICKET_HEADER}.{body}.{_b64encode(signature)}"

    def __init__(self, *args: Any, fallback_keys: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keys = (str(self.signing_key).encode(), *(key.encode() for key in fallback_keys))

    def decode(self, token: Any, verify: bool = True) -> dict[str, Any]:
        if not verify:
            return super().decode(token, verify=False)
        try:
            header, payload, signature = str(token).split(".")
            if header != TICKET_HEADER:
                raise ValueError("unexpected header")
            signed, given = f"{header}.{payload}".encode("ascii"), _b64decode(signature)
            # The current key first: a fallback costs a second hash only for a ticket from before a rotation.
            if not any(hmac.compare_digest(hmac.new(k, signed, hashlib.sha256).digest(), given) for k in self._keys):
                raise ValueError("bad signature")
            claims = json.loads(_b64decode(payload))
        except (ValueError, UnicodeError, binascii.Error) as exc:
            raise TokenBackendError("Token is invalid") from exc
        if not isinstance(claims, dict) or claims.get("iss") != self.issuer or claims.get("aud") != self.audience:
            raise TokenBackendError("Token is invalid")
        exp = claims.get("exp")
        if not isinstance(exp, int) or isinstance(exp, bool):
            raise TokenBackendError("Token is invalid")
        if exp <= time.time():
            raise TokenBackendExpiredToken("Token is expired")
        return claims

    @property
    def _key(self) -> bytes:
        return self._keys[0]


@lru_cache(maxsize=1024)
def _ticket_backend(keys: tuple[str, ...], slug: str) -> TicketBackend:
    """Signs with the first key; verifies with any of them."""
    return TicketBackend("HS256", signing_key=keys[0], audience=slug, issuer=ISSUER, fallback_keys=keys[1:])


class TicketToken(Token):
    """A visitor's place in one queue. Claims: aud (slug), tid, seq, pri, ep (the queue's epoch), and pl
    (its line score at join) with iat: enough to put it back in its place if Redis loses the queue."""

    token_type = "wr_ticket"  # noqa: S105 (a type name, not a secret)
    lifetime = timedelta(hours=24)

    def __init__(self, token: Any = None, verify: bool = True, *, slug: str) -> None:
        self.slug = slug
        self.lifetime = settings.WR_TICKET_LIFETIME
        super().__init__(token, verify)

    def get_token_backend(self) -> TokenBackend:
        return _ticket_backend(_ticket_keys(), self.slug)

    def verify(self) -> None:
        # The backend has checked expiry already (as an integer, without datetime arithmetic).
        if "jti" not in self.payload:
            raise TokenError("Token has no id")
        self.verify_token_type()


@dataclass(frozen=True, slots=True)
class TicketClaims:
    slug: str
    ticket_id: str
    seq: int
    visitor_key: str
    priority: int
    epoch: int
    placement: float | None = None  # line score at join (None: not known, or admitted at once)
    issued_at: int = 0  # seconds since the epoch


def _visitor_issue(slug: str, token_type: str, claims: dict[str, Any]) -> str:
    """A visitor ticket as TicketToken would issue it (type, exp, iat, jti, then `claims`), signed by the
    backend directly: a join signs one, and simplejwt's Token (datetimes, a setting lookup per claim)
    cost several times the signature (bench/RESULTS.md)."""
    now = int(time.time())
    payload = {
        "token_type": token_type,
        "exp": now + int(conf.hot().WR_TICKET_LIFETIME.total_seconds()),
        "iat": now,
        "jti": uuid.uuid4().hex,
        **claims,
    }
    return _ticket_backend(_ticket_keys(), slug).encode(payload)


def ticket_issue(
    *, slug: str, ticket_id: str, seq: int, priority: int, epoch: int, placement: float | None = None
) -> str:
    claims: dict[str, Any] = {"tid": ticket_id, "seq": seq, "pri": priority, "ep": epoch}
    if placement is not None:
        claims["pl"] = placement
    return _visitor_issue(slug, TicketToken.token_type, claims)


# Tickets checked lately, with what they carry: a waiting visitor polls with the same ticket every few
# seconds, mostly over a connection kept alive to the same web worker, and the check (a signature, a JSON
# payload, the claims read) was a tenth of a poll's cost. Kept by the ticket's text, the queue and the keys
# it was checked with (a rotation checks again); its expiry is checked at every use. Only tickets that
# passed are kept, the least recently used let go first past CHECKED_MAX: a crowd larger than that, per
# worker, keeps its most frequent pollers, and costs the others a check as before. About 0.5 KB a ticket.
CHECKED_MAX = 32_768
_checked: OrderedDict[tuple[str, str], tuple[VisitorClaims, int, tuple[str, ...]]] = OrderedDict()


def visitor_ticket_decode(raw: str, *, slug: str) -> VisitorClaims:
    """Either kind of visitor ticket for this queue (one signature check), or InvalidTicket (forged,
    tampered, expired, another queue's). Which kind it is chooses the queue mode (modes.of_claims)."""
    keys = _ticket_keys()
    kept = _checked.get((raw, slug))
    if kept is not None and kept[2] == keys and kept[1] > time.time():
        with contextlib.suppress(KeyError):  # another thread let it go a moment ago
            _checked.move_to_end((raw, slug))
        return kept[0]
    try:
        payload = _ticket_backend(keys, slug).decode(raw)
    except TokenBackendExpiredToken as exc:
        raise InvalidTicket(gettext_noop("The ticket has expired."), expired=True) from exc
    except TokenBackendError as exc:
        raise InvalidTicket(gettext_noop("The ticket is not valid for this queue.")) from exc
    claims = _visitor_claims(payload, slug)
    _checked[(raw, slug)] = (claims, int(payload["exp"]), keys)
    while len(_checked) > CHECKED_MAX:
        with contextlib.suppress(KeyError):  # emptied by another thread meanwhile
            _checked.popitem(last=False)
    return claims


def _visitor_claims(payload: dict[str, Any], slug: str) -> VisitorClaims:
    try:
        if "jti" not in payload:
            raise ValueError("no token id")
        if payload.get("token_type") == PositionToken.token_type:
            return PositionClaims(
                slug, _int(payload["sub"]), _int(payload["ep"]), _int(payload.get("iat", 0)), _int(payload.get("q", 0))
            )
        if payload.get("token_type") != TicketToken.token_type:
            raise ValueError("not a ticket")
        ticket_id, seq = str(payload["tid"]), _int(payload["seq"])
        parsed = store.parse_ticket_id(ticket_id)
        if parsed is None or parsed[0] != seq:
            raise ValueError(ticket_id)
        placement = payload.get("pl")
        return TicketClaims(
            slug,
            ticket_id,
            seq,
            parsed[1],
            _int(payload["pri"]),
            _int(payload["ep"]),
            float(placement) if isinstance(placement, int | float) and not isinstance(placement, bool) else None,
            _int(payload.get("iat", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidTicket(gettext_noop("The ticket is not valid for this queue.")) from exc


def held_claims(slug: str, *, ticket_id: str, priority: int, epoch: int) -> TicketClaims | None:
    """What a ticket with this id carries, for a face that found it by its visitor rather than by a signed
    ticket (the waiting page without JavaScript); None for an id that is not a ticket's."""
    parsed = store.parse_ticket_id(ticket_id)
    return None if parsed is None else TicketClaims(slug, ticket_id, parsed[0], parsed[1], priority, epoch)


def _int(value: Any) -> int:
    """An integer claim (a digit string too, as JWT subjects are strings); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(value)
    return int(value)


# --- Stateless mode: a ticket is its number (SPEC 4) --------------------------------------------------

# The visitor key part of a stateless ticket's id: there is no visitor in Redis, only the number.
STATELESS_VISITOR = "w"


class PositionToken(TicketToken):
    """A stateless queue's ticket: its number is its subject (`sub`), with the epoch it was issued in.
    Nothing about it is stored; its state follows from its number and the queue's window."""

    token_type = "wr_position"  # noqa: S105 (a type name, not a secret)


@dataclass(frozen=True, slots=True)
class PositionClaims:
    slug: str
    number: int
    epoch: int
    issued_at: int = 0
    queue_id: int = 0  # the queue's row it was issued for (0: a ticket from before it was said)

    @property
    def ticket_id(self) -> str:
        return store.ticket_id(self.number, STATELESS_VISITOR)


# What a visitor holds: a tracked queue's ticket or a stateless queue's numbered one.
VisitorClaims = TicketClaims | PositionClaims


def position_issue(*, slug: str, number: int, epoch: int, queue_id: int = 0) -> str:
    claims: dict[str, Any] = {"sub": str(number), "ep": epoch}
    if queue_id:
        claims["q"] = queue_id
    return _visitor_issue(slug, PositionToken.token_type, claims)


# --- Access tokens ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccessClaims:
    slug: str
    ticket_id: str
    seq: int
    visitor_key: str
    fence: int
    expires_at: int  # seconds since the epoch
    epoch: int = 0  # the queue's epoch when the session began (0: a token from before epochs)
    stateless: bool = False  # from a stateless queue: no session is kept (its epoch and queue are checked)
    queue_id: int = 0  # a stateless token's queue row (0: not said)


def access_token_issue(
    *,
    slug: str,
    ticket_id: str,
    fence: int,
    expires_ms: int,
    epoch: int = 0,
    stateless: bool = False,
    queue_id: int = 0,
) -> str:
    ring = key_ring()
    payload: dict[str, Any] = {
        "iss": ISSUER,
        "aud": slug,
        "sub": ticket_id,
        "fence": fence,
        "ep": epoch,
        "iat": int(time.time()),
        "exp": expires_ms // 1000,
    }
    if stateless:
        payload["sl"] = 1
        if queue_id:
            payload["q"] = queue_id
    return jwt.encode(payload, ring.signing_key, algorithm=ACCESS_ALGORITHM, headers={"kid": ring.signing_kid})


def access_token_decode(raw: str, *, slug: str) -> AccessClaims:
    """Signature, audience and expiry checked against the published keys; InvalidAccessToken if not."""
    try:
        kid = jwt.get_unverified_header(raw).get("kid")
        if not isinstance(kid, str):
            raise InvalidAccessToken("The access token names no signing key.")
        key = key_ring(kid=kid).public.get(kid)
        if key is None:
            raise InvalidAccessToken("The access token is not signed by a published key.")
        payload = jwt.decode(
            raw,
            key,
            algorithms=[ACCESS_ALGORITHM],
            audience=slug,
            issuer=ISSUER,
            options={"require": ["exp", "aud", "sub", "fence"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise InvalidAccessToken("The access token has expired.", expired=True) from exc
    except (jwt.PyJWTError, UnicodeError) as exc:  # UnicodeError: a lone surrogate cannot be a token
        raise InvalidAccessToken("The access token is not valid for this queue.") from exc
    parsed = store.parse_ticket_id(str(payload["sub"]))
    fence, epoch, queue_id = payload["fence"], payload.get("ep", 0), payload.get("q", 0)
    if parsed is None or any(not isinstance(v, int) or isinstance(v, bool) for v in (fence, epoch, queue_id)):
        raise InvalidAccessToken("The access token is not valid for this queue.")
    return AccessClaims(
        slug,
        str(payload["sub"]),
        parsed[0],
        parsed[1],
        fence,
        int(payload["exp"]),
        epoch,
        payload.get("sl") == 1,
        queue_id,
    )
