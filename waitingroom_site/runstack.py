"""Run the whole product on one machine, supervised: web (granian), websockets (uvicorn), a Celery worker
and Celery beat, plus an embedded Redis when no other is available.

    python -m waitingroom_site.runstack [--setup] [--host 127.0.0.1] [--port 8000] [--ws-port 8001]
    python -m waitingroom_site.runstack --only worker      # one role, supervised (the containers' way)

--setup first migrates, collects static files and creates the demo queue and staff login.

Supervision: a child that exits is started again after a pause that grows with quick repeated failures
(1 s, 2 s, 4 s … 30 s), and the supervisor says so; one that keeps dying within seconds of its start (five
times in a row) stops the run, with its own lines above saying why. A worker that stops running the
admission ticks the beat sends, or a beat that stops sending them, is replaced (waitingroom_site/liveness.py).
Ctrl-C, SIGTERM and SIGHUP (the terminal closing) stop everything, in order, and wait for it; a second
Ctrl-C hurries. The children die with the supervisor even when it is killed outright (Linux: they ask the
kernel for SIGTERM when their parent dies).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess

from . import devredis, environment, liveness, metrics_access, orphans

BASE_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ROLES = ("web", "ws", "worker", "beat")
ROLE_CHILDREN = {"worker": ("worker", "jobs")}  # the worker role: the ticks' worker and the jobs' worker
WS_PROTOCOL = "queueing.wsprotocol:LeanSansIOProtocol"  # uvicorn's sans-I/O protocol, lighter per socket

QUICK_SECONDS = 10.0  # a death this soon after a start counts as a failure to start
GIVE_UP_AFTER = 5  # quick deaths in a row
BACKOFF_MAX_SECONDS = 30.0
BACKOFF_FIRST_SECONDS = 1.0
STOP_SECONDS = 15.0  # how long a child gets to stop before it is killed
STALLED_STOP_SECONDS = 5.0  # a stalled one is not expected to stop by itself
# Liveness: judged every CHECK_SECONDS once a child has run `grace` seconds (startup, a first tick).
CHECK_SECONDS = 5.0


def say(message: str) -> None:
    """One line on the supervisor's output; a terminal that has gone away (SIGHUP) is not an error."""
    with contextlib.suppress(OSError):
        print(f"[runstack] {message}", flush=True)


def port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PYTHON, str(BASE_DIR / "manage.py"), *args], env=env, cwd=BASE_DIR, check=True)


def _bin(name: str) -> str:
    candidate = Path(PYTHON).parent / name
    return str(candidate) if candidate.exists() else name


def web_command(args: argparse.Namespace) -> list[str]:
    """HTTP: granian (HTTP in Rust) running web.py, an ASGI application that answers status polls, window
    reads and joins on its event loop, with redis.asyncio, and hands everything else to Django's WSGI
    handler in threads (bench/RESULTS.md: twice the polls of the WSGI application under granian's threads,
    four times gunicorn's). Bodies are read on the event loop before a thread is taken, so a body that
    trickles in holds nothing (three slow bodies froze gunicorn's three sync workers for 30 s). gunicorn
    stays available (`--web-server gunicorn`, Django's WSGI application, for comparison)."""
    if args.web_server == "gunicorn":
        return [
            _bin("gunicorn"),
            "waitingroom_site.wsgi",
            *("--bind", f"{args.host}:{args.port}"),
            *("--workers", str(args.web_workers)),
            *("--worker-class", "sync"),
            *("--keep-alive", "5"),
            *("--graceful-timeout", "5"),
            *(("--access-logfile", "-") if args.access_log else ()),
        ]
    return [
        _bin("granian"),
        *("--interface", "asgi", "--http", "1", "--no-ws", "--loop", "uvloop"),
        *("--host", args.host, "--port", str(args.port)),
        *("--workers", str(args.web_workers)),
        "--respawn-failed-workers",  # a web worker that dies is replaced; the others keep serving
        *("--workers-kill-timeout", "5"),
        *("--http1-header-read-timeout", "10000"),  # headers that trickle in are cut off after 10 s
        *("--log-level", "warning"),
        "--access-log" if args.access_log else "--no-access-log",
        "waitingroom_site.web:application",
    ]


def commands(args: argparse.Namespace, worker_name: str, default_queue: str = "waitingroom") -> dict[str, list[str]]:
    """What runs, by name (`default_queue`: Celery's, CELERY_TASK_DEFAULT_QUEUE)."""
    procs = {
        "web": web_command(args),
        # Websockets only: the pages learn its address from WR_WS_BASE_URL (the API's ws_url).
        "ws": [
            _bin("uvicorn"),
            "waitingroom_site.asgi:application",
            *("--host", args.host),
            *("--port", str(args.ws_port)),
            # The sans-I/O websockets protocol: one task per socket where the legacy one keeps four (a
            # third fewer objects for the collector to walk, bench/RESULTS.md), and it waits for a slow
            # reader's buffer to drain instead of buffering without end; without what each connection
            # kept and did not need (queueing/wsprotocol.py).
            *("--ws", WS_PROTOCOL),
            # Events are a few hundred bytes: compressing them saves little and costs two zlib contexts
            # (tens of KB) and CPU per socket (bench/RESULTS.md, push latency).
            *("--ws-per-message-deflate", "false"),
            # A client only says hello and asks for its status: refuse frames bigger than that (the
            # default is 16 MiB, read and parsed in full).
            *("--ws-max-size", "4096"),
            *("--log-level", "warning"),
            "--no-access-log",
        ],
        # The admission ticks, on their own queue (issue 50: periodic jobs that took every slot of one worker
        # stopped them), and every other task: two workers, so no job can take the ticks' slots.
        "worker": [
            *_worker(worker_name, args.worker_concurrency),
            *("-Q", environment.tick_queue_name(default_queue)),
        ],
        "jobs": [*_worker(f"jobs-{worker_name}", args.jobs_concurrency), *("-Q", default_queue)],
        "beat": [_bin("celery"), "-A", "waitingroom_site", "beat", "--loglevel", "INFO", "--pidfile="],
    }
    return {name: procs[name] for role in args.only for name in ROLE_CHILDREN.get(role, (role,))}


def _worker(name: str, concurrency: int) -> list[str]:
    return [
        _bin("celery"),
        *("-A", "waitingroom_site", "worker", "--loglevel", "INFO"),
        *("--concurrency", str(concurrency), "--without-gossip", "--without-mingle"),
        *("-n", name),
    ]


@dataclass
class Child:
    name: str
    command: list[str]
    liveness: str = ""  # "worker" or "beat": judged from its marks in Redis (waitingroom_site/liveness.py)
    node: str = ""  # the worker's node name, for its marks
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    due: float = 0.0  # when a stopped child is to be started again
    restarts: int = 0
    quick_deaths: int = 0  # in a row
    checked: float = 0.0

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Supervisor:
    children: list[Child]
    env: dict[str, str]
    stale_seconds: float = liveness.DEFAULT_STALE_SECONDS
    grace_seconds: float = 45.0
    stopping: bool = False
    hurry: bool = False
    code: int = 0
    _preexec: Callable[[], bool] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Each child gets SIGTERM when this process dies, however it dies.
        self._preexec = orphans.parent_death_request(signal.SIGTERM, parent=os.getpid())

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.stopping:
            self.hurry = True
            return
        say(f"{signal.Signals(signum).name}: stopping everything.")
        self.stopping = True

    def start(self, child: Child) -> None:
        # Own sessions: a Ctrl-C reaches only this supervisor, which then stops each child in turn.
        child.process = subprocess.Popen(
            child.command, env=self.env, cwd=BASE_DIR, start_new_session=True, preexec_fn=self._preexec
        )
        child.started = child.checked = time.monotonic()

    def run(self) -> int:
        for child in self.children:
            if child.process is None:
                self.start(child)
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                if child.process is None:
                    if now >= child.due:
                        self.start(child)
                elif child.process.poll() is not None:
                    self._died(child, now)
                elif child.liveness and now - child.checked >= CHECK_SECONDS:
                    self._judge(child, now)
                if self.stopping:
                    break
            time.sleep(0.2)
        return self.code

    def _died(self, child: Child, now: float) -> None:
        assert child.process is not None
        returncode, pid = child.process.returncode, child.process.pid
        how = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with {returncode}"
        ran = now - child.started
        child.quick_deaths = child.quick_deaths + 1 if ran < QUICK_SECONDS else 0
        if child.quick_deaths >= GIVE_UP_AFTER:
            say(f"{child.name} {how}, the {GIVE_UP_AFTER}th time in a row within seconds of starting; stopping.")
            self.code = returncode if returncode > 0 else 1
            self.stopping = True
            return
        delay = BACKOFF_FIRST_SECONDS * 2.0 ** max(0, child.quick_deaths - 1)
        delay = min(BACKOFF_MAX_SECONDS, delay)
        child.restarts += 1
        say(f"{child.name} {how} after {ran:.0f} s; starting it again in {delay:.0f} s (restart {child.restarts}).")
        child.process, child.due = None, now + delay
        _metrics_forget(self.env, pid)

    def _judge(self, child: Child, now: float) -> None:
        child.checked = now
        if now - child.started < self.grace_seconds:
            return
        env = self.env
        result = liveness.verdict(
            child.liveness,
            name=child.node,
            url=env.get("REDIS_URL"),
            nodes=env.get("REDIS_CLUSTER_NODES", ""),
            prefix=env.get("WR_REDIS_PREFIX"),
            stale=self.stale_seconds,
        )
        if result.alive is False:
            child.restarts += 1
            say(f"{child.name} is stalled ({result.reason}); replacing it (restart {child.restarts}).")
            _stop([child], hurry=False, within=STALLED_STOP_SECONDS)
            self.start(child)

    def stop_all(self) -> None:
        # The application first (no new work), Redis last.
        apps = [c for c in self.children if c.name != "redis"]
        _stop(apps, hurry=self.hurry)
        _stop([c for c in self.children if c.name == "redis"], hurry=self.hurry)
        say("stopped.")


def _stop(children: list[Child], *, hurry: bool, within: float = STOP_SECONDS) -> None:
    running = [c for c in children if c.running()]
    for child in running:
        assert child.process is not None
        child.process.send_signal(signal.SIGKILL if hurry else signal.SIGTERM)
    deadline = time.monotonic() + within
    for child in running:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{child.name} did not stop within {within:.0f} s; killing it.")
            child.process.kill()
            child.process.wait()


def installation_prefix(env: dict[str, str], var_dir: Path) -> str:
    """This installation's key namespace in Redis, for the one-command run (--setup): WR_REDIS_PREFIX if
    set, else one made up the first time and kept in var/redis-prefix. A Redis already running on this
    machine may serve other checkouts or other programs: with its own prefix (and Celery's keys and
    queue under it), this one shares no key with them (issue 19: bin/run used the prefix `wr` and
    Celery's queue `celery` of whatever Redis answered, and left its keys there)."""
    prefix = env.get("WR_REDIS_PREFIX", "")
    kept = var_dir / "redis-prefix"
    if not prefix and kept.exists():
        prefix = kept.read_text().strip()
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", prefix):
        prefix = f"wr-{secrets.token_hex(4)}"
        kept.write_text(prefix + "\n")
    env["WR_REDIS_PREFIX"] = prefix
    env.setdefault("CELERY_KEY_PREFIX", f"{prefix}:celery:")
    env.setdefault("CELERY_TASK_DEFAULT_QUEUE", f"{prefix}-tasks")
    return prefix


def metrics_directory(env: dict[str, str], var_dir: Path) -> Path:
    """The directory every process of this run keeps its metrics in (README "Metrics"; prometheus-client's
    multiprocess mode): PROMETHEUS_MULTIPROC_DIR, else var/metrics. Emptied first: a file left by a process
    of an earlier run would be added to this one's figures."""
    directory = Path(env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(var_dir / "metrics")))
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    return directory


def metrics_serve(env: dict[str, str], directory: Path) -> None:
    """With WR_METRICS_PORT: the metrics of every process this supervisor runs, on that port of
    WR_METRICS_ADDRESS (127.0.0.1 unless set), from a thread of the supervisor. For the processes with no
    web server of their own (worker, beat); the web processes' /metrics gives the same and each queue's."""
    port = env.get("WR_METRICS_PORT", "")
    if not port:
        return
    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    address = env.get("WR_METRICS_ADDRESS", "127.0.0.1")
    allowed = metrics_access.networks(env.get("WR_METRICS_NETWORKS", "127.0.0.0/8,::1/128").split(","))
    try:
        metrics_access.serve(registry, address, int(port), allowed=allowed, token=env.get("WR_METRICS_TOKEN", ""))
    except OSError as exc:  # the product runs without its metrics rather than not at all
        say(f"cannot serve metrics on {address}:{port} ({exc.strerror}): running without them (WR_METRICS_PORT).")
        return
    say(f"metrics of the processes it runs on http://{address}:{port}/metrics")


def _metrics_forget(env: dict[str, str], pid: int) -> None:
    """A child that died: its live gauges (sockets open) no longer count; its counters still do."""
    directory = env.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid, path=directory)  # type: ignore[no-untyped-call]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="migrate, collect static, create the demo")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--web-server", choices=["granian", "gunicorn"], default=os.environ.get("WEB_SERVER", "granian")
    )
    # One worker process per core (granian); gunicorn's sync workers did best with one more than the cores.
    parser.add_argument("--web-workers", type=int, default=int(os.environ.get("WEB_WORKERS", "0")) or None)
    parser.add_argument("--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", "2")))
    # Every task but the ticks (cleanup, snapshots, alerts, turn notices, ...): a worker of its own.
    parser.add_argument("--jobs-concurrency", type=int, default=int(os.environ.get("JOBS_CONCURRENCY", "2")))
    parser.add_argument("--ws-port", type=int, default=int(os.environ.get("WS_PORT", "0")) or None)
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument(
        "--login", action="store_true", help="print the staff login again, with a new password, and exit"
    )
    parser.add_argument("--skip", action="append", default=[], choices=ROLES)
    parser.add_argument("--only", action="append", default=[], choices=ROLES, help="run only these roles")
    parser.add_argument("--var-dir", default=os.environ.get("WR_VAR_DIR", str(BASE_DIR / "var")))
    parser.add_argument(
        "--embedded-redis", action="store_true", help="start an embedded Redis even if another one answers"
    )
    args = parser.parse_args(argv)
    if args.ws_port is None:
        args.ws_port = args.port + 1
    if args.web_workers is None:
        args.web_workers = (os.cpu_count() or 1) + (1 if args.web_server == "gunicorn" else 0)
    args.only = [role for role in (args.only or ROLES) if role not in args.skip]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if "web" in args.only and args.web_server == "gunicorn" and importlib.util.find_spec("gunicorn") is None:
        # gunicorn is for comparison only (bench/), so it is locked with the dev tools, not the runtime.
        say(
            "gunicorn is not installed in this environment: it comes with the dev requirements "
            "(pip install --require-hashes -r requirements-dev.lock; bin/test installs them), "
            "or leave --web-server at granian."
        )
        return 2
    ports = {"web": args.port, "ws": args.ws_port}
    for role, port in ports.items():
        if role in args.only and port_taken(args.host, port):
            say(
                f"port {port} on {args.host} is already in use (another bin/run?): stop that one, "
                f"or choose another with --{'port' if role == 'web' else 'ws-port'}."
            )
            return 2

    var_dir = Path(args.var_dir)
    var_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, WR_VAR_DIR=str(var_dir))
    metrics_dir = metrics_directory(env, var_dir)
    env.setdefault("WR_DEMO", "1")  # the one-command run shows the demo queue's protected page
    # One node name per supervisor, kept across restarts (its liveness marks are found by it).
    worker_name = env.setdefault("WR_WORKER_NAME", f"worker-{os.getpid()}@%h")
    supervisor = Supervisor(
        [],
        env,
        stale_seconds=float(env.get("WR_LIVENESS_STALE_SECONDS", liveness.DEFAULT_STALE_SECONDS)),
        grace_seconds=float(env.get("WR_LIVENESS_GRACE_SECONDS", 45)),
    )
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, supervisor.on_signal)

    if args.login:  # the database under var/ (set up if it is not yet); no Redis needed
        _manage("migrate", "--noinput", "-v", "0", env=env)
        _manage("staff_login", env=env)
        return 0
    if args.setup:
        installation_prefix(env, var_dir)
    redis_url = None if args.embedded_redis else devredis.resolve()
    embedded = redis_url is None
    if redis_url is not None and devredis.cluster_node(redis_url):
        say(
            f"REDIS_URL ({redis_url}) is a Redis Cluster node: set REDIS_CLUSTER_NODES to the cluster's nodes "
            "(host:port,host:port) for the live state, and REDIS_URL to a standalone Redis for the broker, "
            'the channel layer and the cache (README "Redis Cluster").'
        )
        return 2
    if redis_url is None:
        directory = var_dir / "redis"
        port = devredis.free_port()
        redis_url = f"redis://127.0.0.1:{port}/0"
        redis = Child("redis", devredis.embedded_command(directory, port, daemonize=False))
        directory.mkdir(parents=True, exist_ok=True)
        supervisor.children.append(redis)
        supervisor.start(redis)
        devredis.wait_until_it_answers(redis_url, directory)
        say(f"started an embedded Redis at {redis_url} (data in {directory})")
    env["REDIS_URL"] = redis_url
    env.setdefault("WR_WS_BASE_URL", f"ws://{args.host}:{args.ws_port}")
    if args.setup:  # every other command of this checkout acts on this installation (README "Operating it")
        environment.installation_write(var_dir, env)

    try:
        if args.setup:
            _manage("migrate", "--noinput", "-v", "0", env=env)
            _manage("collectstatic", "--noinput", "-v", "0", env=env)
            _manage("setup_demo", env=env)
        node = liveness.worker_node(worker_name)
        for name, command in commands(args, worker_name, env.get("CELERY_TASK_DEFAULT_QUEUE", "waitingroom")).items():
            judged = name if name in ("worker", "beat") else ""
            supervisor.children.append(Child(name, command, liveness=judged, node=node if name == "worker" else ""))
        _banner(args, env, redis_url, embedded=embedded)
        metrics_serve(env, metrics_dir)
        if not supervisor.stopping:
            return supervisor.run()
        return supervisor.code
    except subprocess.CalledProcessError as exc:
        say(f"setup failed: {exc}")
        return exc.returncode or 1
    finally:
        supervisor.stop_all()


def _banner(args: argparse.Namespace, env: dict[str, str], redis_url: str, *, embedded: bool) -> None:
    base = f"http://{args.host}:{args.port}"
    # With a cluster the live state is there, and only the broker, channel layer and cache on REDIS_URL.
    cluster = env.get("REDIS_CLUSTER_NODES", "")
    redis_said = f"live state on the Redis Cluster {cluster}; the rest on Redis" if cluster else "Redis"
    if "web" not in args.only:
        say(f"running {', '.join(args.only)} ({redis_said} {redis_url}); Ctrl-C stops.")
        return
    prefix = env.get("WR_REDIS_PREFIX", "wr")
    if embedded:
        whose = "embedded: started for this run, data under var/redis"
    else:
        whose = f"already running, not started by this run and maybe shared: this installation's keys are {prefix}:*"
    say(
        f"Waiting Room on {base}/  ({redis_said} {redis_url}, {whose})\n"
        f"[runstack]   waiting page: {base}/q/demo/   websockets: {env['WR_WS_BASE_URL']}\n"
        f"[runstack]   join:  curl -X POST {base}/api/v1/queues/demo/join\n"
        f"[runstack]   admin: {base}/admin/   API docs: /api/docs/\n"
        "[runstack]   the staff login again (a new password): bin/run --login\n"
        "[runstack] Ctrl-C stops everything."
    )


if __name__ == "__main__":
    sys.exit(main())
