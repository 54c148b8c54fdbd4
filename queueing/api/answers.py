"""The visitor hot path's answers: a join, a status poll and a stateless queue's window, each written once
as a flow (queueing/flows.py) that ends in an `Answer`, driven from Django's thread (`join_answer`,
`status_answer`, `window_answer`) or from the web server's event loop (`ajoin_answer`, `astatus_answer`,
`awindow_answer`: fastpath.py), and shaped into whichever response its caller needs: a DRF Response (the
documented views in views.py) or a plain Django response (fastpath.py's middleware, in front of Django's
request handling). The waiting page's forms call the domain themselves (views.py).

What a status poll costs: one ticket check (HMAC, no SQL) and one Redis round trip (the status script
with the ticket's rate limiter in it)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from django.core.exceptions import DisallowedHost
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import translation
from django.utils.translation import gettext_noop
from rest_framework.response import Response

from .. import flows, instruments, logcontext, modes, pow, ratelimit, realtime, selectors, services, tokens
from ..models import Queue
from ..visitors import (
    InvalidVisitorId,
    VisitorIdentity,
    client_address,
    position_cookie_name,
    position_cookie_set,
    visitor_cookie_set,
    visitor_identity,
)
from . import serializers as s
from .errors import ApiError, Words, error_body, error_said, retry_after, service_unavailable
from .throttling import rate_limited

logger = logging.getLogger("django.request")


@dataclass(frozen=True)
class Answer:
    """What a visitor endpoint answers, before it is shaped into a DRF or a plain Django response."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    visitor_cookie: str | None = None
    position_cookie: tuple[str, str] | None = None  # (slug, ticket): a stateless queue's dedupe cookie

    @classmethod
    def error(cls, exc: ApiError) -> Answer:
        return cls(exc.status_code, error_body(exc.code, exc.message, **exc.extra), exc.headers)

    @classmethod
    def unavailable(cls) -> Answer:
        """Redis cannot be reached: 503 in the error shape, with a short Retry-After."""
        return cls(*service_unavailable())

    @property
    def error_code(self) -> str:
        """The error's code ('' for a success)."""
        error = self.body.get("error")
        return str(error.get("code", "")) if isinstance(error, dict) else ""

    def drf(self) -> Response:
        """For a DRF view: the language LocaleMiddleware chose is active, so an error is said in it."""
        body = error_said(self.body) if self.status >= 400 else self.body
        response = Response(body, status=self.status, headers=self.headers)
        self.cookies_set(response)
        return response

    def cookies_set(self, response: HttpResponse) -> None:
        if self.visitor_cookie:
            visitor_cookie_set(response, self.visitor_cookie)
        if self.position_cookie:
            position_cookie_set(response, *self.position_cookie)

    def set_cookies(self) -> list[str]:
        """The Set-Cookie header values of the answer's cookies (as Django's handlers write them)."""
        if not (self.visitor_cookie or self.position_cookie):
            return []
        response = HttpResponse()
        self.cookies_set(response)
        return [cookie.output(header="").strip() for cookie in response.cookies.values()]

    def plain(self, request: HttpRequest | None = None) -> HttpResponse:
        """A plain response; an error is said in the language of `request` (the hot path runs in front of
        LocaleMiddleware, so it is looked up here, for errors only)."""
        body = self.body
        if self.status >= 400:
            body = error_said(body, translation.get_language_from_request(request) if request else None)
        response = HttpResponse(
            json.dumps(body, separators=(",", ":")), status=self.status, content_type="application/json"
        )
        for name, value in self.headers.items():
            response[name] = value
        self.cookies_set(response)
        return response


def plain(answer: Callable[[], Answer], request: HttpRequest) -> HttpResponse:
    """A fast-path answer as a plain response; Redis away is a 503 in the error shape."""
    try:
        return answer().plain(request)
    except redis.RedisError:
        return Answer.unavailable().plain(request)


async def on_loop(flow: flows.Flow[Answer]) -> Answer:
    """An answer's flow driven on the web server's event loop. One it could not finish (Django's path has
    its handlers for these): Redis or the database out of reach is a 503 in the error shape, with
    Retry-After; anything else is logged as Django logs a failed request, and a 500 in the error shape."""
    try:
        return await flows.adrive(flow)
    except (redis.RedisError, DatabaseError):
        return Answer.unavailable()
    except Exception as exc:
        logger.error("A request on the event loop failed", exc_info=exc)
        return Answer(500, error_body("server_error", gettext_noop("Something went wrong on our side.")))


def authorization(request: HttpRequest) -> str:
    return str(request.META.get("HTTP_AUTHORIZATION", ""))


def ticket_claims(authorization: str, slug: str) -> tokens.VisitorClaims:
    """A tracked queue's ticket, or a stateless queue's numbered one, from 'Authorization: Bearer ...'."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise ApiError("invalid_ticket", gettext_noop("Send the ticket as 'Authorization: Bearer <ticket>'."))
    try:
        claims = tokens.visitor_ticket_decode(credentials.strip(), slug=slug)
    except tokens.InvalidTicket as exc:
        raise ApiError("invalid_ticket", str(exc)) from exc
    logcontext.bind(ticket=claims.ticket_id)  # in the request's log lines from here on (never the token)
    return claims


def poll_headers(view: selectors.TicketView) -> dict[str, str]:
    if not view.is_waiting:
        return {}
    return {"Retry-After": str(math.ceil(view.poll_after_seconds))}


# --- Join ---------------------------------------------------------------------------------------------


def join_answer(request: HttpRequest, slug: str, data: Any, *, user: Any) -> Answer:
    """`join_flow` from synchronous code: JoinView (signed-in visitors, and the schema) and join_fast
    (Django's fast path)."""
    return flows.drive(join_flow(request, slug, data, user=user))


async def ajoin_answer(request: HttpRequest, slug: str) -> Answer:
    """`join_flow` from the web server's event loop (fastpath.HotPathASGI; `request` built from the ASGI
    scope, its body read; no session, so no signed-in user): what reads the database runs in a thread.
    Failures are answered as `on_loop` says."""
    try:
        data = json_body(request)
    except ApiError as exc:
        return Answer.error(exc)
    return await on_loop(join_flow(request, slug, data, user=None))


def join_flow(request: HttpRequest, slug: str, data: Any, *, user: Any) -> flows.Flow[Answer]:
    """A whole join, in either mode: refused from another site's page, the body's rules, the proof of work,
    then the queue's mode joins (one Redis script) and the ticket is signed.

    The join's rate limiter (per client address, across queues: made-up slugs get no fresh allowance) is
    counted with the first work in Redis: in the join's own script, or, where something must be read first
    (a proof that does not check out, a priority code, a kept ticket), in a round trip before it. A join
    refused before any of that (another site's page, a body that breaks the rules) costs Redis nothing and
    is not counted."""
    try:
        cross_site = _cross_site(request)
        if cross_site and not _api_client(request):
            raise ApiError(
                "cross_site_refused",
                gettext_noop(
                    "Joins from another site's page are refused. An API client sends JSON with its own X-Visitor-Id."
                ),
            )
        address = client_address(request.META)
        fields = s.join_request_validate(data)
        limit = ratelimit.prepare("join", address)
        try:
            try:
                proof = _proof_shown(slug, fields)
            except pow.InvalidProof as exc:  # refused only by a queue whose gate is on; elsewhere ignored
                yield from selectors.limit_flow(limit)
                limit = None
                if (yield from flows.blocking(lambda: services.pow_difficulty_get(slug=slug))) > 0:
                    raise ApiError("invalid_proof_of_work", str(exc)) from exc
                proof = None
            visit = modes.Visit(
                slug=slug,
                identify=lambda: _identify(request, user),
                held_ticket=request.COOKIES.get(position_cookie_name(slug), ""),
                address=address,
                priority_code=fields["priority_code"],
                display_name=fields["display_name"],
                proof=proof,
            )
            joined = yield from modes.join_flow(visit, limit=limit)
        except services.JOIN_REFUSALS as exc:
            raise (yield from _join_refused_flow(slug, exc)) from exc
        except ratelimit.Limited as exc:  # the join's limiter, or too many priority codes tried from here
            raise rate_limited(exc.decision, "join") from exc
    except ApiError as exc:
        return Answer.error(exc)
    return _joined(request, slug, joined, cross_site=cross_site)


def _joined(request: HttpRequest, slug: str, joined: modes.Joined, *, cross_site: bool) -> Answer:
    body = {"ticket": joined.ticket, **joined.view.payload(ahead=False), "ws_url": _ws_url(request, slug)}
    if body["status"] == "active":
        body["status"] = "admitted"  # to a joiner, a live session is simply "go through"
    return Answer(
        201 if joined.created else 200,
        body,
        poll_headers(joined.view),
        # A cross-site request never carries the visitor's cookies (SameSite): it must not replace them.
        None if cross_site else joined.visitor_cookie,
        (slug, joined.ticket) if joined.position_cookie and not cross_site else None,
    )


def _cross_site(request: HttpRequest) -> bool:
    """Sent from another site's page: the browser says so (Sec-Fetch-Site), or the Origin is not this host."""
    if request.META.get("HTTP_SEC_FETCH_SITE") == "cross-site":
        return True
    origin = request.META.get("HTTP_ORIGIN")
    if origin is None:
        return False  # not a browser's cross-origin request (browsers send Origin on every POST)
    try:
        return bool(origin == "null" or urlsplit(str(origin)).netloc != request.get_host())
    except (ValueError, DisallowedHost):
        return True


def _api_client(request: HttpRequest) -> bool:
    """A program, not a hostile page: a JSON body and its own identity header (a page on another site
    cannot send either without a CORS preflight this server never grants)."""
    content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    return content_type == "application/json" and bool(request.META.get("HTTP_X_VISITOR_ID"))


def _proof_shown(slug: str, fields: dict[str, Any]) -> pow.Solved | None:
    """The join's solved challenge, if it shows one (pow.InvalidProof if it does not check out)."""
    if not (fields["pow_challenge"] or fields["pow_nonce"]):
        return None
    return pow.solution_check(slug, fields["pow_challenge"], fields["pow_nonce"])


def _identify(request: HttpRequest, user: Any) -> VisitorIdentity:
    try:
        return visitor_identity(request, user=user)
    except InvalidVisitorId as exc:
        raise ApiError("invalid_visitor_id", str(exc)) from exc


def _ws_url(request: HttpRequest, slug: str) -> str:
    # No ticket in it: URLs land in proxies' access logs. The socket's first message carries the ticket.
    return realtime.socket_url(request, f"/ws/queues/{slug}/")


# Refusals that say only what happened; the others below carry when to come back, or a challenge.
REFUSALS: dict[type[Exception], tuple[str, str]] = {
    services.ProofOfWorkReused: (
        "proof_of_work_reused",
        gettext_noop("That challenge was already used; ask for a new one."),
    ),
    services.QueueClosed: ("queue_closed", gettext_noop("This queue is closed and takes no new visitors.")),
    services.NoPriorityLanes: (
        "invalid_priority_code",
        gettext_noop("This queue has no priority lanes (it runs in stateless mode)."),
    ),
    services.InvalidPriorityCode: (
        "invalid_priority_code",
        gettext_noop("That priority code is unknown, used up or expired."),
    ),
}


def no_queue(slug: str) -> Words:
    return Words(gettext_noop("There is no queue '%(slug)s'."), slug=slug)


def _come_back(code: str, message: str, seconds: float, **extra: Any) -> ApiError:
    headers, wait = retry_after(seconds)
    return ApiError(code, message, headers=headers, **wait, **extra)


def _join_refused_flow(slug: str, exc: Exception) -> flows.Flow[ApiError]:
    """`_join_refused`, which reads the database (a pre-queue's opening) or Redis (a new challenge) for two
    refusals."""
    if isinstance(exc, services.QueueNotOpen | services.ProofOfWorkRequired):
        return (yield from flows.blocking(lambda: _join_refused(slug, exc)))
    return _join_refused(slug, exc)


def _join_refused(slug: str, exc: Exception) -> ApiError:
    """The API's answer to a join the queue refused (either mode)."""
    if type(exc) in REFUSALS:
        return ApiError(*REFUSALS[type(exc)])
    if isinstance(exc, services.QueueNotOpen):
        queue = Queue.objects.filter(slug=slug).only("prequeue_opens_at").first()
        opens = queue.prequeue_opens_at if queue else None
        wait = min(3600, max(1, math.ceil(opens.timestamp() - time.time())) if opens else 60)
        opens_at = opens.isoformat() if opens else None
        return _come_back("queue_not_open", gettext_noop("This queue has not opened yet."), wait, opens_at=opens_at)
    if isinstance(exc, services.ProofOfWorkRequired):
        message = gettext_noop("Solve this challenge and join again with pow_challenge and pow_nonce.")
        return ApiError("proof_of_work_required", message, **services.pow_challenge_issue(slug=slug, bits=exc.bits))
    if isinstance(exc, services.TicketCapReached):
        message = gettext_noop("This network already holds as many tickets for this queue as it may.")
        return _come_back("ticket_cap_reached", message, 60)
    if isinstance(exc, services.QueueFull):
        return _come_back("queue_full", gettext_noop("The queue is full; try again later."), exc.retry_after)
    if isinstance(exc, services.WrongMode):
        return _come_back("service_unavailable", gettext_noop("The queue is changing how it runs; try again."), 1)
    return ApiError("queue_not_found", no_queue(slug))


def json_body(request: HttpRequest) -> Any:
    """The request body as JSON, refused as DRF's JSONParser would refuse it (415, 400 malformed_json)."""
    raw = request.body
    if not raw:
        return {}
    if request.content_type != "application/json":
        raise ApiError("unsupported_media_type", gettext_noop("Send the body as application/json."))
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("malformed_json", f"The body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ApiError("malformed_json", "The body is nested too deeply.") from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def join_fast(request: HttpRequest, slug: str) -> HttpResponse:
    """A join from a visitor without a session (so without a signed-in user): no DRF dispatch."""
    try:
        answer = join_answer(request, slug, json_body(request), user=None)
    except ApiError as exc:
        answer = Answer.error(exc)
    except redis.RedisError:
        answer = Answer.unavailable()
    return answer.plain(request)


# --- Status ---------------------------------------------------------------------------------------------

GONE = {
    "status": "expired",
    "position": None,
    "ahead": None,
    "queue_length": 0,
    "estimated_wait_seconds": None,
    "estimated_wait_range": None,
    "poll_after_seconds": 60.0,
}


def status_answer(authorization: str, slug: str) -> Answer:
    """`status_flow` from synchronous code: StatusView (the documented DRF view) and status_fast (Django's
    fast path). Redis errors propagate (each caller maps them to a 503)."""
    return flows.drive(status_flow(authorization, slug))


async def astatus_answer(authorization: str, slug: str) -> Answer:
    """`status_flow` from the web server's event loop (fastpath.HotPathASGI; failures: `on_loop`)."""
    return await on_loop(status_flow(authorization, slug, on_loop=True))


def status_flow(authorization: str, slug: str, *, on_loop: bool = False) -> flows.Flow[Answer]:
    """A whole status poll: one ticket check (HMAC, no SQL) and one Redis round trip, the ticket's rate
    limiter in it. The database only when Redis lost the queue's policy, or keys must be loaded."""
    try:
        claims = ticket_claims(authorization, slug)
    except ApiError as exc:
        return Answer.error(exc)
    try:
        view = yield from modes.of_claims(claims).status_flow(claims, limit_scope="status")
    except (ratelimit.Limited, selectors.TicketGone) as exc:
        return _status_refused(claims, exc)
    return _status_ok(view, slug, on_loop=on_loop)


def _status_ok(view: selectors.TicketView, slug: str, *, on_loop: bool = False) -> Answer:
    if on_loop:  # the event loop's hot path: counted in a batch (instruments.LoopBatch)
        instruments.loop_batch.inc(instruments.poll_counter(slug))
    else:
        instruments.poll_counter(slug).inc()
    return Answer(200, view.payload(), poll_headers(view))


def _status_refused(claims: tokens.VisitorClaims, exc: Exception) -> Answer:
    if isinstance(exc, ratelimit.Limited):
        return Answer.error(rate_limited(exc.decision, "status"))
    return Answer(200, {"ticket_id": claims.ticket_id, **GONE})


def status_fast(request: HttpRequest, slug: str) -> HttpResponse:
    """The status poll without DRF's dispatch (content negotiation, renderers): the hot path."""
    return plain(lambda: status_answer(authorization(request), slug), request)


# --- A stateless queue's window -------------------------------------------------------------------------


def window_answer(slug: str, address: str = "") -> Answer:
    """`window_flow` from synchronous code."""
    return flows.drive(window_flow(slug, lambda: address))


async def awindow_answer(slug: str, address: Callable[[], str]) -> Answer:
    """`window_flow` from the web server's event loop (failures: `on_loop`)."""
    return await on_loop(window_flow(slug, address))


def window_flow(slug: str, address: Callable[[], str]) -> flows.Flow[Answer]:
    """A stateless queue's window, for anyone (no ticket): one Redis read. Cacheable until about the next
    step of the window (at most one interval), so a CDN can answer most of a crowd's polls. A queue with no
    window is a 404 remembered for a moment; reads that would have to ask the database are limited per
    client (`address` gives it, '' when the caller does not know it)."""
    try:
        window = yield from modes.window_public_flow(slug, address=address)
    except selectors.TicketGone:
        not_stateless = Words(gettext_noop("Queue '%(slug)s' is not a stateless queue (or does not exist)."), slug=slug)
        return Answer.error(ApiError("not_found", not_stateless))
    except ratelimit.Limited as exc:
        return Answer.error(rate_limited(exc.decision, "window"))
    return _window_ok(window)


def _window_ok(window: dict[str, Any]) -> Answer:
    due, interval = window["next_step_in"], window["window_interval"]
    max_age = max(1, min(math.ceil(interval), math.ceil(due) if due is not None else math.ceil(interval)))
    return Answer(200, window, {"Cache-Control": f"public, max-age={max_age}"})


def window_fast(request: HttpRequest, slug: str) -> HttpResponse:
    return plain(lambda: window_answer(slug, client_address(request.META)), request)
