"""The adaptive outflow follows the protected site's health, not one visitor's (issue 13, item 2): the
demo pages are not mounted in production, and one visitor's requests count at most once per
WR_HEALTH_SOURCE_SECONDS (its errors apart from its successes, the same way: test_adaptive.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from django.test import Client

from queueing import store

from .stack import ROOT


def _served(slug: str) -> int:
    client = store.client()
    return sum(int(client.hget(key, "n") or 0) for key in client.scan_iter(match=f"{store.queue_keys(slug).health}:*"))


def test_one_visitor_reloading_a_protected_page_counts_once_per_interval(api, make_queue, settings):
    """Seen: 30 requests per 10 s from one admitted visitor raised the effective outflow from 14.7 to 50.7 a
    minute while the real site reported nothing."""
    settings.WR_HEALTH_REPORT = "local"
    settings.WR_HEALTH_SOURCE_SECONDS = 5
    queue = make_queue(
        capacity=5, adaptive_outflow=True, outflow_min_per_minute=10, outflow_max_per_minute=600, target_url="https://shop.example/"
    )
    browsers = []
    for _ in range(2):
        body = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
        browser = Client()
        token = body["access_token"]
        assert browser.get(f"/demo/{queue.slug}/protected/?wr_access={token}").status_code == 302
        browsers.append(browser)
    for _ in range(30):
        for browser in browsers:
            assert browser.get(f"/demo/{queue.slug}/protected/").status_code == 200
    assert _served(queue.slug) == 2  # one per visitor, not 60


def test_the_demo_pages_are_not_mounted_unless_switched_on():
    code = (
        "import django; django.setup(); from django.urls import resolve, Resolver404\n"
        "try:\n    resolve('/demo/q1/protected/'); print('mounted')\nexcept Resolver404:\n    print('absent')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "WR_DEMO"))}
    env.update(DJANGO_SETTINGS_MODULE="waitingroom_site.settings", SECRET_KEY="x" * 50, DEBUG="0")
    for demo, expected in (("", "absent"), ("1", "mounted")):
        answer = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "WR_DEMO": demo} if demo else env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.stdout.strip() == expected, answer.stderr[-2000:]
