"""Status and join throughput on one Redis and on a Redis Cluster of three masters, six queues, in one run
(issue 16).

Starts a redis-server of its own and a cluster of its own (`waitingroom_site.devcluster`: three masters and
three replicas on 127.0.0.1), each on free ports in a temporary directory, and the product twice, the way
bin/run does (bench/http_bench.py's `start_stack`): once with its live state on the single Redis, once on
the cluster (REDIS_CLUSTER_NODES; REDIS_URL, the channel layer's, Celery's and the cache's, names the single
one). Six queues on each, chosen so that two queues' hash tags land on each master. wrk drives status polls
and joins over HTTP, spread over the six queues, in rounds that interleave the two (and the framework-free
reference, bench/reference_app.py, for the status ratio), so that a noisy moment hits them alike. Before
each run it waits (up to 20 s) for a quiet second on the host, and it records what other work took meanwhile.

    .venv/bin/python bench/cluster_bench.py [--duration 8] [--rounds 5] [--tickets 12000]

Needs wrk (Debian package `wrk`). Prints a table and writes bench/out/cluster_bench.json. On one host the
cluster's six redis-servers share its cores with everything else: the figures compare the code paths (one
connection vs a lane per master, the join's limiter in a slot of its own), not a cluster's capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import redis  # noqa: E402
from http_bench import (  # noqa: E402  (it puts the project root on sys.path)
    OUT,
    dedicated_redis,
    free_port,
    join_script,
    machine,
    median_run,
    queue_configure,
    stack_env,
    start_stack,
    start_uvicorn,
    status_script,
    stop,
    tickets_join,
    wait_healthy,
    wrk,
)
from redis.crc import key_slot  # noqa: E402

from waitingroom_site.devcluster import LocalCluster  # noqa: E402
from waitingroom_site.devredis import server_binary, server_version  # noqa: E402

QUEUES_PER_MASTER = 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def masters_by_slot(nodes: str) -> list[tuple[int, int, str]]:
    """The cluster's slot ranges and the master serving each (CLUSTER SLOTS): (first, last, 'host:port')."""
    host, _, port = nodes.split(",")[0].rpartition(":")
    client = redis.Redis(host=host, port=int(port), decode_responses=True)
    try:
        ranges = client.cluster("SLOTS")
    finally:
        client.close()
    return sorted((int(first), int(last), f"{master[0]}:{master[1]}") for first, last, master, *_ in ranges)


def slugs_on_every_master(nodes: str, per_master: int) -> dict[str, str]:
    """Queue slugs, `per_master` on each master, by the slot of their hash tag (a queue's keys are
    `<prefix>:{slug}:...`): each slug and the master (host:port) that serves it."""
    ranges = masters_by_slot(nodes)
    masters = {master for _, _, master in ranges}
    placed: dict[str, str] = {}
    for n in count():
        slug = f"bench-{n}"
        slot = key_slot(f"{{{slug}}}".encode())
        master = next(master for first, last, master in ranges if first <= slot <= last)
        if sum(1 for m in placed.values() if m == master) < per_master:
            placed[slug] = master
        if len(placed) == per_master * len(masters):
            return placed
    raise AssertionError("unreachable")


def keys_in_slot(master: str, slug: str) -> int:
    """How many keys the master holds in the slot of `slug`'s hash tag (a check that the queue lives there)."""
    host, _, port = master.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    try:
        return int(client.cluster("COUNTKEYSINSLOT", key_slot(f"{{{slug}}}".encode())))
    finally:
        client.close()


def fcall_counts(master: str) -> int:
    """Script calls a node has run since it started (INFO commandstats)."""
    host, _, port = master.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    try:
        return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))
    finally:
        client.close()


def _stat(pid: int | str) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name: [0] is the line's 3rd field (state)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU the processes have used so far."""
    return sum(int(fields[11]) + int(fields[12]) for fields in map(_stat, pids)) / CLOCK_TICKS  # utime, stime


def tree_cpu_seconds(root: int) -> float:
    """CPU a process and its descendants have used so far, with the children they have waited for."""
    parents, used = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry.name)
            except OSError:  # gone meanwhile
                continue
            parents[int(entry.name)], used[int(entry.name)] = int(fields[1]), sum(map(int, fields[11:15]))
    tree = {root}
    while grown := {pid for pid, parent in parents.items() if parent in tree} - tree:
        tree |= grown
    return sum(used.get(pid, 0) for pid in tree) / CLOCK_TICKS


def others_cpu_seconds() -> float:
    """CPU the host has used so far (/proc/stat: busy and stolen time) less the benchmark's (this process's
    tree): what other work took."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = Path("/proc/stat").read_text().split()[1:9]
    busy = sum(int(value) for value in (user, nice, system, irq, softirq, steal))
    return busy / CLOCK_TICKS - tree_cpu_seconds(os.getpid())


def quiet(*, window: float = 1, most_percent: float = 15, patience: float = 20) -> float:
    """Wait (up to `patience` s) for a `window` in which other work on the host used at most `most_percent`
    of one core; the seconds waited. The machine is shared: a round that ran beside a test suite says little."""
    started = time.monotonic()
    while time.monotonic() - started < patience:
        before = others_cpu_seconds()
        time.sleep(window)
        if 100 * (others_cpu_seconds() - before) / window <= most_percent:
            break
    return round(time.monotonic() - started - window, 1)


@dataclass
class Target:
    """One thing wrk drives: where, with which scripts, its own processes (the supervisor's pid), the Redis
    processes behind it (a cluster's: its masters' and its replicas') and the nodes that run its scripts."""

    name: str
    base: str
    pid: int
    status: str
    join: str
    redis_pids: list[int]
    replica_pids: list[int]
    script_nodes: list[str]


def measured(target: Target, script: str, run: dict[str, int]) -> dict[str, Any]:
    """One wrk run once the host is quiet, with the share of one core the Redis processes behind it used
    meanwhile, and other work on the host."""
    waited = quiet()
    redis_before, replicas_before = cpu_seconds(target.redis_pids), cpu_seconds(target.replica_pids)
    others_before, own_before = others_cpu_seconds(), tree_cpu_seconds(target.pid)
    calls_before = sum(map(fcall_counts, target.script_nodes))
    result = wrk(target.base, script, **run)
    if target.script_nodes:  # (and the Celery worker's admission ticks meanwhile, a few a second)
        calls = sum(map(fcall_counts, target.script_nodes)) - calls_before
        result["script_calls_per_request"] = round(calls / result["requests"], 2)
    result["redis_cpu_percent"] = round(100 * (cpu_seconds(target.redis_pids) - redis_before) / run["duration"], 1)
    replicas = cpu_seconds(target.replica_pids) - replicas_before
    result["replicas_cpu_percent"] = round(100 * replicas / run["duration"], 1)  # of redis_cpu_percent
    own = tree_cpu_seconds(target.pid) - own_before
    result["server_cpu_us_per_request"] = round(own * 1e6 / result["requests"])  # web, ws, Celery: all its tree
    others = max(0.0, others_cpu_seconds() - others_before)  # (can come out a tick below 0)
    result["others_cpu_percent"] = round(100 * others / run["duration"], 1)
    result["waited_for_quiet_seconds"] = waited
    return result


def ratios(numerators: list[float], denominators: list[float]) -> dict[str, Any]:
    """Round by round (a round's runs come within a minute of each other, so a slow spell on the host weighs
    on both sides alike), and the median of the rounds'."""
    each = [round(n / d, 3) for n, d in zip(numerators, denominators, strict=True)]
    return {"median": statistics.median(each), "rounds": each}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    found = median_run(runs)
    found["rounds_rps"] = [r["requests_per_second"] for r in runs]
    found["non_2xx_all_rounds"] = sum(r["non_2xx"] for r in runs)
    found["others_cpu_percent_rounds"] = [r["others_cpu_percent"] for r in runs]
    found["each_round"] = runs
    return found


def benchmark(args: argparse.Namespace, work: Path, stack: ExitStack) -> dict[str, Any]:
    (work / "redis").mkdir()
    server, redis_url = dedicated_redis(work / "redis")
    stack.callback(stop, server)
    cluster = LocalCluster(work / "nodes").start()
    stack.callback(cluster.stop)
    placed = slugs_on_every_master(cluster.nodes, QUEUES_PER_MASTER)
    slugs = list(placed)
    ticket_key = secrets.token_hex(32)

    # The product twice, its live state on the single Redis and on the cluster; REDIS_URL the single one in
    # both (the cluster carries no pub/sub for the channel layer and no Celery broker). Each has its own key
    # prefix, database and Celery queue.
    masters = sorted(set(placed.values()))
    master_ports = {int(master.rpartition(":")[2]) for master in masters}
    live_state = {  # REDIS_CLUSTER_NODES, the Redis processes, the replicas among them, the nodes running scripts
        "one_redis": ("", [server.pid], [], [redis_url.removeprefix("redis://").split("/")[0]]),
        "cluster": (
            cluster.nodes,
            [process.pid for process in cluster.processes.values()],
            [process.pid for port, process in cluster.processes.items() if port not in master_ports],
            masters,
        ),
    }
    targets: list[Target] = []
    envs: dict[str, dict[str, str]] = {}
    for name, (cluster_nodes, redis_pids, replica_pids, script_nodes) in live_state.items():
        var = work / f"stack-{name}"
        var.mkdir()
        env = envs[name] = stack_env(redis_url, var, f"wrbench{uuid.uuid4().hex[:6]}", ticket_key)
        env["REDIS_CLUSTER_NODES"] = cluster_nodes
        port = free_port()
        process = start_stack(env, var, port=port, ws_port=free_port(), web_server=args.web_server, web_workers=0)
        stack.callback(stop, process)
        base = f"http://127.0.0.1:{port}"
        targets.append(Target(name, base, process.pid, "", join_script(slugs), redis_pids, replica_pids, script_nodes))
    for target in targets:
        wait_healthy(f"{target.base}/healthz")
        for slug in slugs:
            queue_configure(envs[target.name], slug)
    placement = {slug: (master, keys_in_slot(master, slug)) for slug, master in placed.items()}
    assert all(keys > 0 for _, keys in placement.values()), placement  # each queue's keys on its master

    # The reference: a ticket check and one GET on the single Redis, polled with one queue's tickets (its
    # audience is one queue; the work per poll is the same whichever).
    reference_env = {**envs["one_redis"], "BENCH_QUEUE": slugs[0]}
    client = redis.Redis.from_url(redis_url)
    client.set(reference_env["BENCH_REFERENCE_KEY"], "1")
    client.close()
    ref_port = free_port()
    reference = start_uvicorn("bench.reference_app:app", ref_port, 2, reference_env, work / "ref.log")
    stack.callback(stop, reference)
    wait_healthy(f"http://127.0.0.1:{ref_port}/")
    reference_target = Target("reference", f"http://127.0.0.1:{ref_port}", reference.pid, "", "", [server.pid], [], [])

    for target in targets:  # waiting visitors to poll, over the six queues
        tickets = tickets_join(target.base, slugs, args.tickets)
        target.status = status_script(tickets, work / f"{target.name}-tickets.lua")
        if not reference_target.status:
            first_queue = [ticket for ticket in tickets if ticket[0] == slugs[0]]
            reference_target.status = status_script(first_queue, work / "reference-tickets.lua")

    run = {"duration": args.duration, "connections": args.connections, "threads": args.wrk_threads}
    warm = {**run, "duration": 3}
    for target in [*targets, reference_target]:
        wrk(target.base, target.status, **warm)  # every worker warm, every lane open
    fcalls_before = {master: fcall_counts(master) for master in masters}
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_number in range(args.rounds):
        # Rounds interleave everything; the two stacks swap places each round.
        order = targets if round_number % 2 == 0 else targets[::-1]
        for target in order:
            runs.setdefault(f"{target.name}_status", []).append(measured(target, target.status, run))
        runs.setdefault("reference_status", []).append(measured(reference_target, reference_target.status, run))
        for target in order:
            runs.setdefault(f"{target.name}_join", []).append(measured(target, target.join, run))

    results: dict[str, Any] = {name: summary(found) for name, found in runs.items()}
    results["queues"] = {slug: {"master": master, "keys": keys} for slug, (master, keys) in placement.items()}
    results["script_calls_per_master_in_rounds"] = {
        master: fcall_counts(master) - before for master, before in sorted(fcalls_before.items())
    }
    rps = {name: found["rounds_rps"] for name, found in results.items() if name in runs}
    results["ratios"] = {
        **{
            f"{name}_{kind}_vs_reference": ratios(rps[f"{name}_{kind}"], rps["reference_status"])
            for name in ("one_redis", "cluster")
            for kind in ("status", "join")
        },
        **{
            f"cluster_vs_one_redis_{kind}": ratios(rps[f"cluster_{kind}"], rps[f"one_redis_{kind}"])
            for kind in ("status", "join")
        },
    }
    results["cluster_nodes"] = cluster.nodes
    results["redis_version"] = ".".join(map(str, server_version(server_binary())))
    return results


def table(results: dict[str, Any]) -> str:
    def joined(values: list[float], spec: str) -> str:
        return " · ".join(format(value, spec) for value in values)

    def rps(name: str) -> str:
        found = results[name]
        return f"**{found['requests_per_second']:,.0f}** ({joined(found['rounds_rps'], ',.0f')})"

    def ratio(name: str) -> str:
        found = results["ratios"][name]
        return f"**{found['median']:.3f}** ({joined(found['rounds'], '.3f')})"

    def latency(name: str) -> str:
        return f"{results[name]['p50_ms']:.1f} · {results[name]['p99_ms']:.1f} ms"

    def extra(name: str) -> str:
        found = results[name]
        replicas = f" (replicas {found['replicas_cpu_percent']:.0f} %)" if name.startswith("cluster") else ""
        calls = found["script_calls_per_request"]
        return f"{found['redis_cpu_percent']:.0f} %{replicas} · {calls:.2f} · {found['non_2xx_all_rounds']}"

    def cpu(name: str) -> str:
        return (
            " · ".join(str(results[f"{name}_{kind}"]["server_cpu_us_per_request"]) for kind in ("status", "join"))
            + " µs"
        )

    def others(name: str) -> str:
        return joined(results[name]["others_cpu_percent_rounds"], ".0f") + " %"

    reference = results["reference_status"]
    rows = [
        "| six queues; median (each round) | one Redis | cluster (3 masters + 3 replicas) | cluster ÷ one Redis |",
        "|---|---|---|---|",
        f"| status, req/s | {rps('one_redis_status')} | {rps('cluster_status')} "
        f"| {ratio('cluster_vs_one_redis_status')} |",
        f"| status p50 · p99 (the median round's) | {latency('one_redis_status')} | {latency('cluster_status')} | |",
        f"| status ÷ reference (the reference: {rps('reference_status')} req/s, p99 {reference['p99_ms']:.1f} ms) "
        f"| {ratio('one_redis_status_vs_reference')} | {ratio('cluster_status_vs_reference')} | |",
        f"| join, req/s | {rps('one_redis_join')} | {rps('cluster_join')} | {ratio('cluster_vs_one_redis_join')} |",
        f"| join p50 · p99 (the median round's) | {latency('one_redis_join')} | {latency('cluster_join')} | |",
        f"| join ÷ reference | {ratio('one_redis_join_vs_reference')} | {ratio('cluster_join_vs_reference')} | |",
        f"| status: Redis CPU (100 % = one core) · scripts a request · non-2xx | {extra('one_redis_status')} "
        f"| {extra('cluster_status')} | |",
        f"| join: the same | {extra('one_redis_join')} | {extra('cluster_join')} | |",
        f"| the product's CPU a request, status · join (the reference's: "
        f"{reference['server_cpu_us_per_request']} µs) | {cpu('one_redis')} | {cpu('cluster')} | |",
        f"| other work on the host during the status runs (% of a core) | {others('one_redis_status')} "
        f"| {others('cluster_status')} | |",
        f"| the same, join runs | {others('one_redis_join')} | {others('cluster_join')} | |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--web-server", choices=["granian", "gunicorn"], default="granian")
    parser.add_argument("--tickets", type=int, default=12_000, help="waiting visitors per stack, over six queues")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) afterwards")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is needed: apt-get install wrk")

    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wrbench-cluster-"))
    results: dict[str, Any] = {"machine": machine()}
    cores = results["machine"]["cores"]
    results["note"] = (
        f"One host, {cores} cores: the cluster's six redis-servers (three masters, three replicas) share them "
        "with the web processes, Celery, the single Redis and wrk."
    )
    try:
        with ExitStack() as stack:
            results.update(benchmark(args, work, stack))
    except BaseException:
        print(f"Failed; logs in {work}", file=sys.stderr)
        raise
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    (OUT / "cluster_bench.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print()
    print(results["note"])
    print(table(results))


if __name__ == "__main__":
    main()
