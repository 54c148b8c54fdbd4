"""Structured logs (issue 17): one JSON object per line, each with the request id (the client's
X-Request-ID when fit, else a new one, sent back in the response), the queue and the ticket it concerns,
never the token; a Celery task published while a request is served carries its id into the worker's lines
(a real worker process, on the tests' Redis as its broker)."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from queueing import logcontext
from waitingroom_site.logs import JsonLines

from .stack import ROOT, celery_worker, product_env


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the root logger writes, formatted as in production."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines())
    handler.addFilter(logcontext.ContextFilter())
    logging.getLogger().addHandler(handler)
    try:
        yield out
    finally:
        logging.getLogger().removeHandler(handler)


def parsed(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_request_id_given_is_in_the_lines_with_the_queue_and_ticket_and_sent_back(
    api, make_queue, redis_away, json_lines
):
    queue = make_queue(state="paused")
    joined = api.post(f"/api/v1/queues/{queue.slug}/join", {}, format="json")
    assert re.fullmatch(r"[0-9a-f]{32}", joined["X-Request-ID"])  # none given: a new one
    ticket, ticket_id = joined.json()["ticket"], joined.json()["ticket_id"]
    redis_away()
    answer = api.get(
        f"/api/v1/queues/{queue.slug}/status",
        HTTP_AUTHORIZATION=f"Bearer {ticket}",
        HTTP_X_REQUEST_ID="lb-7f3a.0001",
    )
    assert answer.status_code == 503 and answer["X-Request-ID"] == "lb-7f3a.0001"
    lines = [line for line in parsed(json_lines) if line.get("request_id") == "lb-7f3a.0001"]
    assert lines and all(line["queue"] == queue.slug and line["ticket"] == ticket_id for line in lines)
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(line["level"] == "ERROR" and line["logger"] == "django.request" for line in lines)
    assert ticket not in json_lines.getvalue()


def test_an_unfit_request_id_is_replaced_and_lines_outside_a_request_carry_none(api, json_lines):
    answer = api.get("/healthz", HTTP_X_REQUEST_ID="two words\nand a newline")
    assert re.fullmatch(r"[0-9a-f]{32}", answer["X-Request-ID"])
    logging.getLogger("tests").warning("outside any request")
    line = parsed(json_lines)[-1]
    assert line["message"] == "outside any request" and "request_id" not in line and "queue" not in line


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[Celery, str, Path]]:
    """A real Celery worker on the tests' Redis (broker keys under a prefix of its own), logging JSON."""
    prefix = f"wrl{uuid.uuid4().hex[:6]}"
    env = product_env(tmp_path, prefix)
    env["LOG_FORMAT"] = "json"
    env["WR_TASK_LOG_LEVEL"] = "INFO"  # the per-task lines are quiet by default
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=ROOT, timeout=120)
    assert migrate.returncode == 0
    with celery_worker(env, tmp_path / "worker.log", name=prefix) as app:
        yield app, prefix, tmp_path / "worker.log"


def test_a_task_published_while_a_request_is_served_carries_its_id_into_the_worker(worker):
    app, _, log = worker
    with logcontext.bound(request_id="req-from-a-view"):
        sent = app.send_task("queueing.tasks.cleanup")
    other = app.send_task("queueing.tasks.signing_keys_prune")  # outside any request: its own id
    deadline = time.monotonic() + 60
    while not all(f"[{task.id}] succeeded" in log.read_text() for task in (sent, other)):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    done = {t.id: next(x for x in lines if f"[{t.id}] succeeded" in x["message"]) for t in (sent, other)}
    assert done[sent.id]["request_id"] == "req-from-a-view"
    assert done[other.id]["request_id"] == other.id
