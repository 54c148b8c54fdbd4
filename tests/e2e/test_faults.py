"""The fault suite (issue 12): the whole product under load while its processes are killed and its Redis is
stopped, restarted (with and without its append-only file) and frozen; the holder of a queue's admission
lease is frozen past its lease. Everything is real: a redis-server of the test's own, `runstack` (granian,
uvicorn, Celery worker and beat) and a second Celery worker node, on ports of their own.

Throughout, visitors poll and a protected site verifies and completes sessions, and the test holds the
promises: every answer is a 200 or the 503 error shape (a connection cut by a killed web worker is counted
apart), no ticket is lost, the slots in use never exceed capacity, admissions never exceed what the outflow
allows, and each fault is recovered from within bounds. The figures are printed and written to
`WR_FAULTS_REPORT` (bench/RESULTS.md keeps them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from .. import proctree
from ..stack import ROOT, free_port, redis_server
from .load import Load

pytestmark = pytest.mark.e2e

CAPACITY, OUTFLOW_PER_MINUTE, BURST = 8, 150, 4
VISITORS = 500


class RedisServer:
    """A redis-server of the test's own: stopped like a crash (SHUTDOWN NOSAVE), frozen, restarted."""

    def __init__(self, directory: Path) -> None:
        self.port, self.directory = free_port(), directory
        directory.mkdir(parents=True, exist_ok=True)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start(aof=True)

    def start(self, *, aof: bool) -> None:
        self.process = redis_server(self.port, self.directory, aof=aof)

    def crash(self, *, aof: bool) -> None:
        """SHUTDOWN NOSAVE: with the append-only file on, the data comes back with the restart; off, it is
        gone."""
        with redis.Redis.from_url(self.url) as client:
            client.config_set("appendonly", "yes" if aof else "no")
            if aof:
                deadline = time.monotonic() + 10  # the rewrite that turning it on starts
                while client.info("persistence")["aof_rewrite_in_progress"] and time.monotonic() < deadline:
                    time.sleep(0.05)
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(nosave=True)
        assert self.process is not None
        self.process.wait(timeout=10)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()


@pytest.fixture
def product(tmp_path: Path) -> Iterator[dict[str, Any]]:
    server = RedisServer(tmp_path / "redis")
    prefix = f"wrf{uuid.uuid4().hex[:6]}"
    port, ws_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "REDIS_", "CACHE_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY="faults-" + uuid.uuid4().hex * 2,
        HTTPS="0",
        DEBUG="0",
        ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        REDIS_URL=server.url,
        WR_REDIS_PREFIX=prefix,
        WR_VAR_DIR=str(tmp_path),
        WR_RESTORE_HOLD_SECONDS="8",
        WR_RATE_LIMITS=json.dumps(
            {
                "join": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 100000},
                "status": {"algorithm": "token_bucket", "capacity": 1000, "refill_per_second": 1000},
            }
        ),
    )
    log = tmp_path / "run.log"
    command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--port", str(port)]
    command += ["--ws-port", str(ws_port), "--var-dir", str(tmp_path)]
    second_worker: subprocess.Popen[bytes] | None = None
    with log.open("wb") as out:
        run = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while "ready." not in log.read_text() or not _answers(base):
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        with (tmp_path / "worker2.log").open("wb") as out:
            second_worker = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "waitingroom_site", "worker", "--concurrency", "1"),
                    *("--without-gossip", "--without-mingle", "-n", f"faults2-{os.getpid()}@%h", "--loglevel", "INFO"),
                ],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        yield {
            "server": server,
            "base": base,
            "env": env,
            "prefix": prefix,
            "run": run,
            "log": log,
            "worker2": second_worker,
            "tmp": tmp_path,
        }
    finally:
        for process in (second_worker, run):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        server.stop()


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_product_keeps_its_promises_through_process_and_redis_faults(product):
    env, base, server = product["env"], product["base"], product["server"]
    slug = f"f{uuid.uuid4().hex[:8]}"
    _manage(
        env,
        "configure_queue",
        slug,
        "--target-url",
        "https://shop.example/",
        "--capacity",
        str(CAPACITY),
        "--outflow-per-minute",
        str(OUTFLOW_PER_MINUTE),
        "--burst",
        str(BURST),
        "--presence-timeout",
        "300",
        "--abandon-timeout",
        "900",
        "--claim-ttl",
        "60",
        "--session-ttl",
        "120",
        "--state",
        "paused",
    )
    api_key = _manage(env, "create_api_key", slug).strip()
    load = Load(base, slug, api_key, lambda: redis.Redis.from_url(server.url, socket_timeout=1), product["prefix"])
    load.join_all(VISITORS)
    _manage(env, "configure_queue", slug, "--state", "open")
    began = time.time()
    load.start()
    figures: dict[str, dict[str, Any]] = {}
    run: subprocess.Popen[bytes] = product["run"]

    def settle(name: str, began: float, ended: float, budget: float) -> None:
        """Wait until admissions resume after the fault ended (up to `budget` seconds), then until answers
        are all 2xx again, and note the figures: how long after the fault began clients saw errors."""
        deadline = time.monotonic() + budget
        while load.admissions_after(ended) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)
        errors = [t for t in load.record.errors_at if t >= began]
        figures[name] = {
            "admissions_resumed_after_s": round(load.admissions_after(ended) or -1, 1),
            "error_answers": len(errors),
            "errors_until_s": round(max(errors) - began, 1) if errors else 0,
        }
        assert load.admissions_after(ended) is not None, (name, product["log"].read_text()[-3000:])

    def child(word: str) -> int:
        """The supervisor's child of that name; if it is being started again just now (seen once in CI:
        no granian among the children 4 s into the load), it is given up to 15 s to come back."""
        deadline = time.monotonic() + 15
        while not (found := proctree.named(proctree.children(run.pid), word)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert found, (word, product["log"].read_text()[-3000:])
        return found[0]

    time.sleep(4)
    # 1. A web worker killed (granian respawns it).
    web_workers = proctree.children(child("granian"))
    at = time.time()
    os.kill(web_workers[0], signal.SIGKILL)
    settle("kill -9 a web worker", at, at, 20)
    # 2. The Celery worker killed (the supervisor starts it again; the second node keeps admitting meanwhile).
    at = time.time()
    os.kill(child(" worker "), signal.SIGKILL)
    settle("kill -9 the Celery worker", at, at, 30)
    # 3. Beat killed: no ticks until the supervisor restarts it; freed slots still admit at once.
    at = time.time()
    os.kill(child(" beat "), signal.SIGKILL)
    settle("kill -9 beat", at, at + 6, 30)
    # 4. Redis crashes and comes back, with its append-only file and without (state lost: a new epoch).
    for round_, aof in enumerate((True, False, True, False)):
        at = time.time()
        server.crash(aof=aof)
        time.sleep(1.0)
        server.start(aof=aof)
        settle(f"Redis SHUTDOWN NOSAVE + restart {round_ // 2 + 1}, AOF {'on' if aof else 'off'}", at, time.time(), 45)
    # 5. Redis frozen.
    for seconds in (5, 12):
        at = time.time()
        server.signal(signal.SIGSTOP)
        time.sleep(seconds)
        server.signal(signal.SIGCONT)
        settle(f"Redis SIGSTOP {seconds} s", at, time.time(), 45)
    # 6. The holder of the queue's admission lease frozen past its lease (3 s): the other node takes over.
    with redis.Redis.from_url(server.url, decode_responses=True) as client:
        holder = str(client.get(f"{product['prefix']}:{{{slug}}}:leader") or "")
    frozen = product["worker2"].pid if holder.startswith("faults2-") else child(" worker ")
    group = os.getpgid(frozen)
    os.killpg(group, signal.SIGSTOP)
    at = time.time()
    time.sleep(8)
    admitted_while_frozen = load.admissions_after(at) is not None
    os.killpg(group, signal.SIGCONT)
    settle("lease holder SIGSTOPped 8 s", at, at, 30)
    figures["lease holder SIGSTOPped 8 s"]["admissions_went_on_meanwhile"] = admitted_while_frozen

    time.sleep(3)
    load.stop()
    elapsed = time.time() - began
    # Every ticket accounted for, once more, after the faults: none gone.
    with httpx.Client(base_url=base, timeout=30) as client:
        for ticket_id, ticket in load.tickets.items():
            if ticket_id in load.finished:
                continue
            body = client.get(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {ticket}"}).json()
            if body["status"] == "expired" and not body.get("reason"):
                load.record.lost.add(ticket_id)

    record = load.record
    # Every restart began a new epoch: without the append-only file the state was lost; with it, the state
    # is on another server (its last second's writes may be missing: lua/_policy.lua server_moved).
    epochs = 1 + 4
    allowed = epochs * BURST + OUTFLOW_PER_MINUTE / 60 * elapsed + epochs * OUTFLOW_PER_MINUTE / 60 * 4
    summary = {
        "faults": figures,
        "answers": record.answers,
        "violations": record.violations[:10],
        "tickets": len(load.tickets),
        "admitted": len(record.admitted_at),
        "admissions_allowed_by_outflow": round(allowed),
        "lost": len(record.lost),
        "most_slots_in_use": record.most_used,
        "capacity": CAPACITY,
        "slowest_answer_s": round(record.slow, 2),
        "seconds": round(elapsed),
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if os.environ.get("WR_FAULTS_REPORT"):
        Path(os.environ["WR_FAULTS_REPORT"]).write_text(text)

    assert record.violations == [], record.violations[:10]
    assert record.lost == set()
    assert record.most_used <= CAPACITY
    assert len(record.admitted_at) <= allowed
    assert record.slow < 20  # a frozen Redis is answered within the client's socket timeout, not held
    assert figures["lease holder SIGSTOPped 8 s"]["admissions_went_on_meanwhile"]
    assert run.poll() is None  # the run itself never stopped
