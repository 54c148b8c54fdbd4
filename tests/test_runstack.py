"""The one-command run's supervisor and the liveness check it (and the containers) use: restarts with
backoff, giving up on a child that cannot start, a taken port in one line, and verdicts from the marks the
beat and the workers leave in Redis. The whole stack under the supervisor: tests/e2e/test_supervisor.py."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time

import pytest
from django.conf import settings

from queueing import services, store
from waitingroom_site import devredis, liveness, runstack

from .stack import ROOT


def _verdict(role: str, name: str = "", **kwargs: object) -> liveness.Verdict:
    where = {"url": settings.REDIS_URL, "nodes": settings.REDIS_CLUSTER_NODES, "prefix": settings.WR_REDIS_PREFIX}
    return liveness.verdict(role, name=name, **where, **kwargs)  # type: ignore[arg-type]


@pytest.mark.usefixtures("live_state")  # the marks where the live state is: a single Redis, or the cluster
def test_the_checker_reads_the_marks_under_the_names_the_store_writes():
    services.beat_alive_mark()
    services.worker_alive_mark("worker-1@box")
    assert store.alive_key("worker", "worker-1@box") == liveness.alive_key(
        settings.WR_REDIS_PREFIX, "worker", "worker-1@box"
    )
    assert _verdict("beat").alive is True
    assert _verdict("worker", "worker-1@box").alive is True


@pytest.mark.usefixtures("live_state")
def test_a_worker_that_runs_no_ticks_while_they_are_sent_is_stalled():
    now = time.time()
    services.beat_alive_mark(now=now)
    services.worker_alive_mark("worker-1@box", now=now - 40)
    stalled = _verdict("worker", "worker-1@box", stale=30, now=now)
    assert stalled.alive is False and "40 s" in stalled.reason
    assert _verdict("worker", "never-ran@box", stale=30, now=now).alive is False
    assert _verdict("worker", "worker-1@box", stale=60, now=now).alive is True


def test_without_ticks_being_sent_the_beat_is_stalled_and_the_worker_not_blamed():
    now = time.time()
    services.beat_alive_mark(now=now - 100)
    services.worker_alive_mark("worker-1@box", now=now - 100)
    assert _verdict("beat", stale=30, now=now).alive is False
    no_verdict = _verdict("worker", "worker-1@box", stale=30, now=now)
    assert no_verdict.alive is None and "beat" in no_verdict.reason


def test_an_unreachable_redis_gives_no_verdict_and_the_command_answers_alive():
    port = devredis.free_port()
    result = liveness.verdict("worker", name="w@h", url=f"redis://127.0.0.1:{port}/0")
    assert result.alive is None
    command = [sys.executable, "-m", "waitingroom_site.liveness", "beat"]
    env = {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "PATH": "/usr/bin:/bin"}
    answer = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert answer.returncode == 0 and "unknown" in answer.stdout


def test_the_command_exits_1_for_a_stalled_beat_and_expands_the_node_name():
    env = {"REDIS_URL": settings.REDIS_URL, "WR_REDIS_PREFIX": settings.WR_REDIS_PREFIX, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "waitingroom_site.liveness"]
    answer = subprocess.run([*command, "beat"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert answer.returncode == 1 and "STALLED" in answer.stdout
    services.beat_alive_mark()
    services.worker_alive_mark(f"w-7@{socket.gethostname()}")
    env["WR_WORKER_NAME"] = "w-7@%h"
    answer = subprocess.run([*command, "worker"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert answer.returncode == 0 and "alive" in answer.stdout, answer.stdout


AMQP_URL = os.environ.get("WR_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.mark.parametrize("transport", ["redis", "amqp"])
def test_a_worker_is_ready_only_while_its_broker_answers(transport):
    """`liveness worker --ready` (compose's health check of the worker): a worker alive by its marks but
    whose broker (Redis, or RabbitMQ) does not answer is not ready; answered at once, not after a timeout."""
    reachable = settings.REDIS_URL if transport == "redis" else AMQP_URL
    if transport == "amqp" and not liveness.broker(AMQP_URL).alive:
        pytest.skip(f"no RabbitMQ answers at {AMQP_URL} (WR_TEST_AMQP_URL)")
    nobody = f"{transport}://127.0.0.1:{devredis.free_port()}/"
    services.beat_alive_mark()
    services.worker_alive_mark(f"w-8@{socket.gethostname()}")
    env = {
        "REDIS_URL": settings.REDIS_URL,
        "WR_REDIS_PREFIX": settings.WR_REDIS_PREFIX,
        "WR_WORKER_NAME": "w-8@%h",
        "PATH": "/usr/bin:/bin",
    }
    command = [sys.executable, "-m", "waitingroom_site.liveness", "worker", "--ready"]
    ready = subprocess.run(
        command, cwd=ROOT, env={**env, "CELERY_BROKER_URL": reachable}, capture_output=True, text=True, timeout=30
    )
    assert ready.returncode == 0 and f"the broker ({transport}) answers" in ready.stdout, ready.stdout + ready.stderr
    started = time.monotonic()
    down = subprocess.run(
        command, cwd=ROOT, env={**env, "CELERY_BROKER_URL": nobody}, capture_output=True, text=True, timeout=30
    )
    assert down.returncode == 1 and "NOT READY" in down.stdout, down.stdout + down.stderr
    assert time.monotonic() - started < 10
    # Without --ready the verdict is the supervisor's, which a broker away does not change.
    alive = subprocess.run(
        command[:-1], cwd=ROOT, env={**env, "CELERY_BROKER_URL": nobody}, capture_output=True, text=True, timeout=30
    )
    assert alive.returncode == 0 and "alive" in alive.stdout


def test_a_second_run_on_a_taken_port_says_so_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "waitingroom_site.runstack", "--port", str(port)]
        answer = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    lines = (answer.stdout + answer.stderr).strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "already in use" in lines[0], lines


def test_a_run_whose_redis_url_names_a_cluster_node_says_what_to_set_in_one_line(redis_cluster):
    """Seen: REDIS_URL at a cluster node, and the beat failed at once with MovedError, the run with it."""
    node = redis_cluster.nodes.split(",")[0]
    env = {**os.environ, "REDIS_URL": f"redis://{node}/0"}
    ports = [
        "--port",
        str(devredis.free_port()),
        "--ws-port",
        str(devredis.free_port()),
    ]  # not port + 1: CI saw it taken
    command = [sys.executable, "-m", "waitingroom_site.runstack", *ports]
    answer = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    lines = (answer.stdout + answer.stderr).strip().splitlines()
    assert len(lines) == 1 and "is a Redis Cluster node" in lines[0] and "REDIS_CLUSTER_NODES" in lines[0], lines


def _child(name: str, code: str) -> runstack.Child:
    return runstack.Child(name, [sys.executable, "-c", code])


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(runstack, "BACKOFF_FIRST_SECONDS", 0.05)
    monkeypatch.setattr(runstack, "QUICK_SECONDS", 5.0)


def test_a_child_that_dies_is_started_again_and_the_others_keep_running(quick, tmp_path, capsys):
    starts = tmp_path / "starts"
    flaky = _child("flaky", f"open({str(starts)!r}, 'a').write('x'); import time; time.sleep(0.3)")
    steady = _child("steady", "import time; time.sleep(60)")
    supervisor = runstack.Supervisor([flaky, steady], env={"PATH": "/usr/bin:/bin"})
    supervisor.start(steady)
    assert steady.process is not None
    steady_pid = steady.process.pid
    supervisor.start(flaky)
    deadline = time.monotonic() + 20
    try:
        while len(starts.read_text() if starts.exists() else "") < 3 and time.monotonic() < deadline:
            now = time.monotonic()
            if flaky.process is None:
                if now >= flaky.due:
                    supervisor.start(flaky)
            elif flaky.process.poll() is not None:
                supervisor._died(flaky, now)
            time.sleep(0.05)
        assert len(starts.read_text()) >= 3
        assert steady.running() and steady.process is not None and steady.process.pid == steady_pid
        assert not supervisor.stopping
    finally:
        runstack._stop([flaky, steady], hurry=True)
    said = capsys.readouterr().out
    assert "flaky exited with 0 after 0 s; starting it again" in said and "(restart 2)" in said


def test_a_child_that_keeps_failing_at_start_stops_the_run_with_its_code(quick):
    broken = _child("broken", "import sys; sys.exit(3)")
    steady = _child("steady", "import time; time.sleep(60)")
    supervisor = runstack.Supervisor([steady, broken], env={"PATH": "/usr/bin:/bin"})
    started = time.monotonic()
    try:
        assert supervisor.run() == 3
    finally:
        supervisor.stop_all()
    assert broken.quick_deaths == runstack.GIVE_UP_AFTER
    assert time.monotonic() - started < 15
    assert steady.process is not None and steady.process.returncode is not None  # stopped with the rest


def test_the_backoff_grows_with_quick_deaths_and_is_capped(monkeypatch):
    supervisor = runstack.Supervisor([], env={})
    child = _child("c", "pass")
    delays = []
    for _ in range(4):
        child.process = subprocess.Popen([sys.executable, "-c", "pass"])
        child.process.wait()
        child.started = time.monotonic()
        supervisor._died(child, time.monotonic())
        delays.append(round(child.due - time.monotonic()))
    assert delays == [1, 2, 4, 8]

    def dies(ran: float) -> int:
        child.process = subprocess.Popen([sys.executable, "-c", "pass"])
        child.process.wait()
        child.started = time.monotonic() - ran
        supervisor._died(child, time.monotonic())
        return round(child.due - time.monotonic())

    monkeypatch.setattr(runstack, "BACKOFF_MAX_SECONDS", 3.0)
    child.quick_deaths = 2
    assert dies(ran=0) == 3  # 4 s, capped
    assert dies(ran=60) == 1  # it had run a minute: counting starts again


def test_each_installation_gets_its_own_redis_prefix_kept_in_its_var_dir(tmp_path):
    """bin/run on a Redis someone else runs: its keys, Celery's keys and Celery's queue under a prefix of
    its own, made up once per var/ and kept there (WR_REDIS_PREFIX, when set, wins)."""
    first: dict[str, str] = {}
    prefix = runstack.installation_prefix(first, tmp_path)
    assert prefix.startswith("wr-") and len(prefix) == 11 and prefix != "wr"
    assert first["WR_REDIS_PREFIX"] == prefix and first["CELERY_KEY_PREFIX"] == f"{prefix}:celery:"
    assert first["CELERY_TASK_DEFAULT_QUEUE"] == f"{prefix}-tasks"
    assert runstack.installation_prefix({}, tmp_path) == prefix  # the same installation, the same keys
    other = tmp_path / "other"
    other.mkdir()
    assert runstack.installation_prefix({}, other) != prefix  # another checkout, other keys
    assert runstack.installation_prefix({"WR_REDIS_PREFIX": "mine"}, other) == "mine"


def test_the_installation_file_carries_what_the_run_decided_and_the_environment_still_wins(tmp_path, monkeypatch):
    """bin/run keeps its installation's namespace for the other commands of the checkout (issue 47): never a
    secret or a relaxed setting, this user's only; a variable a command's environment sets is that
    command's; and a process given SECRET_KEY (a deployment) does not read the file at all."""
    from waitingroom_site import environment

    env = {"WR_REDIS_PREFIX": "wr-0badcafe", "REDIS_URL": "redis://127.0.0.1:7001/0", "SECRET_KEY": "s" * 50}
    env.update(HTTPS="0", WR_ALLOW_GENERATED_SECRET="1")  # bin/run's, never kept: bin/manage asks for them
    written = environment.installation_write(tmp_path, env)
    assert stat.S_IMODE(written.stat().st_mode) == 0o600  # a URL may carry a password
    assert environment.installation_read(written) == {
        "REDIS_URL": "redis://127.0.0.1:7001/0",
        "WR_REDIS_PREFIX": "wr-0badcafe",
    }
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/2")
    monkeypatch.delenv("WR_REDIS_PREFIX", raising=False)
    monkeypatch.setenv("SECRET_KEY", "s" * 50)  # a deployment: the file is not read at all
    assert environment.installation_environment(tmp_path) == {} and "WR_REDIS_PREFIX" not in os.environ
    monkeypatch.delenv("SECRET_KEY")  # bin/run's development install: its secret is generated
    supplied = environment.installation_environment(tmp_path)
    assert supplied == {"WR_REDIS_PREFIX": "wr-0badcafe"}
    assert os.environ["REDIS_URL"] == "redis://elsewhere:6379/2" and os.environ["WR_REDIS_PREFIX"] == "wr-0badcafe"
    monkeypatch.delenv("WR_REDIS_PREFIX")  # monkeypatch restores only what it set
    assert environment.installation_environment(tmp_path / "none") == {}


@pytest.mark.parametrize("only", [("web", "ws", "worker", "beat"), ("worker",)])
def test_the_banner_names_the_cluster_the_live_state_is_on(capsys, only):
    """Issue 51: with REDIS_CLUSTER_NODES set, the banner named only REDIS_URL (the broker's, the channel
    layer's and the cache's), as though the queues were there."""
    import argparse

    args = argparse.Namespace(host="127.0.0.1", port=8000, only=only)
    env = {"WR_WS_BASE_URL": "ws://127.0.0.1:8001", "WR_REDIS_PREFIX": "wr-1"}
    runstack._banner(args, env, "redis://127.0.0.1:6379/0", embedded=False)
    alone = capsys.readouterr().out
    nodes = "10.0.0.1:7000,10.0.0.2:7000"
    runstack._banner(args, {**env, "REDIS_CLUSTER_NODES": nodes}, "redis://r:6379/0", embedded=False)
    clustered = capsys.readouterr().out
    assert "(Redis redis://127.0.0.1:6379/0" in alone and "Cluster" not in alone
    assert f"(live state on the Redis Cluster {nodes}; the rest on Redis redis://r:6379/0" in clustered
