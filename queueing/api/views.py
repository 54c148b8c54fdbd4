"""The HTTP API (SPEC 6): one view per operation. Views parse, call one service or selector, and shape
the answer; the rules live in services and selectors. The visitor hot path (join, status, window) is
built in answers.py, which these views and the front-of-Django fast path (fastpath.py) both call."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import cache_control
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView
from rest_framework_simplejwt.authentication import JWTAuthentication

from .. import modes, selectors, services, signing_keys
from ..models import Queue
from ..visitors import client_address
from . import responses as r
from . import serializers as s
from .answers import authorization, join_answer, status_answer, ticket_claims, window_answer
from .authentication import ManagementKeyAuthentication
from .errors import ApiError
from .permissions import CanAddCodes, CanAddQueue, CanChangeQueue, CanDeleteQueue, CanViewQueue
from .schema import JSON_BODY, error_responses
from .throttling import (
    ClientAddressThrottle,
    DatabaseAnswerThrottle,
    StaffThrottle,
    TicketThrottle,
)

# Security requirements for the schema (drf-spectacular's hint says list[str]; it takes these objects).
TICKET_AUTH: Any = [{"ticket": []}]
API_KEY_AUTH: Any = [{"apiKey": []}]
STAFF_AUTH: Any = [{"staffJWT": []}, {"cookieAuth": []}, {"managementKey": []}]


def _validated(serializer_class: type[Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# --- Visitors -------------------------------------------------------------------------------------------


class JoinView(APIView):
    # A signed-in user joins as themselves (CSRF enforced for them); everyone else is anonymous.
    authentication_classes = [SessionAuthentication]
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="queue_join",
        summary="Join a queue",
        description=(
            "Idempotent per visitor: 201 with a new ticket, 200 with the visitor's live ticket. The visitor is "
            "the signed-in user, else the visitor cookie, else `X-Visitor-Id` (a random value of at least 128 "
            "bits, e.g. a UUID4), else a fresh identity set as the cookie. When the queue's proof-of-work gate "
            "is on, a new ticket needs `pow_challenge` and `pow_nonce` (see POST .../challenge); a visitor who "
            "already holds a ticket gets it back without. Joins per client address are rate-limited, and a "
            "queue may cap the live tickets per address (429 `ticket_cap_reached`)."
        ),
        request=s.JoinRequestSerializer,
        examples=[
            OpenApiExample("Join", value={}, request_only=True, description="Any queue without its gate on."),
            OpenApiExample("Join with a name shown to the operator", value={"display_name": "Ana"}, request_only=True),
            OpenApiExample(
                "Join with a priority code",
                value={"priority_code": "SPRING-VIP-7Q2X"},
                request_only=True,
                description="A code the operator made for this queue (admin, Priority codes); case counts.",
            ),
            OpenApiExample(
                "Join through the proof-of-work gate",
                value={"pow_challenge": "<challenge from POST .../challenge>", "pow_nonce": "<your nonce>"},
                request_only=True,
                description="Only when the queue's gate is on: solve the challenge first (see POST .../challenge).",
            ),
        ],
        parameters=[OpenApiParameter("X-Visitor-Id", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False)],
        responses={
            201: r.JoinResponseSerializer,
            200: r.JoinResponseSerializer,
            **error_responses(*JSON_BODY, 403, 406, 409, 428, 429, 503),
        },
        auth=[],
    )
    def post(self, request: Request, slug: str) -> Response:
        return join_answer(request._request, slug, request.data, user=request.user).drf()


class StatusView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="ticket_status",
        summary="A ticket's status (also its heartbeat)",
        description="Poll again after `poll_after_seconds` (also sent as Retry-After while waiting).",
        responses={200: r.StatusResponseSerializer, **error_responses(401, 429, 503)},
        auth=TICKET_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        return status_answer(authorization(request), slug).drf()


class NeighboursView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes = [TicketThrottle]
    throttle_scope = "neighbours"

    @extend_schema(
        operation_id="ticket_neighbours",
        summary="The few visitors around you in line (display names only)",
        responses={200: r.NeighboursResponseSerializer, **error_responses(401, 406, 429, 503)},
        auth=TICKET_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        claims = ticket_claims(authorization(request), slug)
        rows = modes.of_claims(claims).neighbours(claims)  # a stateless queue knows numbers, not people
        return Response(
            {"neighbours": [{"position": r.position, "display_name": r.display_name, "you": r.is_me} for r in rows]}
        )


class ChallengeView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes = [ClientAddressThrottle]
    throttle_scope = "challenge"

    @extend_schema(
        operation_id="pow_challenge",
        summary="A proof-of-work challenge for joining (when the queue's gate is on)",
        description=(
            "When a queue's proof-of-work gate is on (`difficulty` > 0), a join must carry `pow_challenge` "
            "(from here) and a `pow_nonce` such that SHA-256 of `pow_challenge + ':' + pow_nonce` (UTF-8) "
            "starts with `difficulty` zero bits. A challenge is valid for `expires_in` seconds, for this queue "
            "only, and buys one join. A join without a good enough solution gets 428 "
            "`proof_of_work_required` with a fresh challenge in the error object; a spent one gets 409 "
            "`proof_of_work_reused`; a wrong, expired or foreign one gets 400 `invalid_proof_of_work`. "
            "With the gate off, `difficulty` is 0 and joins need nothing."
        ),
        request=None,
        responses={201: r.ChallengeResponseSerializer, **error_responses(406, 429, 503)},
    )
    def post(self, request: Request, slug: str) -> Response:
        try:
            return Response(services.pow_challenge_issue(slug=slug), status=201)
        except services.QueueNotFound as exc:
            raise ApiError("queue_not_found", f"There is no queue '{slug}'.") from exc


class WindowView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="queue_window",
        summary="A stateless queue's window (public, cacheable): tell your own state from your place",
        description=(
            "Stateless queues only (SPEC 4). A ticket is waiting while its `place` (in the join and status "
            "answers) is above `active_to`, active while it is between `active_from` and `active_to`, and "
            "expired below `active_from`. The window moves by `window_size` every `window_interval` seconds "
            "while the queue admits (`next_step_in`: seconds to the next step; null while it stands still). "
            "`Cache-Control: max-age` lasts until about the next step. An active ticket gets its access token "
            "from the status endpoint. 404 `not_found` for a tracked queue."
        ),
        responses={200: r.WindowResponseSerializer, **error_responses(429, 503)},
    )
    def get(self, request: Request, slug: str) -> Response:
        return window_answer(slug, client_address(request.META)).drf()


SHUFFLE_REVEALED_MAX_AGE = 3600  # a revealed shuffle never changes; a new start is a new sale, seen within this


def _etag_matches(header: str, etag: str) -> bool:
    """If-None-Match names this entity tag (weak ones compare as strong there, RFC 9110 13.1.2), or is '*'."""
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return etag in tags or "*" in tags


class ShuffleView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes = [DatabaseAnswerThrottle]
    throttle_scope = "shuffle"

    @extend_schema(
        operation_id="prequeue_shuffle",
        summary="The auditable pre-queue shuffle: commitment before the start, seed and order after",
        description=(
            "Before the start: the SHA-256 `commitment` of a secret seed, published when the schedule was "
            "set. From the start: the `seed`, the pre-queue's `tickets` ([sequence number, priority level]) "
            "and the `order` they were put in. Anyone can check that the seed hashes to the commitment and "
            "that ordering by priority level (highest first), then by SHA-256 of `<seed>:<sequence number>`, "
            "gives that order (`manage.py verify_shuffle`). Cacheable for a few seconds before the start and "
            f"for {SHUFFLE_REVEALED_MAX_AGE} s once revealed (it never changes then); send `If-None-Match` "
            "with the `ETag` to get 304. Rate-limited per client address."
        ),
        responses={200: r.ShuffleResponseSerializer, 304: None, **error_responses(406, 429)},
    )
    def get(self, request: Request, slug: str) -> Response:
        summary = selectors.queue_shuffle_summary_get(slug=slug)
        if summary is None:
            raise ApiError("not_found", "This queue has no scheduled start, so no shuffle.")
        max_age = SHUFFLE_REVEALED_MAX_AGE if summary["revealed"] else 5
        headers = {"ETag": selectors.queue_shuffle_etag(summary), "Cache-Control": f"public, max-age={max_age}"}
        if _etag_matches(request.META.get("HTTP_IF_NONE_MATCH", ""), headers["ETag"]):
            return Response(status=304, headers=headers)  # the lists are not even read
        return Response(selectors.queue_shuffle_get(slug=slug), headers=headers)


class LeaveView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="ticket_leave",
        summary="Give up a ticket",
        request=None,
        responses={204: None, **error_responses(401, 406, 503)},
        auth=TICKET_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        claims = ticket_claims(authorization(request), slug)
        modes.of_claims(claims).leave(claims)
        return Response(status=204)


# --- Staff ------------------------------------------------------------------------------------------------


def _queue_payload(queue: Queue) -> dict[str, Any]:
    return dict(r.QueueSerializer(queue).data)


class _StaffView(APIView):
    authentication_classes = [JWTAuthentication, SessionAuthentication, ManagementKeyAuthentication]
    permission_classes: list[Any] = [CanChangeQueue]
    throttle_classes = [StaffThrottle]

    def queue(self, slug: str) -> Queue:
        return get_object_or_404(Queue, slug=slug)


class StatsView(_StaffView):
    permission_classes = [CanViewQueue]  # (issue 50: staff status alone was enough)

    @extend_schema(
        operation_id="queue_stats",
        summary="Live figures of a queue",
        responses={200: r.StatsResponseSerializer, **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        self.queue(slug)
        return Response(selectors.queue_stats_get(slug=slug))


class PauseView(_StaffView):
    @extend_schema(
        operation_id="queue_pause",
        summary="Pause admission (joins still accepted)",
        request=None,
        responses={200: r.QueueSerializer, **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        queue = services.queue_pause(self.queue(slug), actor=request.user)
        return Response(_queue_payload(queue))


class ResumeView(_StaffView):
    @extend_schema(
        operation_id="queue_resume",
        summary="Resume admission",
        request=None,
        responses={200: r.QueueSerializer, **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        queue = services.queue_resume(self.queue(slug), actor=request.user)
        return Response(_queue_payload(queue))


class QueueView(_StaffView):
    def get_permissions(self) -> list[Any]:
        return [CanViewQueue()] if self.request.method == "GET" else [CanChangeQueue()]

    @extend_schema(
        operation_id="queue_get",
        summary="A queue's admission policy",
        responses={200: r.QueueSerializer, **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        return Response(_queue_payload(self.queue(slug)))

    @extend_schema(
        operation_id="queue_update",
        summary="Change a queue's settings: capacity, outflow, schedule, target… (next tick; audited)",
        request=s.QueuePatchSerializer,
        examples=[
            OpenApiExample(
                "More capacity and a faster outflow",
                value={"capacity": 50, "outflow_per_minute": 120},
                request_only=True,
            ),
            OpenApiExample(
                "Schedule the sale: the pre-queue opens an hour before the start",
                value={"prequeue_opens_at": "2031-03-01T09:00:00Z", "starts_at": "2031-03-01T10:00:00Z"},
                request_only=True,
            ),
            OpenApiExample(
                "Adapt the outflow to the site's health",
                value={"adaptive_outflow": True, "outflow_min_per_minute": 30, "outflow_max_per_minute": 240},
                request_only=True,
            ),
        ],
        responses={200: r.QueueSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def patch(self, request: Request, slug: str) -> Response:
        queue = self.queue(slug)
        changes = _validated(s.QueuePatchSerializer, request.data)
        try:
            queue = services.queue_update(queue, changes=changes, actor=request.user)
        except ValidationError as exc:
            raise ApiError("invalid_request", "The change is not valid.", fields=exc.message_dict) from exc
        return Response(_queue_payload(queue))

    @extend_schema(
        operation_id="queue_delete",
        summary="Delete a queue: its line, tickets and sessions end with it (audited; the log stays)",
        responses={204: None, **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def delete(self, request: Request, slug: str) -> Response:
        if not CanDeleteQueue().has_permission(request, self):
            raise ApiError("permission_denied", CanDeleteQueue().message)
        services.queue_delete(self.queue(slug), actor=request.user)
        return Response(status=204)


class QueuesView(_StaffView):
    """The management API's collection (issue 19): what admin and `configure_queue` do, for automation.
    Every change goes through the same service (services.queue_configure) and is audited alike."""

    def get_permissions(self) -> list[Any]:
        return [CanAddQueue()] if self.request.method == "POST" else [CanViewQueue()]

    @extend_schema(
        operation_id="queue_list",
        summary="Every queue's settings",
        responses={200: r.QueueSerializer(many=True), **error_responses(401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def get(self, request: Request) -> Response:
        return Response([_queue_payload(queue) for queue in Queue.objects.order_by("slug")])

    @extend_schema(
        operation_id="queue_create",
        summary="Create a queue (audited; mirrored to Redis like one made in admin)",
        request=s.QueueCreateSerializer,
        examples=[
            OpenApiExample(
                "A sale of 50 at a time, 120 a minute",
                value={
                    "slug": "spring-sale",
                    "name": "Spring sale",
                    "target_url": "https://shop.example/sale",
                    "capacity": 50,
                    "outflow_per_minute": 120,
                    "state": "paused",
                },
                request_only=True,
            )
        ],
        responses={201: r.QueueSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 409, 429, 503)},
        auth=STAFF_AUTH,
    )
    def post(self, request: Request) -> Response:
        data = _validated(s.QueueCreateSerializer, request.data)
        slug = data.pop("slug")
        if Queue.objects.filter(slug=slug).exists():
            raise ApiError("queue_exists", f"A queue {slug} exists already: PATCH /api/v1/queues/{slug} changes it.")
        try:
            queue, _ = services.queue_configure(slug=slug, changes=data, actor=request.user)
        except ValidationError as exc:
            raise ApiError("invalid_request", "The queue is not valid.", fields=exc.message_dict) from exc
        return Response(_queue_payload(queue), status=201)


class CodesView(_StaffView):
    permission_classes = [CanAddCodes]

    @extend_schema(
        operation_id="priority_codes_generate",
        summary="Generate priority codes (96 random bits each), returned this once (audited without them)",
        request=s.CodesRequestSerializer,
        examples=[
            OpenApiExample(
                "Fifty VIP codes, one use each", value={"count": 50, "level": 2, "max_uses": 1}, request_only=True
            )
        ],
        responses={201: s.CodesResponseSerializer, **error_responses(*JSON_BODY, 401, 403, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        queue = self.queue(slug)
        data = _validated(s.CodesRequestSerializer, request.data)
        try:
            codes = services.priority_codes_generate(queue, **data, actor=request.user)
        except ValidationError as exc:
            raise ApiError("invalid_request", "The codes are not valid.", fields=exc.message_dict) from exc
        terms = {"level": data["level"], "max_uses": data.get("max_uses"), "expires_at": data.get("expires_at")}
        return Response({"codes": [code.code for code in codes], **terms}, status=201)


@cache_control(public=True, max_age=300)
def jwks_view(request: HttpRequest) -> JsonResponse:
    """The public keys protected sites verify access tokens with (offline)."""
    return JsonResponse(signing_keys.jwks())
