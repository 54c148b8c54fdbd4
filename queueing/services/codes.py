"""Priority codes (SPEC 3.1): a code's use taken and given back, codes generated in bulk, the level a
signed-in user's groups give, and a waiting visitor's code entered on the page (issue 20), which moves the
ticket up to where a joiner of the code's level would be placed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from .. import clock, ratelimit, realtime, selectors, store
from ..models import PriorityCode, PriorityLevel, Queue, priority_code_new
from .admission import queue_admit
from .audit import queue_change_record
from .errors import InvalidPriorityCode, NotInLine, TicketNotFound
from .recovery import with_policy


def priority_code_reserve(*, slug: str, code: str, address: str = "") -> int:
    """Take one use of a priority code; returns its level. InvalidPriorityCode if it cannot be used.

    Joins that carry a code are counted per client `address` in their own scope (`priority_code`),
    before the code is looked up: past the limit even a right code is refused (ratelimit.Limited), or a
    guesser would learn from the answers; joins without a code are not counted there. Wrong codes are
    counted per queue too, from any address (`priority_code_failed`, 200 in 10 minutes by default): past
    that, every code tried for the queue is refused until the limiter lets one through again (issue 50:
    guesses from many addresses were limited per address only)."""
    if address:
        selectors.limit_check("priority_code", address)
    locked = store.codes_locked(slug)
    if locked > 0:
        raise ratelimit.Limited(ratelimit.Decision(False, locked, 0))
    try:
        # Checked as admin checks codes before any SQL: a NUL or a lone surrogate would fail in the database.
        PriorityCode._meta.get_field("code").run_validators(code)
    except ValidationError as exc:
        raise InvalidPriorityCode(code) from exc
    now = timezone.now()
    usable = PriorityCode.objects.filter(queue__slug=slug, code=code).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )
    # One conditional UPDATE, so parallel joins cannot use a code more often than its limit.
    taken = usable.filter(Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses"))).update(uses=F("uses") + 1)
    if not taken:
        _wrong_code(slug)
        raise InvalidPriorityCode(code)
    return PriorityCode.objects.values_list("level", flat=True).get(queue__slug=slug, code=code)


def _wrong_code(slug: str) -> None:
    """Count a wrong code for the queue; past its limit, lock the queue's codes for as long as the limiter
    says (this attempt is answered as the wrong code it was)."""
    try:
        selectors.limit_check("priority_code_failed", slug)
    except ratelimit.Limited as exc:
        store.codes_lock(slug, seconds=max(1.0, exc.decision.retry_after))


PRIORITY_CODES_MAX = 10_000  # generated in one go


def priority_codes_generate(
    queue: Queue,
    *,
    count: int,
    level: int,
    max_uses: int | None = None,
    expires_at: Any = None,
    actor: Any = None,
    actor_label: str = "",
) -> list[PriorityCode]:
    """`count` fresh codes of `level` for `queue` (96 random bits each: models.priority_code_new), in one
    transaction, audited (how many and their terms, never the codes themselves)."""
    if not 1 <= count <= PRIORITY_CODES_MAX:
        raise ValidationError({"count": f"Between 1 and {PRIORITY_CODES_MAX:,}."})
    codes = [
        PriorityCode(queue=queue, code=priority_code_new(), level=level, max_uses=max_uses, expires_at=expires_at)
        for _ in range(count)
    ]
    for code in codes[:1]:
        code.full_clean(exclude=["queue"])
    with transaction.atomic():
        PriorityCode.objects.bulk_create(codes)
        terms = {"codes": count, "level": level, "max_uses": max_uses, "expires_at": expires_at}
        queue_change_record(
            queue, action="codes_generated", before={}, after=terms, actor=actor, actor_label=actor_label
        )
    return codes


def priority_code_release(*, slug: str, code: str) -> None:
    PriorityCode.objects.filter(queue__slug=slug, code=code, uses__gt=0).update(uses=F("uses") - 1)


def priority_for_user(*, slug: str, user: AbstractBaseUser | AnonymousUser | None) -> int:
    """The highest level a signed-in user gets from group membership (0 for everyone else)."""
    if user is None or not user.is_authenticated:
        return 0
    level = (
        PriorityLevel.objects.filter(queue__slug=slug, group__user__pk=user.pk)
        .order_by("-level")
        .values_list("level", flat=True)
        .first()
    )
    return int(level or 0)


@dataclass(frozen=True)
class Promotion:
    """A code a waiting visitor entered: `promoted` (its level is the code's now) or not (it had that level
    or a higher one already, and the code's use was given back); its place before and the ticket now."""

    promoted: bool
    before: int
    ticket: store.TicketState


def ticket_promote(
    *, slug: str, visitor_key: str, seq: int, code: str, address: str = "", now: float | None = None
) -> Promotion:
    """A waiting visitor's priority code (the waiting page's "Have a code?"): one use of the code is taken
    and the ticket moves up as a joiner of the code's level would be placed now, never back (lua/promote.lua).

    InvalidPriorityCode (unknown, used up, expired; ratelimit.Limited past the address's tries, as joins
    with a code); NotInLine when the ticket is admitted, in a session or finished; TicketNotFound when the
    queue no longer knows it. The code's use is given back whenever it moved nobody. A code that cannot be
    used any more is still answered as kept (not promoted) for a ticket that has its level already: the
    visitor who used a single-use code and enters it again is told it is applied, not that it is unknown."""

    def promoted(level: int) -> store.PromoteReply:
        return store.promote(slug, visitor_key=visitor_key, seq=seq, level=level, now_ms=clock.now_ms(now))

    try:
        level = priority_code_reserve(slug=slug, code=code, address=address)
    except InvalidPriorityCode:
        held = _code_held(slug=slug, code=code, promoted=promoted)
        if held is None:
            raise
        return held
    try:
        reply = with_policy(slug, lambda: promoted(level), lambda reply: reply.outcome == "no_config")
    except Exception:
        priority_code_release(slug=slug, code=code)
        raise
    realtime.send(realtime.queue_move(slug, reply.moves))
    if reply.outcome != "promoted":
        priority_code_release(slug=slug, code=code)
    if reply.freed:
        queue_admit(slug=slug, now=now)
    if reply.outcome == "not_waiting":
        raise NotInLine(slug)
    if reply.outcome not in ("promoted", "kept") or reply.ticket is None:
        raise TicketNotFound(slug)
    return Promotion(reply.outcome == "promoted", reply.before, reply.ticket)


def _code_held(*, slug: str, code: str, promoted: Callable[[int], store.PromoteReply]) -> Promotion | None:
    """The ticket's place, kept, when it has the level of a code of this queue that can no longer be used
    (used up, perhaps by this very ticket, or expired since); None when the code is not one of the queue's
    or the ticket does not have its level (the refusal stands)."""
    try:
        PriorityCode._meta.get_field("code").run_validators(code)
    except ValidationError:
        return None
    level = PriorityCode.objects.filter(queue__slug=slug, code=code).values_list("level", flat=True).first()
    if level is None:
        return None
    # Level 0 raises nobody: promote.lua answers 'kept' with the ticket's level and place (a poll's writes).
    reply = with_policy(slug, lambda: promoted(0), lambda reply: reply.outcome == "no_config")
    realtime.send(realtime.queue_move(slug, reply.moves))  # a parked visitor back at its place
    if reply.outcome != "kept" or reply.ticket is None or reply.ticket.priority < level:
        return None
    return Promotion(False, reply.before, reply.ticket)
