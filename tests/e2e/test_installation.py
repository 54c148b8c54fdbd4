"""One installation, one namespace (issue 47): a command run from the checkout beside bin/run, with no
environment of its own, acts on the running installation: its database, its Redis (here an embedded one on
a port of its own, which nothing else could guess), its key prefix and its secret."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from ..stack import ROOT, _healthy, _wait_for, free_port, stop_process

pytestmark = pytest.mark.e2e

# What a new shell on the machine has: nothing of the product's.
BARE = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")}


def manage(var: Path, *args: str, command: str = "bin/manage", **env: str) -> subprocess.CompletedProcess[str]:
    """`bin/manage ARGS` as the docs give it (or `manage.py`), from the checkout, with no environment but
    WR_VAR_DIR (the checkout's var/ in a test of its own)."""
    program = (
        ["bash", str(ROOT / "bin" / "manage")] if command == "bin/manage" else [sys.executable, str(ROOT / "manage.py")]
    )
    return subprocess.run(
        [*program, *args],
        env=dict(BARE, WR_VAR_DIR=str(var), **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def installation(tmp_path):
    """bin/run's stack (`runstack --setup`, with bin/run's own environment: plain HTTP, a generated secret),
    on an embedded Redis of its own; yields its var/ and its URL."""
    var, port = tmp_path / "var", free_port()
    var.mkdir()
    log = var / "run.log"
    env = dict(BARE, HTTPS="0", WR_ALLOW_GENERATED_SECRET="1", LOG_FORMAT="text", WR_VAR_DIR=str(var))
    command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--embedded-redis", "--skip", "ws"]
    command += ["--port", str(port), "--ws-port", str(free_port()), "--var-dir", str(var)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: "ready." in log.read_text(), 120, "the worker", log)
        _wait_for(lambda: _healthy(url), 60, "the web server", log)
        yield var, url
    finally:
        stop_process(process, timeout=60)


def _join(client: httpx.Client, slug: str) -> httpx.Response:
    return client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})


def test_a_queue_changed_with_the_readmes_command_is_the_running_installations_at_the_next_join(installation):
    """Seen: manage.py beside bin/run used the prefix `wr` (and whatever Redis answered on 6379); a queue it
    made was new to bin/run's Redis, started epoch 2 with a 60-s hold, and a close it made was not seen."""
    var, url = installation
    made = manage(
        var,
        "configure_queue",
        "sale",
        "--target-url",
        "https://shop.example.com/",
        "--capacity",
        "2",
        "--outflow-per-minute",
        "600",
    )
    assert made.returncode == 0, made.stdout + made.stderr
    with httpx.Client(base_url=url, timeout=10) as client:
        joined = _join(client, "sale")
        assert joined.status_code == 201, joined.text
        ticket = joined.json()
        assert ticket["epoch"] == 1, ticket  # no epoch after a "loss" of a queue this Redis never held
        bearer = {"Authorization": f"Bearer {ticket['ticket']}"}
        deadline = time.monotonic() + 20  # a free slot: at the join or the next tick; a restore hold is 60 s
        while (status := client.get("/api/v1/queues/sale/status", headers=bearer).json())["status"] != "admitted":
            assert time.monotonic() < deadline, status
            time.sleep(0.5)

        closed = manage(var, "configure_queue", "sale", "--state", "closed")
        assert closed.returncode == 0, closed.stdout + closed.stderr
        refused = _join(client, "sale")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "queue_closed", refused.text


def test_a_broken_installation_file_is_said_in_one_line_never_another_namespace(tmp_path):
    (tmp_path / "installation.env").write_text("WR_REDIS_PREFIX=wr-1234abcd\nthis is not a setting\n")
    broken = manage(tmp_path, "configure_queue", "sale", "--state", "closed", command="manage.py")
    assert broken.returncode == 2
    assert broken.stderr.strip().count("\n") == 0, broken.stderr
    assert "installation.env, line 2" in broken.stderr


def test_bin_manage_without_an_installation_says_so(tmp_path):
    missing = manage(tmp_path, "configure_queue", "sale")
    assert missing.returncode == 2
    assert "installation.env is missing" in missing.stderr and "bin/run" in missing.stderr
    (tmp_path / "installation.env").write_text("WR_REDIS_PREFIX=wr-1234abcd\n")
    deployed = manage(tmp_path, "configure_queue", "sale", SECRET_KEY="s" * 50)  # a deployment's environment
    assert deployed.returncode == 2 and "SECRET_KEY is set" in deployed.stderr
