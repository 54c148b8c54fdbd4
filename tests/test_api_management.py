"""The management API (issue 19, item 5): what admin and configure_queue do, for automation, through the
same services and audited alike. Staff sign in for a JWT (/api/v1/auth/token) and act by the permissions
of their group: Queue operators may create, change and delete queues and make codes; viewers may look."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from queueing import store
from queueing.models import PriorityCode, Queue, QueueChange

pytestmark = pytest.mark.django_db
JSON = "application/json"


def signed_in(group: str) -> dict[str, str]:
    name = group.split()[-1]
    user = get_user_model().objects.create_user(name, password="pw-mgmt-4567", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    tokens = Client().post("/api/v1/auth/token", {"username": name, "password": "pw-mgmt-4567"}, JSON).json()
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens['access']}"}


def call(method: str, path: str, auth: dict[str, str], body: Any = None) -> Any:
    data = json.dumps(body) if body is not None else ""
    return Client().generic(method, path, data, JSON, HTTP_AUTHORIZATION=auth.get("HTTP_AUTHORIZATION", ""))


NEW = {"slug": "spring-sale", "name": "Spring sale", "target_url": "https://shop.example/sale", "capacity": 50}


def test_an_operator_creates_lists_changes_and_deletes_a_queue_all_audited():
    operator = signed_in("Queue operators")
    created = call("POST", "/api/v1/queues", operator, {**NEW, "state": "paused", "outflow_per_minute": 120})
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["slug"], body["capacity"], body["state"], body["target_url"]) == (
        "spring-sale",
        50,
        "paused",
        "https://shop.example/sale",
    )
    assert store.config_read("spring-sale")["capacity"] == "50"  # mirrored into Redis, as from admin
    entry = QueueChange.objects.get(queue_slug="spring-sale", action="create")
    assert entry.actor is not None and entry.actor.get_username() == "operators"
    listed = call("GET", "/api/v1/queues", operator).json()
    assert [q["slug"] for q in listed] == ["spring-sale"]
    again = call("POST", "/api/v1/queues", operator, NEW)
    assert again.status_code == 409 and again.json()["error"]["code"] == "queue_exists"
    changed = call("PATCH", "/api/v1/queues/spring-sale", operator, {"capacity": 60})
    assert changed.status_code == 200 and changed.json()["capacity"] == 60
    gone = call("DELETE", "/api/v1/queues/spring-sale", operator)
    assert gone.status_code == 204 and not Queue.objects.filter(slug="spring-sale").exists()
    assert store.config_read("spring-sale") == {}
    assert QueueChange.objects.filter(queue_slug="spring-sale", action="delete").exists()  # the log stays


def test_a_queue_the_model_refuses_is_a_400_naming_the_fields():
    operator = signed_in("Queue operators")
    refused = call("POST", "/api/v1/queues", operator, {**NEW, "session_ttl": 60, "claim_ttl": 120})
    assert refused.status_code == 400
    assert "claim_ttl" in refused.json()["error"]["fields"]
    assert not Queue.objects.filter(slug="spring-sale").exists()
    unknown = call("POST", "/api/v1/queues", operator, {**NEW, "colour": "red"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_fields"


def test_an_operator_makes_codes_that_are_shown_once_and_work(make_queue):
    operator = signed_in("Queue operators")
    queue = make_queue()
    made = call("POST", f"/api/v1/queues/{queue.slug}/codes", operator, {"count": 5, "level": 2, "max_uses": 1})
    assert made.status_code == 201, made.content
    codes = made.json()["codes"]
    assert len(set(codes)) == 5 and made.json()["level"] == 2
    assert set(PriorityCode.objects.filter(queue=queue).values_list("code", flat=True)) == set(codes)
    entry = QueueChange.objects.get(queue=queue, action="codes_generated")
    assert entry.after["codes"] == 5 and codes[0] not in str(entry.after)
    joined = Client().post(
        f"/api/v1/queues/{queue.slug}/join", {"priority_code": codes[0]}, JSON, HTTP_X_VISITOR_ID=str(uuid.uuid4())
    )
    assert joined.status_code == 201


def test_a_viewer_may_look_and_change_nothing(make_queue):
    viewer = signed_in("Queue viewers")
    queue = make_queue()
    assert call("GET", "/api/v1/queues", viewer).status_code == 200
    for method, path, body in (
        ("POST", "/api/v1/queues", NEW),
        ("DELETE", f"/api/v1/queues/{queue.slug}", None),
        ("POST", f"/api/v1/queues/{queue.slug}/codes", {"count": 1, "level": 2}),
        ("PATCH", f"/api/v1/queues/{queue.slug}", {"capacity": 9}),
    ):
        answer = call(method, path, viewer, body)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "permission_denied", (method, path)
    assert Queue.objects.filter(slug=queue.slug, capacity=queue.capacity).exists()
    assert call("GET", "/api/v1/queues", {}).status_code == 401


def test_deleting_while_redis_is_away_is_a_503_and_loses_nothing(make_queue, settings):
    operator = signed_in("Queue operators")
    queue = make_queue()
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    answer = call("DELETE", f"/api/v1/queues/{queue.slug}", operator)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "service_unavailable"
    assert Queue.objects.filter(slug=queue.slug).exists()
    assert not QueueChange.objects.filter(queue_slug=queue.slug, action="delete").exists()


def test_an_operator_schedules_a_sale_and_retargets_it_over_the_api(make_queue):
    operator = signed_in("Queue operators")
    queue = make_queue()
    schedule = {"prequeue_opens_at": "2031-03-01T09:00:00Z", "starts_at": "2031-03-01T10:00:00Z"}
    answer = call("PATCH", f"/api/v1/queues/{queue.slug}", operator, {**schedule, "target_url": "/sale/"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["prequeue_opens_at"], body["starts_at"], body["target_url"]) == (
        "2031-03-01T09:00:00Z",
        "2031-03-01T10:00:00Z",
        "/sale/",
    )
    entry = QueueChange.objects.filter(queue=queue, action="update").latest("id")
    assert {"prequeue_opens_at", "starts_at", "target_url"} <= set(entry.after)
    backwards = call("PATCH", f"/api/v1/queues/{queue.slug}", operator, {"starts_at": "2031-03-01T08:00:00Z"})
    assert backwards.status_code == 400, backwards.content  # the pre-queue would open after the start
