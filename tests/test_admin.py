"""Operators configure queues in Django admin; saves go through the services (validated, audited, synced)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from queueing import store
from queueing.models import Queue, QueueAPIKey, QueueChange


@pytest.fixture
def admin_client(client, db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


FORM = {
    "slug": "spring-sale",
    "name": "Spring sale",
    "target_url": "https://shop.example/",
    "state": "open",
    "time_zone": "UTC",
    "capacity": "20",
    "capacity_source": "counted",
    "outflow_per_minute": "60",
    "burst": "5",
    "session_ttl": "600",
    "claim_ttl": "60",
    "presence_timeout": "60",
    "abandon_timeout": "300",
    "max_waiting": "0",
    "max_tickets_per_address": "0",
    "pow_difficulty": "0",
    # Adaptive outflow: off, with the defaults the add form shows.
    "health_latency_p95_ms": "1000",
    "health_error_rate": "0.05",
    "adaptive_step_per_minute": "6",
    "adaptive_decrease_factor": "0.7",
    "adaptive_interval_seconds": "10",
    "adaptive_min_requests": "20",
    "mode": "tracked",
    "window_size": "100",
    "window_interval": "10",
    "active_windows": "2",
    # The add form's priority levels (issue 19): none sent, so the queue gets the four defaults.
    "priority_levels-TOTAL_FORMS": "0",
    "priority_levels-INITIAL_FORMS": "0",
    # The queue's words in other languages (issue 20): none.
    "texts-TOTAL_FORMS": "0",
    "texts-INITIAL_FORMS": "0",
}


def test_adding_a_queue_in_admin_validates_audits_and_mirrors_to_redis(admin_client):
    response = admin_client.post("/admin/queueing/queue/add/", FORM)
    assert response.status_code == 302, response.content
    queue = Queue.objects.get(slug="spring-sale")
    assert queue.priority_levels.count() == 4
    assert QueueChange.objects.get(queue=queue).action == "create"
    assert store.config_read("spring-sale")["capacity"] == "20"


def test_admin_refuses_a_claim_ttl_longer_than_the_session(admin_client):
    response = admin_client.post("/admin/queueing/queue/add/", {**FORM, "claim_ttl": "900"})
    assert response.status_code == 200
    assert b"cannot be longer than the session" in response.content
    assert not Queue.objects.exists()


def test_the_change_list_shows_live_counts_and_pause_resume_actions(admin_client, make_queue, api):
    queue = make_queue(state="paused")
    for _ in range(3):
        api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    page = admin_client.get("/admin/queueing/queue/")
    assert page.status_code == 200
    html = page.content.decode()
    row = html[html.index(f">{queue.slug}</a>") :].split("</tr>")[0]
    assert '<td class="field-live_waiting">3</td>' in row
    admin_client.post("/admin/queueing/queue/", {"action": "resume_queues", "_selected_action": [queue.pk]})
    assert Queue.objects.get(pk=queue.pk).state == "open"
    admin_client.post("/admin/queueing/queue/", {"action": "pause_queues", "_selected_action": [queue.pk]})
    assert store.config_read(queue.slug)["state"] == "paused"


def test_editing_a_priority_level_updates_the_placement_in_redis_and_is_audited(admin_client, make_queue):
    queue = make_queue()
    page = admin_client.get(f"/admin/queueing/queue/{queue.pk}/change/")
    assert page.status_code == 200
    levels = list(queue.priority_levels.order_by("level"))
    data = {k: v for k, v in FORM.items() if k != "slug"}
    data.update(
        {
            "priority_levels-TOTAL_FORMS": "4",
            "priority_levels-INITIAL_FORMS": "4",
            "priority_levels-MIN_NUM_FORMS": "0",
            "priority_levels-MAX_NUM_FORMS": "4",
        }
    )
    for i, level in enumerate(levels):
        data.update(
            {
                f"priority_levels-{i}-id": str(level.pk),
                f"priority_levels-{i}-queue": str(queue.pk),
                f"priority_levels-{i}-level": str(level.level),
                f"priority_levels-{i}-name": level.name,
                f"priority_levels-{i}-placement_fraction": "0.3" if level.level == 1 else str(level.placement_fraction),
                f"priority_levels-{i}-group": "",
            }
        )
    response = admin_client.post(f"/admin/queueing/queue/{queue.pk}/change/", data)
    assert response.status_code == 302, response.content[:3000]
    assert store.config_read(queue.slug)["pf1"] == "0.3"
    assert store.config_read(queue.slug)["capacity"] == "20"
    # Audited, who and what, like any change to the queue.
    entry = QueueChange.objects.get(queue=queue, action="priority_levels")
    assert entry.actor_label == "root"
    assert entry.before == {"1": {"name": "Elevated", "placement_fraction": 0.1, "group": None}}
    assert entry.after == {"1": {"name": "Elevated", "placement_fraction": 0.3, "group": None}}
    # Saving again without touching a level writes no entry.
    admin_client.post(f"/admin/queueing/queue/{queue.pk}/change/", data)
    assert QueueChange.objects.filter(queue=queue, action="priority_levels").count() == 1


def test_an_api_key_created_in_admin_is_shown_once_and_stored_hashed(admin_client, make_queue):
    queue = make_queue()
    response = admin_client.post(
        "/admin/queueing/queueapikey/add/",
        {"name": "shop", "queue": queue.pk, "expiry_date_0": "", "expiry_date_1": ""},
        follow=True,
    )
    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    key = next(m for m in messages if "API key" in m).split(" is: ")[1].split(". ")[0]
    stored = QueueAPIKey.objects.get(queue=queue)
    assert key.startswith(stored.prefix + ".")
    assert stored.is_valid(key)
    assert key not in admin_client.get(f"/admin/queueing/queueapikey/{stored.pk}/change/").content.decode()


def test_admin_pages_render(admin_client, make_queue):
    make_queue()
    for path in [
        "/admin/",
        "/admin/queueing/queue/",
        "/admin/queueing/prioritycode/",
        "/admin/queueing/queueapikey/",
        "/admin/queueing/signingkey/",
        "/admin/queueing/queuechange/",
        "/admin/django_celery_beat/periodictask/",
    ]:
        assert admin_client.get(path).status_code == 200, path


# --- Staff password logins are limited (django-axes): a username from an address, or an address: 10 failures ---


def admin_login(password: str, address: str = "203.0.113.7") -> Any:
    body = {"username": "root", "password": password, "next": "/admin/"}
    return Client(REMOTE_ADDR=address).post("/admin/login/", body)


def test_the_admin_login_locks_a_username_out_from_an_address_after_ten_wrong_passwords(db):
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    answers = [admin_login(f"guess-{i}").status_code for i in range(11)]
    assert answers == [200] * 9 + [429, 429]  # the login form again, then the lockout page
    refused = admin_login("pw-root-123")  # even the right password, until the cool-off is over
    assert refused.status_code == 429 and b"too many login attempts" in refused.content
    assert admin_login("pw-root-123", address="203.0.113.8").status_code == 302  # username and address together

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert admin_login("pw-root-123").status_code == 302
    assert not AccessAttempt.objects.exists()  # a success clears the count


def test_password_spraying_from_one_address_is_locked_out_too(db):
    """Issue 50, item 7. Seen: 15 usernames x 1 password from one address all answered 200 (the lockout was
    per username and address; the address-wide `auth` limit guards only the token endpoint)."""
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")

    def sprayed(username: str, address: str = "203.0.113.7") -> int:
        body = {"username": username, "password": "Summer2026!", "next": "/admin/"}
        return int(Client(REMOTE_ADDR=address).post("/admin/login/", body).status_code)

    answers = [sprayed(f"user{i}") for i in range(15)]
    assert answers == [200] * 9 + [429] * 6
    assert admin_login("pw-root-123").status_code == 429  # the address, whatever the username
    assert admin_login("pw-root-123", address="203.0.113.8").status_code == 302  # another address is not


def test_the_api_token_endpoint_counts_towards_the_same_lockout_and_keeps_its_error_shape(staff_user):
    def token(password: str) -> Any:
        body = {"username": "staffer", "password": password}
        return Client().post("/api/v1/auth/token", body, content_type="application/json", REMOTE_ADDR="203.0.113.9")

    assert {token(f"guess-{i}").status_code for i in range(10)} == {401}
    refused = token("pw-staff-123")
    assert refused.status_code == 401 and "error" in refused.json()
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert "access" in token("pw-staff-123").json()
