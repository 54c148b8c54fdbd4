"""Turn notices (issue 20, "Notify me"): a waiting visitor leaves an e-mail address and is told, in their
language, when their turn is near (a link back to their place) and when it comes (a link of its own, which
takes them through; each works once, models.PlaceLink); the address is deleted once the turn is told, the
ticket ends, the sale ends (the queue is closed), or the ticket's lifetime is over.

A notice keeps its ticket present while the visitor is away from the page (presence and parking, SPEC 3.4),
as the page's own polls would: its record is seen until the notice's end (store.notice_keep, lua/notice.lua).
`turn_notices_send` runs every few seconds (the "Turn notices" periodic task); its work does not grow with the
notices kept (issue 50): per queue with notices, one script (store.notices_read, lua/notices.lua) gives the
noticed tickets that left the line since the last run and those near the head whose nearness is not told,
and only those are read and written to. After the queue's live state was lost (or before the first run) the
run keeps every notice of the database again, once. Each e-mail is claimed by one conditional UPDATE or
DELETE before it is sent, so two runs at once send it once; an e-mail the SMTP server refused is given back
and tried on the next run.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from .. import selectors, store, tokens
from ..models import PlaceLink, Queue, QueueText, TurnNotice
from ..selectors import TicketGone, TicketView
from ..templatetags.waiting import epoch_clock, wait_text
from ..visitors import identity_unseal, link_token_hash
from .errors import NoticesFull, NotInLine, QueueNotFound
from .recovery import with_policy

logger = logging.getLogger(__name__)

EMAIL_MAX = 254
WIDE_PREFIX = 48
PLACE_TOKEN_BYTES = 32
SMTP_TIMEOUT_SECONDS = 10
DUE_READ_MAX = 500  # noticed tickets that left the line, read a run per queue (the rest on the next)


def turn_notice_request(
    *, claims: tokens.TicketClaims, email: str, language: str, link: str, sealed: str = "", address: str = ""
) -> TurnNotice:
    """Keep `email` to tell this waiting ticket's visitor when their turn is near and when it comes (one
    address per ticket: asking again replaces it, and the turn's nearness is told again). `link`: the
    waiting page's address; `sealed`: the visitor's identity (visitors.identity_seal) when each e-mail is
    to carry a place link that takes another browser there, else ''.

    ValidationError for an address that is not one; NotInLine when the ticket is no longer waiting
    (TicketGone when its queue does not know it); ratelimit.Limited past the address's `notify` limit (or
    its /48's, `notify_wide`, for IPv6); NoticesFull when the queue keeps WR_NOTIFY_MAX_PER_QUEUE already."""
    if address:
        selectors.limit_check("notify", address)
        wide = _wide_group(address)
        if wide:  # an IPv6 client's /48 too: one /48 holds 65,536 /64s (issue 50)
            selectors.limit_check("notify_wide", wide)
    email = email.strip()
    if len(email) > EMAIL_MAX:
        raise ValidationError("Enter a valid email address.", code="invalid")
    validate_email(email)
    view = _read(claims)
    if view.status != "waiting":
        raise NotInLine(claims.slug)
    queue = Queue.objects.filter(slug=claims.slug).only("pk").first()
    if queue is None:
        raise QueueNotFound(claims.slug)
    kept = TurnNotice.objects.filter(queue=queue)
    if kept.count() >= settings.WR_NOTIFY_MAX_PER_QUEUE and not kept.filter(ticket_id=claims.ticket_id).exists():
        raise NoticesFull(claims.slug)  # (asking again for the same ticket replaces its address)
    notice, _created = TurnNotice.objects.update_or_create(
        queue=queue,
        ticket_id=claims.ticket_id,
        defaults={
            "email": email,
            "language": language,
            "link": link,
            "sealed": sealed,
            "epoch": claims.epoch,
            "near_sent_at": None,
        },
    )
    if _keep(notice, claims.slug) != "ok":  # it left the line since it was read: nothing kept
        notice.delete()
        raise NotInLine(claims.slug)
    return notice


def _keep(notice: TurnNotice, slug: str, *, told: bool = False) -> str:
    """The notice's ticket noticed in the queue's live state, and present until the notice's end."""
    until = notice.created_at + settings.WR_TICKET_LIFETIME
    return with_policy(
        slug,
        lambda: store.notice_keep(
            slug, ticket_id=notice.ticket_id, until_ms=int(until.timestamp() * 1000), now_ms=_ms(), told=told
        ),
        lambda kept: kept == "no_config",
    )


def _wide_group(address: str) -> str:
    """The /48 an IPv6 client's group (visitors.address_group: its /64) is in; '' for IPv4."""
    try:
        network = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return ""
    if network.version != 6 or network.prefixlen < WIDE_PREFIX:
        return ""
    return str(network.supernet(new_prefix=WIDE_PREFIX))


def _read(claims: tokens.TicketClaims, now: float | None = None) -> TicketView:
    """The ticket's state (its heartbeat too), the queue's policy synced once if Redis lost it."""
    return with_policy(claims.slug, lambda: selectors.polled(selectors.ticket_status_plan(claims=claims, now=now)))


def _near(view: TicketView) -> bool:
    if view.drawn_at_start or view.position is None:
        return False  # a pre-queue's places are drawn at the start: nobody is near before then
    if view.position <= settings.WR_NOTIFY_NEAR_PLACES:
        return True
    seconds = view.estimated_wait_seconds
    return seconds is not None and seconds <= settings.WR_NOTIFY_NEAR_SECONDS


def turn_notices_send(*, now: float | None = None) -> int:
    """Tell every noticed visitor whose turn is near or has come; forget those whose ticket ended. Returns
    how many e-mails were sent."""
    moment = time.time() if now is None else now
    _lapsed_forget(moment)
    PlaceLink.objects.filter(expires_at__lt=datetime.fromtimestamp(moment, tz=UTC)).delete()
    sent = 0
    for queue in Queue.objects.filter(Exists(TurnNotice.objects.filter(queue=OuterRef("pk")))):
        sent += _queue_run(queue, moment)
    return sent


def _lapsed_forget(moment: float) -> None:
    """Notices past the ticket's lifetime go (their tickets' promise of presence ends with them)."""
    lifetime = settings.WR_TICKET_LIFETIME.total_seconds()
    lapsed = TurnNotice.objects.filter(created_at__lt=datetime.fromtimestamp(moment - lifetime, tz=UTC))
    by_queue: dict[str, list[str]] = {}
    for slug, ticket_id in lapsed.values_list("queue__slug", "ticket_id"):
        by_queue.setdefault(slug, []).append(ticket_id)
    lapsed.delete()
    for slug, ticket_ids in by_queue.items():
        store.notices_forget(slug, noticed=ticket_ids)


def _queue_run(queue: Queue, moment: float) -> int:
    slug = queue.slug

    def read() -> store.NoticesReply | None:
        return store.notices_read(
            slug,
            now_ms=int(moment * 1000),
            places=settings.WR_NOTIFY_NEAR_PLACES,
            seconds=settings.WR_NOTIFY_NEAR_SECONDS,
            most_due=DUE_READ_MAX,
        )

    try:
        reading = with_policy(slug, read, lambda reply: reply is None)
    except QueueNotFound:
        return 0
    if reading is None:
        return 0
    notices = TurnNotice.objects.filter(queue=queue)
    if reading.state == "closed" or reading.mode == Queue.Mode.STATELESS:
        notices.delete()  # the sale is over, or its numbers are not followed one by one any more
        store.notices_clear(slug)
        return 0
    sent = 0
    if not reading.seeded:  # its live state began since (lost, or before the first run): kept again, once
        sent += sum(_settle(_of(notice, queue), moment, seeding=True)[0] for notice in notices.iterator())
        store.notices_seeded(slug)
        reading = read() or reading
    named = notices.filter(ticket_id__in=[*reading.due, *reading.near])
    found = {notice.ticket_id: _of(notice, queue) for notice in named}
    settled: list[str] = []
    for ticket_id in reading.due:
        notice = found.get(ticket_id)
        told, done = _settle(notice, moment) if notice else (0, True)
        sent += told
        if done:
            settled.append(ticket_id)
    store.notices_forget(slug, due=settled)
    sent += _near_run(slug, found, reading.near, moment)
    return sent


def _of(notice: TurnNotice, queue: Queue) -> TurnNotice:
    notice.queue = queue  # (read once for the run, not once a notice)
    return notice


def _near_run(slug: str, found: dict[str, TurnNotice], ticket_ids: list[str], moment: float) -> int:
    """Tell those near the head whose nearness is not told yet (notices.lua found them)."""
    store.notices_forget(slug, noticed=[ticket_id for ticket_id in ticket_ids if ticket_id not in found])
    near = [found[ticket_id] for ticket_id in ticket_ids if ticket_id in found]
    # One told already, or claimed by a run sending it now, is left to the run that claimed it: that run marks
    # it told once sent (_settle), or gives it back when the SMTP server refused it.
    return sum(_settle(notice, moment)[0] for notice in near if notice.near_sent_at is None)


def _settle(notice: TurnNotice, moment: float, *, seeding: bool = False) -> tuple[int, bool]:
    """Read the notice's ticket and do what its state asks: tell the turn, tell its nearness, or forget the
    notice. Returns (e-mails sent, whether the run is done with it: not when an e-mail was refused). While
    seeding, a waiting ticket is kept noticed again (its record restored first, if it can be)."""
    slug = notice.queue.slug
    claims = tokens.held_claims(slug, ticket_id=notice.ticket_id, priority=0, epoch=notice.epoch)
    try:
        if claims is None:
            raise TicketGone(slug)
        view = _read(claims, moment)
        if seeding and view.status == "waiting" and _keep(notice, slug, told=notice.near_sent_at is not None) != "ok":
            view = _read(claims, moment)  # it left the line meanwhile: as it is now
    except (TicketGone, QueueNotFound):
        notice.delete()
        return 0, True
    if view.status in ("admitted", "active"):
        sent = _turn_tell(notice, view)
        return sent, sent == 1 or not TurnNotice.objects.filter(pk=notice.pk).exists()
    if view.is_finished or view.queue_state == "closed":
        notice.delete()  # it ended without a turn (left, expired, revoked), or the sale did: nothing kept
        return 0, True
    if notice.near_sent_at is None and _near(view) and _near_tell(notice, view):
        store.notice_told(slug, notice.ticket_id)  # (notices.lua finds it near no more)
        return 1, True
    return 0, True


def _near_tell(notice: TurnNotice, view: TicketView) -> int:
    claimed = TurnNotice.objects.filter(pk=notice.pk, near_sent_at__isnull=True).update(near_sent_at=_now())
    if not claimed:
        return 0  # another run tells it
    with translation.override(notice.language):
        subject = _("%(queue)s: your turn is near") % {"queue": _queue_name(notice)}
        body = _(
            "You are number %(position)s in line for %(queue)s. Estimated wait: %(wait)s.\n\n"
            "Come back to your place now, so that you are there when your turn comes:\n%(link)s\n\n"
            "When it comes we will e-mail you again; your turn is then held for you for %(held)s."
        ) % {
            "position": view.position,
            "queue": _queue_name(notice),
            "wait": wait_text(view.estimated_wait_seconds),
            "link": _place_url(notice),
            "held": wait_text(notice.queue.claim_ttl),
        }
    if _send(notice, subject, body):
        return 1
    TurnNotice.objects.filter(pk=notice.pk).update(near_sent_at=None)  # tried again on the next run
    return 0


def _turn_tell(notice: TurnNotice, view: TicketView) -> int:
    with transaction.atomic():
        claimed, _kinds = TurnNotice.objects.filter(pk=notice.pk).delete()
    if not claimed:
        return 0
    held_until = int(view.expires_at or 0) - notice.queue.session_ttl + notice.queue.claim_ttl
    with translation.override(notice.language), timezone.override(notice.queue.time_zone):
        subject = _("%(queue)s: it's your turn") % {"queue": _queue_name(notice)}
        body = _(
            "It's your turn in line for %(queue)s.\n\nGo through now:\n%(link)s\n\n"
            "Your turn is held until %(until)s; after that it passes to the next in line."
        ) % {"queue": _queue_name(notice), "link": _place_url(notice), "until": epoch_clock(held_until)}
    if _send(notice, subject, body):
        return 1
    notice.pk = None  # refused: kept again (a new row) and tried on the next run
    notice.save()
    return 0


def _place_url(notice: TurnNotice) -> str:
    """The link an e-mail carries: a new place link (its token random, kept hashed) when the visitor asked
    from the page with its cookie; else the waiting page."""
    if not notice.sealed:
        return notice.link
    token = secrets.token_urlsafe(PLACE_TOKEN_BYTES)
    PlaceLink.objects.create(
        queue=notice.queue,
        ticket_id=notice.ticket_id,
        epoch=notice.epoch,
        token_hash=link_token_hash(token),
        sealed=notice.sealed,
        expires_at=_now() + settings.WR_TICKET_LIFETIME,
    )
    return f"{notice.link}?{urlencode({'resume': token})}"


@dataclass(frozen=True)
class PlaceOffer:
    """What a place link offers: the ticket's place now, and whose it is."""

    link_id: int
    cookie_id: str
    view: TicketView


def place_link_read(*, slug: str, token: str) -> PlaceOffer | None:
    """The place a link offers; None for a link that is not one, was used, is past its time, or whose ticket
    ended (or belongs to an epoch that is over). Reading it changes nothing (but counts as the ticket's
    heartbeat, as a poll would)."""
    now = _now()
    found = PlaceLink.objects.filter(
        token_hash=link_token_hash(token), queue__slug=slug, used_at__isnull=True, expires_at__gt=now
    ).first()
    if found is None:
        return None
    cookie_id = identity_unseal(found.sealed)
    claims = tokens.held_claims(slug, ticket_id=found.ticket_id, priority=0, epoch=found.epoch)
    if cookie_id is None or claims is None or claims.visitor_key != tokens.visitor_key(f"cookie:{cookie_id}"):
        return None
    try:
        view = _read(claims)
    except (TicketGone, QueueNotFound):
        return None
    if view.is_finished:
        return None
    return PlaceOffer(found.pk, cookie_id, view)


def place_link_take(*, slug: str, token: str) -> str | None:
    """Use a place link: the visitor cookie's id it gives (once: one conditional UPDATE, so two browsers
    racing get it once), or None as place_link_read says."""
    offer = place_link_read(slug=slug, token=token)
    if offer is None:
        return None
    taken = PlaceLink.objects.filter(pk=offer.link_id, used_at__isnull=True).update(used_at=_now())
    return offer.cookie_id if taken else None


def _send(notice: TurnNotice, subject: str, body: str) -> bool:
    with translation.override(notice.language):
        footer = _("You asked for this e-mail on the waiting page. Your address is deleted once your turn has come.")
    message = EmailMessage(
        subject=subject,
        body=f"{body}\n\n-- \n{footer}\n",
        from_email=settings.WR_NOTIFY_FROM_EMAIL,
        to=[notice.email],
        headers={"X-WaitingRoom-Queue": notice.queue.slug},
        connection=get_connection(timeout=SMTP_TIMEOUT_SECONDS),
    )
    try:
        message.send()
    except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors
        logger.warning("turn notice for %s not sent: %s: %s", notice.queue.slug, exc.__class__.__name__, exc)
        return False
    return True


def _queue_name(notice: TurnNotice) -> str:
    """The queue's name in the visitor's language where the operator gave one (QueueText)."""
    given = QueueText.objects.filter(queue=notice.queue, language=notice.language).exclude(name="")
    return given.values_list("name", flat=True).first() or notice.queue.name


def _now() -> datetime:
    return datetime.now(tz=UTC)


def _ms() -> int:
    return int(time.time() * 1000)
