"""Roles (issue 19): the groups migration 0013 makes, the printed login an operator who can do the README's
whole walk-through, and styled pages for what a login may not do (403), what is not there (404) and what
went wrong (500). Seen before: the printed login got a bare "403 Forbidden" on "Add queue", and the demo
queue's page had no priority-levels table."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client, RequestFactory

from queueing.models import Queue
from waitingroom_site import urls

from .test_admin import FORM

pytestmark = pytest.mark.django_db


def codenames(group: str) -> set[str]:
    return set(Group.objects.get(name=group).permissions.values_list("codename", flat=True))


def test_the_two_roles_exist_with_what_each_may_do():
    operators, viewers = codenames("Queue operators"), codenames("Queue viewers")
    for model in ("queue", "prioritylevel", "prioritycode", "queueapikey"):
        assert {f"add_{model}", f"change_{model}", f"delete_{model}", f"view_{model}"} <= operators
    assert {"view_queuechange", "view_queuesnapshot", "view_waitsample"} <= operators
    assert not any(name.endswith("signingkey") for name in operators)  # signing keys stay with superusers
    assert {"add_alerthook", "change_alerthook", "delete_alerthook", "view_alertdelivery"} <= operators
    assert viewers == {
        "view_alertdelivery",  # the log, not the hooks (they hold the webhooks' secrets)
        "view_queue",
        "view_prioritylevel",
        "view_queuechange",
        "view_queueshuffle",
        "view_queuesnapshot",
        "view_waitsample",
    }


def printed_login() -> Client:
    out = StringIO()
    call_command("setup_demo", stdout=out)
    password = out.getvalue().split("password ")[1].split()[0]
    client = Client()
    logged_in = client.post("/admin/login/?next=/admin/", {"username": "staff", "password": password})
    assert logged_in.status_code == 302 and logged_in["Location"] == "/admin/"
    return client


def test_the_printed_login_can_create_a_queue_with_levels_and_see_the_demo_s_levels():
    client = printed_login()
    add = client.get("/admin/queueing/queue/add/")
    assert add.status_code == 200
    created = client.post("/admin/queueing/queue/add/", FORM)
    assert created.status_code == 302, created.content
    queue = Queue.objects.get(slug=FORM["slug"])
    demo = client.get(f"/admin/queueing/queue/{Queue.objects.get(slug='demo').pk}/change/")
    assert demo.status_code == 200 and b'id="priority_levels-group"' in demo.content
    page = client.get(f"/admin/queueing/queue/{queue.pk}/change/")
    assert b'id="priority_levels-group"' in page.content
    assert client.get("/admin/queueing/prioritycode/add/").status_code == 200
    assert client.get("/admin/queueing/queueapikey/add/").status_code == 200
    assert client.get(f"/dashboard/{queue.slug}/").status_code == 200
    assert client.get("/admin/queueing/signingkey/").status_code == 403


def test_a_viewer_is_told_plainly_what_it_cannot_do():
    user = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name="Queue viewers"))
    client = Client()
    client.force_login(user)
    assert client.get("/admin/queueing/queue/").status_code == 200
    refused = client.get("/admin/queueing/queue/add/")
    assert refused.status_code == 403
    html = refused.content.decode()
    assert "You cannot open this page" in html and "Queue operators" in html
    assert 'href="/static/queueing/base.css"' in html  # the site's own style, not a bare page


def test_pages_that_are_not_there_and_errors_are_styled(client):
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404 and "There is no page here" in missing.content.decode()
    assert 'href="/static/queueing/base.css"' in missing.content.decode()
    api_missing = client.get("/api/v1/no-such-thing")
    assert api_missing.status_code == 404 and api_missing["Content-Type"].startswith("application/json")
    broken = urls.server_error(RequestFactory().get("/somewhere/"))
    assert broken.status_code == 500 and b"Something went wrong on our side" in broken.content
