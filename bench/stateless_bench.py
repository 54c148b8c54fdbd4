"""Stateless mode benchmark (issue 6): joins, status polls and window reads per second over HTTP, and Redis
memory after 1,000,000 joins against tracked mode's. Each HTTP figure is also given as a ratio to the
framework-free reference (bench/reference_app.py: a ticket check and one Redis GET), run in the same rounds.

Starts the product the way bin/run does (`python -m waitingroom_site.runstack --setup`), creates a stateless
queue and a tracked one, and drives both with wrk on 127.0.0.1 in interleaved rounds (the median round is
reported): stateless join (each request a new number: no cookie), stateless status (a ticket of 2,000),
the public window endpoint (no ticket), and tracked status and join for comparison in the same run. Then,
on a dedicated redis-server, joins 1,000,000 visitors to a stateless queue and to a tracked one (the
scripts pipelined, as fast as Redis takes them) and reports the memory each used.

    .venv/bin/python bench/stateless_bench.py [--duration 15] [--rounds 3] [--memory-joins 1000000]

Needs wrk (Debian package `wrk`). Prints every figure and writes bench/out/stateless_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_bench import (
    BENCH_RATE_LIMITS,
    JOIN_LUA,
    OUT,
    ROOT,
    STATUS_LUA,
    free_port,
    machine,
    median_run,
    start,
    start_uvicorn,
    stop,
    wait_healthy,
    wrk,
)

from waitingroom_site import devredis

WINDOW_LUA = r"""
request = function() return wrk.format("GET", "WINDOW_PATH") end
"""


def _configure(env: dict[str, str], slug: str, *options: str) -> None:
    command = [sys.executable, "manage.py", "configure_queue", slug, "--target-url", "https://shop.example/"]
    subprocess.run([*command, *options], env=env, cwd=ROOT, check=True, capture_output=True)


def _tickets(base: str, slug: str, count: int, var: Path, name: str) -> Path:
    with httpx.Client(base_url=base, timeout=10) as client, ThreadPoolExecutor(16) as pool:
        tickets = list(
            pool.map(
                lambda _: client.post(
                    f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())}
                ).json()["ticket"],
                range(count),
            )
        )
    path = var / f"{name}.lua"
    path.write_text("return {" + ",".join(json.dumps(t) for t in tickets) + "}")
    return path


def http_benchmarks(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    prefix = f"wrbench{uuid.uuid4().hex[:6]}"
    var = OUT / "var-stateless"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    port, ref_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        HTTPS="0",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        REDIS_URL=redis_url,
        WR_REDIS_PREFIX=prefix,
        CELERY_KEY_PREFIX=f"{prefix}:celery:",
        CELERY_TASK_DEFAULT_QUEUE=f"{prefix}-tasks",
        LOG_LEVEL="WARNING",
        WR_RATE_LIMITS=BENCH_RATE_LIMITS,
        # The reference (bench/reference_app.py) checks the stateless queue's tickets with the same key.
        WR_TICKET_SIGNING_KEY=secrets.token_hex(32),
        BENCH_REDIS_URL=redis_url,
        BENCH_QUEUE="wide",
        BENCH_REFERENCE_KEY=f"{prefix}:reference",
    )
    command = [sys.executable, "-m", "waitingroom_site.runstack", "--setup", "--port", str(port)]
    command += ["--var-dir", str(var)]
    if args.web_workers:
        command += ["--web-workers", str(args.web_workers)]
    stack = start(command, env, var / "stack.log")
    processes = [stack]
    results: dict[str, Any] = {"web_workers": args.web_workers or "default"}
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/healthz")
        # Nobody is let through during the run (a window of one number a minute; the tracked queue paused
        # with its one slot taken), so every status answer is the commonest one: waiting.
        _configure(env, "wide", "--mode", "stateless", "--window-size", "1", "--window-interval", "3600")
        _configure(env, "tracked", "--capacity", "1", "--presence-timeout", "3600", "--abandon-timeout", "7200")
        stateless_tickets = _tickets(base, "wide", args.tickets, var, "stateless")
        tracked_tickets = _tickets(base, "tracked", args.tickets, var, "tracked")

        def status(slug: str, tickets: Path) -> str:
            path = f"/api/v1/queues/{slug}/status"
            return STATUS_LUA.replace("TICKETS_FILE", str(tickets)).replace("STATUS_PATH", path)

        subprocess.run(["redis-cli", "-u", redis_url, "set", f"{prefix}:reference", "1"], capture_output=True)
        reference = start_uvicorn("bench.reference_app:app", ref_port, args.reference_workers, env, var / "ref.log")
        processes.append(reference)
        ref_base = f"http://127.0.0.1:{ref_port}"
        wait_healthy(ref_base + "/")
        scripts = {
            "stateless_join": JOIN_LUA.replace("QUEUE", "wide"),
            "stateless_status": status("wide", stateless_tickets),
            "window": WINDOW_LUA.replace("WINDOW_PATH", "/api/v1/queues/wide/window"),
            "tracked_status": status("tracked", tracked_tickets),
            "tracked_join": JOIN_LUA.replace("QUEUE", "tracked"),
        }
        run = {"duration": args.duration, "connections": args.connections, "threads": args.wrk_threads}
        for script in scripts.values():
            wrk(base, script, **{**run, "duration": 2})  # warm every worker up on every path
        reference_script = scripts["stateless_status"]
        wrk(ref_base, reference_script, **{**run, "duration": 2})
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in [*scripts, "reference_status"]}
        for _ in range(args.rounds):
            for name, script in scripts.items():
                rounds[name].append(wrk(base, script, **run))
            rounds["reference_status"].append(wrk(ref_base, reference_script, **run))
        for name, runs in rounds.items():
            results[name] = median_run(runs)
            results[name]["rounds_rps"] = [r["requests_per_second"] for r in runs]
        reference_rps = results["reference_status"]["requests_per_second"]
        for name in scripts:
            results[f"{name}_vs_reference"] = round(results[name]["requests_per_second"] / reference_rps, 3)
        window = httpx.get(f"{base}/api/v1/queues/wide/window")
        results["window_cache_control"] = window.headers.get("cache-control")
        results["window_issued_after_runs"] = window.json()["issued"]
    finally:
        for process in processes:
            stop(process)
        import redis

        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for at in range(0, len(keys), 1000):
            client.delete(*keys[at : at + 1000])
        client.close()
    return results


def memory_benchmarks(args: argparse.Namespace) -> dict[str, Any]:
    """On a dedicated redis-server: memory after N joins, stateless against tracked."""
    directory = Path(tempfile.mkdtemp(prefix="wrbench-redis-"))
    binary = shutil.which("redis-server") or devredis.server_binary()
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    server = subprocess.Popen([*command, "--dir", str(directory)], stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        while not devredis.answers(url):
            time.sleep(0.05)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")
        os.environ.setdefault("SECRET_KEY", "bench-" + "x" * 50)
        os.environ["REDIS_URL"] = url
        import django

        django.setup()
        from queueing import store, tokens

        client = store.client()
        now = int(time.time() * 1000)
        joins = args.memory_joins
        out: dict[str, Any] = {"redis_version": client.info("server")["redis_version"], "joins": joins}

        # Stateless: the window's hash, and nothing else, whatever the number of joins.
        store.config_write("wide", {"state": "open", "mode": "stateless", "epoch": 1})
        store.window_config_write(
            "wide", {"state": "open", "size": 1, "interval_ms": 3_600_000, "windows": 2, "max": 10**12}, {}
        )
        store.window_epoch_start("wide", epoch=1, floor=0, seq_max=10**12, active=0, gap=0, now_ms=now)
        win = store.queue_keys("wide").win
        before, win_before = int(client.info("memory")["used_memory"]), int(client.memory_usage(win) or 0)
        keys_before = client.dbsize()
        join = store.library().function("window/join")
        store.load_library(client)
        client.config_resetstat()
        started = time.perf_counter()
        for _ in range(joins // 1000):
            pipe = client.pipeline(transaction=False)
            for _ in range(1000):
                pipe.fcall(join, 2, win, "unused", now, 0, 0, "next")
            pipe.execute()
        seconds = time.perf_counter() - started
        stats = client.info("commandstats").get("cmdstat_fcall", {})
        out["stateless"] = {
            "issued": store.window_read("wide").issued,
            "used_memory_delta_bytes": int(client.info("memory")["used_memory"]) - before,
            "window_hash_bytes_before_after": [win_before, int(client.memory_usage(win) or 0)],
            "keys_before_after": [keys_before, client.dbsize()],
            "join_script_usec_per_call": round(stats.get("usec_per_call", 0), 2),
            "joins_per_second_pipelined": round(joins / seconds),
        }

        # Tracked: the same number of joins to a paused queue (everyone waits).
        store.config_write(
            "tracked",
            {
                "state": "paused",
                "capacity": 1,
                "outflow_per_minute": 60,
                "burst": 1,
                "presence_timeout": 3600,
                "abandon_timeout": 7200,
                "target_url": "/x",
                "epoch": 1,
            },
        )
        store.epoch_start("tracked", epoch=1, floor=0, seq_max=10**12)
        before = int(client.info("memory")["used_memory"])
        keys = store.queue_keys("tracked").script_keys()
        tracked_join = store.library().function("join")
        client.config_resetstat()
        started = time.perf_counter()
        for batch in range(joins // 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(1000):
                visitor = tokens.visitor_key(f"bench:{batch * 1000 + i}")
                pipe.fcall(tracked_join, len(keys), *keys, visitor, now, 0, "")
            pipe.execute()
        seconds = time.perf_counter() - started
        stats = client.info("commandstats").get("cmdstat_fcall", {})
        used = int(client.info("memory")["used_memory"]) - before
        waiting = store.line_count("tracked")
        out["tracked"] = {
            "waiting": waiting,
            "used_memory_delta_bytes": used,
            "bytes_per_waiting_ticket": round(used / waiting, 1),
            "join_script_usec_per_call": round(stats.get("usec_per_call", 0), 2),
            "joins_per_second_pipelined": round(joins / seconds),
        }
        return out
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
    parser.add_argument("--web-workers", type=int, default=0, help="0: bin/run's default for the server")
    parser.add_argument("--reference-workers", type=int, default=2)
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--memory-joins", type=int, default=1_000_000)
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if not shutil.which("wrk") and not args.skip_http:
        raise SystemExit("wrk is needed: apt-get install wrk")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine()}
    if not args.skip_http:
        redis_url = devredis.resolve() or "redis://127.0.0.1:6379/0"
        results["http"] = http_benchmarks(args, redis_url)
    if not args.skip_memory:
        results["memory"] = memory_benchmarks(args)
    print(json.dumps(results, indent=2))
    (OUT / "stateless_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
