"""HTTP and Redis benchmark for the queue engine (issue 2).

Starts the product the way bin/run does (`python -m waitingroom_site.runstack --setup`: granian, or
gunicorn with `--web-server gunicorn`; Celery
worker and beat), drives it with wrk on 127.0.0.1, and in the same run serves the framework-free
reference (bench/reference_app.py under uvicorn) to compare status throughput against. Then, on a
dedicated redis-server, measures Redis bytes per waiting ticket at 100,000 tickets and the admission
script's time for 1,000 admits.

    .venv/bin/python bench/http_bench.py [--duration 15] [--connections 64] [--asgi-compare]

Needs wrk (Debian package `wrk`). Prints every figure and writes bench/out/http_bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
QUEUE = "bench"
sys.path.insert(0, str(ROOT))

from waitingroom_site import devredis  # noqa: E402

# The limiters are the product's defaults (settings.WR_RATE_LIMITS), in every join and poll, except the
# join limit (per address): the load generator sends every join from 127.0.0.1, so it is lifted for the
# run (the limiter still runs, with a limit no run reaches). The status limiter (per ticket) is the
# default one: the runs rotate over enough tickets (--tickets, 20,000) that no honest poll is refused.
LIFTED = {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 10**12}
# Every limiter lifted (the other benchmarks, which poll a few tickets far more often than a visitor would).
BENCH_RATE_LIMITS = json.dumps(
    {
        "join": LIFTED,
        "challenge": LIFTED,
        "status": {"algorithm": "token_bucket", "capacity": 10**12, "refill_per_second": 10**12},
        "neighbours": {"algorithm": "token_bucket", "capacity": 10**12, "refill_per_second": 10**12},
        "protected": {"algorithm": "token_bucket", "capacity": 10**12, "refill_per_second": 10**12},
        "staff": {"algorithm": "sliding_log", "window_seconds": 1, "max_requests": 10**9},
        "auth": {"algorithm": "sliding_log", "window_seconds": 1, "max_requests": 10**9},
    }
)


READ_LIMITS = "import json\nfrom waitingroom_site.settings import WR_RATE_LIMITS\nprint(json.dumps(WR_RATE_LIMITS))"


def bench_rate_limits(env: dict[str, str]) -> str:
    """The product's default limiters (read from its settings), with joins lifted as above."""
    defaults = subprocess.run(
        [sys.executable, "-c", READ_LIMITS],
        env={k: v for k, v in env.items() if k != "WR_RATE_LIMITS"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.dumps({**json.loads(defaults), "join": LIFTED, "challenge": LIFTED})


WAITING_COUNT = """
import sys, django
django.setup()
from queueing.selectors.queues import queue_stats_get
print(queue_stats_get(slug=sys.argv[1])["waiting"])
"""


JOIN_LUA = r"""
local paths = {JOIN_PATHS}
local counter = 0
local seed = tostring({}):sub(8)
math.randomseed(os.time() + tonumber(seed, 16) % 100000)
local function hex16() return string.format("%04x", math.random(0, 65535)) end
request = function()
  counter = counter + 1
  local id = ""
  for _ = 1, 8 do id = id .. hex16() end
  return wrk.format("POST", paths[counter % #paths + 1],
    {["Content-Type"] = "application/json", ["X-Visitor-Id"] = id}, "{}")
end
"""

STATUS_LUA = r"""
polls = dofile("TICKETS_FILE")
local i = math.random(1, #polls)
request = function()
  i = i % #polls + 1
  return wrk.format("GET", polls[i][1], {["Authorization"] = "Bearer " .. polls[i][2]})
end
"""


def join_script(slugs: list[str]) -> str:
    """wrk's script for joins, a new visitor each, spread over the queues in turn."""
    paths = ",".join(json.dumps(f"/api/v1/queues/{slug}/join") for slug in slugs)
    return JOIN_LUA.replace("JOIN_PATHS", paths)


def status_script(tickets: list[tuple[str, str]], tickets_file: Path) -> str:
    """wrk's script for status polls of `tickets` ((slug, ticket) pairs, written to `tickets_file`) in rotation."""
    polls = (f"{{{json.dumps(f'/api/v1/queues/{slug}/status')},{json.dumps(ticket)}}}" for slug, ticket in tickets)
    tickets_file.write_text("return {" + ",".join(polls) + "}")
    return STATUS_LUA.replace("TICKETS_FILE", str(tickets_file))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def _ms(value: str) -> float:
    number, unit = float(re.match(r"[\d.]+", value).group()), re.search(r"[a-z]+$", value).group()  # type: ignore[union-attr]
    return number * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def wrk(url: str, script: str, *, duration: int, connections: int, threads: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    result = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "-s", handle.name, url],
        capture_output=True,
        text=True,
        check=True,
    )
    os.unlink(handle.name)
    text = result.stdout
    percentiles = {p: _ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", text, re.M)}
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: (.*)", text)
    return {
        "requests_per_second": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),  # type: ignore[union-attr]
        "p50_ms": percentiles.get("50"),
        "p99_ms": percentiles.get("99"),
        "requests": int(re.search(r"(\d+) requests in", text).group(1)),  # type: ignore[union-attr]
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (its latencies come with it)."""
    ordered = sorted(runs, key=lambda r: r["requests_per_second"])
    return dict(ordered[len(ordered) // 2])


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_uvicorn(app: str, port: int, workers: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    uvicorn = str(Path(sys.executable).parent / "uvicorn")
    return start(
        [uvicorn, app, "--port", str(port), "--workers", str(workers), "--no-access-log", "--log-level", "warning"],
        env,
        log,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def stack_env(redis_url: str, var: Path, prefix: str, ticket_key: str) -> dict[str, str]:
    """The product's environment for a benchmark: its own key prefix, database, Celery queue and signing key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        WR_TICKET_SIGNING_KEY=ticket_key,
        HTTPS="0",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        REDIS_URL=redis_url,
        WR_REDIS_PREFIX=prefix,
        CELERY_KEY_PREFIX=f"{prefix}:celery:",
        CELERY_TASK_DEFAULT_QUEUE=f"{prefix}-tasks",
        LOG_LEVEL="WARNING",
        BENCH_REDIS_URL=redis_url,
        BENCH_QUEUE=QUEUE,
        BENCH_REFERENCE_KEY=f"{prefix}:reference",
    )
    env["WR_RATE_LIMITS"] = bench_rate_limits(env)
    return env


def start_stack(
    env: dict[str, str], var: Path, *, port: int, ws_port: int, web_server: str, web_workers: int
) -> subprocess.Popen[bytes]:
    """The product as bin/run starts it (web server, websocket server, Celery worker and beat), on `port`."""
    command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--port", str(port)]
    command += ["--ws-port", str(ws_port), "--var-dir", str(var), "--web-server", web_server]
    command += ["--web-workers", str(web_workers)] if web_workers else []
    return start(command, env, var / "stack.log")


def queue_configure(env: dict[str, str], slug: str, *, sale: bool = False) -> None:
    """A queue that admits almost nobody for the run (1 a minute): its visitors stay waiting, as most pollers
    are. With `sale`, a queue open mid-sale: 100 slots, 1,200 admitted a minute, an admission unclaimed for
    30 s let go (so slots keep coming back and the line keeps moving), the tick's table of waits in force."""
    options = {
        "--target-url": "https://shop.example/",
        "--capacity": "1",
        "--outflow-per-minute": "1",
        "--burst": "1",
        "--presence-timeout": "3600",
        "--abandon-timeout": "7200",
    }
    if sale:
        options.update({"--capacity": "100", "--outflow-per-minute": "1200", "--burst": "20", "--claim-ttl": "30"})
        options["--state"] = "open"
    command = [sys.executable, "manage.py", "configure_queue", slug, *(p for o in options.items() for p in o)]
    subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True)


def tickets_join(base: str, slugs: list[str], count: int) -> list[tuple[str, str]]:
    """`count` visitors joined, over the queues in turn: their (slug, ticket)."""

    def join(n: int) -> tuple[str, str]:
        slug = slugs[n % len(slugs)]
        reply = client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})
        return slug, str(reply.json()["ticket"])

    with httpx.Client(base_url=base, timeout=10) as client, ThreadPoolExecutor(16) as pool:
        return list(pool.map(join, range(count)))


def http_benchmarks(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    prefix = f"wrbench{uuid.uuid4().hex[:6]}"
    var = OUT / "var"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    port, ws_port, ref_port = free_port(), free_port(), free_port()  # not port + 1: that one may be taken
    env = stack_env(redis_url, var, prefix, secrets.token_hex(32))
    stack = start_stack(env, var, port=port, ws_port=ws_port, web_server=args.web_server, web_workers=args.web_workers)
    results: dict[str, Any] = {
        "queue": "open mid-sale" if args.sale else "admitting 1 a minute",
        "web_server": args.web_server,
        "web_workers": args.web_workers or "default",
    }
    processes = [stack]
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/healthz")
        queue_configure(env, QUEUE, sale=args.sale)
        # Tickets for the status runs (waiting visitors, as most pollers are).
        status = status_script(tickets_join(base, [QUEUE], args.tickets), var / "tickets.lua")
        run = {"duration": args.duration, "connections": args.connections, "threads": args.wrk_threads}

        # The reference, in the same run, on the same machine, with the same tickets.
        subprocess.run(["redis-cli", "-u", redis_url, "set", f"{prefix}:reference", "1"], capture_output=True)
        reference = start_uvicorn("bench.reference_app:app", ref_port, args.reference_workers, env, var / "ref.log")
        processes.append(reference)
        ref_base = f"http://127.0.0.1:{ref_port}"
        wait_healthy(ref_base + "/")
        wrk(base, status, **{**run, "duration": 3})  # warm up every worker
        wrk(ref_base, status, **{**run, "duration": 3})

        # Rounds interleave the two servers, so a noisy moment on the machine hits both alike.
        rounds: dict[str, list[dict[str, Any]]] = {"status": [], "reference_status": [], "join": []}
        for _ in range(args.rounds):
            rounds["status"].append(wrk(base, status, **run))
            rounds["reference_status"].append(wrk(ref_base, status, **run))
            if not args.skip_join:
                rounds["join"].append(wrk(base, join_script([QUEUE]), **run))
        for name, runs in rounds.items():
            if not runs:
                continue
            results[name] = median_run(runs)
            results[name]["rounds_rps"] = [r["requests_per_second"] for r in runs]
        # Read by the product's own selector (the line lives in buckets; no single key holds its length).
        results["waiting_after_join_runs"] = int(
            subprocess.run(
                [sys.executable, "-c", WAITING_COUNT, QUEUE],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        stop(reference)
        results["status_vs_reference"] = round(
            results["status"]["requests_per_second"] / results["reference_status"]["requests_per_second"], 3
        )

        if args.asgi_compare:
            # Django's own ASGI handler under uvicorn, same workers as the reference, for the WSGI/ASGI choice.
            asgi_port = free_port()
            asgi = start_uvicorn(
                "waitingroom_site.asgi:application", asgi_port, args.reference_workers, env, var / "asgi.log"
            )
            processes.append(asgi)
            asgi_base = f"http://127.0.0.1:{asgi_port}"
            wait_healthy(asgi_base + "/healthz")
            wrk(asgi_base, status, **{**run, "duration": 3})
            results["django_asgi_status"] = wrk(asgi_base, status, **run)
            stop(asgi)
    finally:
        for process in processes:
            stop(process)
        _delete_prefix(redis_url, prefix)
    return results


def _delete_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start_at in range(0, len(keys), 1000):
        client.delete(*keys[start_at : start_at + 1000])
    client.close()


def dedicated_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of the benchmark's own (no persistence) on a free port, answering: (process, URL)."""
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or devredis.server_binary(),
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(directory)),
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    while not devredis.answers(url):
        time.sleep(0.05)
    return server, url


@contextlib.contextmanager
def own_redis_and_database(prefix: str, *, debug: bool = False) -> Iterator[Path]:
    """A redis-server of the benchmark's own and a SQLite database in a directory of its own, named in this
    process's environment for Django (set up by the caller); the server stopped and the directory removed
    afterwards. Yields the directory."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    server, url = dedicated_redis(directory)
    try:
        os.environ.update(
            DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
            DEBUG="1" if debug else "0",
            HTTPS="0",
            SECRET_KEY="bench-" + "x" * 50,
            DATABASE_URL=f"sqlite:///{directory / 'db.sqlite3'}",
            REDIS_URL=url,
            WR_REDIS_PREFIX="bench",
        )
        os.chdir(ROOT)
        yield directory
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


def django_on(url: str) -> None:
    """Django set up in this process, its Redis the benchmark's own at `url`."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")
    os.environ.setdefault("SECRET_KEY", "bench-" + "x" * 50)
    os.environ["REDIS_URL"] = url
    import django

    django.setup()


def redis_benchmarks(args: argparse.Namespace) -> dict[str, Any]:
    """On a dedicated redis-server: memory per waiting ticket, and the admission script's cost."""
    directory = Path(tempfile.mkdtemp(prefix="wrbench-redis-"))
    server, url = dedicated_redis(directory)
    try:
        django_on(url)
        from queueing import store, tokens

        client = store.client()
        version = client.info("server")["redis_version"]
        policy = {
            "state": "paused",
            "capacity": 1_000_000,
            "capacity_source": "counted",
            "outflow_per_minute": 60_000,
            "burst": 1000,
            "session_ttl": 3600,
            "claim_ttl": 600,
            "presence_timeout": 3600,
            "abandon_timeout": 7200,
            "max_waiting": 0,
            "target_url": "/x",
            "epoch": 1,
            "pf1": 0.1,
            "pf2": 0.5,
            "pf3": 1.0,
        }
        store.config_write("mem", policy)
        store.epoch_start("mem", epoch=1, floor=0, seq_max=10**9)
        base = int(client.info("memory")["used_memory"])
        join = store.library().function("join")
        store.load_library(client)
        keys = store.queue_keys("mem").script_keys()
        now = int(time.time() * 1000)
        client.config_resetstat()
        started = time.perf_counter()
        for batch in range(args.memory_tickets // 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(1000):
                n = batch * 1000 + i
                pipe.fcall(join, len(keys), *keys, tokens.visitor_key(f"bench:{n}"), now, 0, "")
            pipe.execute()
        join_seconds = time.perf_counter() - started
        fcall = client.info("commandstats").get("cmdstat_fcall", {})
        used = int(client.info("memory")["used_memory"])
        waiting = store.line_count("mem")
        per_key = {
            name: int(client.memory_usage(getattr(store.queue_keys("mem"), name), samples=0) or 0)
            for name in ("tk", "st", "cfg")
        }
        # The line: its buckets and their two indexes (lua/_line.lua, line_add).
        line = store.line_keys("mem")
        per_key["line_buckets_and_indexes"] = sum(int(client.memory_usage(name, samples=0) or 0) for name in line)
        per_key["line_keys_count"] = len(line)
        # Waiting visitors' records, in small hashes (QueueKeys.record): their count and bytes all told.
        small = store.record_hashes("mem")
        per_key["tk_small_hashes"] = sum(int(client.memory_usage(name, samples=0) or 0) for name in small)
        per_key["tk_small_hashes_count"] = len(small)

        # Admission: 1,000 admits in one call of the script.
        store.config_write("adm", {**policy, "state": "paused"})
        store.epoch_start("adm", epoch=1, floor=0, seq_max=10**9)
        pipe = client.pipeline(transaction=False)
        akeys = store.queue_keys("adm").script_keys()
        for i in range(1000):
            pipe.fcall(join, len(akeys), *akeys, tokens.visitor_key(f"adm:{i}"), now, 0, "")
        pipe.execute()
        store.config_write("adm", {"state": "open"})
        client.config_resetstat()
        t0 = time.perf_counter()
        reply = store.admit("adm", now_ms=now + 1000, max_admit=1000, scan_limit=4000)
        admit_wall_ms = (time.perf_counter() - t0) * 1000
        admit_server_us = client.info("commandstats")["cmdstat_fcall"]["usec"]
        assert len(reply.admitted) == 1000, len(reply.admitted)
        return {
            "redis_version": version,
            "tickets": waiting,
            "bytes_per_waiting_ticket": round((used - base) / waiting, 1),
            "used_memory_delta_bytes": used - base,
            "memory_usage_by_key": per_key,
            "join_script_usec_per_call": round(fcall.get("usec_per_call", 0), 2),
            "join_pipelined_per_second": round(args.memory_tickets / join_seconds),
            "admit_1000_server_ms": round(admit_server_us / 1000, 2),
            "admit_1000_wall_ms": round(admit_wall_ms, 2),
        }
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--web-server", choices=["granian", "gunicorn"], default="granian")
    parser.add_argument("--web-workers", type=int, default=0, help="0: bin/run's default for the server")
    parser.add_argument("--reference-workers", type=int, default=2)
    parser.add_argument("--tickets", type=int, default=20_000)
    parser.add_argument("--memory-tickets", type=int, default=100_000)
    parser.add_argument("--asgi-compare", action="store_true")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--skip-join", action="store_true", help="status and the reference only (process scaling)")
    parser.add_argument("--sale", action="store_true", help="the queue open mid-sale (admitting), not paused")
    args = parser.parse_args()
    if not shutil.which("wrk") and not args.skip_http:
        raise SystemExit("wrk is needed: apt-get install wrk")

    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine()}
    if not args.skip_http:
        redis_url = devredis.resolve()
        embedded = None
        if redis_url is None:
            embedded, redis_url = devredis.start_embedded(OUT / "redis", daemonize=False)
        try:
            results["http"] = http_benchmarks(args, redis_url)
        finally:
            if embedded is not None:
                embedded.terminate()
    if not args.skip_redis:
        results["redis"] = redis_benchmarks(args)
    (OUT / "http_bench.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
