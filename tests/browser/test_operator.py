"""The operator's whole path (issue 19) in headless Chromium against the running stack, with the login
bin/run prints: create a queue with its priority levels, schedule it, generate codes, set up an alert
hook to a receiver this test starts, run the sale from the dashboard (pause asks, resume), read the audit
log and the alerts' delivery log. Every page on the way is checked with axe-core (run in the page)."""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from ..receivers import Receiver
from .conftest import PHONE, accessible
from .test_dashboard import DESKTOP, staff_login

pytestmark = pytest.mark.browser


def watching(stack: Any, hook: str) -> bool:
    """Whether the Alerts task has had its first look for the hook (its later looks tell what changed)."""
    script = f"from alerts.models import AlertWatch; print(AlertWatch.objects.filter(hook__name={hook!r}).count())"
    return int(stack.manage("shell", "--no-imports", "-c", script).strip().splitlines()[-1]) > 0


def deliveries(stack: Any) -> str:
    """The stack's alert deliveries, as the delivery log has them (for a failure's message)."""
    script = "from alerts.models import AlertDelivery as D; "
    script += "print(list(D.objects.values_list('event', 'status', 'last_error')))"
    return str(stack.manage("shell", "--no-imports", "-c", script).strip().splitlines()[-1])


def test_an_operator_sets_up_and_runs_a_sale_with_the_printed_login(stack, contexts, screenshot):
    receiver = Receiver()
    try:
        _walk(stack, contexts(viewport=DESKTOP, accept_downloads=True).new_page(), receiver, screenshot)
    finally:
        receiver.stop()


def _walk(stack: Any, page: Page, receiver: Receiver, screenshot: Any) -> None:
    slug = f"walk-{uuid.uuid4().hex[:6]}"
    staff_login(stack, page, "/admin/")
    accessible(page)

    # A queue, with its VIPs placed further ahead than the default, aimed first at the page README names
    # (the demo queue's: the trap of issue 19), which the admin names as wrong.
    page.goto(f"{stack.url}/admin/queueing/queue/add/")
    accessible(page)
    page.fill("#id_name", "Walk-through sale")
    page.fill("#id_slug", slug)
    page.fill("#id_target_url", "/demo/protected/")
    page.fill("#id_capacity", "5")
    page.fill("#id_priority_levels-2-placement_fraction", "0.6")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    expect(page.locator(".messagelist")).to_contain_text("Check the target URL")
    accessible(page)

    # Its page says so too, and how to protect a site; aimed at its own demo page, it ends tomorrow.
    page.locator("#result_list a", has_text=slug).click()
    expect(page.locator(".wr-protecting .errornote")).to_be_visible()
    expect(page.locator(".wr-protecting")).to_contain_text(f'@require_queue_access("{slug}")')
    accessible(page)
    expect(page.locator("#id_priority_levels-2-placement_fraction")).to_have_value("0.6")
    page.fill("#id_target_url", f"/demo/{slug}/protected/")
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    page.fill("#id_ends_at_0", tomorrow.strftime("%Y-%m-%d"))
    page.fill("#id_ends_at_1", "18:00:00")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    expect(page.locator(".messagelist")).not_to_contain_text("Check the target URL")
    expect(page.locator(".wr-protecting .errornote")).to_have_count(0)

    # "Try the hand-over": a test visitor joins in a new tab and is sent on to the target, let in.
    with page.context.expect_page() as opened:
        page.click("text=Try the hand-over")
    visitor = opened.value
    visitor.wait_for_url(f"**/demo/{slug}/protected/**", timeout=30_000)
    expect(visitor.locator("h1")).to_have_text("You're in")
    visitor.close()
    page.goto(f"{stack.url}/admin/queueing/queue/")

    # Five VIP codes, downloaded once.
    page.locator("#result_list tr", has_text=slug).locator("input.action-select").check()
    page.select_option("select[name=action]", "generate_codes")
    page.click("button[name=index]")
    accessible(page)
    page.fill("#id_count", "5")
    with page.expect_download() as download:
        page.click("input[type=submit][value='Generate and download']")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert len(rows) == 5 and {row["queue"] for row in rows} == {slug} and {row["level"] for row in rows} == {"2"}

    # An alert hook to a receiver of this test's, told when the queue pauses and opens again.
    page.goto(f"{stack.url}/admin/alerts/alerthook/add/")
    accessible(page)
    page.fill("#id_name", f"Pager {slug}")
    page.select_option("#id_queue", page.locator("#id_queue option", has_text=slug).get_attribute("value"))
    page.fill("#id_url", receiver.url)
    page.check("input[name=events][value='queue.paused']")
    page.check("input[name=events][value='queue.opened']")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    deadline = time.monotonic() + 30
    while not watching(stack, f"Pager {slug}"):
        assert time.monotonic() < deadline, "the Alerts task never looked at the queue"
        time.sleep(1)

    # The sale, from the dashboard: its schedule, pause (asked first), the audit entry, resume.
    page.goto(f"{stack.url}/dashboard/{slug}/")
    expect(page.locator("#dash-link")).to_have_attribute("data-state", "live")
    expect(page.locator("body")).to_contain_text("ends")
    accessible(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#q-pause")
    expect(page.locator("#q-state")).to_have_text("paused")
    page.reload()
    expect(page.locator("#q-audit")).to_contain_text("state open → paused")
    # The charts span the last hour whatever the points (one point drew an axis of years), in 24-hour UTC.
    span = page.evaluate("() => { const x = window.dashboard.charts[0].scales.x; return [x.min, x.max]; }")
    assert abs(span[1] - time.time()) < 120 and abs(span[1] - span[0] - 3600) < 1, span
    expect(page.locator("h2", has_text="Last 1 h")).to_contain_text("times in UTC")
    expect(page.locator("#q-audit")).to_contain_text("codes generated")  # audited without the codes
    expect(page.locator("#q-audit")).to_contain_text("codes 5, level 2, max uses 1")
    expect(page.locator("#q-audit")).to_contain_text("level 2 placement fraction 0.5 → 0.6")
    expect(page.locator("#q-audit")).to_contain_text(f"ends at — → {tomorrow:%Y-%m-%d} 18:00:00 UTC")
    screenshot(page, "operator-1-paused")
    page.click("#q-resume")
    expect(page.locator("#q-state")).to_have_text("open")

    # Deliveries are independent (a worker's processes send them side by side), so they may arrive in any
    # order; each says when its change happened.
    deadline = time.monotonic() + 40
    while sorted(body["event"] for body in receiver.bodies()) != ["queue.opened", "queue.paused"]:
        assert time.monotonic() < deadline, (receiver.bodies(), deliveries(stack))
        time.sleep(0.5)
    told = sorted(receiver.bodies(), key=lambda body: body["details"]["at"])
    assert [body["event"] for body in told] == ["queue.paused", "queue.opened"]
    paused = told[0]
    assert paused["queue"]["slug"] == slug and paused["details"]["by"] == "staff"  # the figures are as of now
    page.goto(f"{stack.url}/admin/alerts/alertdelivery/")
    expect(page.locator("#result_list")).to_contain_text("Delivered")
    accessible(page)
    page.locator("#result_list tbody th a").first.click()
    expect(page.locator("body")).to_contain_text(json.dumps(slug))
    accessible(page)


def test_the_dashboard_is_accessible_on_a_phone(stack, contexts):
    slug = stack.new_queue(capacity=2)
    page = contexts(viewport=PHONE).new_page()
    staff_login(stack, page, "/dashboard/")
    accessible(page)
    page.goto(f"{stack.url}/dashboard/{slug}/")
    expect(page.locator("#dash-link")).to_have_attribute("data-state", "live")
    accessible(page)
