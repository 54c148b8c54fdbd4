"""Admission ticks on time under a flood of turn notices (issue 50, item 3): bin/run's whole stack (its own
embedded Redis and SQLite file under a temporary directory), with --notices turn notices spread over queues
of at most WR_NOTIFY_MAX_PER_QUEUE each (made as the product keeps them: a row and its ticket noticed in
Redis, store.notice_keep), the "Turn notices" task running every 5 s, and one more queue admitting 2 a second.
Over --seconds it counts that queue's admissions (on time: 2 a second), the jobs waiting on the Celery queue
the notices' task shares with every other job, and how long one run of the notices takes (timed apart, in
the sampling process: its work should not grow with the notices, services/notices.py).

    .venv/bin/python bench/notices_flood.py [--notices 100000] [--seconds 60] [--per-queue 10000]

Before the admission tick had a queue and a worker of its own, ~37,000 notices filled bin/run's worker slots
and the ticks stopped (the issue's figure); tests/e2e/test_supervisor.py keeps a small version as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SETUP = """
import time
from queueing import services, store, tokens
from queueing.models import TurnNotice
from django.conf import settings
per_queue = QUEUE_SIZE or settings.WR_NOTIFY_MAX_PER_QUEUE
changes = {"name": "Flood", "target_url": "https://shop.example/", "state": "open", "capacity": 1000000,
           "outflow_per_minute": 120, "burst": 1, "claim_ttl": 600, "presence_timeout": 3600,
           "abandon_timeout": 7200}  # (its visitors do not poll: present all along)
services.queue_configure(slug="flood", changes=changes)
made, q = 0, 0
while made < NOTICES:
    slug = f"noticed-{q}"
    queue, _ = services.queue_configure(slug=slug, changes={"name": slug, "target_url": "https://shop.example/",
                                                             "state": "paused"})
    notices = []
    for i in range(min(per_queue, NOTICES - made)):
        ticket = services.queue_join(slug=slug, visitor_key=tokens.visitor_key(f"cookie:{slug}-{i}")).ticket
        notices.append(TurnNotice(queue=queue, ticket_id=ticket.ticket_id, epoch=queue.epoch,
                                  email=f"v{i}@example.com", link=f"http://x/q/{slug}/"))
    TurnNotice.objects.bulk_create(notices, batch_size=2000)
    until_ms = int((time.time() + settings.WR_TICKET_LIFETIME.total_seconds()) * 1000)
    for notice in notices:
        store.notice_keep(slug, ticket_id=notice.ticket_id, until_ms=until_ms, now_ms=int(time.time() * 1000))
    store.notices_seeded(slug)
    made, q = made + len(notices), q + 1
for i in range(200):  # people waiting in the admitting queue
    services.queue_join(slug="flood", visitor_key=tokens.visitor_key(f"cookie:flood-{i}"))
print(json.dumps({"notices": TurnNotice.objects.count(), "queues": q}))
"""

LOOK = """
import time
from queueing import services, store
from waitingroom_site.celery import app
from django.conf import settings
with app.connection_for_write() as connection:
    jobs = connection.default_channel.client.llen(settings.CELERY_TASK_DEFAULT_QUEUE)
started = time.perf_counter()
services.turn_notices_send()
run_ms = round((time.perf_counter() - started) * 1000, 1)
print(json.dumps({"admitted": store.snapshot("flood").admitted, "jobs_waiting": jobs, "notices_run_ms": run_ms}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notices", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--per-queue", type=int, default=0, help="notices a queue (0: WR_NOTIFY_MAX_PER_QUEUE)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wr-notices-") as tmp:
        var = Path(tmp) / "var"
        var.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "REDIS_"))}
        env.pop("CACHE_URL", None)
        env.update(
            DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
            SECRET_KEY="notices-bench-" + "x" * 40,
            HTTPS="0",
            DEBUG="0",
            ALLOWED_HOSTS="127.0.0.1",
            DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
            WR_NOTIFY_BY_EMAIL="1",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(free_port()),  # nobody listens: no notice is near, none is sent
        )
        log = var / "run.log"
        command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--embedded-redis"]
        command += ["--port", str(free_port()), "--ws-port", str(free_port()), "--var-dir", str(var)]
        with log.open("wb") as out:
            run = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while "ready." not in log.read_text():
                assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)

            def python(code: str) -> Any:
                lines = (var / "installation.env").read_text().splitlines()
                kept = dict(line.split("=", 1) for line in lines if "=" in line)
                script = f"import django, json\ndjango.setup()\n{code}"
                done = subprocess.run(
                    [sys.executable, "-c", script], env={**kept, **env}, cwd=ROOT, capture_output=True, text=True
                )
                assert done.returncode == 0, done.stderr[-3000:]
                return json.loads(done.stdout.strip().splitlines()[-1])

            started = time.monotonic()
            made = python(SETUP.replace("NOTICES", str(args.notices)).replace("QUEUE_SIZE", str(args.per_queue)))
            setup_s = time.monotonic() - started
            samples = []
            began = time.monotonic()
            while time.monotonic() - began < args.seconds:
                time.sleep(min(10, args.seconds))
                samples.append({"at_s": round(time.monotonic() - began, 1), **python(LOOK)})
            span = samples[-1]["at_s"] - samples[0]["at_s"]
            admitted = samples[-1]["admitted"] - samples[0]["admitted"]
            results = {
                "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "setup": {**made, "seconds": round(setup_s, 1)},
                "admitted_per_second": round(admitted / span, 2),  # from the first sample to the last
                "expected_per_second": 2.0,
                "samples": samples,
            }
            print(json.dumps(results, indent=2))
        finally:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()


if __name__ == "__main__":
    main()
