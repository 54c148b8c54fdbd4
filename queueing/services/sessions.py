"""The protected site's side (SPEC 6.2): verify an access token (its first use starts the session),
complete it (freeing the slot at once), revoke a visitor, and the site's own count of sessions."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .. import clock, realtime, selectors, store, tokens
from ..models import Queue
from . import completions
from .admission import queue_admit
from .errors import NotInStatelessMode, QueueNotFound, TicketNotFound
from .recovery import with_policy


@dataclass(frozen=True)
class VerifyResult:
    valid: bool
    reason: str  # '' when valid; expired | superseded | revoked | full | bound_elsewhere | invalid
    ticket_id: str
    expires_at: int  # seconds since the epoch


BROWSER_SECRET_MAX = 200


# What the binding scripts are given for a verify without a browser's secret that is not the site's own
# server-side check: valid only while nobody has bound the session (session_start.lua, window/bind.lua).
NO_BROWSER = "?"


def browser_digest(secret: str, *, server: bool = False) -> str:
    """What Redis keeps of a browser's secret: a digest (the secret itself stays in the browser's cookie).
    Without one: '' for the site's own server-side check, NO_BROWSER otherwise."""
    if not secret:
        return "" if server else NO_BROWSER
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


def session_verify(
    *,
    slug: str,
    raw_token: str,
    browser: str = "",
    rebind: bool = False,
    server: bool = False,
    now: float | None = None,
) -> VerifyResult:
    """Check an access token; its first successful check turns ADMITTED into ACTIVE.

    `browser`: a secret of the browser presenting the token (the site keeps it in an HttpOnly cookie). The
    first verify that brings one binds the session to that browser; afterwards the token verifies with a
    secret only if it is that one ('bound_elsewhere' otherwise, and without a secret too, issue 50), so one
    admission cannot let several browsers in. `server`: the site's own check with no browser behind it:
    the token alone is checked, bound or not. `rebind` hands
    the session over to this browser on purpose (the protected site's decision, e.g. after the visitor
    proved who they are)."""
    try:
        claims = tokens.access_token_decode(raw_token, slug=slug)
    except tokens.InvalidAccessToken as exc:
        return VerifyResult(False, "expired" if exc.expired else "invalid", "", 0)
    binding = browser_digest(browser, server=server)
    if claims.stateless and (store.mode(slug) or selectors.queue_mode_get(slug)) != Queue.Mode.STATELESS:
        return VerifyResult(False, "invalid", claims.ticket_id, 0)  # signed before a switch to tracked mode
    if claims.stateless:
        # A stateless queue keeps no sessions (SPEC 4): a token it signed is good until it expires, in the
        # browser that first presented it, while its sale goes on (its epoch one of the window's).
        bound = store.window_token_bind(
            slug,
            token_id=claims.ticket_id,
            binding=binding,
            expires_ms=claims.expires_at * 1000,
            epoch=claims.epoch,
            queue_id=claims.queue_id,
            rebind=rebind,
        )
        if bound == "void":  # signed in a sale before a change of mode, or for a queue deleted since
            return VerifyResult(False, "invalid", claims.ticket_id, 0)
        if bound != "ok":
            return VerifyResult(False, "bound_elsewhere", claims.ticket_id, 0)
        return VerifyResult(True, "", claims.ticket_id, claims.expires_at)
    reply = _of_session(
        store.session_start,
        slug,
        claims,
        now,
        expires_ms=claims.expires_at * 1000,
        binding=binding,
        rebind=rebind,
    )
    if reply.freed:
        queue_admit(slug=slug, now=now)
    if reply.result != "valid":
        return VerifyResult(False, reply.result, claims.ticket_id, 0)
    return VerifyResult(True, "", claims.ticket_id, reply.expires_ms // 1000)


class _SessionReply(Protocol):
    @property
    def result(self) -> str: ...


R = TypeVar("R", bound=_SessionReply)


def _of_session(script: Callable[..., R], slug: str, claims: tokens.AccessClaims, now: float | None, **more: Any) -> R:
    """A session script on the session `claims` speak of. Redis may have lost the queue's policy with its
    state (before the next tick mirrors it again): then it is synced and the script runs once more."""
    return with_policy(
        slug,
        lambda: script(
            slug,
            visitor_key=claims.visitor_key,
            seq=claims.seq,
            fence=claims.fence,
            now_ms=clock.now_ms(now),
            epoch=claims.epoch,
            **more,
        ),
        lambda reply: reply.result == "no_config",
    )


def session_complete(
    *, slug: str, claims: tokens.AccessClaims, now: float | None = None, journaled: bool = True
) -> str:
    """End a session and free its slot at once; the next visitor is admitted without waiting for a tick.

    Returns 'completed', 'already' (completing twice is harmless) or why the session is not live. A
    stateless queue's session holds no slot: completing it changes nothing. A completion is kept a while
    for a replay should a failover of the Redis Cluster lose it (completions.py), unless it is that replay.
    """
    if claims.stateless:
        return "completed"
    reply = _of_session(store.complete, slug, claims, now)
    if journaled and reply.result == "completed":
        journal.note(slug, claims, now=time.time())
    realtime.send(realtime.queue_move(slug, reply.moves))
    if reply.freed:
        queue_admit(slug=slug, now=now)
    return reply.result


def _again(slug: str, claims: tokens.AccessClaims, now: float) -> str:
    return session_complete(slug=slug, claims=claims, now=now, journaled=False)


# This process's completions, made again should a failover of the Redis Cluster lose them.
journal = completions.Journal(_again)


def session_revoke(*, slug: str, ticket_id: str, now: float | None = None) -> str:
    """Throw a visitor out (waiting or in session). Returns 'revoked' or 'already'."""
    if store.parse_ticket_id(ticket_id) is None:
        raise TicketNotFound(ticket_id)
    if selectors.queue_mode_get(slug) == Queue.Mode.STATELESS:
        raise NotInStatelessMode("A stateless queue keeps no tickets or sessions to revoke.")
    reply = store.revoke(slug, ticket_id=ticket_id, now_ms=clock.now_ms(now))
    if reply.result == "not_found":
        raise TicketNotFound(ticket_id)
    if reply.result == "revoked":
        realtime.send(realtime.expired(slug, [ticket_id], "revoked") + realtime.queue_move(slug, reply.moves))
    if reply.freed:
        queue_admit(slug=slug, now=now)
    return reply.result


def capacity_report(*, slug: str, in_use: int, now: float | None = None) -> tuple[int, int, str]:
    """The protected site's own absolute count of sessions in use (seed 001); admits at once if room.

    Returns (capacity, slots in use after that admission, capacity source). A stateless queue's window
    stands still while the site reports itself full (capacity_source = reported)."""
    if selectors.queue_mode_get(slug) == Queue.Mode.STATELESS:
        store.window_capacity_report(slug, in_use=in_use, now_ms=clock.now_ms(now))
        config = store.config_read(slug)
        return int(config.get("capacity") or 0), in_use, config.get("capacity_source", "counted")
    reply = with_policy(
        slug, lambda: store.capacity_report(slug, in_use=in_use, now_ms=clock.now_ms(now)), lambda r: r is None
    )
    if reply is None:
        raise QueueNotFound(slug)
    capacity, used, source = reply.capacity, reply.used, reply.source
    figures = queue_admit(slug=slug, now=now).figures
    if figures is not None:
        capacity, used = figures.capacity, figures.used
    return capacity, used, source
