"""A code entered while waiting (issue 20): `POST /api/v1/queues/<slug>/code` with the visitor's ticket and
`{"code": "..."}`. The answer says plainly whether it worked: 200 with `promoted` (moved up, or already at
that level) and the place before and now, and a ticket signed again with the new level; else the error
shape: the code is unknown, used up or expired (400), the visitor is no longer in line (409), too many
codes tried from this address (429). The waiting page's form without JavaScript answers through here too."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_noop
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import modes, ratelimit, selectors, services, tokens
from ..visitors import client_address
from . import responses as r
from . import serializers as s
from .answers import REFUSALS, Answer, authorization, no_queue, poll_headers, ticket_claims
from .errors import ApiError
from .schema import JSON_BODY, error_responses
from .throttling import rate_limited
from .views import TICKET_AUTH

NOT_IN_LINE = gettext_noop(
    "A code moves only visitors waiting in line: you have been let through already, or your ticket has ended."
)
TICKET_UNKNOWN = gettext_noop("This queue no longer knows that ticket; join again.")


def code_answer(claims: tokens.VisitorClaims, data: Any, *, address: str) -> Answer:
    """The code's whole use: validate, take one use of it and move the ticket (one Redis script), sign the
    ticket again and read its state."""
    try:
        code = s.code_request_validate(data)
        try:
            promoted = modes.of_claims(claims).promote(claims, code=code, address=address)
        except services.InvalidPriorityCode as exc:
            raise ApiError(*REFUSALS[type(exc)]) from exc
        except ratelimit.Limited as exc:  # too many codes tried from this address
            raise rate_limited(exc.decision, "priority_code") from exc
        except services.NotInLine as exc:
            raise ApiError("not_in_line", NOT_IN_LINE) from exc
        except (services.TicketNotFound, selectors.TicketGone) as exc:
            raise ApiError("ticket_not_found", TICKET_UNKNOWN) from exc
        except services.QueueNotFound as exc:
            raise ApiError("queue_not_found", no_queue(claims.slug)) from exc
    except ApiError as exc:
        return Answer.error(exc)
    body = {
        "ticket": promoted.ticket,
        "promoted": promoted.promoted,
        "priority": promoted.view.priority,
        "position_before": promoted.position_before,
        **promoted.view.payload(),
    }
    return Answer(200, body, poll_headers(promoted.view))


class CodeView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="ticket_code",
        summary="Use an invite or priority code while waiting (moves you up; never back)",
        description=(
            "Moves the ticket to where a joiner of the code's level is placed now, or leaves it where it is "
            "when that is further ahead already. Replace the ticket you hold with the one answered: it carries "
            "the new level. A code whose level you have already spends nothing (`promoted`: false), also when "
            "it is used up or expired since (entered again on the ticket it was applied to). In a pre-queue "
            "(`place_drawn_at_start`) there is no place yet: the level puts the ticket ahead of every lower "
            "level when the places are drawn at the start, and `position_before` is null."
        ),
        request=s.CodeRequestSerializer,
        examples=[OpenApiExample("Enter a code", value={"code": "SPRING-VIP-7Q2X"}, request_only=True)],
        responses={200: r.CodeResponseSerializer, **error_responses(*JSON_BODY, 401, 404, 406, 409, 429, 503)},
        auth=TICKET_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        claims = ticket_claims(authorization(request), slug)
        return code_answer(claims, request.data, address=client_address(request.META)).drf()
