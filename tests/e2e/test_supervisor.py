"""bin/run's supervisor with the whole stack under it (its own embedded Redis, SQLite file and ports): a
child killed or stalled is replaced while the rest keeps serving, and no process of the run outlives the
supervisor, however it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .. import proctree
from ..stack import ROOT, free_port

pytestmark = pytest.mark.e2e


def _wait_for(predicate: Callable[[], object], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-4000:]}")


def _still_running(pids: list[int], within: float) -> list[str]:
    """The pids (with their command lines) still running after up to `within` seconds. A Celery worker's warm
    shutdown waits for its tick in flight, which on a loaded machine takes more than a few seconds."""
    deadline = time.monotonic() + within
    while (left := [pid for pid in pids if proctree.alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [f"{pid} {proctree.cmdline(pid)[:100]}" for pid in left]


def _stacks_of(left: list[str], log: Path) -> str:
    """What the processes `left` (_still_running's lines) were doing: SIGUSR1 makes a Celery worker log the
    stack of each of its threads (its "cry" handler), into the run's log. Seen once in a whole run: a worker
    in its warm shutdown outlived the supervisor's SIGKILL by 30 s, its log ending at "Warm shutdown"."""
    for line in left:
        with contextlib.suppress(OSError):
            os.kill(int(line.split()[0]), signal.SIGUSR1)
    time.sleep(2)
    return f"{left}\n{log.read_text()[-8000:]}"


class Run:
    def __init__(self, var: Path, **env: str) -> None:
        var.mkdir()
        self.port, self.var, self.log = free_port(), var, var / "run.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "REDIS_"))}
        environment.pop("CACHE_URL", None)
        environment.update(
            DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
            SECRET_KEY="supervisor-test-" + "x" * 40,
            HTTPS="0",
            DEBUG="0",
            ALLOWED_HOSTS="127.0.0.1",
            DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
            **env,
        )
        command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--embedded-redis"]
        command += ["--port", str(self.port), "--ws-port", str(free_port()), "--var-dir", str(var)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _wait_for(lambda: "ready." in self.log.read_text(), 120, "the worker", self.log)
        _wait_for(self.answers, 60, "the web server", self.log)

    def answers(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def said(self, words: str) -> bool:
        return any(words in line for line in self.log.read_text().splitlines() if line.startswith("[runstack]"))

    def role(self, word: str) -> int | None:
        """The supervisor's child running `word` (not its own children); None between two of them."""
        top = proctree.named(proctree.children(self.process.pid), word)
        assert len(top) <= 1, (word, top)
        return top[0] if top else None

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def run(tmp_path):
    runs: list[Run] = []

    def start(**env: str) -> Run:
        runs.append(Run(tmp_path / f"run{len(runs)}", **env))
        return runs[-1]

    yield start
    for one in runs:
        one.end()
        leftovers = [pid for pid in proctree.descendants(one.process.pid) if proctree.alive(pid)]
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)


def test_a_killed_or_stalled_worker_is_replaced_while_the_web_keeps_serving_and_nothing_outlives_a_kill(run):
    one = run(WR_LIVENESS_STALE_SECONDS="4", WR_LIVENESS_GRACE_SECONDS="8")
    web, beat, worker = one.role("granian"), one.role("beat"), one.role(" worker ")
    assert web and beat and worker

    os.kill(worker, signal.SIGKILL)
    _wait_for(lambda: one.said("worker was killed by SIGKILL"), 10, "the supervisor to notice", one.log)
    _wait_for(lambda: one.role(" worker ") not in (None, worker), 15, "a new worker", one.log)
    assert one.answers() and one.role("granian") == web and one.role("beat") == beat
    assert one.process.poll() is None

    # Frozen, not dead: the ticks it no longer runs give it away.
    stalled = one.role(" worker ")
    assert stalled
    assert one.said("(restart 1)")
    time.sleep(10)  # past the grace of the new worker, and a first tick run
    os.kill(stalled, signal.SIGSTOP)
    _wait_for(lambda: one.said("worker is stalled"), 40, "the stall to be seen", one.log)
    _wait_for(lambda: one.role(" worker ") not in (None, stalled), 20, "its replacement", one.log)
    assert not proctree.alive(stalled)
    assert one.answers() and one.role("granian") == web

    _wait_for(lambda: len(proctree.children(one.role(" worker ") or 0)) >= 2, 30, "the new worker's pool", one.log)
    everything = proctree.descendants(one.process.pid)
    assert len(everything) >= 9  # redis, granian and its 2 workers, uvicorn, worker and its pool of 2, beat
    # A pool process that never finishes: the worker's warm shutdown waits for its pool (seen twice in whole
    # runs, the worker killed a second after it started: it and its pool were alive 30 s after the kill).
    os.kill(proctree.children(one.role(" worker ") or 0)[0], signal.SIGSTOP)
    one.process.kill()  # SIGKILL: the supervisor cannot stop anything itself
    one.process.wait()
    # Each child has its SIGTERM from the kernel; nobody is left to kill one that takes its time. A worker
    # ends itself WR_WORKER_ORPHAN_GRACE_SECONDS (10) after, and its pool dies with it.
    left = _still_running(everything, 30)
    assert left == [], _stacks_of(left, one.log)


def test_closing_the_terminal_stops_every_process_of_the_run(run):
    one = run()
    _wait_for(lambda: len(proctree.descendants(one.process.pid)) >= 9, 30, "every process", one.log)
    everything = proctree.descendants(one.process.pid)
    one.process.send_signal(signal.SIGHUP)
    # The supervisor waits for each child (and kills one that takes more than its STOP_SECONDS) before it exits.
    assert one.process.wait(timeout=60) == 0
    assert _still_running(everything, 5) == []
    assert one.said("SIGHUP: stopping everything.") and one.said("stopped.")
