"""Admin that explains itself (issue 19, items 2 and 3). Seen before: a queue aimed at /demo/protected/
(the only protected page README named) sent its admitted visitors into the demo queue's line ("That link
to the site was not valid", "This line is closed"), where they lost their turn; nothing warned."""

from __future__ import annotations

import csv
import io
import json
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from queueing import services
from queueing.models import Queue
from queueing.targets import target_problem

from .test_admin import FORM

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_a_target_that_takes_another_queue_s_tokens_is_named():
    problem = target_problem("spring-sale", "/demo/protected/")
    assert '"demo"' in problem and "lose their turn" in problem
    assert "/demo/spring-sale/protected/" in problem  # the page that would work
    assert target_problem("spring-sale", "/demo/spring-sale/protected/") == ""
    assert target_problem("demo", "/demo/protected/?from=mail") == ""
    assert '"other"' in target_problem("spring-sale", "/demo/other/protected/")


def test_a_page_of_this_server_that_checks_no_token_or_is_not_there_is_named():
    assert "does not check access tokens" in target_problem("spring-sale", "/")
    assert '@require_queue_access("spring-sale")' in target_problem("spring-sale", "/")
    assert "No page of this server answers at /nowhere/" in target_problem("spring-sale", "/nowhere/")
    assert target_problem("spring-sale", "https://shop.example/sale") == ""  # another site: not checkable here


@override_settings(
    MIDDLEWARE=["queueing.middleware.QueueAccessMiddleware"], WR_PROTECTED_PATHS={"/shop/": "spring-sale"}
)
def test_paths_the_middleware_protects_take_the_queue_it_names():
    assert target_problem("spring-sale", "/shop/boots") == ""
    assert '"spring-sale"' in target_problem("winter", "/shop/boots")


def test_saving_a_queue_aimed_at_the_demo_s_page_warns_and_its_page_says_how_to_protect_a_site(admin_client):
    saved = admin_client.post("/admin/queueing/queue/add/", {**FORM, "target_url": "/demo/protected/"}, follow=True)
    assert saved.status_code == 200
    warnings = [str(m) for m in saved.context["messages"] if m.level_tag == "warning"]
    assert len(warnings) == 1 and "lose their turn" in warnings[0]
    queue = Queue.objects.get(slug=FORM["slug"])
    page = admin_client.get(f"/admin/queueing/queue/{queue.pk}/change/").content.decode()
    assert "Protecting your site" in page and "lose their turn" in page
    assert '@require_queue_access("spring-sale")' in page and 'WR_PROTECTED_PATHS = {"/sale/": "spring-sale"}' in page
    assert "/api/v1/queues/spring-sale/sessions/verify" in page
    assert 'href="/dashboard/spring-sale/"' in page and 'href="/q/spring-sale/"' in page
    # Aimed at its own demo page, the page shows no warning.
    services.queue_configure(slug=queue.slug, changes={"target_url": "/demo/spring-sale/protected/"})
    assert "lose their turn" not in admin_client.get(f"/admin/queueing/queue/{queue.pk}/change/").content.decode()


def test_the_admin_links_to_the_dashboard_and_each_queue_s_pages(admin_client, make_queue):
    queue = make_queue()
    index = admin_client.get("/admin/").content.decode()
    assert 'href="/dashboard/"' in index and "Running a sale" in index
    listing = admin_client.get("/admin/queueing/queue/").content.decode()
    assert f'href="/dashboard/{queue.slug}/"' in listing and f'href="/q/{queue.slug}/"' in listing


def test_the_mode_and_adaptive_settings_are_folded_until_in_use(admin_client, make_queue):
    tracked = make_queue()
    page = admin_client.get(f"/admin/queueing/queue/{tracked.pk}/change/").content.decode()
    assert page.count('class="module aligned collapse"') == 3  # the closed page's, the mode's, the adaptive's
    adaptive = make_queue(
        adaptive_outflow=True, outflow_per_minute=60, outflow_min_per_minute=10, outflow_max_per_minute=100
    )
    page = admin_client.get(f"/admin/queueing/queue/{adaptive.pk}/change/").content.decode()
    assert page.count('class="module aligned collapse"') == 2  # the closed page's and the mode's
    worded = make_queue(closed_message="Sold out.")
    page = admin_client.get(f"/admin/queueing/queue/{worded.pk}/change/").content.decode()
    assert page.count('class="module aligned collapse"') == 2  # the mode's and the adaptive's


def test_an_operator_generates_codes_and_downloads_them_as_csv(make_queue):
    """The admin action: N random codes (96 bits each) of a level, saved with the queue, downloaded once as
    CSV, audited without the codes; each one then lets a visitor join at its level, up to its uses."""
    from queueing.models import PriorityCode, QueueChange

    from .test_roles import printed_login

    client = printed_login()  # an operator, not a superuser
    queue = make_queue()
    chosen = {"action": "generate_codes", "_selected_action": [queue.pk]}
    form = client.post("/admin/queueing/queue/", chosen)
    assert form.status_code == 200 and "Generate priority codes" in form.content.decode()
    refused = client.post("/admin/queueing/queue/", {**chosen, "apply": "1", "count": "0", "level": "2"})
    assert refused.status_code == 200 and not PriorityCode.objects.exists()  # the form again, with the error
    answer = client.post(
        "/admin/queueing/queue/", {**chosen, "apply": "1", "count": "25", "level": "2", "max_uses": "1"}
    )
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert f'filename="{queue.slug}-priority-codes.csv"' in answer["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(answer.content.decode())))
    assert rows[0] == ["queue", "code", "level", "max_uses", "expires_at"] and len(rows) == 26
    codes = [row[1] for row in rows[1:]]
    assert len(set(codes)) == 25 and all(len(code) == 16 for code in codes)  # 16 URL-safe characters: 96 bits
    assert set(PriorityCode.objects.filter(queue=queue).values_list("code", flat=True)) == set(codes)
    entry = QueueChange.objects.get(queue=queue, action="codes_generated")
    assert entry.after["codes"] == 25 and entry.after["level"] == 2 and codes[0] not in json.dumps(entry.after)
    first = join_with_code(queue.slug, codes[0])
    assert first.status_code == 201 and PriorityCode.objects.get(code=codes[0]).uses == 1
    spent = join_with_code(queue.slug, codes[0])
    assert spent.status_code == 400 and spent.json()["error"]["code"] == "invalid_priority_code"  # its one use


def join_with_code(slug: str, code: str):
    body = json.dumps({"priority_code": code})
    return Client().post(f"/api/v1/queues/{slug}/join", body, "application/json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))


def test_priority_levels_are_edited_on_the_add_form(admin_client):
    """Issue 19: the levels could only be edited once the queue existed. The add form shows the four a
    queue gets; what is changed there is what the queue is made with (audited, mirrored into Redis)."""
    from queueing import store
    from queueing.models import PriorityLevel, QueueChange

    form = admin_client.get("/admin/queueing/queue/add/").content.decode()
    assert 'name="priority_levels-TOTAL_FORMS" value="4"' in form
    assert 'name="priority_levels-2-placement_fraction" value="0.5"' in form  # VIP: the middle, by default
    levels = {"priority_levels-TOTAL_FORMS": "4", "priority_levels-INITIAL_FORMS": "0"}
    for i, row in enumerate(
        [(0, "Normal", "0.0"), (1, "Elevated", "0.1"), (2, "Members", "0.8"), (3, "Premium", "1.0")]
    ):
        level, name, fraction = row
        levels |= {
            f"priority_levels-{i}-level": str(level),
            f"priority_levels-{i}-name": name,
            f"priority_levels-{i}-placement_fraction": fraction,
        }
    saved = admin_client.post("/admin/queueing/queue/add/", {**FORM, **levels})
    assert saved.status_code == 302, saved.content.decode()[:3000]
    queue = Queue.objects.get(slug=FORM["slug"])
    made = {lvl.level: (lvl.name, lvl.placement_fraction) for lvl in PriorityLevel.objects.filter(queue=queue)}
    assert made == {0: ("Normal", 0.0), 1: ("Elevated", 0.1), 2: ("Members", 0.8), 3: ("Premium", 1.0)}
    assert QueueChange.objects.filter(queue=queue, action="priority_levels").exists()
    assert 0.8 in json.loads(store.snapshot(queue.slug).config["packed"])  # VIP's place, as joins read it
