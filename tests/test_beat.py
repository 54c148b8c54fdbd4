"""One beat sends the periodic tasks however many run (issue 12: two beats sent every task twice): the lease
in Redis, and two real `celery beat` processes on a broker of the test's own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from queueing import beat

from .stack import ROOT, product_env


def test_one_of_two_beats_leads_and_the_other_takes_over_when_the_lease_lapses(monkeypatch):
    monkeypatch.setattr(beat, "LEASE_SECONDS", 0.5)
    first, second = beat.BeatLease("beat-a"), beat.BeatLease("beat-b")
    assert first.holds(now=100.0) and not second.holds(now=100.0)
    assert first.holds(now=100.5)  # asked at most once a second: the answer it had
    assert first.holds(now=101.2) and not second.holds(now=101.2)  # renewed
    time.sleep(0.7)  # the leader stops asking: its lease lapses
    assert second.holds(now=103.0)
    assert not first.holds(now=104.0)


def test_a_beat_that_cannot_reach_redis_sends_nothing(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert not beat.BeatLease("beat-a").holds(now=100.0)


def _sent_ticks(client: redis.Redis, key: str) -> int:
    messages = [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    return sum(1 for message in messages if message["headers"]["task"] == "queueing.tasks.admission_tick")


@pytest.mark.e2e
def test_two_real_beats_send_each_tick_once_and_the_standby_takes_over(tmp_path: Path):
    prefix = f"wrb{uuid.uuid4().hex[:8]}"
    env = product_env(tmp_path, prefix)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{prefix}:celery:{prefix}-tasks-ticks"  # the ticks' own queue (issue 50)
    command = [sys.executable, "-m", "celery", "-A", "waitingroom_site", "beat", "--loglevel", "INFO", "--pidfile="]
    logs = [tmp_path / "beat1.log", tmp_path / "beat2.log"]
    beats = []
    try:
        for log in logs:
            with log.open("wb") as out:
                beats.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while _sent_ticks(client, key) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        start = _sent_ticks(client, key)
        time.sleep(8)
        sent = _sent_ticks(client, key) - start
        assert 5 <= sent <= 10, sent  # one a second: one beat sends (two would send about 16)
        said = [log.read_text() for log in logs]
        leader = next(i for i, text in enumerate(said) if "leads: it sends the periodic tasks" in text)
        assert "stands by" in said[1 - leader]

        beats[leader].send_signal(signal.SIGKILL)  # the leader dies without letting go of its lease
        beats[leader].wait()
        time.sleep(beat.LEASE_SECONDS + 3)
        before = _sent_ticks(client, key)
        time.sleep(4)
        assert _sent_ticks(client, key) - before >= 2  # the standby sends now
        assert "leads: it sends the periodic tasks" in logs[1 - leader].read_text()
    finally:
        for process in beats:
            if process.poll() is None:
                process.kill()
                process.wait()
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
