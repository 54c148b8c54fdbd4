"""End to end against the real processes: gunicorn (several workers), uvicorn (websockets), Celery worker
and beat."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e


def join(client, slug: str, visitor: str | None = None, body: dict | None = None):
    return client.post(
        f"/api/v1/queues/{slug}/join", json=body or {}, headers={"X-Visitor-Id": visitor or str(uuid.uuid4())}
    )


def test_the_worker_and_beat_admit_at_the_configured_rate(stack):
    # 60/min = 1 per second with burst 1; the beat's 1-second tick drives it. Capacity is not the limit.
    stack.configure(
        "rate", target_url="https://shop.example/", capacity=500, outflow_per_minute=60, burst=1, state="paused"
    )
    with stack.client() as client:
        for _ in range(40):
            assert join(client, "rate").status_code == 201
    stack.configure("rate", state="open")
    start = time.monotonic()
    time.sleep(2)  # let the first ticks settle, then measure over a clean window
    begin, t0 = int(stack.stats("rate").get("admitted", 0)), time.monotonic()
    time.sleep(8)
    admitted, elapsed = int(stack.stats("rate").get("admitted", 0)) - begin, time.monotonic() - t0
    assert abs(admitted - elapsed) <= 2, (admitted, elapsed)  # 1/s, give or take a one-second tick
    assert int(stack.stats("rate")["admitted"]) <= 1 + (time.monotonic() - start) + 1


def test_200_parallel_http_joins_get_200_distinct_consecutive_positions(stack):
    stack.configure("crowd", target_url="https://shop.example/", state="paused")
    with stack.thread_clients() as client, ThreadPoolExecutor(max_workers=32) as pool:
        responses = list(pool.map(lambda _: join(client, "crowd"), range(200)))
    assert [r.status_code for r in responses] == [201] * 200
    bodies = [r.json() for r in responses]
    assert sorted(b["position"] for b in bodies) == list(range(1, 201))
    assert len({b["ticket_id"] for b in bodies}) == 200
    assert stack.waiting("crowd") == 200


def test_20_parallel_http_joins_from_one_visitor_get_one_ticket(stack):
    stack.configure("same", target_url="https://shop.example/", state="paused")
    visitor = str(uuid.uuid4())
    with stack.thread_clients() as client, ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(lambda _: join(client, "same", visitor), range(20)))
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    assert len({r.json()["ticket_id"] for r in responses}) == 1
    assert stack.waiting("same") == 1


def test_a_priority_code_is_never_used_beyond_its_limit_under_parallel_joins(stack):
    stack.configure("codes", target_url="https://shop.example/", state="paused")
    code = "RACE-" + uuid.uuid4().hex[:6]
    stack.manage(
        "shell",
        "--no-imports",
        "-c",
        (
            "from queueing.models import PriorityCode, Queue; "
            f"PriorityCode.objects.create(queue=Queue.objects.get(slug='codes'), code='{code}', level=2, max_uses=3)"
        ),
    )
    with stack.thread_clients() as client, ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(pool.map(lambda _: join(client, "codes", body={"priority_code": code}), range(12)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(201) == 3 and codes.count(400) == 9
    assert stack.waiting("codes") == 3


def test_a_visitor_goes_through_the_demo_and_finishing_admits_the_next_at_once(stack):
    # The demo queue from setup_demo: capacity 5. Fill it, then one more waits.
    api_key = stack.manage("create_api_key", "demo").strip()
    stack.configure("demo", capacity=1, burst=5)
    with stack.client() as site, stack.client() as first_browser, stack.client() as second_browser:
        first = join(first_browser, "demo").json()
        second = join(second_browser, "demo").json()
        assert (first["status"], second["status"]) == ("admitted", "waiting")
        entered = first_browser.get(first["redirect_url"])
        assert entered.status_code == 302
        page = first_browser.get("/demo/protected/")
        assert page.status_code == 200 and "You're in" in page.text
        verify = site.post(
            "/api/v1/queues/demo/sessions/verify",
            # The site's own check, with no browser behind it: the session is bound to the first browser's
            # secret since its page (issue 50: without it, a bound session is refused)
            json={"access_token": first["access_token"], "server": True},
            headers={"Authorization": f"Api-Key {api_key}"},
        )
        assert verify.json()["valid"] is True
        csrf = first_browser.cookies.get("csrftoken")
        done = first_browser.post(
            "/demo/protected/finish",
            data={"csrfmiddlewaretoken": csrf},
            headers={"Referer": f"{stack.url}/demo/protected/"},
        )
        assert done.status_code == 200, done.text[:500]
        status = second_browser.get(
            "/api/v1/queues/demo/status", headers={"Authorization": f"Bearer {second['ticket']}"}
        )
        assert status.json()["status"] == "admitted"


def test_staff_can_log_in_and_pause_over_the_api(stack):
    stack.configure("staffq", target_url="https://shop.example/")
    with stack.client() as client:
        token = client.post("/api/v1/auth/token", json={"username": "staff", "password": stack.staff_password()})
        assert token.status_code == 200
        auth = {"Authorization": f"Bearer {token.json()['access']}"}
        assert client.post("/api/v1/queues/staffq/pause", headers=auth).json()["state"] == "paused"
        assert client.get("/api/v1/queues/staffq/stats", headers=auth).json()["state"] == "paused"


def test_static_files_and_api_docs_are_served_without_debug(stack):
    with stack.client() as client:
        assert client.get("/api/docs/").status_code == 200
        assert client.get("/static/queueing/base.css").status_code == 200
        assert client.get("/admin/login/").status_code == 200


def test_ctrl_c_stops_every_process_cleanly(stack, tmp_path):
    """Runs a second, separate stack and stops it the way a terminal's Ctrl-C does."""
    import signal
    import subprocess

    from ..stack import free_port, start_runstack

    env = dict(stack.env, WR_VAR_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    env["WR_METRICS_PORT"] = str(free_port())  # the session's stack serves its metrics on the other one
    log = tmp_path / "log"
    process = start_runstack(tmp_path, env, log, port=free_port(), ws_port=free_port())
    deadline = time.monotonic() + 90
    while "ready." not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.3)
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) >= 4, log.read_text()[-3000:]  # web, ws, worker, beat
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    for pid in children:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text().lower()
    assert "[runstack] stopped." in log.read_text()


def test_an_admission_by_the_worker_reaches_the_visitors_socket_and_nobody_elses(stack):
    """Through the real websocket server (uvicorn), with the real Celery worker and beat admitting."""
    from websockets.sync.client import connect

    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=5, state="paused")
    with stack.client() as client:
        first = join(client, slug).json()
        second = join(client, slug).json()
    assert first["ws_url"].startswith(stack.ws_url)

    headers = {"Origin": stack.url}
    with (
        connect(first["ws_url"], additional_headers=headers) as one,
        connect(second["ws_url"], additional_headers=headers) as two,
    ):
        for socket_, ticket in ((one, first), (two, second)):  # the ticket goes in the first message
            socket_.send(json.dumps({"type": "hello", "ticket": ticket["ticket"]}))
        time.sleep(0.5)
        stack.configure(slug, state="open")  # the beat's next tick admits the first
        deadline = time.monotonic() + 10
        while (event := json.loads(one.recv(timeout=max(0.1, deadline - time.monotonic()))))["type"] != "admitted":
            pass
        heard: list[dict] = []
        try:
            while True:
                heard.append(json.loads(two.recv(timeout=2)))
        except TimeoutError:
            pass

    assert event["ticket_id"] == first["ticket_id"] and event["access_token"]
    kinds = [e["type"] for e in heard]
    assert "admitted" not in kinds
    assert "queue_move" in kinds  # the first one left the line: the second moved up


def test_a_queue_whose_redis_state_is_lost_mid_sale_loses_nobody_under_parallel_traffic(stack):
    """The queue's keys vanish (what a flush or an empty replica does to it) while the real worker and beat
    run; then returning pollers and new joiners arrive at once, over several web workers and threads."""
    slug = stack.new_queue(state="paused", capacity=5)
    with stack.thread_clients() as client, ThreadPoolExecutor(max_workers=16) as pool:
        old = list(pool.map(lambda _: join(client, slug).json(), range(30)))
        positions = {t["ticket_id"]: t["position"] for t in old}
        keys = list(stack.redis.scan_iter(match=f"{stack.prefix}:{{{slug}}}:*"))
        stack.redis.delete(*keys)

        def poll(ticket: dict) -> dict:
            answer = client.get(
                f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {ticket['ticket']}"}
            )
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        # 30 old tickets polling and 20 new visitors joining, all at once.
        futures = [pool.submit(poll, t) for t in old] + [pool.submit(lambda: join(client, slug)) for _ in range(20)]
        results = [f.result() for f in futures]
        new = [r.json() for r in results[30:]]
        assert all(r.status_code == 201 for r in results[30:])
        assert [r for r in results[:30] if r["status"] != "waiting"] == []
        after = {t["ticket_id"]: poll(t)["position"] for t in old}
        new_positions = sorted(poll(t)["position"] for t in new)

    assert after == positions  # every old ticket at its place, in its order
    assert new_positions == list(range(31, 51))  # everyone who joined after the loss behind them
    seqs = [int(t["ticket_id"][:10]) for t in old + new]
    assert len(set(seqs)) == 50 and min(seqs[30:]) > max(seqs[:30])
    assert stack.redis.hget(f"{stack.prefix}:{{{slug}}}:cfg", "epoch") == "2"
    epochs = stack.manage(
        "shell",
        "--no-imports",
        "-c",
        "from queueing.models import QueueChange; "
        f"print(QueueChange.objects.filter(queue__slug='{slug}', action='epoch').count())",
    )
    assert epochs.strip() == "1"  # one new epoch, however many processes noticed the loss


def test_requests_whose_bodies_trickle_in_do_not_hold_up_everyone_else(stack):
    """Seen with bin/run's three sync gunicorn workers: three bodies announced as 100 bytes that sent one
    froze every other request for 30 s (the workers' timeout)."""
    import socket
    from urllib.parse import urlsplit

    address = urlsplit(stack.url)
    slow = []
    try:
        for _ in range(24):
            sock = socket.create_connection((address.hostname, address.port), timeout=5)
            sock.sendall(
                b"POST /api/v1/queues/demo/join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            slow.append(sock)
        time.sleep(0.5)
        with stack.client() as client:
            started = time.monotonic()
            for _ in range(5):
                assert client.get("/healthz").status_code == 200
                assert client.get("/q/demo/").status_code == 200
            assert time.monotonic() - started < 5
    finally:
        for sock in slow:
            sock.close()


def test_the_run_s_output_is_what_a_person_needs_and_the_login_can_be_had_again(stack):
    """Issue 19: Celery's lines, several a second, pushed the printed password out of sight, and nothing
    said that the Redis in use was someone else's. Now: no line per task (LOG_LEVEL is INFO here), the
    banner says whose Redis it is and this installation's keys, and `--login` gives the login again."""
    import subprocess
    import sys

    from ..stack import ROOT

    time.sleep(3)  # a few admission ticks sent and run
    log = stack.log.read_text()
    assert "ready." in log  # the worker's own start-up line still shows
    assert "succeeded in" not in log and "Sending due task" not in log and "Received task" not in log
    assert (
        f"already running, not started by this run and maybe shared: this installation's keys are {stack.prefix}:*"
        in log
    )
    assert "bin/run --login" in log
    # On a copy of the stack's database: the other tests log in with the password the stack printed.
    import shutil

    var = Path(stack.env["WR_VAR_DIR"])
    copy = var / "login-copy"
    copy.mkdir(exist_ok=True)
    for name in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"):  # (the database may be in WAL mode)
        if (var / name).exists():
            shutil.copy(var / name, copy / name)
    env = dict(stack.env, WR_VAR_DIR=str(copy), DATABASE_URL=f"sqlite:///{copy / 'db.sqlite3'}")
    command = [sys.executable, "-m", "waitingroom_site.runstack", "--login", "--var-dir", str(copy)]
    again = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    password = again.stdout.split("password ")[1].split()[0]
    check = (
        "from django.contrib.auth import get_user_model as u; print(u().objects.get(username='staff').check_password("
    )
    works = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", f"{check}{password!r}))"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert works.stdout.strip().endswith("True"), works.stdout + works.stderr


def test_a_code_entered_while_waiting_moves_at_most_its_uses_under_parallel_entries(stack):
    """Issue 20, item 2: twelve waiting visitors (each from an address of its own) enter a three-use code at
    once, through the web server's several processes: three move up, nine are told it is used up; and one
    visitor entering a code six times at once moves once and spends one use."""
    slug = stack.new_queue(state="paused")
    stack.manage(
        "shell",
        "--no-imports",
        "-c",
        f"from queueing.models import PriorityCode, Queue; q = Queue.objects.get(slug='{slug}'); "
        "PriorityCode.objects.create(queue=q, code='RACE-3', level=2, max_uses=3); "
        "PriorityCode.objects.create(queue=q, code='RACE-ANY', level=1)",
    )
    clients = [
        httpx.Client(base_url=stack.url, timeout=15, transport=httpx.HTTPTransport(local_address=f"127.0.0.{10 + i}"))
        for i in range(13)
    ]
    try:
        tickets = [join(client, slug).json()["ticket"] for client in clients]

        def enter(i: int, code: str):
            headers = {"Authorization": f"Bearer {tickets[i]}"}
            return clients[i].post(f"/api/v1/queues/{slug}/code", json={"code": code}, headers=headers)

        with ThreadPoolExecutor(max_workers=12) as pool:
            answers = list(pool.map(lambda i: enter(i, "RACE-3"), range(12)))
        assert sorted(r.status_code for r in answers) == [200] * 3 + [400] * 9
        assert all(r.json()["promoted"] for r in answers if r.status_code == 200)
        assert {r.json()["error"]["code"] for r in answers if r.status_code == 400} == {"invalid_priority_code"}
        with ThreadPoolExecutor(max_workers=6) as pool:
            again = list(pool.map(lambda _: enter(12, "RACE-ANY"), range(6)))
        assert [r.status_code for r in again] == [200] * 6
        assert sorted(r.json()["promoted"] for r in again) == [False] * 5 + [True]
        assert {r.json()["position"] for r in again} == {12}  # ahead of the last tenth of thirteen
    finally:
        for client in clients:
            client.close()
    uses = stack.manage(
        "shell",
        "--no-imports",
        "-c",
        "from queueing.models import PriorityCode; "
        f"print(sorted(PriorityCode.objects.filter(queue__slug='{slug}').values_list('code', 'uses')))",
    )
    assert uses.strip() == "[('RACE-3', 3), ('RACE-ANY', 1)]"
    assert stack.waiting(slug) == 13
