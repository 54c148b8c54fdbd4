"""Pages: the waiting page (SPEC 8) and the demo protected page (the demo queue's target).

The waiting page works with JavaScript (it joins through the API, then listens on the websocket and
polls as a fallback: static/queueing/waiting.js) and without it: the page itself looks up the visitor's
ticket, a form POST joins, and the page refreshes itself at the advised interval. A join that could not
be made yet (the line is full, not open, or too many attempts came from the address) is retried by the
page's refresh: it carries a signed, short-lived `rejoin` token for this visitor and queue, so a refresh
(a GET) may join on the visitor's behalf, as the JavaScript page does on arrival, and nobody else's link can.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import select_template
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import get_language
from django.utils.translation import gettext_lazy as _
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from . import flows, instruments, modes, ratelimit, selectors, services, tokens
from .api.notices import NOT_WAITING, NOTICES_FULL, place_of
from .api.serializers import PRIORITY_CODE_MAX
from .middleware import QueueAccess, access_cookie_name, queue_access_serve, waiting_page_url
from .models import Queue
from .visitors import (
    InvalidVisitorId,
    VisitorIdentity,
    client_address,
    position_cookie_name,
    position_cookie_set,
    visitor_cookie_id,
    visitor_cookie_set,
    visitor_identity,
)

DEMO_QUEUE = "demo"

# Why a protected site sent the visitor back (require_queue_access adds ?reason=...).
RETURN_REASONS = {
    "expired": _("Your session has ended."),
    "revoked": _("Your session was ended by the site."),
    "superseded": _("You have a newer session somewhere else."),
    "full": _("The waiting room restarted and your session could not be resumed: the site is full. Please join again."),
    "bound_elsewhere": _(
        "That link to the site was already used in another browser: each place in line lets in one browser. "
        "Join the line here to get a place of your own."
    ),
    "invalid": _("That link to the site was not valid."),
}


def _policy(slug: str) -> dict[str, str]:
    """The queue's policy as mirrored in Redis (no SQL on page loads); synced from the database if missing."""
    try:
        return services.with_policy(slug, lambda: selectors.queue_policy_get(slug))
    except services.QueueNotFound as exc:
        raise Http404("No such queue.") from exc


def _identity(request: HttpRequest) -> VisitorIdentity:
    try:
        return visitor_identity(request, user=request.user)
    except InvalidVisitorId:  # a browser sends no X-Visitor-Id; a bad one is ignored here
        request.META.pop("HTTP_X_VISITOR_ID", None)
        return visitor_identity(request, user=request.user)


def _not_open_until(policy: dict[str, str]) -> float | None:
    """When the pre-queue opens (epoch seconds), if it has not yet."""
    opens_ms = int(float(policy.get("prequeue_opens_at_ms") or 0))
    return opens_ms / 1000 if opens_ms and opens_ms > time.time() * 1000 else None


def _closed(policy: dict[str, str]) -> bool:
    ends_ms = int(float(policy.get("ends_at_ms") or 0))
    return policy.get("state") == "closed" or bool(ends_ms and ends_ms <= time.time() * 1000)


def page_state(view: selectors.TicketView | None, policy: dict[str, str]) -> str:
    if view is None:
        if _closed(policy):
            return "closed"
        return "notyet" if _not_open_until(policy) else "join"
    if view.access_token:
        return "admitted"
    if view.is_finished:
        return "expired"
    if view.queue_state == "closed":
        return "closed"
    if view.opens_in_seconds:
        return "prequeue"
    return "paused" if view.queue_state == "paused" else "waiting"


@require_http_methods(["GET", "POST"])
@ensure_csrf_cookie
def waiting_page(request: HttpRequest, slug: str) -> HttpResponse:
    policy = _policy(slug)
    identity = _identity(request)
    if request.method == "POST":
        if request.POST.get("action") == "code":
            return _code_from_form(request, slug, identity)
        if request.POST.get("action") == "notify":
            return _notify_from_form(request, slug, identity)
        if request.POST.get("action") == "resume":
            return _resume_take(request, slug, policy)
        return _join_from_form(request, slug, identity)
    if "resume" in request.GET:  # a turn notice's link: its page, where this browser may take the place
        return _resume_page(request, slug, policy)
    held_ticket = request.COOKIES.get(position_cookie_name(slug), "")
    view = modes.named(policy.get("mode")).held(slug, identity=identity, held_ticket=held_ticket)
    without_ticket = view is None or view.is_finished
    if "rejoin" in request.GET:  # the no-JavaScript page's own refresh, retrying a join
        retry = _retry_read(request.GET["rejoin"], slug, identity)
        if retry is None or not without_ticket:
            return HttpResponseRedirect(request.path, status=303)
        return _join_from_form(request, slug, identity)
    requested = request.GET.get("state", "")  # after a no-JavaScript join was refused
    if requested in ("closed", "full", "limited", "pow", "notyet") and without_ticket:
        state = requested
    else:
        state = page_state(view, policy)
    opens = _not_open_until(policy)
    retry = _retry_read(request.GET.get("retry", ""), slug, identity) if state == requested else None
    if state == "notyet" and retry is None:  # the page joins by itself once the line opens
        retry = _Retry("notyet", _until_open(policy))
    refresh, refresh_url = _refresh(state, view), ""
    if state in ("full", "limited", "notyet"):
        refresh_url = request.path  # the plain page: it shows the join button, or the visitor's place
    if retry is not None and retry.state == state:
        refresh, refresh_url = retry.wait, f"{request.path}?rejoin={_retry_token(slug, identity, retry)}"
    texts = _texts(policy)
    context: dict[str, Any] = {
        "queue": {"slug": slug, "name": texts["name"] or slug, "intro": texts["intro"]},
        "state": state,
        "takes_codes": policy.get("codes") == "1",  # a tracked queue with codes (Queue.takes_codes)
        "notify_by_email": settings.WR_NOTIFY_BY_EMAIL and policy.get("mode") != Queue.Mode.STATELESS,
        "code_said": _code_said(request.GET.get("code", ""), request.GET.get("before", ""), view),
        "notify_said": NOTIFY_SAID.get(request.GET.get("notify", ""), ""),
        # The operator's words for a closed line (and an ended sale), as mirrored with the policy.
        "closed": {
            "message": texts["closed_message"],
            "link_url": policy.get("closed_link_url", ""),
            "link_text": texts["closed_link_text"],
        },
        "view": view,
        "reason": RETURN_REASONS.get(request.GET.get("reason", "")),
        "opens_at": datetime.fromtimestamp(opens, tz=UTC) if opens else None,
        # The commitment, seed and times only: never the pre-queue's lists (megabytes in a big sale).
        "shuffle": selectors.queue_shuffle_summary_get(slug=slug) if policy.get("starts_at_ms", "0") != "0" else None,
        "refresh_seconds": refresh,
        "refresh_url": refresh_url,
        "retry_in": refresh if retry is not None and retry.state == state else None,
        "held_until": _held_until(view, policy),
        "config": {
            "slug": slug,
            "state": state,
            "joinUrl": reverse("queue-join", args=[slug]),
            "statusUrl": reverse("queue-status", args=[slug]),
            "neighboursUrl": reverse("queue-neighbours", args=[slug]),
            "windowUrl": reverse("queue-window", args=[slug]),
            "codeUrl": reverse("queue-code", args=[slug]),
            "notifyUrl": reverse("queue-notify", args=[slug]),
            "mode": policy.get("mode") or Queue.Mode.TRACKED,
            "powWorkerUrl": static("queueing/pow-worker.js"),
            # An admission's token runs for the session; its turn is held for the claim window from the
            # same moment (lua/_lib.lua): held until expires_at - sessionTtl + claimTtl.
            "sessionTtl": int(policy.get("session_ttl") or 0),
            "claimTtl": int(policy.get("claim_ttl") or 0),
            "pageUrl": request.path,
        },
    }
    template = select_template([f"queueing/queues/{slug}/waiting.html", "queueing/waiting.html"])
    response = TemplateResponse(request, template, context)
    with timezone.override(_time_zone(policy)):  # clock times without JavaScript: the queue's zone
        response.render()
    if identity.new_cookie:
        visitor_cookie_set(response, identity.new_cookie)
    return response


def _resume_page(request: HttpRequest, slug: str, policy: dict[str, str]) -> HttpResponse:
    """A turn notice's link (?resume=...): a page that changes nothing, whose button (a POST) takes the place
    in this browser. Opened where it was asked from (the same identity already): the page itself."""
    token = request.GET["resume"]
    offer = services.place_link_read(slug=slug, token=token)
    if offer is not None and visitor_cookie_id(request) == offer.cookie_id:
        return HttpResponseRedirect(request.path, status=303)
    return _resume_render(request, slug, policy, offer, token)


def _resume_take(request: HttpRequest, slug: str, policy: dict[str, str]) -> HttpResponse:
    """The place link's button: this browser becomes the visitor who asked for the e-mail (once), then their
    page, without the link in its address."""
    token = request.POST.get("token", "")
    cookie_id = services.place_link_take(slug=slug, token=token) if token else None
    if cookie_id is None:
        return _resume_render(request, slug, policy, None, "")
    response = HttpResponseRedirect(request.path, status=303)
    visitor_cookie_set(response, cookie_id)
    return response


def _resume_render(
    request: HttpRequest, slug: str, policy: dict[str, str], offer: services.PlaceOffer | None, token: str
) -> HttpResponse:
    texts = _texts(policy)
    mine = visitor_cookie_id(request)
    context = {
        "queue": {"slug": slug, "name": texts["name"] or slug},
        "offer": offer,
        "token": token,
        "replaces": offer is not None and mine is not None and mine != offer.cookie_id,
        "page_url": request.path,
    }
    response = render(request, "queueing/resume.html", context, status=200 if offer else 410)
    response["Cache-Control"] = "no-store"
    return response


def _time_zone(policy: dict[str, str]) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(policy.get("time_zone") or settings.TIME_ZONE)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo(settings.TIME_ZONE)


def _texts(policy: dict[str, str]) -> dict[str, str]:
    """The queue's own words in the visitor's language where the operator gave them (QueueText), else as
    written on the queue (mirrored with the policy: no SQL on a page load)."""
    try:
        given = json.loads(policy.get("texts") or "{}").get(get_language() or "", {})
    except (ValueError, AttributeError):
        given = {}
    return {f: str(given.get(f) or policy.get(f) or "") for f in Queue.TRANSLATED_FIELDS}


def _held_until(view: selectors.TicketView | None, policy: dict[str, str]) -> int | None:
    """Until when an admitted visitor's turn is held (the claim window), as a Unix time."""
    if view is None or view.status != "admitted" or not view.expires_at:
        return None
    return int(view.expires_at) - int(policy.get("session_ttl") or 0) + int(policy.get("claim_ttl") or 0)


def _refresh(state: str, view: selectors.TicketView | None) -> int | None:
    """Without JavaScript the page refreshes itself: at the advised poll interval while in line, and
    every 30 s on the page of a refused join (sooner when its retry is due)."""
    if state in ("waiting", "paused", "prequeue") and view is not None:
        return max(2, math.ceil(view.poll_after_seconds))
    if state in ("full", "limited", "notyet"):
        return 30
    return None


RETRY_SALT = "waitingroom.rejoin"
RETRY_MAX_AGE = 3600  # a page left open longer shows the join button again instead


@dataclass(frozen=True)
class _Retry:
    state: str  # why the join was refused: full, limited or notyet
    wait: int  # seconds until the page retries


def _visitor_tag(slug: str, identity: VisitorIdentity) -> str:
    return hashlib.sha256(f"{slug}:{identity.key}".encode()).hexdigest()[:16]


def _retry_token(slug: str, identity: VisitorIdentity, retry: _Retry) -> str:
    return signing.dumps([_visitor_tag(slug, identity), retry.state, retry.wait], salt=RETRY_SALT)


def _retry_read(token: str, slug: str, identity: VisitorIdentity) -> _Retry | None:
    """The retry a refused no-JavaScript join left for this visitor and queue, if the token is theirs."""
    if not token:
        return None
    try:
        tag, state, wait = signing.loads(token, salt=RETRY_SALT, max_age=RETRY_MAX_AGE)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if tag != _visitor_tag(slug, identity) or state not in ("full", "limited", "notyet"):
        return None
    return _Retry(str(state), max(2, min(300, int(wait))))


def _until_open(policy: dict[str, str]) -> int:
    opens = _not_open_until(policy)
    return max(2, min(30, math.ceil(opens - time.time()))) if opens else 2


def _refused(request: HttpRequest, slug: str, identity: VisitorIdentity, retry: _Retry) -> str:
    """Where a refused join sends the visitor: the refusal's page, which retries by itself."""
    return f"{request.path}?state={retry.state}&retry={_retry_token(slug, identity, retry)}"


def _join_from_form(request: HttpRequest, slug: str, identity: VisitorIdentity) -> HttpResponse:
    """The join button without JavaScript (or its retry): the domain's join (as the API's, its limiter counted
    once), then the page (post/redirect/get). A refused join shows the refusal's page, which retries by
    itself where waiting can help."""
    entered = request.POST.get("code", "").strip()[:PRIORITY_CODE_MAX] if request.method == "POST" else ""
    address = client_address(request.META)
    visit = modes.Visit(
        slug=slug,
        identify=lambda: identity,
        held_ticket=request.COOKIES.get(position_cookie_name(slug), ""),
        address=address,
        priority_code=entered,
    )
    target, joined = request.path, None
    try:
        joined = flows.drive(modes.join_flow(visit, limit=ratelimit.prepare("join", address)))
    except services.QueueNotFound as exc:
        raise Http404("No such queue.") from exc
    except ratelimit.Limited as exc:  # the join's limiter, or too many codes tried from here
        instruments.rate_limited.labels("join").inc()
        target = _refused(request, slug, identity, _Retry("limited", max(1, math.ceil(exc.decision.retry_after))))
    except services.TicketCapReached:
        target = _refused(request, slug, identity, _Retry("limited", 60))
    except services.QueueNotOpen:
        target = _refused(request, slug, identity, _Retry("notyet", _until_open(_policy(slug))))
    except services.QueueFull as exc:
        target = _refused(request, slug, identity, _Retry("full", exc.retry_after))
    except (services.ProofOfWorkRequired, services.ProofOfWorkReused):
        target += "?state=pow"  # the gate's puzzle needs JavaScript
    except services.QueueClosed:
        target += "?state=closed"
    except (services.InvalidPriorityCode, services.NoPriorityLanes):
        target += "?code=bad"  # the join page again, saying so: joining without the code is one click
    except services.WrongMode:
        pass  # the queue changed how it runs twice during the join: the page again, and its button
    else:
        if entered:
            target += "?code=joined"
    response = HttpResponseRedirect(target, status=303)
    if joined is not None and joined.position_cookie:
        position_cookie_set(response, slug, joined.ticket)
    if identity.new_cookie:
        visitor_cookie_set(response, identity.new_cookie)
    return response


# What the page says after a code was entered without JavaScript (?code=...; waiting.js says the same).
CODE_SAID = {
    "joined": _("Your code worked: you joined the line with priority."),
    "kept": _("You already have the place this code gives, so it did not move you and was not used up."),
    # In a pre-queue there is no place yet: the code's level counts at the draw (shuffle.shuffle_order).
    "drawn": _(
        "Your code worked: when the line opens and places are drawn, you will be placed ahead of everyone with a "
        "lower priority."
    ),
    "drawn_kept": _(
        "This code's priority is already applied to your ticket: when the line opens and places are drawn, you "
        "will be placed ahead of everyone with a lower priority."
    ),
    "bad": _(
        "That code did not work: it is unknown, used up or expired. Codes are case-sensitive; check it and try again."
    ),
    "limited": _("Too many codes were tried from here. Please wait a few minutes and try again."),
    "late": _("Codes only move people waiting in line, and you are no longer waiting."),
    "empty": _("Type your code first."),
}


def _code_said(outcome: str, before: str, view: selectors.TicketView | None) -> str:
    if outcome == "moved" and before.isdigit() and view is not None and view.position:
        return _("Your code worked: you moved up from place %(before)s to place %(now)s.") % {
            "before": int(before),
            "now": view.position,
        }
    return str(CODE_SAID.get(outcome, ""))


def _code_from_form(request: HttpRequest, slug: str, identity: VisitorIdentity) -> HttpResponse:
    """A code entered without JavaScript: the API's answer for the visitor's own ticket, then the page saying
    what came of it (post/redirect/get). Without a ticket, the join takes the code."""
    entered = request.POST.get("code", "").strip()[:PRIORITY_CODE_MAX]
    if not entered:
        return HttpResponseRedirect(f"{request.path}?code=empty", status=303)
    claims = _held_claims(slug, identity)
    if claims is None:
        return _join_from_form(request, slug, identity)
    promoted = None
    try:
        promoted = modes.of_claims(claims).promote(claims, code=entered, address=client_address(request.META))
    except (services.InvalidPriorityCode, services.NoPriorityLanes):
        outcome = "bad"
    except ratelimit.Limited:  # too many codes tried from here
        instruments.rate_limited.labels("priority_code").inc()
        outcome = "limited"
    except (services.NotInLine, services.TicketNotFound, selectors.TicketGone, services.QueueNotFound):
        outcome = "late"
    else:
        outcome = "moved" if promoted.promoted else "kept"
        if promoted.view.drawn_at_start:
            outcome = "drawn" if outcome == "moved" else "drawn_kept"
    before = f"&before={promoted.position_before}" if promoted is not None and outcome == "moved" else ""
    return HttpResponseRedirect(f"{request.path}?code={outcome}{before}", status=303)


# What the page says after an address was left without JavaScript (?notify=...; waiting.js says the same).
NOTIFY_SAID = {
    "kept": _("We will e-mail you when your turn is near, and again when it comes. You may leave this page."),
    "bad": _("That does not look like an e-mail address. Please check it and try again."),
    "limited": _("Too many addresses were left from here. Please wait a few minutes and try again."),
    "late": _(NOT_WAITING),  # the API's words for it too
    "full": _(NOTICES_FULL),
}


def _notify_from_form(request: HttpRequest, slug: str, identity: VisitorIdentity) -> HttpResponse:
    """An address left without JavaScript, for the visitor's own ticket, then the page saying so."""
    claims = _held_claims(slug, identity)
    if claims is None:
        return HttpResponseRedirect(f"{request.path}?notify=late", status=303)
    if not settings.WR_NOTIFY_BY_EMAIL:  # the page offers no address field then
        return HttpResponseRedirect(request.path, status=303)
    email = request.POST.get("email", "")
    if not email.strip():  # nothing typed: said so, without counting it against the address's limit
        return HttpResponseRedirect(f"{request.path}?notify=bad", status=303)
    outcome = "kept"
    link, sealed = place_of(request, claims)
    try:
        services.turn_notice_request(
            claims=claims,
            email=email,
            language=get_language() or settings.LANGUAGE_CODE,
            link=link,
            sealed=sealed,
            address=client_address(request.META),
        )
    except ValidationError:
        outcome = "bad"
    except ratelimit.Limited:  # too many addresses left from here
        instruments.rate_limited.labels("notify").inc()
        outcome = "limited"
    except (services.NotInLine, selectors.TicketGone, services.QueueNotFound):
        outcome = "late"
    except services.NoticesFull:
        outcome = "full"
    return HttpResponseRedirect(f"{request.path}?notify={outcome}", status=303)


def _held_claims(slug: str, identity: VisitorIdentity) -> tokens.TicketClaims | None:
    """The claims of the ticket this visitor holds while it is live (a page without JavaScript has no
    signed ticket, only the visitor's cookie), or None."""
    view = modes.TRACKED.held(slug, identity=identity, held_ticket="")
    if view is None or view.is_finished:
        return None
    return tokens.held_claims(slug, ticket_id=view.ticket_id, priority=view.priority, epoch=view.epoch)


def home(request: HttpRequest) -> HttpResponse:
    queues = Queue.objects.exclude(state=Queue.State.CLOSED).values("slug", "name")
    return render(request, "queueing/home.html", {"queues": queues})


# The demo protected site: what a site behind a queue looks like. /demo/protected/ is the demo queue's
# target; /demo/<slug>/protected/ protects any queue the same way (used by the browser tests).


@require_GET
def demo_protected(request: HttpRequest, slug: str = DEMO_QUEUE) -> HttpResponseBase:
    # What @require_queue_access(slug) does (access check, timed for the site's health), slug from the URL.
    return queue_access_serve(request, slug, lambda: _demo_page(request, slug))


# Whose tokens the page takes, as @require_queue_access marks its views (admin checks a queue's target).
demo_protected.queue_access_slug = lambda kwargs: kwargs.get("slug", DEMO_QUEUE)  # type: ignore[attr-defined]


def _demo_page(request: HttpRequest, slug: str) -> HttpResponse:
    finish_url = reverse("demo-finish") if slug == DEMO_QUEUE else reverse("demo-finish-queue", args=[slug])
    context = {"access": request.queue_access, "slug": slug, "finish_url": finish_url}  # type: ignore[attr-defined]
    return render(request, "queueing/demo_protected.html", context)


@require_POST
def demo_finish(request: HttpRequest, slug: str = DEMO_QUEUE) -> HttpResponseBase:
    """The visitor is done: complete the session so the next visitor is admitted at once."""
    return queue_access_serve(request, slug, lambda: _demo_finish(request, slug))


def _demo_finish(request: HttpRequest, slug: str) -> HttpResponse:
    access: QueueAccess = request.queue_access  # type: ignore[attr-defined]
    claims = tokens.access_token_decode(access.token, slug=slug)
    services.session_complete(slug=slug, claims=claims)
    response = render(request, "queueing/demo_finished.html", {"slug": slug, "waiting_url": waiting_page_url(slug)})
    response.delete_cookie(access_cookie_name(slug))
    return response
