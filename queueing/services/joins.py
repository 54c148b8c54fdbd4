"""Joins (SPEC 3.1, 4): a ticket in a tracked queue (idempotent per visitor; priority levels and codes,
codes.py; the per-address cap, the proof-of-work gate) or a number in a stateless one; leaving."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import clock, flows, pow, realtime, selectors, store, tokens
from ..selectors import Polled
from .admission import queue_admit
from .codes import priority_code_release, priority_code_reserve
from .errors import (
    ProofOfWorkRequired,
    ProofOfWorkReused,
    QueueClosed,
    QueueFull,
    QueueNotOpen,
    TicketCapReached,
    WrongMode,
)
from .recovery import needs_sync, policy_flow, with_policy


@dataclass(frozen=True)
class JoinResult:
    created: bool
    reply: store.TicketReply

    @property
    def ticket(self) -> store.TicketState:
        assert self.reply.ticket is not None
        return self.reply.ticket


def queue_join_flow(
    *,
    slug: str,
    visitor_key: str,
    priority: int = 0,
    priority_code: str = "",
    display_name: str = "",
    address: str = "",
    proof: pow.Solved | None = None,
    now: float | None = None,
    limit: store.LimitCall | None = None,
) -> flows.Flow[JoinResult]:
    """Give the visitor a ticket, or its existing live one (idempotent per visitor). With `limit` (the
    join's rate limiter), it is counted before anything else: in the join's own script, or in a round trip
    of its own before a priority code is taken.

    A priority code's use is taken before the join and given back when the visitor already had a ticket,
    so retries never spend a code twice.
    """
    if priority_code:
        yield from selectors.limit_flow(limit)
        limit = None
        code = priority_code
        priority = max(
            priority, (yield from flows.blocking(lambda: priority_code_reserve(slug=slug, code=code, address=address)))
        )
    gate = [limit]

    def joined() -> flows.Flow[Polled[JoinResult]]:
        plan = join_plan(
            slug=slug,
            visitor_key=visitor_key,
            priority=priority,
            display_name=display_name,
            address=address,
            proof=proof,
            now=now,
            limit=gate.pop() if gate else None,  # counted once: a join again after a sync runs without it
        )
        return flows.execute(plan)

    try:
        polled = yield from policy_flow(slug, joined, lambda polled: needs_sync(polled.value.reply))
    except GeneratorExit:
        raise
    except BaseException:  # a cancelled request's too (flows.adrive throws it in): the code's use given back
        if priority_code:
            yield from flows.blocking(lambda: priority_code_release(slug=slug, code=priority_code))
        raise
    if priority_code and (polled.refusal is not None or not polled.value.created):
        # Refused, or the visitor had a ticket already: the code moved nobody.
        yield from flows.blocking(lambda: priority_code_release(slug=slug, code=priority_code))
    yield from flows.publish(polled.messages)  # (failing here, the join stands, and its code stays spent)
    result = polled.outcome()
    if result.ticket.freed:
        yield from flows.blocking(lambda: queue_admit(slug=slug, now=now))
    return result


queue_join = flows.synchronous(queue_join_flow)  # Give the visitor a ticket, or its existing live one.


def join_plan(
    *,
    slug: str,
    visitor_key: str,
    priority: int = 0,
    display_name: str = "",
    address: str = "",
    proof: pow.Solved | None = None,
    now: float | None = None,
    limit: store.LimitCall | None = None,
) -> store.Plan[Polled[JoinResult]]:
    """A join as one round trip's plan (with `limit`, the join's rate limiter first in the same script).

    Reading it gives the result, the events to publish (the new place in line) and the refusal, if the
    queue refused the join (closed, full, not open, capped, proof of work; WrongMode when Redis has no
    tracked policy for the queue: see `needs_sync`). ratelimit.Limited is raised at once: nothing ran."""
    plan = store.join_plan(
        slug,
        visitor_key=visitor_key,
        now_ms=clock.now_ms(now),
        priority=priority,
        display_name=display_name,
        address=address,
        pow_bits=proof.bits if proof else 0,
        pow_id=proof.challenge_id if proof else "",
        pow_ttl_ms=pow.CHALLENGE_TTL_SECONDS * 1000 + 1000,
        limit=limit,
    )

    def read(replies: tuple[store.TicketReply | None, store.LimitReply | None]) -> Polled[JoinResult]:
        reply, limited = replies
        selectors.limit_decided(limited)
        assert reply is not None
        result = JoinResult(created=reply.outcome == "created", reply=reply)
        if reply.outcome in ("stateless", "no_config", "no_seq"):
            # no_config and no_seq: the caller syncs the policy and joins again. Still no policy after the
            # sync: the tracked scripts keep no live state for this queue, as after a switch to stateless
            # mode (the mode's new epoch is live only in the window).
            return Polled(result, [], WrongMode(slug))
        messages = realtime.queue_move(slug, reply.moves, reply.figures.waiting if reply.figures else None)
        return Polled(result, messages, _refusal(slug, reply))

    return plan.then(read)


# What join.lua and window/join.lua answer when they refuse a join (a stateless queue is never capped).
REFUSED_BY: dict[str, type[Exception]] = {
    "closed": QueueClosed,
    "not_open": QueueNotOpen,
    "capped": TicketCapReached,
    "pow_required": ProofOfWorkRequired,
    "pow_reused": ProofOfWorkReused,
}


def _refusal(slug: str, reply: store.TicketReply) -> Exception | None:
    """Why the join script refused a join (None: it did not)."""
    outcome, _, bits = reply.outcome.partition(":")
    if outcome == "pow_required" and bits:
        return ProofOfWorkRequired(slug, int(bits))  # the gate asks more of this address
    if outcome in REFUSED_BY:
        return REFUSED_BY[outcome](slug)
    if reply.outcome == "full":
        figures = reply.figures
        retry = 30
        if figures is not None and figures.outflow_per_minute > 0:
            retry = max(5, min(300, int(60 * 10 / figures.outflow_per_minute)))
        return QueueFull(retry)
    return None


def stateless_join_flow(
    *, slug: str, proof: pow.Solved | None = None, now: float | None = None, limit: store.LimitCall | None = None
) -> flows.Flow[store.Window]:
    """A new number in a stateless queue (SPEC 4): an increment in Redis, nothing stored per visitor.
    Gives the window as the join left it; the number is `window.next_number`. With `limit` (the join's
    rate limiter), it is counted first, in the same script."""
    gate = [limit]

    def joined() -> flows.Flow[Polled[tuple[str, store.Window]]]:
        plan = stateless_join_plan(slug=slug, proof=proof, now=now, limit=gate.pop() if gate else None)
        return flows.execute(plan)

    polled = yield from policy_flow(slug, joined, lambda polled: polled.value[0] in ("no_config", "no_seq"))
    return polled.outcome()[1]


queue_join_stateless = flows.synchronous(stateless_join_flow)  # A new number in a stateless queue.


def stateless_join_plan(
    *, slug: str, proof: pow.Solved | None = None, now: float | None = None, limit: store.LimitCall | None = None
) -> store.Plan[Polled[tuple[str, store.Window]]]:
    """A stateless join as one round trip's plan (with `limit`, the join's rate limiter first in the same
    script). Reading it gives (outcome, window) and the refusal, if the queue refused the join; no_config
    and no_seq: the caller syncs the policy and joins again (still no_config after that: WrongMode, the
    queue is not, or no longer, stateless). ratelimit.Limited is raised at once: nothing ran."""
    plan = store.window_join_plan(
        slug,
        now_ms=clock.now_ms(now),
        pow_bits=proof.bits if proof else 0,
        pow_id=proof.challenge_id if proof else "",
        pow_ttl_ms=pow.CHALLENGE_TTL_SECONDS * 1000 + 1000,
        limit=limit,
    )

    def read(
        replies: tuple[tuple[str, store.Window] | None, store.LimitReply | None],
    ) -> Polled[tuple[str, store.Window]]:
        joined, limited = replies
        selectors.limit_decided(limited)
        assert joined is not None
        return Polled(joined, [], _stateless_refusal(slug, *joined))

    return plan.then(read)


def _stateless_refusal(slug: str, outcome: str, window: store.Window) -> Exception | None:
    """Why window/join.lua refused a join (None: it did not)."""
    if outcome == "full":
        return QueueFull(max(5, min(300, window.interval_ms // 1000)))
    if outcome in ("no_config", "no_seq"):
        return WrongMode(slug)
    return REFUSED_BY[outcome](slug) if outcome in REFUSED_BY else None


def pow_difficulty_get(*, slug: str) -> int:
    """The queue's proof-of-work difficulty now (0: no gate), from its policy in Redis; QueueNotFound."""
    config = with_policy(slug, lambda: selectors.queue_policy_get(slug))
    return int(config.get("pow_difficulty") or 0)


def pow_challenge_issue(*, slug: str, bits: int = 0) -> dict[str, Any]:
    """A proof-of-work challenge at the queue's difficulty now (no SQL: the policy is in Redis), or at `bits`
    where the gate asks more of a client (ProofOfWorkRequired.bits)."""
    return pow.challenge_issue(slug, max(bits, pow_difficulty_get(slug=slug)))


def ticket_leave(*, slug: str, claims: tokens.TicketClaims, now: float | None = None) -> bool:
    """The visitor gives up its ticket. Returns False when it had already finished (harmless)."""
    reply = store.leave(slug, visitor_key=claims.visitor_key, seq=claims.seq, now_ms=clock.now_ms(now))
    realtime.send(realtime.queue_move(slug, reply.moves))
    if reply.freed:
        queue_admit(slug=slug, now=now)
    return reply.result == "left"
