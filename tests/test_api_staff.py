"""Staff API: stats, pause, resume, patch; who may call them; the audit log."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from queueing import services, store
from queueing.models import QueueChange

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def url(slug: str, op: str = "") -> str:
    return f"/api/v1/queues/{slug}" + (f"/{op}" if op else "")


@pytest.fixture
def queue(make_queue):
    return make_queue(capacity=2, burst=2)


@pytest.fixture
def plain_staff(db):
    """Staff without any permission on queues."""
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("looker", password="pw", is_staff=True))
    return client


@pytest.fixture
def member(db):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("member", password="pw"))
    return client


def test_stats_show_live_counts(staff_api, api, queue):
    joined = [
        api.post(url(queue.slug, "join"), format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json() for _ in range(5)
    ]
    body = staff_api.get(url(queue.slug, "stats")).json()
    assert (body["waiting"], body["admitted"], body["active"]) == (3, 2, 0)
    assert body["head_position"] == int(joined[2]["ticket_id"].split(".")[0])  # the third joiner is next in
    assert body["capacity_in_use"] == 2 and body["capacity_use"] == 1.0
    assert body["totals"]["joined"] == 5 and body["totals"]["admitted"] == 2
    assert body["outflow_per_minute_configured"] == 600.0


def test_pause_stops_admission_on_the_next_tick_and_resume_restarts_it(staff_api, api, queue, clock):
    response = staff_api.post(url(queue.slug, "pause"))
    assert (response.status_code, response.json()["state"]) == (200, "paused")
    for _ in range(3):
        api.post(url(queue.slug, "join"), format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert services.queue_admit(slug=queue.slug, now=clock.advance(5)).admitted == []
    assert staff_api.post(url(queue.slug, "resume")).json()["state"] == "open"
    assert len(services.queue_admit(slug=queue.slug, now=clock.advance(5)).admitted) == 2


def test_patch_changes_capacity_and_outflow_and_is_audited(staff_api, staff_user, queue):
    response = staff_api.patch(url(queue.slug), {"capacity": 50, "outflow_per_minute": 30.5}, format="json")
    assert response.status_code == 200
    assert (response.json()["capacity"], response.json()["outflow_per_minute"]) == (50, 30.5)
    change = QueueChange.objects.filter(queue=queue, action="update").latest("id")
    assert change.actor == staff_user and change.actor_label == "staffer"
    assert change.before == {"capacity": 2, "outflow_per_minute": 600.0}
    assert change.after == {"capacity": 50, "outflow_per_minute": 30.5}
    assert store.config_read(queue.slug)["capacity"] == "50"


@pytest.mark.parametrize(
    "body", [{"capacity": 0}, {"outflow_per_minute": -1}, {"capacity": "9"}, {"state": "open"}, {}]
)
def test_patch_refuses_bad_changes(staff_api, queue, body):
    response = staff_api.patch(url(queue.slug), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] in ("invalid_request", "unknown_fields")


def test_pause_and_resume_are_audited(staff_api, queue):
    staff_api.post(url(queue.slug, "pause"))
    staff_api.post(url(queue.slug, "resume"))
    changes = list(QueueChange.objects.filter(queue=queue, action="update").order_by("id"))
    assert [(c.before, c.after) for c in changes] == [
        ({"state": "open"}, {"state": "paused"}),
        ({"state": "paused"}, {"state": "open"}),
    ]


@pytest.mark.parametrize(("method", "op"), [("get", "stats"), ("post", "pause"), ("post", "resume"), ("patch", "")])
def test_anonymous_callers_get_401(api, queue, method, op):
    response = getattr(api, method)(url(queue.slug, op), {}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "authentication_required")


@pytest.mark.parametrize(("method", "op"), [("get", "stats"), ("post", "pause"), ("post", "resume"), ("patch", "")])
def test_non_staff_get_403(member, queue, method, op):
    response = getattr(member, method)(url(queue.slug, op), {"capacity": 3}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (403, "permission_denied")


def test_staff_with_the_view_permission_may_look_but_not_steer(plain_staff, queue):
    # Issue 50, item 11: staff status alone let any staff account read every queue's settings and figures.
    assert plain_staff.get(url(queue.slug, "stats")).status_code == 403
    assert plain_staff.get(url(queue.slug)).status_code == 403
    looker = get_user_model().objects.get(username="looker")
    looker.user_permissions.add(Permission.objects.get(codename="view_queue"))
    viewer = APIClient()
    viewer.force_authenticate(get_user_model().objects.get(pk=looker.pk))  # (its permissions read afresh)
    assert viewer.get(url(queue.slug, "stats")).status_code == 200
    assert viewer.get(url(queue.slug)).status_code == 200
    assert viewer.post(url(queue.slug, "pause")).status_code == 403
    assert viewer.patch(url(queue.slug), {"capacity": 3}, format="json").status_code == 403


def test_staff_can_use_a_jwt_from_the_token_endpoint(api, staff_user, queue):
    tokens = api.post("/api/v1/auth/token", {"username": "staffer", "password": "pw-staff-123"}, format="json").json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tokens['access']}")
    assert client.post(url(queue.slug, "pause")).json()["state"] == "paused"


def test_a_session_login_must_send_the_csrf_token(staff_user, queue):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff_user)
    assert client.post(url(queue.slug, "pause")).status_code == 403


def test_an_unknown_queue_is_404(staff_api, db):
    assert staff_api.get(url("nope", "stats")).json()["error"]["code"] == "not_found"


def test_a_change_answered_503_because_redis_is_away_was_not_made(staff_api, make_queue, redis_away):
    """Issue 12: a pause answered "503, retry" was committed anyway (database, audit log and Redis said paused)."""
    from queueing.models import Queue

    queue = make_queue(state="open")
    changes_before = QueueChange.objects.filter(queue=queue).count()
    redis_away()
    paused = staff_api.post(f"/api/v1/queues/{queue.slug}/pause")
    patched = staff_api.patch(f"/api/v1/queues/{queue.slug}", {"capacity": 99}, format="json")
    assert paused.status_code == patched.status_code == 503
    assert paused.json()["error"]["code"] == "service_unavailable"
    queue = Queue.objects.get(pk=queue.pk)
    assert (queue.state, queue.capacity) == ("open", 10)
    assert QueueChange.objects.filter(queue=queue).count() == changes_before
