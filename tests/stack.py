"""The real stack for end-to-end and browser tests: `python -m waitingroom_site.runstack --setup`, exactly
as bin/run starts it (granian, uvicorn for websockets, Celery worker, Celery beat), with its own SQLite
file, Redis key prefix and ports. One per test session, started by the first test that asks for it."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from celery import Celery
from django.conf import settings

from waitingroom_site import devredis

from .receivers import Mailbox, smtp_server

ROOT = Path(__file__).resolve().parents[1]

# The product's management commands, one after another in one process of the stack's own environment
# (a line of JSON in: the command's arguments; a line out: whether it succeeded and what it printed). The
# same commands as `manage.py` runs them, without starting Django again for each (about 2 s of a core, a
# fifth of the browser tests' time when each queue was made so). The command line itself is tested where
# it is the point (tests/e2e/test_installation.py, test_stack.py's login, `Stack.manage(fresh=True)`).
MANAGER = """
import contextlib, io, json, os, sys, traceback
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")
import django
django.setup()
from django.core.management import call_command
for line in sys.stdin:
    out, ok = io.StringIO(), True
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            call_command(*json.loads(line), stdout=out, stderr=out)
    except BaseException:
        ok = False
        out.write(traceback.format_exc())
    sys.__stdout__.write(json.dumps({"ok": ok, "out": out.getvalue()}) + "\\n")
    sys.__stdout__.flush()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server(
    port: int, directory: Path | None = None, *, aof: bool = False, replica_of: int = 0
) -> subprocess.Popen[bytes]:
    """A redis-server of a test's own on `port`, answering when this returns: no RDB snapshots, its data in
    `directory` with an append-only file if `aof` (else it comes back empty after a restart); a replica of
    the server on port `replica_of`, if given."""
    command = [devredis.server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    command += ["--appendonly", "yes" if aof else "no", *(("--dir", str(directory)) if directory else ())]
    command += ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    devredis.wait_until_it_answers(f"redis://127.0.0.1:{port}/0", directory or ROOT)
    return process


class ThreadClients:
    """One httpx.Client per thread, closed together. Threads sharing one Client's connection pool were seen
    to read from a connection another thread had closed (`httpx.ReadError: [Errno 9] Bad file descriptor`,
    32 threads joining at once): the test's client failing, not the server."""

    def __init__(self, make: Any) -> None:
        self._make, self._local, self._lock = make, threading.local(), threading.Lock()
        self._all: list[httpx.Client] = []

    def _own(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._make()
            with self._lock:
                self._all.append(client)
        return client

    def get(self, *args: Any, **kwargs: Any) -> httpx.Response:
        return self._own().get(*args, **kwargs)

    def post(self, *args: Any, **kwargs: Any) -> httpx.Response:
        return self._own().post(*args, **kwargs)

    def __enter__(self) -> ThreadClients:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self._all:
            client.close()


@dataclass
class Stack:
    url: str
    ws_url: str
    env: dict[str, str]
    prefix: str
    log: Path
    process: subprocess.Popen[bytes]
    redis: redis.Redis = field(repr=False)
    metrics_port: int = 0  # the supervisor's WR_METRICS_PORT: every process's own metrics
    mailbox: Mailbox | None = field(default=None, repr=False)  # what the product e-mailed (its SMTP server)
    manager: subprocess.Popen[str] | None = field(default=None, repr=False)  # MANAGER, once asked for
    manager_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def manage(self, *args: str, fresh: bool = False) -> str:
        """A management command's output (it must succeed): `manage.py` itself with `fresh`, else MANAGER."""
        if fresh:
            result = subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True
            )
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout
        with self.manager_lock:
            if self.manager is None or self.manager.poll() is not None:
                self.manager = subprocess.Popen(
                    [sys.executable, "-c", MANAGER], env=self.env, cwd=ROOT, text=True,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                )  # fmt: skip
            assert self.manager.stdin is not None and self.manager.stdout is not None
            self.manager.stdin.write(json.dumps(args) + "\n")
            self.manager.stdin.flush()
            answer = json.loads(self.manager.stdout.readline() or '{"ok": false, "out": "the manager ended"}')
        assert answer["ok"], answer["out"]
        return str(answer["out"])

    def close(self) -> None:
        if self.manager is not None:
            assert self.manager.stdin is not None
            self.manager.stdin.close()  # it ends at the end of its input
            try:
                self.manager.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.manager.kill()
                self.manager.wait()

    def stats(self, slug: str) -> dict[str, Any]:
        return self.redis.hgetall(f"{self.prefix}:{{{slug}}}:st")  # type: ignore[return-value]

    def waiting(self, slug: str) -> int:
        return int(self.redis.hget(f"{self.prefix}:{{{slug}}}:line:f", "n") or 0)  # the line's count (lua/_lib.lua)

    def staff_password(self) -> str:
        match = re.search(r"password (\S+)", self.log.read_text())
        assert match, "setup_demo printed no staff login"
        return match.group(1)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=15, **kwargs)

    def thread_clients(self) -> ThreadClients:
        """A client for a pool of threads: each thread its own httpx.Client."""
        return ThreadClients(self.client)

    def configure(self, slug: str, **options: Any) -> dict[str, Any]:
        args = ["configure_queue", slug]
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        return dict(json.loads(self.manage(*args)))

    def new_queue(self, **options: Any) -> str:
        """A queue of its own for one test, protected by the demo page (/demo/<slug>/protected/)."""
        slug = f"t{uuid.uuid4().hex[:10]}"
        guards = {"max_tickets_per_address": 0, "pow_difficulty": 0}  # a scheduled start turns them on
        self.configure(slug, target_url=f"/demo/{slug}/protected/", **{**guards, **options})
        return slug


def _wait_for(predicate: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-4000:]}")


def stop_process(process: subprocess.Popen[bytes], *, timeout: float, signum: int = signal.SIGTERM) -> None:
    """Stop a process a test started (by its own handle): `signum`, then a kill if it outlasts `timeout`."""
    process.send_signal(signum)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start_runstack(
    var: Path, env: dict[str, str], log: Path, *, port: int, ws_port: int, setup: bool = True
) -> subprocess.Popen[bytes]:
    """`python -m waitingroom_site.runstack --setup`, as bin/run starts it, logging to `log` (without
    `--setup`: another node of a product whose database is set up already)."""
    command = [sys.executable, "-m", "waitingroom_site.runstack", *(["--setup"] if setup else [])]
    command += ["--port", str(port), "--ws-port", str(ws_port), "--var-dir", str(var)]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def product_env(var: Path, prefix: str) -> dict[str, str]:
    """The environment the product's own processes get in a test: production settings on plain HTTP, a
    SQLite file under `var`, the test Redis with every key (and Celery's broker keys) under `prefix`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "PROMETHEUS_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        HTTPS="0",
        DEBUG="0",
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        REDIS_URL=settings.REDIS_URL,
        CACHE_URL=settings.REDIS_URL,  # the test database: its cache keys go with the prefix
        WR_REDIS_PREFIX=prefix,
        CELERY_KEY_PREFIX=f"{prefix}:celery:",
        CELERY_TASK_DEFAULT_QUEUE=f"{prefix}-tasks",
        WR_VAR_DIR=str(var),
        WR_ALERT_PRIVATE_TARGETS="1",  # the tests' webhook receivers listen on 127.0.0.1
    )
    return env


def run_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with smtp_server() as (mailbox, smtp_port):
        yield from _run_stack(tmp_path_factory, mailbox, smtp_port)


def _run_stack(tmp_path_factory: pytest.TempPathFactory, mailbox: Mailbox, smtp_port: int) -> Iterator[Stack]:
    var = tmp_path_factory.mktemp("stack")
    port, ws_port, metrics_port = free_port(), free_port(), free_port()
    prefix = f"wre{uuid.uuid4().hex[:8]}"
    env = product_env(var, prefix)
    env.update(
        ALLOWED_HOSTS="127.0.0.1,localhost",
        WR_METRICS_PORT=str(metrics_port),
        LOG_LEVEL=os.environ.get("WR_E2E_LOG_LEVEL", "INFO"),
        # E-mail (turn notices) to a real SMTP server the tests read.
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp_port),
        WR_NOTIFY_BY_EMAIL="1",
        # The limiters run, with room for tests that join and poll from one address faster than people.
        WR_RATE_LIMITS=json.dumps(
            {
                "join": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 5000},
                "status": {"algorithm": "token_bucket", "capacity": 100, "refill_per_second": 20},
            }
        ),
    )
    log = var / "stack.log"
    process = start_runstack(var, env, log, port=port, ws_port=ws_port)
    url = f"http://127.0.0.1:{port}"
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    stack = Stack(url, f"ws://127.0.0.1:{ws_port}", env, prefix, log, process, client, metrics_port, mailbox)
    try:
        _wait_for(lambda: _healthy(url), 90, "the web server", log)
        _wait_for(lambda: "ready." in log.read_text(), 90, "the Celery worker", log)
        yield stack
    finally:
        stack.close()
        stop_process(process, timeout=60, signum=signal.SIGINT)  # what Ctrl-C does
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@contextmanager
def celery_worker(env: dict[str, str], log: Path, *, name: str) -> Iterator[Celery]:
    """A real Celery worker of the product (solo pool) with `env` (product_env's: its own broker keys and
    task queue), logging to `log`; yields an app that publishes to it, and stops the worker after."""
    command = [sys.executable, "-m", "celery", "-A", "waitingroom_site", "worker", "--pool", "solo"]
    command += ["--without-gossip", "--without-mingle", "-n", f"{name}@%h", "--loglevel", "INFO"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    app = Celery("tests-publisher", broker=settings.REDIS_URL)
    app.conf.broker_transport_options = {"global_keyprefix": env["CELERY_KEY_PREFIX"]}
    app.conf.task_default_queue = env["CELERY_TASK_DEFAULT_QUEUE"]
    try:
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield app
    finally:
        process.terminate()
        process.wait(timeout=30)
        app.close()


def race(env: dict[str, str], setup: str, racer: str, *, racers: int = 4) -> list[Any]:
    """Migrate the product's database in `env`, run `setup` (Python, with Django set up by it), then start
    `racers` processes of `racer` that wait for a common start (START_AT, after every one has started
    Django) and print one JSON value last: those values, in order. The keys under env's prefix are
    deleted after."""
    prefix = env["WR_REDIS_PREFIX"]
    try:
        for command in (["manage.py", "migrate", "-v", "0"], ["-c", setup]):
            done = subprocess.run(
                [sys.executable, *command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, done.stderr[-3000:]
        started = {**env, "START_AT": str(time.time() + 6)}
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", racer],
                env=started,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(racers)
        ]
        outcomes = []
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-3000:]
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
        return outcomes
    finally:
        client = redis.Redis.from_url(settings.REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
