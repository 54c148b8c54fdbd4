"""A Content Security Policy on every page, and no inline script for it to block (issue 13, item 10)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .stack import ROOT

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.IGNORECASE)


def _policy(response: Any) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


@pytest.mark.parametrize("path", ["/q/{slug}/", "/admin/login/", "/api/docs/", "/api/redoc/", "/dashboard/"])
def test_every_page_carries_a_policy_that_allows_scripts_only_from_this_site(client, make_queue, path):
    queue = make_queue()
    response = client.get(path.format(slug=queue.slug), follow=True)
    assert response.status_code == 200
    policy = _policy(response)
    assert policy["script-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["object-src"] == ["'none'"]


def test_no_template_of_ours_has_an_inline_script():
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("templates", "admin_dashboard/templates", "queueing/templates")
        if (ROOT / folder).is_dir()
        for path in Path(ROOT / folder).rglob("*.html")
        if INLINE_SCRIPT.search(path.read_text())
    ]
    assert offenders == []


def test_the_api_docs_load_their_start_up_script_as_a_file(client):
    page = client.get("/api/docs/").content.decode()
    assert not INLINE_SCRIPT.search(page)
    script = re.search(r'<script src="([^"]*\?script[^"]*)"', page)
    assert script and client.get(script.group(1).replace("&amp;", "&")).status_code == 200


def test_pages_connect_only_to_this_site_and_its_websocket_server(client, make_queue):
    """Issue 50, item 11: connect-src allowed websockets to any host (ws: wss:). 'self' covers the page's own
    host (ws and wss too); the websocket server's own origin, where WR_WS_BASE_URL names one, is added."""
    import os
    import subprocess
    import sys

    queue = make_queue()
    connect = _policy(client.get(f"/q/{queue.slug}/"))["connect-src"]
    assert "ws:" not in connect and "wss:" not in connect and "'self'" in connect
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(' '.join(settings.CONTENT_SECURITY_POLICY['DIRECTIVES']['connect-src']))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(DJANGO_SETTINGS_MODULE="waitingroom_site.settings", SECRET_KEY="x" * 50, HTTPS="0")
    for base, expected in (("wss://ws.example.com:8443/", "'self' wss://ws.example.com:8443"), ("", "'self'")):
        answer = subprocess.run(
            [sys.executable, "-c", code], env={**env, "WR_WS_BASE_URL": base}, cwd=ROOT, capture_output=True, text=True
        )
        assert answer.stdout.strip().splitlines()[-1] == expected, answer.stderr[-2000:]
