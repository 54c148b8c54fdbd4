"""POST /api/v1/queues/<slug>/code (issue 20, item 2): a waiting visitor's code over the API, its answers
and its refusals in the API's error shape."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from queueing import store
from queueing.models import PriorityCode

from .factories import decode_ticket
from .windows import clear_of_a_window_edge

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def url(slug: str, op: str) -> str:
    return f"/api/v1/queues/{slug}/{op}"


def join(api, slug: str) -> dict:
    response = api.post(url(slug, "join"), format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert response.status_code == 201, response.content
    return response.json()


def enter(api, slug: str, ticket: str, body, **extra):
    return api.post(url(slug, "code"), body, format="json", HTTP_AUTHORIZATION=f"Bearer {ticket}", **extra)


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


@pytest.fixture
def line(make_queue, api):
    queue = make_queue(state="paused", capacity=2)
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2, max_uses=2)
    return queue, [join(api, queue.slug) for _ in range(30)]


def test_a_code_moves_the_visitor_up_and_answers_a_ticket_with_its_new_level(api, line):
    queue, joined = line
    last = joined[-1]
    response = enter(api, queue.slug, last["ticket"], {"code": "Gold-2026"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["promoted"] is True and body["priority"] == 2
    assert body["position_before"] == 30 and body["position"] == 16  # ahead of the last half of 30
    assert body["status"] == "waiting" and body["ahead"] == 15 and body["ticket_id"] == last["ticket_id"]
    claims = decode_ticket(body["ticket"], slug=queue.slug)
    assert claims.priority == 2 and claims.placement is not None
    assert claims.placement < decode_ticket(last["ticket"], slug=queue.slug).placement  # type: ignore[operator]
    for ticket in (body["ticket"], last["ticket"]):  # the old ticket names the same place
        polled = api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}").json()
        assert polled["position"] == 16
    assert (
        api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION=f"Bearer {joined[15]['ticket']}").json()["position"] == 17
    )  # moved back by one
    assert PriorityCode.objects.get(code="Gold-2026").uses == 1


def test_the_same_code_again_answers_not_promoted_and_spends_nothing(api, line):
    queue, joined = line
    enter(api, queue.slug, joined[-1]["ticket"], {"code": "Gold-2026"})
    again = enter(api, queue.slug, joined[-1]["ticket"], {"code": "Gold-2026"})
    assert again.status_code == 200
    assert again.json()["promoted"] is False and again.json()["position_before"] == again.json()["position"] == 16
    assert PriorityCode.objects.get(code="Gold-2026").uses == 1


def test_unusable_codes_are_400_and_move_nobody(api, line):
    queue, joined = line
    enter(api, queue.slug, joined[28]["ticket"], {"code": "Gold-2026"})
    enter(api, queue.slug, joined[29]["ticket"], {"code": "Gold-2026"})  # its second and last use
    for code in ("Gold-2026", "gold-2026", "NOPE"):
        error = refused(enter(api, queue.slug, joined[27]["ticket"], {"code": code}), 400, "invalid_priority_code")
        assert "unknown, used up or expired" in error["message"]
    assert store.line_members(queue.slug)[29] == joined[27]["ticket_id"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "invalid_request"),
        ({"code": ""}, "invalid_request"),
        ({"code": 7}, "invalid_request"),
        ({"code": "x" * 65}, "invalid_request"),
        ({"code": "a\x00b"}, "invalid_request"),
        ({"code": "Gold-2026", "level": 3}, "unknown_fields"),
        (["Gold-2026"], "invalid_request"),
    ],
)
def test_bad_bodies_are_400_in_the_error_shape(api, line, body, code):
    queue, joined = line
    refused(enter(api, queue.slug, joined[-1]["ticket"], body), 400, code)
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_no_ticket_or_another_queues_ticket_is_401(api, line, make_queue):
    queue, _ = line
    refused(api.post(url(queue.slug, "code"), {"code": "Gold-2026"}, format="json"), 401, "invalid_ticket")
    other = make_queue(state="paused")
    refused(enter(api, queue.slug, join(api, other.slug)["ticket"], {"code": "Gold-2026"}), 401, "invalid_ticket")


def test_an_admitted_visitor_gets_409_not_in_line(api, make_queue):
    queue = make_queue(capacity=5)
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2)
    joined = join(api, queue.slug)
    assert joined["status"] == "admitted"
    error = refused(enter(api, queue.slug, joined["ticket"], {"code": "Gold-2026"}), 409, "not_in_line")
    assert "let through" in error["message"]
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_a_ticket_the_queue_no_longer_knows_is_404(api, line):
    queue, joined = line
    api.post(url(queue.slug, "leave"), HTTP_AUTHORIZATION=f"Bearer {joined[3]['ticket']}")
    refused(enter(api, queue.slug, joined[3]["ticket"], {"code": "Gold-2026"}), 409, "not_in_line")
    store.queue_delete(queue.slug)
    refused(enter(api, queue.slug, joined[4]["ticket"], {"code": "Gold-2026"}), 404, "ticket_not_found")
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_a_stateless_queue_has_no_priority_lanes(api, make_queue):
    queue = make_queue(mode="stateless", window_size=5, window_interval=10)
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2)
    joined = api.post(url(queue.slug, "join"), format="json").json()
    error = refused(enter(api, queue.slug, joined["ticket"], {"code": "Gold-2026"}), 400, "invalid_priority_code")
    assert "stateless" in error["message"]


def test_guessing_codes_is_refused_past_the_addresses_limit(api, line, settings):
    queue, joined = line
    settings.WR_RATE_LIMITS = {
        **settings.WR_RATE_LIMITS,
        "priority_code": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 3},
    }
    clear_of_a_window_edge(600)
    for guess in range(3):
        refused(enter(api, queue.slug, joined[-1]["ticket"], {"code": f"GUESS-{guess}"}), 400, "invalid_priority_code")
    response = enter(api, queue.slug, joined[-1]["ticket"], {"code": "Gold-2026"})
    refused(response, 429, "rate_limited")
    assert int(response["Retry-After"]) >= 1
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_redis_away_is_503(api, line, redis_away):
    queue, joined = line
    redis_away()
    refused(enter(api, queue.slug, joined[-1]["ticket"], {"code": "Gold-2026"}), 503, "service_unavailable")
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_a_single_use_code_entered_again_on_its_own_ticket_answers_that_it_is_applied(api, line):
    """Issue 47, item 11: the second entry of a code this ticket used up said "unknown, used up or expired"."""
    queue, joined = line
    PriorityCode.objects.create(queue=queue, code="Once-2026", level=2, max_uses=1)
    assert enter(api, queue.slug, joined[-1]["ticket"], {"code": "Once-2026"}).json()["promoted"] is True
    again = enter(api, queue.slug, joined[-1]["ticket"], {"code": "Once-2026"})
    assert again.status_code == 200, again.content
    assert again.json()["promoted"] is False and again.json()["priority"] == 2
    assert again.json()["position_before"] == again.json()["position"] == 16
    refused(enter(api, queue.slug, joined[0]["ticket"], {"code": "Once-2026"}), 400, "invalid_priority_code")
    assert PriorityCode.objects.get(code="Once-2026").uses == 1


def test_a_code_in_the_pre_queue_answers_no_place_before_or_after_and_again_that_it_is_applied(api, make_queue):
    """Issue 47, item 11: in a pre-queue a code raises the level the draw at the start orders by (no place
    exists before it); its answer had the line's order before the draw as `position_before`, and the page
    said "moved up from place 36 to place null"; entering it again said "unknown, used up or expired"."""
    queue = make_queue(starts_at=timezone.now() + timedelta(hours=1))
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2, max_uses=1)
    joined = [join(api, queue.slug) for _ in range(6)]
    first = enter(api, queue.slug, joined[-1]["ticket"], {"code": "Gold-2026"})
    assert first.status_code == 200, first.content
    body = first.json()
    assert body["promoted"] is True and body["priority"] == 2 and body["place_drawn_at_start"] is True
    assert body["position"] is None and body["position_before"] is None and body["ahead"] is None
    again = enter(api, queue.slug, body["ticket"], {"code": "Gold-2026"})
    assert again.status_code == 200, again.content
    assert again.json()["promoted"] is False and again.json()["priority"] == 2
    assert again.json()["position_before"] is None and again.json()["place_drawn_at_start"] is True
    refused(enter(api, queue.slug, joined[0]["ticket"], {"code": "Gold-2026"}), 400, "invalid_priority_code")
    assert PriorityCode.objects.get(code="Gold-2026").uses == 1
