"""The management API (issue 19, item 5): what admin and configure_queue do, for automation, through the
same services and audited alike. Staff sign in for a JWT (/api/v1/auth/token) and act by the permissions
of their group: Queue operators may create, change and delete queues and make codes; viewers may look."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client

from queueing import store
from queueing.models import ManagementKey, PriorityCode, PriorityLevel, Queue, QueueChange

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


def test_an_operator_changes_priority_levels_validated_as_in_admin_and_audited(make_queue):
    queue = make_queue()
    Group.objects.create(name="Members")
    operator, viewer = signed_in("Queue operators"), signed_in("Queue viewers")
    levels = call("GET", f"/api/v1/queues/{queue.slug}/levels", viewer)
    assert levels.status_code == 200
    assert [(lv["level"], lv["placement_fraction"]) for lv in levels.json()] == [(0, 0.0), (1, 0.1), (2, 0.5), (3, 1.0)]
    body = {"levels": [{"level": 2, "name": "Members", "placement_fraction": 0.75, "group": "Members"}]}
    assert call("PATCH", f"/api/v1/queues/{queue.slug}/levels", viewer, body).status_code == 403
    changed = call("PATCH", f"/api/v1/queues/{queue.slug}/levels", operator, body)
    assert changed.status_code == 200, changed.content
    assert changed.json()[2] == {"level": 2, "name": "Members", "placement_fraction": 0.75, "group": "Members"}
    assert store.config_read(queue.slug)["pf2"] == "0.75"  # mirrored into Redis: joins use it at once
    entry = QueueChange.objects.get(queue_slug=queue.slug, action="priority_levels")
    assert entry.actor_label == "operators" and entry.after["2"]["placement_fraction"] == 0.75

    for bad, problem in (
        ({"levels": [{"level": 0, "placement_fraction": 0.5}]}, "Normal joiners always go to the back"),
        ({"levels": [{"level": 1, "group": "Nobody"}]}, "no group named “Nobody”"),
        ({"levels": [{"level": 1, "name": "ok"}, {"level": 0, "placement_fraction": 0.2}]}, "level 0"),
    ):
        refused = call("PATCH", f"/api/v1/queues/{queue.slug}/levels", operator, bad)
        assert refused.status_code == 400 and problem in json.dumps(refused.json(), ensure_ascii=False), refused.json()
    assert PriorityLevel.objects.get(queue=queue, level=1).name == "Elevated"  # all or none
    out_of_range = call("PATCH", f"/api/v1/queues/{queue.slug}/levels", operator, {"levels": [{"level": 4}]})
    assert out_of_range.status_code == 400 and out_of_range.json()["error"]["code"] == "invalid_request"


def test_an_operator_makes_lists_and_revokes_api_keys_and_a_revoked_key_is_refused_at_once(make_queue):
    queue = make_queue()
    operator, viewer = signed_in("Queue operators"), signed_in("Queue viewers")
    made = call("POST", f"/api/v1/queues/{queue.slug}/keys", operator, {"name": "shop checkout"})
    assert made.status_code == 201, made.content
    key, prefix = made.json()["key"], made.json()["prefix"]
    assert key.startswith(prefix) and made.json()["revoked"] is False
    listed = call("GET", f"/api/v1/queues/{queue.slug}/keys", operator).json()
    assert [(k["prefix"], k["name"]) for k in listed] == [(prefix, "shop checkout")] and "key" not in listed[0]
    assert call("GET", f"/api/v1/queues/{queue.slug}/keys", viewer).status_code == 403  # viewers see no keys
    site = {"HTTP_AUTHORIZATION": f"Api-Key {key}"}
    assert call("PUT", f"/api/v1/queues/{queue.slug}/capacity", site, {"in_use": 0}).status_code == 200
    assert call("DELETE", f"/api/v1/queues/{queue.slug}/keys/{prefix}", viewer).status_code == 403
    assert call("DELETE", f"/api/v1/queues/{queue.slug}/keys/{prefix}", operator).status_code == 204
    refused = call("PUT", f"/api/v1/queues/{queue.slug}/capacity", site, {"in_use": 0})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    missing = call("DELETE", f"/api/v1/queues/{queue.slug}/keys/nosuchkey", operator)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    other = make_queue()
    assert call("DELETE", f"/api/v1/queues/{other.slug}/keys/{prefix}", operator).status_code == 404
    log = [(e.action, e.summary()) for e in QueueChange.objects.filter(queue_slug=queue.slug).order_by("created_at")]
    assert ("api_key_created", f"api key shop checkout ({prefix})") in log
    assert ("api_key_revoked", f"api key shop checkout ({prefix}) → —") in log
    assert key not in json.dumps(list(QueueChange.objects.values("before", "after")), default=str)


def management_key(role: str) -> dict[str, str]:
    out = StringIO()
    call_command("create_management_key", f"{role}-bot", "--role", role, stdout=out)
    return {"HTTP_AUTHORIZATION": f"Api-Key {out.getvalue().strip()}"}


def test_a_management_key_automates_without_a_staff_login_within_its_role(make_queue):
    operator_key, viewer_key = management_key("operator"), management_key("viewer")
    created = call("POST", "/api/v1/queues", operator_key, NEW)
    assert created.status_code == 201, created.content
    entry = QueueChange.objects.get(queue_slug="spring-sale", action="create")
    assert entry.actor is None and entry.actor_label.startswith("management key “operator-bot”")
    assert call("POST", "/api/v1/queues/spring-sale/pause", operator_key).json()["state"] == "paused"
    assert call("GET", "/api/v1/queues", viewer_key).status_code == 200
    assert call("GET", "/api/v1/queues/spring-sale/stats", viewer_key).status_code == 200
    refused = call("PATCH", "/api/v1/queues/spring-sale", viewer_key, {"capacity": 9})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert call("POST", "/api/v1/queues", viewer_key, {**NEW, "slug": "other"}).status_code == 403
    keys = call("POST", "/api/v1/queues/spring-sale/keys", operator_key, {"name": "site"})
    assert keys.status_code == 201
    site_key = {"HTTP_AUTHORIZATION": f"Api-Key {keys.json()['key']}"}  # a queue's key manages nothing
    wrong = call("GET", "/api/v1/queues", site_key)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    revoked = ManagementKey.objects.get(name="operator-bot")
    revoked.revoked = True
    revoked.save()
    assert call("GET", "/api/v1/queues", operator_key).status_code == 401
    assert call("GET", "/api/v1/queues", {"HTTP_AUTHORIZATION": "Api-Key not.a-key"}).status_code == 401
