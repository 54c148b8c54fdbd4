"""A sale scheduled in admin (issue 47, items 7 and 8): its times are read and shown in the queue's own time
zone, named beside each field, and it gets the same hoarding guards as one scheduled over the API or with
the configure_queue command."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from io import StringIO
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from queueing.models import Queue, QueueChange
from tests.test_admin import FORM


@pytest.fixture
def operator(client, db):
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def at(date: str, time: str) -> dict[str, str]:
    return {"_0": date, "_1": time}


def schedule(**moments: dict[str, str]) -> dict[str, str]:
    """The split date and time inputs admin posts for each moment."""
    return {f"{name}{half}": value for name, halves in moments.items() for half, value in halves.items()}


def change_form(queue: Queue, **changes: str) -> dict[str, str]:
    """The change form as posted for an existing queue, its four priority levels untouched."""
    data = {k: v for k, v in FORM.items() if k != "slug"}
    data.update(
        {
            "time_zone": queue.time_zone,
            "priority_levels-TOTAL_FORMS": "4",
            "priority_levels-INITIAL_FORMS": "4",
            "priority_levels-MIN_NUM_FORMS": "0",
            "priority_levels-MAX_NUM_FORMS": "4",
        }
    )
    for i, level in enumerate(queue.priority_levels.order_by("level")):
        data.update(
            {
                f"priority_levels-{i}-id": str(level.pk),
                f"priority_levels-{i}-queue": str(queue.pk),
                f"priority_levels-{i}-level": str(level.level),
                f"priority_levels-{i}-name": level.name,
                f"priority_levels-{i}-placement_fraction": str(level.placement_fraction),
                f"priority_levels-{i}-group": "",
            }
        )
    return {**data, **changes}


BERLIN_SALE_TIMES = schedule(prequeue_opens_at=at("2026-12-03", "17:00"), starts_at=at("2026-12-03", "18:00"))
BERLIN_SALE = {**FORM, "time_zone": "Europe/Berlin", **BERLIN_SALE_TIMES}


# --- Item 7: times in the queue's time zone ---


def test_a_new_queue_s_times_are_read_in_the_time_zone_chosen_in_the_same_form(operator):
    response = operator.post("/admin/queueing/queue/add/", BERLIN_SALE)
    assert response.status_code == 302, response.content[:3000]
    queue = Queue.objects.get(slug="spring-sale")
    assert queue.prequeue_opens_at == datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
    assert queue.starts_at == datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
    body = operator.get("/api/v1/queues/spring-sale").json()  # the API keeps UTC
    assert (body["prequeue_opens_at"], body["starts_at"]) == ("2026-12-03T16:00:00Z", "2026-12-03T17:00:00Z")
    assert QueueChange.objects.get(queue=queue, action="create").after["starts_at"] == "2026-12-03T17:00:00Z"


def test_the_change_form_shows_the_times_in_the_queue_s_zone_and_names_it(operator, make_queue):
    queue = make_queue(
        time_zone="Europe/Berlin",
        prequeue_opens_at=datetime(2026, 12, 3, 16, 0, tzinfo=UTC),
        starts_at=datetime(2026, 12, 3, 17, 0, tzinfo=UTC),
    )
    page = operator.get(f"/admin/queueing/queue/{queue.pk}/change/")
    html = page.content.decode()
    assert 'name="prequeue_opens_at_1" value="17:00:00"' in html
    assert 'name="starts_at_1" value="18:00:00"' in html
    form = page.context["adminform"].form
    for field in ("prequeue_opens_at", "starts_at"):
        assert "Europe/Berlin (CET, UTC+01:00)" in form.fields[field].help_text
    assert "Europe/Berlin (" in form.fields["ends_at"].help_text  # empty: named at today's offset
    # Admin's "Now" shortcuts and its "you are N hours ahead" note count from the queue's zone, too.
    offset = timezone.localtime(timezone.now(), ZoneInfo("Europe/Berlin")).utcoffset()
    assert offset is not None
    assert f'data-admin-utc-offset="{int(offset.total_seconds())}"' in html


def test_saving_the_change_form_untouched_keeps_the_times(operator, make_queue):
    queue = make_queue(time_zone="Europe/Berlin")
    response = operator.post(f"/admin/queueing/queue/{queue.pk}/change/", change_form(queue, **BERLIN_SALE_TIMES))
    assert response.status_code == 302, response.content[:3000]
    saved = Queue.objects.get(pk=queue.pk)
    assert saved.starts_at == datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
    again = operator.post(f"/admin/queueing/queue/{queue.pk}/change/", change_form(queue, **BERLIN_SALE_TIMES))
    assert again.status_code == 302
    assert Queue.objects.get(pk=queue.pk).starts_at == saved.starts_at


def test_a_new_zone_keeps_the_clock_times_shown_beside_it(operator, make_queue):
    """The form's times are read in the zone submitted with them: what the operator sees is what is kept."""
    queue = make_queue(time_zone="Europe/Berlin")
    operator.post(f"/admin/queueing/queue/{queue.pk}/change/", change_form(queue, **BERLIN_SALE_TIMES))
    assert Queue.objects.get(pk=queue.pk).starts_at == datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
    london = change_form(queue, **BERLIN_SALE_TIMES, time_zone="Europe/London")
    response = operator.post(f"/admin/queueing/queue/{queue.pk}/change/", london)
    assert response.status_code == 302, response.content[:3000]
    assert Queue.objects.get(pk=queue.pk).starts_at == datetime(2026, 12, 3, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "moment",
    [
        at("2026-03-29", "02:30"),  # Berlin's clocks go from 02:00 to 03:00: no such time
        at("2026-10-25", "02:30"),  # from 03:00 back to 02:00: twice
    ],
)
def test_a_time_that_does_not_exist_or_comes_twice_in_the_queue_s_zone_is_refused(operator, make_queue, moment):
    queue = make_queue(time_zone="Europe/Berlin")
    data = change_form(queue, **schedule(starts_at=moment))
    response = operator.post(f"/admin/queueing/queue/{queue.pk}/change/", data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "starts_at" in errors and "Europe/Berlin" in str(errors["starts_at"])
    assert Queue.objects.get(pk=queue.pk).starts_at is None


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "x" * 300])
def test_times_given_with_a_zone_that_is_not_one_are_refused_with_it_not_an_error_page(operator, zone):
    response = operator.post("/admin/queueing/queue/add/", {**BERLIN_SALE, "time_zone": zone})
    assert response.status_code == 200
    assert "time_zone" in response.context["adminform"].form.errors
    assert not Queue.objects.exists()


# --- Item 8: the same hoarding guards whichever way a sale is scheduled ---


def shown(page: Any, field: str) -> str:
    """What the admin form shows in a field, as the browser posts it back."""
    value = page.context["adminform"].form[field].value()
    return "" if value is None else str(value)


def test_a_sale_scheduled_in_admin_over_the_api_or_by_command_gets_the_same_guards(operator):
    add = operator.get("/admin/queueing/queue/add/")
    guards_as_shown = {f: shown(add, f) for f in ("max_tickets_per_address", "pow_difficulty")}
    starts = {"starts_at": "2031-03-01T10:00:00Z"}
    in_admin = {**FORM, **guards_as_shown, "slug": "in-admin", **schedule(starts_at=at("2031-03-01", "10:00"))}
    assert operator.post("/admin/queueing/queue/add/", in_admin).status_code == 302
    over_api = operator.post(
        "/api/v1/queues",
        json.dumps({"slug": "over-api", "name": "Over the API", "target_url": "https://shop.example/", **starts}),
        content_type="application/json",
    )
    assert over_api.status_code == 201, over_api.content
    call_command(
        "configure_queue", "by-command", "--starts-at", starts["starts_at"], "--target-url", "/", stdout=StringIO()
    )

    guards = {
        q.slug: (q.starts_at, q.max_tickets_per_address, q.pow_difficulty)
        for q in Queue.objects.filter(slug__in=["in-admin", "over-api", "by-command"])
    }
    start = datetime(2031, 3, 1, 10, 0, tzinfo=UTC)
    assert guards == dict.fromkeys(("in-admin", "over-api", "by-command"), (start, 20, 16))


def test_an_operator_turns_the_guards_off_in_admin_by_saying_0(operator):
    chosen = {
        **FORM,
        "max_tickets_per_address": "0",
        "pow_difficulty": "",
        **schedule(starts_at=at("2031-03-01", "10:00")),
    }
    assert operator.post("/admin/queueing/queue/add/", chosen).status_code == 302
    queue = Queue.objects.get(slug="spring-sale")
    assert (queue.max_tickets_per_address, queue.pow_difficulty) == (0, 16)
    page = operator.get(f"/admin/queueing/queue/{queue.pk}/change/")
    assert (shown(page, "max_tickets_per_address"), shown(page, "pow_difficulty")) == ("0", "16")  # a choice shows


def test_a_queue_scheduled_later_in_admin_gets_the_guards_and_one_without_a_start_none(operator, make_queue):
    queue = make_queue()
    page = operator.get(f"/admin/queueing/queue/{queue.pk}/change/")
    guards_as_shown = {f: shown(page, f) for f in ("max_tickets_per_address", "pow_difficulty")}
    assert guards_as_shown == {"max_tickets_per_address": "", "pow_difficulty": ""}  # the default: off for now
    unscheduled = operator.post(f"/admin/queueing/queue/{queue.pk}/change/", change_form(queue, **guards_as_shown))
    assert unscheduled.status_code == 302, unscheduled.content[:3000]
    assert Queue.objects.filter(pk=queue.pk, max_tickets_per_address=0, pow_difficulty=0).exists()
    scheduled = change_form(queue, **guards_as_shown, **schedule(starts_at=at("2031-03-01", "10:00")))
    assert operator.post(f"/admin/queueing/queue/{queue.pk}/change/", scheduled).status_code == 302
    assert Queue.objects.filter(pk=queue.pk, max_tickets_per_address=20, pow_difficulty=16).exists()


def test_priority_codes_expire_at_a_time_typed_and_shown_in_the_queue_s_zone(operator, make_queue):
    """The codes form read its expiry in the server's zone (UTC here) and said so, so codes for a Berlin
    sale, typed to expire at 20:00, lived an hour longer; the list and a code's page showed UTC."""
    from queueing.models import PriorityCode

    queue = make_queue(time_zone="Europe/Berlin")
    chosen = {"action": "generate_codes", "_selected_action": [queue.pk]}
    form = operator.post("/admin/queueing/queue/", chosen).content.decode()
    assert "Europe/Berlin (CET, UTC+01:00)" in form and "this server's time zone" not in form
    answer = operator.post(
        "/admin/queueing/queue/",
        {**chosen, "apply": "1", "count": "2", "level": "2", "max_uses": "1", "expires_at": "2026-12-03 20:00"},
    )
    assert answer["Content-Type"].startswith("text/csv")
    code = PriorityCode.objects.filter(queue=queue).first()
    assert code is not None and code.expires_at == datetime(2026, 12, 3, 19, 0, tzinfo=UTC)
    listed = operator.get("/admin/queueing/prioritycode/").content.decode()
    assert "2026-12-03 20:00 Europe/Berlin (CET, UTC+01:00)" in listed
    page = operator.get(f"/admin/queueing/prioritycode/{code.pk}/change/").content.decode()
    assert 'value="20:00:00"' in page and "Europe/Berlin" in page
    moved = {
        "queue": str(queue.pk),
        "code": code.code,
        "level": "2",
        "max_uses": "1",
        "expires_at_0": "2026-12-03",
        "expires_at_1": "21:30",
    }
    saved = operator.post(f"/admin/queueing/prioritycode/{code.pk}/change/", moved)
    assert saved.status_code == 302, saved.content[:2000]
    code.refresh_from_db()
    assert code.expires_at == datetime(2026, 12, 3, 20, 30, tzinfo=UTC)
