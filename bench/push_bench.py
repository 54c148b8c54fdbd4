"""Live push benchmark (issue 3): admission-to-`admitted` latency at the visitor's websocket, and the
websocket server's memory per connected socket.

For each socket count N it starts a fresh stack the way bin/run does (`python -m waitingroom_site.runstack
--setup`), without the Celery worker and beat so that nothing but this script admits: gunicorn (web) and
uvicorn (websockets) only, on free ports, against Redis under a prefix of its own. It then

1. creates a paused queue, joins N visitors over HTTP and opens N websocket clients with their tickets;
2. reads the uvicorn process's RSS before the first socket and once all N are open and settled;
3. opens the queue and, from this process (Django set up on the same Redis, prefix and database), runs
   admission rounds: `services.queue_admit` admitting `--per-round` visitors, which publishes their private
   `admitted` events and one `queue_move` to every socket. Latency of a ticket = arrival of its first
   `admitted` message at its client - the time taken just before the `queue_admit` call of its round.

    .venv/bin/python bench/push_bench.py [--sockets 2000 5000] [--per-round 20] [--samples 300]
                                         [--compression deflate|none] [--py-spy /tmp/pyspy/bin/py-spy]

Progress goes to stderr; the figures are printed as JSON and written to bench/out/push_bench.json.
Every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

# http_bench puts the project root on sys.path.
from http_bench import (  # noqa: E402
    BENCH_RATE_LIMITS,
    OUT,
    ROOT,
    _delete_prefix,
    free_port,
    machine,
    start,
    stop,
    wait_healthy,
)

from waitingroom_site import devredis  # noqa: E402

TARGET_P99_MS = 250.0
TARGET_BYTES_PER_SOCKET = 50 * 1024
LOST_AFTER_S = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[push_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- /proc --------------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def ws_server_pid(stack_pid: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in children_of(stack_pid):
            if "waitingroom_site.asgi:application" in cmdline(pid):
                return pid
        time.sleep(0.2)
    raise RuntimeError("the websocket server (uvicorn) did not start")


def rss_bytes(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int | str = "self") -> float:
    fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuWindow:
    """CPU used by the websocket server, this process and the whole machine over a stretch of time."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.wall = time.monotonic()
        self.server = cpu_seconds(server_pid)
        self.own = cpu_seconds()
        self.machine = machine_ticks()

    def result(self) -> dict[str, float]:
        wall = time.monotonic() - self.wall
        busy, total = machine_ticks()
        return {
            "seconds": round(wall, 2),
            "ws_server_cpu_pct": round(100 * (cpu_seconds(self.server_pid) - self.server) / wall, 1),
            "bench_process_cpu_pct": round(100 * (cpu_seconds() - self.own) / wall, 1),
            "machine_busy_pct": round(100 * (busy - self.machine[0]) / max(1, total - self.machine[1]), 1),
        }


# --- Figures ------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def summary_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    figures = {f"p{p}": percentile(ms, p) for p in (50, 90, 99)}
    figures.update(max=max(ms) if ms else None, mean=sum(ms) / len(ms) if ms else None)
    return {k: (round(v, 1) if v is not None else None) for k, v in figures.items()}


# --- The stack ----------------------------------------------------------------------------------------


def stack_env(redis_url: str, prefix: str, var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        WR_TICKET_SIGNING_KEY=secrets.token_hex(32),
        HTTPS="0",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        REDIS_URL=redis_url,
        WR_REDIS_PREFIX=prefix,
        CELERY_KEY_PREFIX=f"{prefix}:celery:",
        CELERY_TASK_DEFAULT_QUEUE=f"{prefix}-tasks",
        LOG_LEVEL="WARNING",
        WR_RATE_LIMITS=BENCH_RATE_LIMITS,  # thousands of joins from 127.0.0.1 (see http_bench.py)
    )
    return env


def start_stack(env: dict[str, str], var: Path, name: str) -> tuple[Any, int, int, int]:
    port, ws_port = free_port(), free_port()
    stack = start(
        [
            sys.executable,
            "-m",
            "waitingroom_site.runstack",
            "--setup",
            *("--port", str(port), "--ws-port", str(ws_port), "--var-dir", str(var)),
            *("--skip", "worker", "--skip", "beat"),
        ],
        env,
        var / f"stack-{name}.log",
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz")
        ws_pid = ws_server_pid(stack.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", ws_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    except BaseException:
        stop(stack)
        raise
    return stack, port, ws_port, ws_pid


def configure_queue(env: dict[str, str], slug: str) -> None:
    # Outflow at the model's ceiling (1,000,000 a minute): the bucket never limits the rounds.
    # Paused while everyone joins: with the queue open and the line empty, the first joiner would be let
    # straight through. The bench process opens it for the measurement.
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "configure_queue",
            slug,
            *("--target-url", "https://shop.example/", "--capacity", "1000000"),
            *("--outflow-per-minute", "1000000", "--burst", "100000"),
            *("--presence-timeout", "3600", "--abandon-timeout", "7200"),
            *("--claim-ttl", "600", "--session-ttl", "3600", "--state", "paused"),
        ],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def join_all(base: str, slug: str, n: int) -> list[dict[str, Any]]:
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as client, ThreadPoolExecutor(16) as pool:

        def join(_: int) -> dict[str, Any]:
            answer = client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})
            answer.raise_for_status()
            body = answer.json()
            return {key: body[key] for key in ("ticket", "ticket_id", "ws_url", "status")}

        return list(pool.map(join, range(n)))


# --- Sockets and admission ----------------------------------------------------------------------------


class Clients:
    """N websocket clients, each reading forever and noting when its `admitted` message arrives."""

    def __init__(self, origin: str, compression: str | None) -> None:
        self.origin = origin
        self.compression = compression
        self.sockets: list[Any] = []
        self.readers: list[asyncio.Task[None]] = []
        self.pushed_at: dict[str, list[float]] = {}  # `admitted` events pushed by queue_admit
        self.polled_at: dict[str, list[float]] = {}  # `admitted` sent by the socket's own status poll
        self.move_last: dict[int, float] = {}
        self.move_count: Counter[int] = Counter()
        self.other: Counter[str] = Counter()
        self.closed_early = 0
        self.connect_failures = 0

    async def open_all(self, tickets: list[dict[str, Any]], concurrency: int) -> None:
        from websockets.asyncio.client import connect

        gate = asyncio.Semaphore(concurrency)

        async def open_one(ticket: dict[str, Any]) -> None:
            async with gate:
                for attempt in range(3):
                    try:
                        ws = await connect(
                            ticket["ws_url"],
                            origin=self.origin,  # type: ignore[arg-type]
                            compression=self.compression,
                            proxy=None,
                            open_timeout=60,
                            ping_interval=None,  # the server pings; the client answers
                            close_timeout=5,
                            max_queue=None,
                        )
                        # The ticket goes in the first message, not the URL (the server answers "ready").
                        await ws.send(json.dumps({"type": "hello", "ticket": ticket["ticket"]}))
                        break
                    except Exception:  # refused, reset, timed out: try again
                        if attempt == 2:
                            self.connect_failures += 1
                            return
                        await asyncio.sleep(0.5)
            self.sockets.append(ws)
            self.readers.append(asyncio.ensure_future(self._read(ws)))

        await asyncio.gather(*(open_one(t) for t in tickets))

    async def _read(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in ws:
                now = time.time()
                if '"admitted"' in message:
                    event = json.loads(message)
                    if event.get("type") == "admitted":
                        arrivals = self.pushed_at if event.get("via") == "push" else self.polled_at
                        arrivals.setdefault(event["ticket_id"], []).append(now)
                        continue
                if '"queue_move"' in message:
                    seq = int(json.loads(message)["seq"])
                    self.move_count[seq] += 1
                    if now > self.move_last.get(seq, 0.0):
                        self.move_last[seq] = now
                    continue
                kind = message.split('"type": "', 1)[-1].split('"', 1)[0] if '"type": "' in message else "?"
                self.other[kind] += 1
        except ConnectionClosed:
            self.closed_early += 1

    async def close_all(self) -> None:
        gate = asyncio.Semaphore(200)

        async def close(ws: Any) -> None:
            async with gate:
                with contextlib.suppress(Exception):  # closing is best effort; the stack stops next
                    await asyncio.wait_for(ws.close(), 10)

        await asyncio.gather(*(close(ws) for ws in self.sockets))
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


async def measure(
    args: argparse.Namespace, n: int, base: str, ws_pid: int, slug: str, tickets: list[dict[str, Any]]
) -> dict[str, Any]:
    from django.conf import settings

    from queueing import realtime, services

    clients = Clients(origin=base, compression=None if args.compression == "none" else "deflate")
    result: dict[str, Any] = {"sockets": n}
    rss_before = rss_bytes(ws_pid)
    started = time.monotonic()
    window = CpuWindow(ws_pid)
    await clients.open_all(tickets, args.connect_concurrency)
    result["connect_seconds"] = round(time.monotonic() - started, 2)
    # The client's own thousands of long-lived objects (sockets, tasks) out of the collector's way, so
    # that a full collection in this process does not pass for push latency.
    gc.collect()
    gc.freeze()
    result["connect_cpu"] = window.result()
    result["connected"] = len(clients.sockets)
    result["connect_failures"] = clients.connect_failures
    log(f"N={n}: {len(clients.sockets)} sockets open in {result['connect_seconds']} s; settling")

    # Settle (every socket's first status poll happens 1-3 s after it opens), then an idle stretch: the
    # server's CPU while nothing is admitted is the cost of its sockets' own status polls (every ~10 s
    # while the queue is paused).
    await asyncio.sleep(args.settle)
    result["idle_paused"] = await idle_window(args, clients, ws_pid)
    rss_after = rss_bytes(ws_pid)
    result.update(
        server_rss_before_bytes=rss_before,
        server_rss_bytes=rss_after,
        server_rss_delta_bytes=rss_after - rss_before,
        bytes_per_socket=round((rss_after - rss_before) / max(1, len(clients.sockets))),
    )
    log(
        f"N={n}: RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB "
        f"({result['bytes_per_socket']} B/socket); idle (paused) server CPU "
        f"{result['idle_paused']['ws_server_cpu_pct']}%"
    )

    # Open, and let every socket's status poll move to the open queue's interval (with this policy 2 s,
    # from ~10 s while paused) before measuring: the steady state of an open queue with a short wait.
    await asyncio.to_thread(services.queue_configure, slug=slug, changes={"state": "open"})
    await asyncio.sleep(args.open_settle)
    result["idle_open"] = await idle_window(args, clients, ws_pid, spy=f"push_pyspy_{n}_idle_open.txt")
    log(
        f"N={n}: open, idle: server CPU {result['idle_open']['ws_server_cpu_pct']}%, "
        f"{result['idle_open']['status_messages_per_second']} status polls/s"
    )

    def admit() -> tuple[float, float, Any]:
        settings.WR_ADMIT_MAX_PER_CALL = args.per_round
        t0 = time.time()
        reply = services.queue_admit(slug=slug)
        return t0, time.time(), reply

    # Tag the pushed `admitted` events (bench process only; the server forwards events verbatim), so that a
    # client tells them from the `admitted` its socket's own status poll sends when it sees the news first.
    original_admitted = realtime.admitted

    def tagged(*a: Any, **kw: Any) -> realtime.Message:
        group, event = original_admitted(*a, **kw)
        return group, {**event, "via": "push"}

    realtime.admitted = tagged
    sent: dict[str, float] = {}
    rounds: list[dict[str, Any]] = []
    known = {t["ticket_id"] for t in tickets}
    spy = py_spy(args, ws_pid, f"push_pyspy_{n}_rounds.txt")
    window = CpuWindow(ws_pid)
    positions = clients.other["position"]
    max_rounds = 3 * (-(-args.samples // args.per_round)) + 5
    while len(sent) < args.samples and len(rounds) < max_rounds:
        t0, t1, reply = await asyncio.to_thread(admit)
        ids = [a.ticket_id for a in reply.admitted]
        for ticket_id in ids:
            sent[ticket_id] = t0
        rounds.append({"t0": t0, "call_s": t1 - t0, "admitted": len(ids), "ids": ids, "seq": reply.moves.seq})
        await asyncio.sleep(args.interval)
    result["rounds_cpu"] = window.result()
    result["rounds_cpu"]["status_messages_per_second"] = round(
        (clients.other["position"] - positions) / result["rounds_cpu"]["seconds"]
    )
    if spy is not None:
        result["rounds_cpu"]["py_spy"] = await asyncio.to_thread(py_spy_stop, spy)
    # Stragglers: wait until every admitted ticket has its push, or LOST_AFTER_S after the last round.
    deadline = time.time() + LOST_AFTER_S
    while time.time() < deadline and any(t not in clients.pushed_at for t in sent):
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    realtime.admitted = original_admitted

    def first(arrivals: dict[str, list[float]], ticket_id: str, t0: float) -> float | None:
        times = [t - t0 for t in arrivals.get(ticket_id, []) if t - t0 <= LOST_AFTER_S]
        return min(times) if times else None

    latencies, either, lost, poll_first = [], [], 0, 0
    for ticket_id, t0 in sent.items():
        pushed, polled = first(clients.pushed_at, ticket_id, t0), first(clients.polled_at, ticket_id, t0)
        if pushed is None:
            lost += 1
        else:
            latencies.append(pushed)
        if polled is not None and (pushed is None or polled < pushed):
            poll_first += 1
        seen = [t for t in (pushed, polled) if t is not None]
        if seen:
            either.append(min(seen))
    per_round = []
    for r in rounds:
        lat = [x for t in r["ids"] if (x := first(clients.pushed_at, t, r["t0"])) is not None]
        move = clients.move_last.get(r["seq"])
        per_round.append(
            {
                "admitted": r["admitted"],
                "call_ms": round(r["call_s"] * 1000, 1),
                "first_push_ms": round(min(lat) * 1000, 1) if lat else None,
                "last_push_ms": round(max(lat) * 1000, 1) if lat else None,
                "queue_move_last_ms": round((move - r["t0"]) * 1000, 1) if move else None,
            }
        )
    fanout = [clients.move_last[r["seq"]] - r["t0"] for r in rounds if r["seq"] and r["seq"] in clients.move_last]
    move_delivered = [clients.move_count[r["seq"]] for r in rounds if r["seq"]]
    result.update(
        latency_ms=summary_ms(latencies),
        samples=len(latencies),
        admitted=len(sent),
        lost=lost,
        not_our_tickets=len(set(sent) - known),
        # What the visitor sees: the push or its socket's status poll, whichever came first.
        first_admitted_message_ms=summary_ms(either),
        status_poll_came_first=poll_first,
        rounds=len(rounds),
        per_round=args.per_round,
        interval_s=args.interval,
        admit_call_ms=summary_ms([r["call_s"] for r in rounds]),
        queue_move_last_socket_ms=summary_ms(fanout),  # t0 -> the round's queue_move at the last socket
        queue_move_min_sockets_reached=min(move_delivered) if move_delivered else None,
        other_messages=dict(clients.other),
        closed_by_server=clients.closed_early,
        per_round_detail=per_round,
    )
    log(
        f"N={n}: {len(latencies)} samples, p50 {result['latency_ms']['p50']} ms, p99 {result['latency_ms']['p99']} ms, "
        f"max {result['latency_ms']['max']} ms, lost {lost}, poll first {poll_first}; queue_move to all sockets p50 "
        f"{result['queue_move_last_socket_ms']['p50']} ms; server CPU {result['rounds_cpu']['ws_server_cpu_pct']}%"
    )
    await clients.close_all()
    return result


async def idle_window(
    args: argparse.Namespace, clients: Clients, ws_pid: int, spy: str | None = None
) -> dict[str, Any]:
    """CPU over `--idle` seconds with no admission, and how many status polls the sockets received."""
    process = py_spy(args, ws_pid, spy) if spy else None
    positions = clients.other["position"]
    window = CpuWindow(ws_pid)
    await asyncio.sleep(args.idle)
    figures: dict[str, Any] = window.result()
    figures["status_messages_per_second"] = round((clients.other["position"] - positions) / figures["seconds"])
    if process is not None:
        figures["py_spy"] = await asyncio.to_thread(py_spy_stop, process)
    return figures


def py_spy(args: argparse.Namespace, pid: int, name: str) -> tuple[subprocess.Popen[bytes], Path] | None:
    """Sample the websocket server (collapsed stacks of the thread holding the GIL) until py_spy_stop."""
    if not args.py_spy:
        return None
    path = OUT / name
    command = [args.py_spy, "record", "-p", str(pid), "-r", "100", "--nonblocking", "--gil"]
    command += ["--format", "raw", "-o", str(path)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path


def py_spy_stop(spy: tuple[subprocess.Popen[bytes], Path]) -> str:
    process, path = spy
    process.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return str(path.relative_to(ROOT))


# --- Main ---------------------------------------------------------------------------------------------


def django_setup(env: dict[str, str]) -> None:
    # The stack's own environment: same Redis, prefix, keys and database (signing keys live there).
    os.environ.update(env)
    import django

    django.setup()


def run_one(args: argparse.Namespace, n: int, env: dict[str, str], var: Path) -> dict[str, Any]:
    stack, port, _ws_port, ws_pid = start_stack(env, var, str(n))
    try:
        base = f"http://127.0.0.1:{port}"
        slug = f"push-{n}"
        configure_queue(env, slug)
        started = time.monotonic()
        tickets = join_all(base, slug, n)
        waiting = [t for t in tickets if t["status"] == "waiting"]
        log(f"N={n}: {len(tickets)} joined in {time.monotonic() - started:.1f} s ({len(waiting)} waiting)")
        runner = asyncio.Runner(loop_factory=_loop_factory())
        try:
            return runner.run(measure(args, n, base, ws_pid, slug, waiting))
        finally:
            runner.close()
    finally:
        stop(stack)


def _loop_factory() -> Any:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between admission rounds")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of each idle CPU measurement")
    parser.add_argument("--open-settle", type=float, default=13.0, help="seconds from opening to the rounds")
    parser.add_argument("--compression", choices=["deflate", "none"], default="deflate")
    parser.add_argument("--py-spy", default="", help="path of a py-spy binary: also profile the server")
    parser.add_argument("--output", default=str(OUT / "push_bench.json"))
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * max(args.sockets) + 1000
    if soft < wanted:  # the stack's processes inherit it
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(hard, wanted), hard)
        )
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    OUT.mkdir(parents=True, exist_ok=True)
    var = OUT / "push-var"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    redis_url = devredis.resolve()
    embedded = None
    if redis_url is None:
        embedded, redis_url = devredis.start_embedded(var / "redis", daemonize=False)
    prefix = f"wrpush{uuid.uuid4().hex[:6]}"
    env = stack_env(redis_url, prefix, var)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["bench/push_bench.py", *sys.argv[1:]]),
        "settings": {
            "per_round": args.per_round,
            "samples": args.samples,
            "interval_s": args.interval,
            "compression": args.compression,
            "fd_limit": fd_limit,
            "redis": "embedded" if embedded else "shared 127.0.0.1",
        },
        "targets": {"p99_ms_at_5000": TARGET_P99_MS, "bytes_per_socket": TARGET_BYTES_PER_SOCKET},
        "runs": [],
    }
    log(f"Redis {redis_url}, prefix {prefix}")
    try:
        django_setup(env)
        for n in args.sockets:
            results["runs"].append(run_one(args, n, env, var))
    finally:
        _delete_prefix(redis_url, prefix)
        if embedded is not None:
            embedded.terminate()
    runs = {r["sockets"]: r for r in results["runs"]}
    largest = runs[max(runs)]
    results["met"] = {
        "p99": largest["latency_ms"]["p99"] is not None and largest["latency_ms"]["p99"] <= TARGET_P99_MS,
        "lost_zero": all(r["lost"] == 0 for r in runs.values()),
        "bytes_per_socket": all(r["bytes_per_socket"] <= TARGET_BYTES_PER_SOCKET for r in runs.values()),
    }
    Path(args.output).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
