"""Turn notices (issue 20, "Notify me"): `POST /api/v1/queues/<slug>/notify` with the visitor's ticket and
`{"email": "..."}`. The address is kept while the ticket waits, to e-mail the visitor when their turn is near
and when it comes (services/notices.py), with a link back to their place that can take another browser there
once (asked from the waiting page, with its visitor cookie: models.PlaceLink); deleted once the turn is told.
The waiting page's form without JavaScript answers through here too."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext_noop
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import ratelimit, selectors, services, tokens
from ..visitors import client_address, identity_seal, visitor_cookie_id
from . import responses as r
from . import serializers as s
from .answers import Answer, authorization, ticket_claims
from .codes import TICKET_UNKNOWN
from .errors import ApiError
from .schema import JSON_BODY, error_responses
from .throttling import rate_limited
from .views import TICKET_AUTH

# A visitor no longer waiting, in the API's answer and on the page without JavaScript (views.NOTIFY_SAID).
NOT_WAITING = gettext_noop("Only people waiting in line can be e-mailed, and you are no longer waiting.")
# The queue keeps as many addresses as it may (WR_NOTIFY_MAX_PER_QUEUE), in the answer and on the page.
NOTICES_FULL = gettext_noop(
    "No more e-mail addresses can be kept for this line. Keep this page open: it takes you through at your turn."
)


def place_of(request: HttpRequest, claims: tokens.TicketClaims) -> tuple[str, str]:
    """The waiting page's address, and the visitor's identity sealed when the request came with the page's
    visitor cookie and it is this ticket's (each e-mail then carries a place link, PlaceLink); else ''."""
    path = reverse("waiting-page", args=[claims.slug])
    base = settings.WR_PUBLIC_URL.rstrip("/") if settings.WR_PUBLIC_URL else request.build_absolute_uri("/")[:-1]
    cookie_id = visitor_cookie_id(request)
    if cookie_id and tokens.visitor_key(f"cookie:{cookie_id}") == claims.visitor_key:
        return f"{base}{path}", identity_seal(cookie_id)
    return f"{base}{path}", ""


def notify_answer(request: HttpRequest, claims: tokens.VisitorClaims, data: Any) -> Answer:
    """Keep the address for the ticket's turn notices: 201, or the error shape."""
    try:
        if not settings.WR_NOTIFY_BY_EMAIL:
            raise ApiError(
                "not_found", gettext_noop("This waiting room sends no e-mail (its operator has not set it up).")
            )
        email = s.notify_request_validate(data)
        if not isinstance(claims, tokens.TicketClaims):
            raise ApiError(
                "not_in_line",
                gettext_noop("A stateless queue's numbers are not followed one by one: keep the page open."),
            )
        try:
            link, sealed = place_of(request, claims)
            services.turn_notice_request(
                claims=claims,
                email=email,
                language=translation.get_language() or settings.LANGUAGE_CODE,
                link=link,
                sealed=sealed,
                address=client_address(request.META),
            )
        except ValidationError as exc:
            raise ApiError(
                "invalid_request", gettext_noop("The request has invalid fields."), fields={"email": exc.messages}
            ) from exc
        except ratelimit.Limited as exc:
            raise rate_limited(exc.decision, "notify") from exc
        except services.NotInLine as exc:
            raise ApiError("not_in_line", NOT_WAITING) from exc
        except services.NoticesFull as exc:
            raise ApiError("notices_full", NOTICES_FULL) from exc
        except (selectors.TicketGone, services.QueueNotFound) as exc:
            raise ApiError("ticket_not_found", TICKET_UNKNOWN) from exc
    except ApiError as exc:
        return Answer.error(exc)
    body = {
        "email": email.strip(),
        "near_places": settings.WR_NOTIFY_NEAR_PLACES,
        "near_seconds": settings.WR_NOTIFY_NEAR_SECONDS,
    }
    return Answer(201, body)


class NotifyView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="ticket_notify",
        summary="E-mail me when my turn is near and when it comes",
        description=(
            "Keeps the address while the ticket waits (one per ticket: asking again replaces it). The visitor is "
            "e-mailed once when `near_places` or fewer are ahead or the estimate is `near_seconds` or less, and "
            "again when admitted, with a link back to their place; the address is deleted once the turn is told "
            "or the ticket ends. While an address is kept, the ticket counts as present, as if its page were open."
        ),
        request=s.NotifyRequestSerializer,
        examples=[OpenApiExample("Leave an address", value={"email": "ada@example.com"}, request_only=True)],
        responses={201: r.NotifyResponseSerializer, **error_responses(*JSON_BODY, 401, 404, 406, 409, 429, 503)},
        auth=TICKET_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        claims = ticket_claims(authorization(request), slug)
        return notify_answer(request, claims, request.data).drf()
