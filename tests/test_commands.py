"""Management commands for automation: configure_queue, create_api_key, setup_demo, rotate_signing_key."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from queueing import store
from queueing.models import Queue, QueueAPIKey, QueueChange, SigningKey


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_configure_queue_creates_then_updates_and_prints_the_result(db):
    created = json.loads(
        run(
            "configure_queue",
            "sale",
            "--name",
            "Big sale",
            "--target-url",
            "https://shop.example/",
            "--capacity",
            "250",
            "--outflow-per-minute",
            "120.5",
            "--burst",
            "20",
            "--session-ttl",
            "900",
            "--claim-ttl",
            "90",
            "--presence-timeout",
            "45",
            "--abandon-timeout",
            "400",
            "--max-waiting",
            "100000",
            "--state",
            "paused",
        )
    )
    assert created["created"] is True
    assert (created["capacity"], created["outflow_per_minute"], created["state"]) == (250, 120.5, "paused")
    updated = json.loads(run("configure_queue", "sale", "--capacity", "300"))
    assert updated["created"] is False and updated["capacity"] == 300 and updated["burst"] == 20
    assert store.config_read("sale")["capacity"] == "300"
    assert [c.actor_label for c in QueueChange.objects.order_by("id")] == ["configure_queue command"] * 2


def test_configure_queue_refuses_invalid_settings_clearly(db):
    with pytest.raises(CommandError, match="capacity"):
        run("configure_queue", "sale", "--target-url", "https://shop.example/", "--capacity", "0")
    with pytest.raises(CommandError, match=r"There is no queue 'sale'\. To make one, give at least --target-url"):
        run("configure_queue", "sale")  # a new queue needs a target
    assert not Queue.objects.exists()


def test_a_command_given_a_slug_that_does_not_exist_says_so(db):
    """Issue 47: `configure_queue sael --state closed` (a typo) answered "target_url: This field cannot be
    blank", and `verify_shuffle` of an unknown queue that it had no scheduled start."""
    run("configure_queue", "sale", "--target-url", "https://shop.example/")
    for command in (("configure_queue", "sael", "--state", "closed"), ("verify_shuffle", "sael")):
        with pytest.raises(CommandError, match="There is no queue 'sael'"):
            run(*command)
    assert Queue.objects.get().state == "open" and list(Queue.objects.values_list("slug", flat=True)) == ["sale"]


def test_create_api_key_prints_a_working_key_once(db):
    run("configure_queue", "sale", "--target-url", "https://shop.example/")
    key = run("create_api_key", "sale", "--name", "checkout").strip()
    stored = QueueAPIKey.objects.get()
    assert stored.name == "checkout" and stored.queue.slug == "sale"
    assert QueueAPIKey.objects.get_from_key(key) == stored
    with pytest.raises(CommandError):
        run("create_api_key", "nope")


def test_setup_demo_creates_the_demo_and_prints_the_login_only_the_first_time(db):
    first = run("setup_demo")
    assert "Staff login (shown once; bin/run --login gives it a new password)" in first
    password = first.split("password ")[1].split()[0]
    user = get_user_model().objects.get(username="staff")
    assert user.is_staff and user.check_password(password) and user.has_perm("queueing.change_queue")
    assert Queue.objects.get(slug="demo").target_url == "/demo/protected/"
    assert SigningKey.objects.count() == 1
    assert "Staff login" not in run("setup_demo")
    again = run("staff_login")  # the login again: a new password, the old one no longer works
    new_password = again.split("password ")[1].split()[0]
    user.refresh_from_db()
    assert new_password != password and user.check_password(new_password) and not user.check_password(password)
    assert user.groups.filter(name="Queue operators").exists()


def test_rotate_signing_key_publishes_a_new_key(db):
    run("setup_demo")
    out = run("rotate_signing_key", "--lead-seconds", "0")
    assert out.startswith("New key ")
    assert SigningKey.objects.count() == 2


def test_configure_queue_explains_itself():
    """Issue 12: `--help` crashed on a '%' in one option's help text."""
    from queueing.management.commands.configure_queue import Command

    text = Command().create_parser("manage.py", "configure_queue").format_help()
    assert "--health-error-rate" in text and "5%" in text
