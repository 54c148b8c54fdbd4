"""Live push benchmark (issues 3 and 15): admission-to-`admitted` latency at the visitor's websocket, how
long a public event takes to reach the last socket, the websocket servers' CPU at rest and their memory
per socket, and the worst pause of their event loops.

For each socket count N it starts a fresh stack the way bin/run does (`python -m waitingroom_site.runstack
--setup`), without the Celery worker and beat so that nothing but this script admits: the web server and
one websocket server (uvicorn), plus `--ws-servers` - 1 more websocket servers started the same way on
ports of their own, against Redis under a prefix of its own. It then

1. creates a paused queue, joins N visitors over HTTP and opens N websocket clients with their tickets,
   spread evenly over the websocket servers, in `--client-procs` processes of their own
   (bench/push_clients.py), so that the clients' CPU is reported apart from the servers';
2. reads each server's RSS before the first socket and once all are open and settled (every socket has
   heard its catch-up read, then `--settle` seconds), and their CPU over `--idle` seconds at rest (the
   queue paused, then open);
3. opens the queue and, from this process (Django set up on the same Redis, prefix and database), runs
   admission rounds for `--duration` seconds: `services.queue_admit` admitting `--per-round` visitors,
   which publishes their private `admitted` events and one `queue_move` to every socket. Latency of a
   ticket = arrival of its first `admitted` message at its client - the time taken just before the
   `queue_admit` call of its round; a round's public event latency = the arrival of its `queue_move` at
   the last socket to get it - the same time;
4. with the product stopped, opens as many sockets from the same clients on the framework-free reference
   (bench/push_reference.py: accept, and write one frame built once to every socket when told) and times
   `--reference-rounds` of its events the same way: the product's public event figure as a ratio to this
   machine's floor.

The servers report their worst event-loop pause every 5 s (queueing/loopwatch.py), with their longest
garbage collection. Their settings are production's: objects frozen out of the collector's sight every
2 s, no full collection while they hold sockets (wscollector.Collector); `--gc-full-seconds N` adds one every
N seconds, to see what it would cost.

    .venv/bin/python bench/push_bench.py [--sockets 2000 5000] [--duration 120] [--ws-servers 1]
                                         [--client-procs 2] [--per-round 20] [--py-spy PATH]
                                         [--reference-rounds 120]

Progress goes to stderr; the figures are printed as JSON and written to bench/out/push_bench.json.
Every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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

# Issue 15, at 18,000 sockets a server.
TARGET_ADMITTED_P99_MS = 100.0
TARGET_PUBLIC_EVENT_P99_MS = 250.0
TARGET_BYTES_PER_SOCKET = 25 * 1000
TARGET_IDLE_CPU_PCT = 10.0
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
    """CPU used by the websocket servers, the client processes, this process and the whole machine over a
    stretch of time (% of one core; the machine's as % of all its cores)."""

    def __init__(self, servers: list[int], clients: list[int]) -> None:
        self.servers, self.clients = servers, clients
        self.wall = time.monotonic()
        self.server = [cpu_seconds(pid) for pid in servers]
        self.client = sum(cpu_seconds(pid) for pid in clients)
        self.own = cpu_seconds()
        self.machine = machine_ticks()

    def result(self) -> dict[str, Any]:
        wall = time.monotonic() - self.wall
        busy, total = machine_ticks()
        per_server = [
            round(100 * (cpu_seconds(pid) - before) / wall, 1)
            for pid, before in zip(self.servers, self.server, strict=True)
        ]
        return {
            "seconds": round(wall, 2),
            "ws_server_cpu_pct": max(per_server),  # the busiest server's
            "ws_servers_cpu_pct": per_server,
            "client_processes_cpu_pct": round(
                100 * (sum(cpu_seconds(p) for p in self.clients) - self.client) / wall, 1
            ),
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


def stack_env(redis_url: str, prefix: str, var: Path, gc_full_seconds: int) -> dict[str, str]:
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
        LOG_LEVEL="INFO",  # the websocket servers' reports of their event loop's pauses (queueing/loopwatch.py)
        WR_WS_REPORT_SECONDS=str(REPORT_SECONDS),
        WR_WS_GC_FULL_SECONDS=str(gc_full_seconds),  # 0, production's: none while sockets are held
        WR_RATE_LIMITS=BENCH_RATE_LIMITS,  # thousands of joins from 127.0.0.1 (see http_bench.py)
    )
    return env


@dataclass
class Stack:
    process: Any
    port: int
    ws_ports: list[int]
    ws_pids: list[int]
    logs: list[Path]  # where each websocket server's reports go
    extra: list[Any]  # websocket servers started beside the stack's own


def start_stack(env: dict[str, str], var: Path, name: str, ws_servers: int) -> Stack:
    """The stack as bin/run starts it (web and one websocket server), and ws_servers - 1 more websocket
    servers started exactly as runstack starts its own, on ports of their own: the sockets are spread over
    them as a load balancer would."""
    port, ws_port = free_port(), free_port()
    log_path = var / f"stack-{name}.log"
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
        log_path,
    )
    result = Stack(stack, port, [ws_port], [], [log_path], [])
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz")
        result.ws_pids.append(ws_server_pid(stack.pid))
        for i in range(1, ws_servers):
            from waitingroom_site import runstack

            extra_port = free_port()
            command = runstack.commands(runstack._parse(["--only", "ws", "--ws-port", str(extra_port)]), "w")["ws"]
            extra_log = var / f"ws-{name}-{i}.log"
            process = start(command, env, extra_log)
            result.extra.append(process)
            result.ws_ports.append(extra_port)
            result.ws_pids.append(process.pid)
            result.logs.append(extra_log)
        for ws in result.ws_ports:
            wait_listening(ws)
    except BaseException:
        stop_stack(result)
        raise
    return result


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_stack(stack: Stack) -> None:
    for process in stack.extra:
        stop(process)
    stop(stack.process)


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


# --- The clients and the servers' reports --------------------------------------------------------------


class ClientProcs:
    """The websocket clients in processes of their own (bench/push_clients.py), the tickets split evenly."""

    def __init__(self, args: argparse.Namespace, tickets: list[dict[str, Any]], var: Path) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.outs: list[Path] = []
        count = args.client_procs
        for i in range(count):
            part, out = var / f"clients-{i}.json", var / f"clients-{i}-heard.json"
            part.write_text(json.dumps(tickets[i::count]))
            command = [sys.executable, str(BENCH / "push_clients.py"), "--tickets", str(part), "--out", str(out)]
            command += ["--concurrency", str(max(1, args.connect_concurrency // count))]
            self.procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            self.outs.append(out)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _ask(self, line: str) -> list[str]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        return [self._answer(proc) for proc in self.procs]

    @staticmethod
    def _answer(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"client process {proc.pid} ended (exit {proc.wait()})")
        return line

    def wait_open(self) -> tuple[int, int]:
        opened = failures = 0
        for proc in self.procs:
            _, n, failed = self._answer(proc).split()
            opened, failures = opened + int(n), failures + int(failed)
        return opened, failures

    def positions(self) -> int:
        """`position` messages heard so far (the servers' status reads on the visitors' behalf)."""
        return sum(json.loads(line)["other"].get("position", 0) for line in self._ask("STATS"))

    def close_crowd(self, k: int) -> dict[str, Any]:
        """Close k sockets at once, the back of the line, split over the client processes; when every
        process has sent its closes and seen the server close them all."""
        for i, proc in enumerate(self.procs):
            assert proc.stdin is not None
            proc.stdin.write(f"CLOSE {k // len(self.procs) + (i < k % len(self.procs))}\n")
            proc.stdin.flush()
        answers = [json.loads(self._answer(proc)) for proc in self.procs]
        return {
            "closed": sum(a["closed"] for a in answers),
            "closes_sent_s": max(a["sent_s"] for a in answers),
            "all_closed_s": max(a["all_closed_s"] for a in answers),
            "ticket_ids": [t for a in answers for t in a["ticket_ids"]],
        }

    def stop(self) -> dict[str, Any]:
        """What all the clients heard, merged."""
        self._ask("STOP")
        for proc in self.procs:
            proc.wait(timeout=60)
        merged: dict[str, Any] = {"pushed_at": {}, "polled_at": {}, "move_last": {}, "move_count": Counter()}
        merged.update(other=Counter(), closed_by_server=0, state_last={}, state_count=Counter())
        for out in self.outs:
            heard = json.loads(out.read_text())
            merged["pushed_at"].update(heard["pushed_at"])
            merged["polled_at"].update(heard["polled_at"])
            for seq, at in heard["move_last"].items():
                merged["move_last"][int(seq)] = max(at, merged["move_last"].get(int(seq), 0.0))
            merged["move_count"].update({int(seq): n for seq, n in heard["move_count"].items()})
            for k, at in heard["state_last"].items():
                merged["state_last"][int(k)] = max(at, merged["state_last"].get(int(k), 0.0))
            merged["state_count"].update({int(k): n for k, n in heard["state_count"].items()})
            merged["other"].update(heard["other"])
            merged["closed_by_server"] += heard["closed_by_server"]
        return merged

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


REPORT_SECONDS = 5
PAUSE = re.compile(
    r"websocket server (\d+): (.*), worst event-loop pause ([\d.]+) ms .*longest garbage collection ([\d.]+) ms"
)


class Reports:
    """The websocket servers' reports (queueing/loopwatch.py) written from a moment on."""

    def __init__(self, logs: list[Path]) -> None:
        self.logs = logs
        self.offsets = [path.stat().st_size for path in logs]

    def worst_pause_ms(self) -> dict[str, Any]:
        time.sleep(REPORT_SECONDS + 1)  # the period under way reports too
        worst: list[float] = []
        collections: list[float] = []
        held = ""
        for path, offset in zip(self.logs, self.offsets, strict=True):
            with path.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            pauses = [(float(m.group(3)), m.group(2), float(m.group(4))) for m in PAUSE.finditer(text)]
            worst.append(max(p for p, _, _ in pauses) if pauses else float("nan"))
            collections.append(max(c for _, _, c in pauses) if pauses else float("nan"))
            held = held or (pauses[-1][1] if pauses else "")
        return {
            "worst_loop_pause_ms": max(worst),
            "per_server": worst,
            "longest_collection_ms": max(collections),
            "reports_say": held,
        }


# --- Admission rounds ---------------------------------------------------------------------------------


def measure(
    args: argparse.Namespace, n: int, stack: Stack, slug: str, tickets: list[dict[str, Any]], var: Path
) -> dict[str, Any]:
    from django.conf import settings

    from queueing import realtime, services

    for i, ticket in enumerate(tickets):  # spread over the servers, as a load balancer would
        port = stack.ws_ports[i % len(stack.ws_ports)]
        ticket["ws_url"] = ticket["ws_url"].replace(f":{stack.ws_ports[0]}/", f":{port}/")
    result: dict[str, Any] = {"sockets": n, "ws_servers": len(stack.ws_pids), "client_processes": args.client_procs}
    rss_before = [rss_bytes(pid) for pid in stack.ws_pids]
    started = time.monotonic()
    clients = ClientProcs(args, tickets, var)
    try:
        window = CpuWindow(stack.ws_pids, clients.pids)
        opened, failures = clients.wait_open()
        result["connect_seconds"] = round(time.monotonic() - started, 2)
        result["connect_cpu"] = window.result()
        result["connected"], result["connect_failures"] = opened, failures
        log(f"N={n}: {opened} sockets open in {result['connect_seconds']} s; settling")
        # Every socket reads its status once, 0.5-2 s after its hello; at 18,000 the server is still
        # answering hellos when the clients have all connected, and those reads would fall in the idle window.
        caught_up = time.monotonic() + 120
        while clients.positions() < opened and time.monotonic() < caught_up:
            time.sleep(1)
        result["catch_up_seconds"] = round(time.monotonic() - started - result["connect_seconds"], 1)
        time.sleep(args.settle)
        result["idle_paused"] = idle_window(args, clients, stack)
        rss_after = [rss_bytes(pid) for pid in stack.ws_pids]
        per_server = max(1, opened // len(stack.ws_pids))
        result.update(
            server_rss_before_bytes=rss_before,
            server_rss_bytes=rss_after,
            bytes_per_socket=round(max((a - b) / per_server for a, b in zip(rss_after, rss_before, strict=True))),
        )
        log(
            f"N={n}: RSS {[round(b / 2**20, 1) for b in rss_before]} -> {[round(a / 2**20, 1) for a in rss_after]} MiB "
            f"({result['bytes_per_socket']} B/socket); catch-up reads done {result['catch_up_seconds']} s after; "
            f"idle (paused): server CPU {result['idle_paused']['ws_servers_cpu_pct']}%"
        )
        services.queue_configure(slug=slug, changes={"state": "open"})
        time.sleep(args.open_settle)
        result["idle_open"] = idle_window(args, clients, stack, spy=f"push_pyspy_{n}_idle_open.txt")
        log(
            f"N={n}: open, idle: server CPU {result['idle_open']['ws_servers_cpu_pct']}%, "
            f"{result['idle_open']['status_messages_per_second']} status reads/s, "
            f"worst pause {result['idle_open']['worst_loop_pause_ms']} ms"
        )

        result["state_changes"] = state_changes(args, slug)

        # Tag the pushed `admitted` events (this process only; the server forwards events verbatim), so that a
        # client tells them from the `admitted` its socket's own status read sends when it sees the news first.
        original_admitted = realtime.admitted

        def tagged(*a: Any, **kw: Any) -> realtime.Message:
            group, event = original_admitted(*a, **kw)
            return group, {**event, "via": "push"}

        realtime.admitted = tagged
        settings.WR_ADMIT_MAX_PER_CALL = args.per_round
        sent: dict[str, float] = {}
        rounds: list[dict[str, Any]] = []
        spy = py_spy(args, stack.ws_pids[0], f"push_pyspy_{n}_rounds.txt")
        reports = Reports(stack.logs)
        window = CpuWindow(stack.ws_pids, clients.pids)
        positions = clients.positions()
        began = time.monotonic()
        end = began + args.duration
        crowd: Any = None  # the mass close under way (a thread waiting for the clients to close the crowd)
        with ThreadPoolExecutor(1) as closer:
            while time.monotonic() < end:
                if args.mass_close and crowd is None and time.monotonic() >= began + args.duration / 2:
                    rss_close = [rss_bytes(pid) for pid in stack.ws_pids]
                    close_at, crowd = time.time(), closer.submit(clients.close_crowd, args.mass_close)
                    log(f"N={n}: closing {args.mass_close} sockets at once")
                t0 = time.time()
                reply = services.queue_admit(slug=slug)
                t1 = time.time()
                ids = [a.ticket_id for a in reply.admitted]
                for ticket_id in ids:
                    sent[ticket_id] = t0
                rounds.append({"t0": t0, "call_s": t1 - t0, "admitted": len(ids), "ids": ids, "seq": reply.moves.seq})
                time.sleep(max(0.0, args.interval - (time.time() - t0)))
        closed = crowd.result() if crowd is not None else None
        result["rounds_cpu"] = window.result()
        result["rounds_cpu"]["status_messages_per_second"] = round(
            (clients.positions() - positions) / result["rounds_cpu"]["seconds"]
        )
        if spy is not None:
            result["rounds_cpu"]["py_spy"] = py_spy_stop(spy)
        time.sleep(LOST_AFTER_S)  # stragglers
        result["rounds_pause"] = reports.worst_pause_ms()
        if closed is not None:
            rss_after_close = [rss_bytes(pid) for pid in stack.ws_pids]
            result["mass_close"] = {
                "sockets": closed["closed"],
                "closes_sent_s": closed["closes_sent_s"],
                "all_closed_s": closed["all_closed_s"],
                "at": close_at,
                "server_rss_before_close_bytes": rss_close,
                "server_rss_after_close_bytes": rss_after_close,  # the rounds' second half, and 5 s, later
            }
        realtime.admitted = original_admitted
        heard = clients.stop()
        time.sleep(args.settle)
        result["server_rss_after_all_closed_bytes"] = [rss_bytes(pid) for pid in stack.ws_pids]
    finally:
        clients.kill()
    crowd_ids = set(closed["ticket_ids"]) if closed is not None else set()
    return figures(args, result, heard, sent, rounds, {t["ticket_id"] for t in tickets}, crowd_ids)


def state_changes(args: argparse.Namespace, slug: str) -> list[tuple[float, float]]:
    """Pause and resume the queue `--state-changes` times (an even number: it ends open), one every
    `--interval` seconds, as the management API does (services.queue_configure): the moments just before
    each call and just after it returned. Each is pushed to every socket as a `state` event."""
    from queueing import services

    moments = []
    for i in range(args.state_changes):
        t0 = time.time()
        services.queue_configure(slug=slug, changes={"state": "paused" if i % 2 == 0 else "open"})
        t1 = time.time()
        moments.append((t0, t1))
        time.sleep(max(0.0, args.interval - (time.time() - t0)))
    time.sleep(1)
    return moments


def figures(
    args: argparse.Namespace,
    result: dict[str, Any],
    heard: dict[str, Any],
    sent: dict[str, float],
    rounds: list[dict[str, Any]],
    known: set[str],
    crowd: set[str],
) -> dict[str, Any]:
    def first(arrivals: dict[str, list[float]], ticket_id: str, t0: float) -> float | None:
        times = [t - t0 for t in arrivals.get(ticket_id, []) if t - t0 <= LOST_AFTER_S]
        return min(times) if times else None

    latencies, either, lost, poll_first, gone = [], [], 0, 0, 0
    for ticket_id, t0 in sent.items():
        pushed, polled = first(heard["pushed_at"], ticket_id, t0), first(heard["polled_at"], ticket_id, t0)
        if pushed is None and ticket_id in crowd:
            gone += 1  # admitted after its socket closed with the crowd: nobody there to hear it
        elif pushed is None:
            lost += 1
        else:
            latencies.append(pushed)
        if polled is not None and (pushed is None or polled < pushed):
            poll_first += 1
        seen = [t for t in (pushed, polled) if t is not None]
        if seen:
            either.append(min(seen))
    fanout = [heard["move_last"][r["seq"]] - r["t0"] for r in rounds if r["seq"] and r["seq"] in heard["move_last"]]
    states = result.pop("state_changes", [])
    # The open before the state changes was each socket's first `state` event; the k-th change its (k+1)-th.
    state_fanout = [heard["state_last"][k + 2] - t0 for k, (t0, _) in enumerate(states) if k + 2 in heard["state_last"]]
    state_after = [heard["state_last"][k + 2] - t1 for k, (_, t1) in enumerate(states) if k + 2 in heard["state_last"]]
    if "mass_close" in result:
        close_at = result["mass_close"].pop("at")
        settled = close_at + result["mass_close"]["all_closed_s"]

        def moves(lo: float, hi: float) -> dict[str, Any]:
            return summary_ms(
                [
                    heard["move_last"][r["seq"]] - r["t0"]
                    for r in rounds
                    if lo <= r["t0"] < hi and r["seq"] in heard["move_last"]
                ]
            )

        result["mass_close"].update(
            queue_move_last_socket_ms_before=moves(0, close_at),
            queue_move_last_socket_ms_while_closing=moves(close_at, settled + 1),
            queue_move_last_socket_ms_after=moves(settled + 1, float("inf")),
            admitted_after_their_socket_closed=gone,
        )
    move_delivered = [heard["move_count"][r["seq"]] for r in rounds if r["seq"]]
    slowest = sorted(rounds, key=lambda r: heard["move_last"].get(r["seq"], r["t0"]) - r["t0"])[-5:]
    result.update(
        latency_ms=summary_ms(latencies),
        samples=len(latencies),
        admitted=len(sent),
        lost=lost,
        not_our_tickets=len(set(sent) - known),
        # What the visitor sees: the push or its socket's status read, whichever came first.
        first_admitted_message_ms=summary_ms(either),
        status_read_came_first=poll_first,
        rounds=len(rounds),
        rounds_seconds=args.duration,
        per_round=args.per_round,
        interval_s=args.interval,
        admit_call_ms=summary_ms([r["call_s"] for r in rounds]),
        queue_move_last_socket_ms=summary_ms(fanout),  # t0 -> the round's queue_move at the last socket
        queue_move_min_sockets_reached=min(move_delivered) if move_delivered else None,
        state_changes=len(states),
        state_last_socket_ms=summary_ms(state_fanout),  # just before the change's call -> its last socket
        state_last_socket_after_call_ms=summary_ms(state_after),  # the call's return -> its last socket
        state_min_sockets_reached=min((heard["state_count"][k + 2] for k in range(len(states))), default=None),
        slowest_rounds_queue_move_ms=[
            round((heard["move_last"].get(r["seq"], 0) - r["t0"]) * 1000, 1) for r in slowest
        ],
        other_messages=dict(heard["other"]),
        closed_by_server=heard["closed_by_server"],
    )
    log(
        f"N={result['sockets']}: {len(latencies)} samples, p50 {result['latency_ms']['p50']} ms, "
        f"p99 {result['latency_ms']['p99']} ms, max {result['latency_ms']['max']} ms, lost {lost}; queue_move at the "
        f"last socket p50 {result['queue_move_last_socket_ms']['p50']} "
        f"p99 {result['queue_move_last_socket_ms']['p99']} ms; "
        f"server CPU {result['rounds_cpu']['ws_servers_cpu_pct']}%, "
        f"clients {result['rounds_cpu']['client_processes_cpu_pct']}%; "
        f"worst loop pause {result['rounds_pause']['worst_loop_pause_ms']} ms"
    )
    return result


def idle_window(args: argparse.Namespace, clients: ClientProcs, stack: Stack, spy: str | None = None) -> dict[str, Any]:
    """CPU over `--idle` seconds with no admission, the status reads the sockets received, the worst pause."""
    process = py_spy(args, stack.ws_pids[0], spy) if spy else None
    positions = clients.positions()
    reports = Reports(stack.logs)
    window = CpuWindow(stack.ws_pids, clients.pids)
    time.sleep(args.idle)
    result: dict[str, Any] = window.result()
    result["status_messages_per_second"] = round((clients.positions() - positions) / result["seconds"], 1)
    if process is not None:
        result["py_spy"] = py_spy_stop(process)
    result["worst_loop_pause_ms"] = reports.worst_pause_ms()["worst_loop_pause_ms"]
    return result


def py_spy(args: argparse.Namespace, pid: int, name: str) -> tuple[subprocess.Popen[bytes], Path] | None:
    """Sample the websocket server (collapsed stacks of the thread holding the GIL) until py_spy_stop."""
    if not args.py_spy:
        return None
    path = OUT / name
    command = [args.py_spy, "record", "-p", str(pid), "-r", str(args.py_spy_rate), "--nonblocking", "--gil"]
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
    stack = start_stack(env, var, str(n), args.ws_servers)
    try:
        base = f"http://127.0.0.1:{stack.port}"
        slug = f"push-{n}"
        configure_queue(env, slug)
        started = time.monotonic()
        tickets = join_all(base, slug, n)
        waiting = [t for t in tickets if t["status"] == "waiting"]
        log(f"N={n}: {len(tickets)} joined in {time.monotonic() - started:.1f} s ({len(waiting)} waiting)")
        result = measure(args, n, stack, slug, waiting, var)
    finally:
        stop_stack(stack)
    if args.reference_rounds > 0:  # with the product stopped: the machine as the product had it
        result["reference"] = reference(args, waiting, var)
        ours, floor = result["queue_move_last_socket_ms"], result["reference"]["queue_move_last_socket_ms"]
        result["public_event_vs_reference"] = {
            q: round(ours[q] / floor[q], 2) if ours[q] and floor[q] else None for q in ("p50", "p99")
        }
        state = result["state_last_socket_ms"]
        result["state_event_vs_reference"] = {
            q: round(state[q] / floor[q], 2) if state[q] and floor[q] else None for q in ("p50", "p99")
        }
        log(
            f"N={n}: reference: queue_move at the last socket p50 {floor['p50']} p99 {floor['p99']} ms "
            f"(writes alone p50 {result['reference']['writes_ms']['p50']} ms); "
            f"the product's is {result['public_event_vs_reference']['p50']}x (p50) and "
            f"{result['public_event_vs_reference']['p99']}x (p99) the reference's"
        )
        if "mass_close" in result["reference"]:
            closing = result["reference"]["mass_close"]
            log(
                f"N={n}: reference: {closing['sockets']} sockets closing at once paused its loop at most "
                f"{closing['worst_loop_pause_ms']} ms (before: {closing['pause_before_ms']} ms); the product's "
                f"worst over its rounds with the same close: {result['rounds_pause']['worst_loop_pause_ms']} ms"
            )
    return result


def _reference_pause(server: subprocess.Popen[str]) -> float:
    """The reference's worst event-loop pause since the last time it was asked (ms)."""
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write("PAUSE\n")
    server.stdin.flush()
    return float(server.stdout.readline().split()[1])


def reference(args: argparse.Namespace, tickets: list[dict[str, Any]], var: Path) -> dict[str, Any]:
    """The public event's figure on the framework-free reference (bench/push_reference.py): the same clients,
    as many sockets, one event every `--interval` seconds for `--reference-rounds` rounds."""
    port = free_port()
    command = [sys.executable, str(BENCH / "push_reference.py"), "--port", str(port)]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        if server.stdout.readline().strip() != "LISTENING":
            raise RuntimeError("the reference server did not start")
        own = [{**t, "ws_url": f"ws://127.0.0.1:{port}{urlsplit(t['ws_url']).path}"} for t in tickets]
        clients = ClientProcs(args, own, var)
        try:
            opened, failures = clients.wait_open()
            time.sleep(args.settle)
            window = CpuWindow([server.pid], clients.pids)
            sent: list[tuple[int, float]] = []
            writes: list[float] = []
            closing: dict[str, Any] = {}  # the mass close, as the product had it: mid-rounds, the back of the line
            with ThreadPoolExecutor(1) as closer:
                for seq in range(1, args.reference_rounds + 1):
                    if args.mass_close and not closing and seq > args.reference_rounds // 2:
                        closing["pause_before_ms"] = _reference_pause(server)
                        closing["crowd"] = closer.submit(clients.close_crowd, args.mass_close)
                    t0 = time.time()
                    server.stdin.write(f"MOVE {seq}\n")
                    server.stdin.flush()
                    writes.append(float(server.stdout.readline().split()[1]))
                    sent.append((seq, t0))
                    time.sleep(max(0.0, args.interval - (time.time() - t0)))
            if closing:
                closed = closing.pop("crowd").result()
                time.sleep(1)
                closing.update(
                    sockets=closed["closed"],
                    all_closed_s=closed["all_closed_s"],
                    worst_loop_pause_ms=_reference_pause(server),  # the close and the rounds after it
                )
            cpu = window.result()
            time.sleep(1)
            heard = clients.stop()
        finally:
            clients.kill()
    finally:
        server.kill()
        server.wait()
    fanout = [heard["move_last"][seq] - t0 for seq, t0 in sent if seq in heard["move_last"]]
    return {
        **({"mass_close": closing} if closing else {}),
        "connected": opened,
        "connect_failures": failures,
        "rounds": len(sent),
        "queue_move_last_socket_ms": summary_ms(fanout),
        "queue_move_min_sockets_reached": min((heard["move_count"][seq] for seq, _ in sent), default=None),
        "writes_ms": summary_ms(writes),
        "server_cpu_pct": cpu["ws_server_cpu_pct"],
        "client_processes_cpu_pct": cpu["client_processes_cpu_pct"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of admission rounds")
    parser.add_argument("--ws-servers", type=int, default=1, help="websocket servers the sockets are spread over")
    parser.add_argument("--client-procs", type=int, default=2, help="processes holding the client sockets")
    parser.add_argument("--gc-full-seconds", type=int, default=0, help="the servers' WR_WS_GC_FULL_SECONDS")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between admission rounds")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each idle CPU measurement")
    parser.add_argument("--open-settle", type=float, default=13.0, help="seconds from opening to the rounds")
    parser.add_argument("--py-spy", default="", help="path of a py-spy binary: also profile the server")
    parser.add_argument("--py-spy-rate", type=int, default=100, help="py-spy's samples a second")
    parser.add_argument("--state-changes", type=int, default=20, help="pauses and resumes before the rounds")
    parser.add_argument(
        "--mass-close", type=int, default=0, help="sockets (the back of the line) closed at once mid-rounds"
    )
    parser.add_argument(
        "--reference-rounds", type=int, default=120, help="events on the framework-free reference (0: none)"
    )
    parser.add_argument("--output", default=str(OUT / "push_bench.json"))
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(args.sockets) + 1000  # (the hard limit may be lower: 20,000 on the host of 2026-12-05)
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
    env = stack_env(redis_url, prefix, var, args.gc_full_seconds)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["bench/push_bench.py", *sys.argv[1:]]),
        "settings": {
            "per_round": args.per_round,
            "rounds_seconds": args.duration,
            "ws_servers": args.ws_servers,
            "client_processes": args.client_procs,
            "gc_full_seconds": args.gc_full_seconds,
            "interval_s": args.interval,
            "fd_limit": fd_limit,
            "redis": "embedded" if embedded else "shared 127.0.0.1",
        },
        "targets": {
            "admitted_p99_ms": TARGET_ADMITTED_P99_MS,
            "public_event_last_socket_p99_ms": TARGET_PUBLIC_EVENT_P99_MS,
            "bytes_per_socket": TARGET_BYTES_PER_SOCKET,
            "idle_cpu_pct_of_a_core": TARGET_IDLE_CPU_PCT,
        },
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
    results["met"] = {
        "admitted_p99": all(
            r["latency_ms"]["p99"] is not None and r["latency_ms"]["p99"] <= TARGET_ADMITTED_P99_MS
            for r in runs.values()
        ),
        "public_event_p99": all(
            r["queue_move_last_socket_ms"]["p99"] is not None
            and r["queue_move_last_socket_ms"]["p99"] <= TARGET_PUBLIC_EVENT_P99_MS
            for r in runs.values()
        ),
        "lost_zero": all(r["lost"] == 0 for r in runs.values()),
        "bytes_per_socket": all(r["bytes_per_socket"] <= TARGET_BYTES_PER_SOCKET for r in runs.values()),
        "idle_cpu": all(r["idle_open"]["ws_server_cpu_pct"] <= TARGET_IDLE_CPU_PCT for r in runs.values()),
    }
    Path(args.output).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
