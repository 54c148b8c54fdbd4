"""Wait-estimate simulator (issue 18): sales run against the real product over HTTP, and the wait each
visitor was told at its join compared with the wait it had.

    .venv/bin/python bench/estimate_sim.py [--only NAME] [--scenarios bench/estimate_scenarios.json]

It starts the product as bin/run does (`runstack --setup`: web, websockets, Celery worker and beat; its
own key prefix, database and ports; Redis as bin/run finds it), and for each scenario (data: arrivals in
bursts, the share of visitors who walk away silently and when, the time admitted visitors spend on the
site, priority joiners, a pause, a scheduled start with its pre-queue, the queue's policy) runs a sale
on a queue of its own: every visitor a coroutine that joins, polls when the answer says to, walks away
(stops polling, never calls leave) if it is one who does, and once admitted starts its session on the
protected site (verify), stays, and completes it through the API.

The wait a visitor had is from its join to its admission, as the server saw them: the join's time is taken
around the request, the admission's from the session's end it is told (`expires_at` less the queue's
session TTL: whole seconds, so ±0.5 s). Visitors who waited at least 10 s and were told an estimate at
their join are counted. For each scenario it prints the error |told - had| / had (median, p90), told ÷ had
(p10, median, p90), how the estimate a visitor sees converges (the error of the estimate seen at a quarter,
half and three quarters of the wait), and the share of waits within the range the product gave
(`estimated_wait_range`, when it gives one); then markdown rows for bench/RESULTS.md. Results go to
bench/out/estimate_sim.json, with every visitor's record.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
SCENARIOS = ROOT / "bench" / "estimate_scenarios.json"
COUNTED_WAIT_S = 10.0
# Between two sales of one queue (--same-queue): the tick skips the last silent tickets, and the line is empty.
LINE_CLEARS_S = 5.0
# The limiters per address, lifted: a thousand visitors share the simulator's one address for joins, and
# its priority joiners for their codes (20 in 10 minutes: a second run's were refused 429, and joined no lane).
LIMITS = {
    scope: {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 10**9}
    for scope in ("join", "challenge", "priority_code")
}


@dataclass
class Visitor:
    index: int
    arrives_at: float  # seconds into the sale
    walks_away_after: float | None  # seconds after its join; None: stays
    service_s: float
    priority_code: str = ""
    burst: int = 0  # which of the scenario's arrival bursts it came with
    joined_at: float = 0.0
    told: int | None = None  # estimated_wait_seconds at its join
    told_range: list[int] | None = None
    ahead: int | None = None  # tickets ahead of it at its join
    seen: list[tuple[float, int]] = field(default_factory=list)  # (seconds since join, estimate) at polls
    admitted_at: float | None = None
    outcome: str = "waiting"
    stopped: bool = False  # joined before the operator's pause and admitted after it: a wait no estimate foresaw

    @property
    def wait(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.joined_at


@dataclass(frozen=True)
class Product:
    """Where the product answers, and how to run its management commands (the bench's own product, or a
    test's stack)."""

    url: str
    manage: Callable[..., str]


def visitors_of(scenario: dict[str, Any], rng: random.Random, codes: list[str]) -> list[Visitor]:
    crowd: list[Visitor] = []
    walk = scenario.get("walk_away", {"share": 0.0})
    service = scenario["service_seconds"]
    priority = scenario.get("priority", {"share": 0.0})
    for index, burst in enumerate(scenario["arrivals"]):
        for _ in range(burst["count"]):
            arrives = burst["at"] + rng.uniform(0, burst.get("over", 0))
            away = rng.uniform(*walk["after_seconds"]) if rng.random() < walk["share"] else None
            code = rng.choice(codes) if codes and rng.random() < priority["share"] else ""
            crowd.append(Visitor(len(crowd), arrives, away, rng.uniform(*service), code, burst=index))
    return crowd


async def visit(
    client: httpx.AsyncClient, product_key: str, slug: str, visitor: Visitor, session_ttl: int, started: float
) -> None:
    await asyncio.sleep(max(0.0, started + visitor.arrives_at - time.time()))
    body = {"priority_code": visitor.priority_code} if visitor.priority_code else {}
    before = time.time()
    joined = await client.post(f"/api/v1/queues/{slug}/join", json=body, headers={"X-Visitor-Id": str(uuid.uuid4())})
    visitor.joined_at = (before + time.time()) / 2
    if joined.status_code not in (200, 201):
        visitor.outcome = f"join {joined.status_code}"
        return
    answer = joined.json()
    ticket = answer["ticket"]
    visitor.told, visitor.told_range = answer.get("estimated_wait_seconds"), answer.get("estimated_wait_range")
    position = answer.get("position")  # the join's answer carries its place; "ahead" only where the page shows it
    visitor.ahead = answer["ahead"] if answer.get("ahead") is not None else (position - 1 if position else None)
    auth = {"Authorization": f"Bearer {ticket}"}
    while answer["status"] == "waiting":
        pause = float(answer.get("poll_after_seconds") or 2.0)
        if visitor.walks_away_after is not None:
            left = visitor.joined_at + visitor.walks_away_after - time.time()
            if left < pause:
                await asyncio.sleep(max(0.0, left))
                visitor.outcome = "walked away"
                return
        await asyncio.sleep(pause)
        polled = await client.get(f"/api/v1/queues/{slug}/status", headers=auth)
        if polled.status_code != 200:
            continue  # a 429 or 503: poll again later
        answer = polled.json()
        if answer["status"] == "waiting" and answer.get("estimated_wait_seconds") is not None:
            visitor.seen.append((time.time() - visitor.joined_at, int(answer["estimated_wait_seconds"])))
    if answer["status"] not in ("admitted", "active"):
        visitor.outcome = answer["status"]
        return
    visitor.admitted_at = float(answer["expires_at"]) - session_ttl + 0.5
    visitor.outcome = "admitted"
    site = {"Authorization": f"Api-Key {product_key}"}
    token = {"access_token": answer["access_token"]}
    await client.post(f"/api/v1/queues/{slug}/sessions/verify", json=token, headers=site)
    await asyncio.sleep(visitor.service_s)
    await client.post(f"/api/v1/queues/{slug}/sessions/complete", json=token, headers=site)


def configure(product: Product, slug: str, **options: Any) -> None:
    args = ["configure_queue", slug]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    product.manage(*args)


async def operator(product: Product, slug: str, scenario: dict[str, Any], started: float, paused: list[float]) -> None:
    """The operator's part of the scenario: a pause, and the resume after it; `paused` gets the moment the
    pause had surely begun (its command returned)."""
    pause = scenario.get("pause")
    if not pause:
        return
    await asyncio.sleep(max(0.0, started + pause["at"] - time.time()))
    await asyncio.to_thread(configure, product, slug, state="paused")
    paused.append(time.time())
    await asyncio.sleep(pause["for"])
    await asyncio.to_thread(configure, product, slug, state="open")


def priority_codes(product: Product, slug: str, scenario: dict[str, Any]) -> list[str]:
    priority = scenario.get("priority")
    if not priority or not priority.get("share"):
        return []
    code = f"SIM-{uuid.uuid4().hex[:8]}"
    product.manage(
        "shell",
        "--no-imports",
        "-c",
        "from queueing.models import PriorityCode, Queue; "
        f"PriorityCode.objects.create(queue=Queue.objects.get(slug='{slug}'), code='{code}', "
        f"level={int(priority.get('level', 2))}, max_uses=100000)",
    )
    return [code]


def run_scenario(
    product: Product, scenario: dict[str, Any], *, seed: int = 1, slug: str = "", others: int = 0
) -> dict[str, Any]:
    """One sale, on a queue of its own or on `slug`'s (a later sale of a queue that has run one); what the
    visitors were told and had, summarised. `others`: queues of this product that have run sales before
    (a new queue begins its record of walking away from theirs)."""
    later_sale = bool(slug)
    if later_sale:
        time.sleep(LINE_CLEARS_S)
    slug = slug or f"sim-{scenario['name'][:30]}-{uuid.uuid4().hex[:6]}".lower()
    policy = {"state": "open", "max_tickets_per_address": 0, "pow_difficulty": 0, **scenario["policy"]}
    configure(product, slug, target_url="https://shop.example/", **policy)
    key = product.manage("create_api_key", slug).strip()
    rng = random.Random(seed)
    crowd = visitors_of(scenario, rng, priority_codes(product, slug, scenario))
    session_ttl = int(policy.get("session_ttl", 600))
    started = time.time() + 1.0
    schedule = scenario.get("schedule")
    if schedule:  # a pre-queue from the sale's start, and admission from `starts_after` seconds into it
        started = time.time() + 4.0  # the configuring process takes a second or two
        configure(
            product,
            slug,
            max_tickets_per_address=0,  # a scheduled start's guards would turn these on
            pow_difficulty=0,
            prequeue_opens_at=_iso(started - 1),
            starts_at=_iso(started + schedule["starts_after"]),
        )

    paused: list[float] = []

    async def sale() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=product.url, timeout=30, limits=limits) as client:
            await asyncio.gather(
                operator(product, slug, scenario, started, paused),
                *(visit(client, key, slug, visitor, session_ttl, started) for visitor in crowd),
            )

    began = time.monotonic()
    asyncio.run(sale())
    for visitor in crowd:  # as the product marks them (its samples' `stopped`): a pause began while they waited
        visitor.stopped = any(visitor.joined_at < at < (visitor.admitted_at or 0) for at in paused)
    summary = summarise(crowd)
    if schedule:
        summary["drawn_at"] = round(started + schedule["starts_after"])
        summary.update(at_the_draw(crowd, summary["drawn_at"]))
    summary.update(name=scenario["name"], slug=slug, visitors=len(crowd), seconds=round(time.monotonic() - began))
    summary["sale"] = "later" if later_sale else "new" if others else "first"
    summary["crowd"] = [dataclasses.asdict(visitor) for visitor in crowd]  # to study (written, not printed)
    return summary


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(round(moment), tz=UTC).isoformat()


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarise(crowd: list[Visitor]) -> dict[str, Any]:
    """The figures over every visitor, and the main ones for each arrival burst (`by_burst`): the first
    burst of a new queue's first sale is told its waits before anyone has walked away or finished. Waits an
    operator's pause lengthened (`stopped`) are left out, as the dashboard leaves them out, and summed up
    apart (`lengthened`): no estimate at the join could foresee the pause."""
    summary = _figures(crowd)
    lengthened = [dataclasses.replace(v, stopped=False) for v in crowd if v.stopped]
    if lengthened:
        apart = _figures(lengthened)
        shown = ("counted", "error_median", "error_p90", "told_over_had_median", "error_at_50pct")
        summary["lengthened"] = {key: apart[key] for key in shown}
    bursts = sorted({v.burst for v in crowd})
    if len(bursts) > 1:
        keep = ("counted", "error_median", "error_p90", "told_over_had_median")
        summary["by_burst"] = [{key: _figures([v for v in crowd if v.burst == b])[key] for key in keep} for b in bursts]
    return summary


def at_the_draw(crowd: list[Visitor], drawn_at: float) -> dict[str, Any]:
    """A pre-queue's tickets have no place until the draw at the start, so what they are told at the join is the
    middle place's wait with a range over the draw (issue 18, item 3): a wait drawn at place 1 is far from the
    middle's, whatever the estimator. The first estimate that can be right is the one seen at the first poll
    after the draw: its error against the wait left then, for those who joined before the start."""
    errors = []
    for visitor in crowd:
        if visitor.joined_at >= drawn_at or visitor.wait is None:
            continue
        after = [(since, est) for since, est in visitor.seen if visitor.joined_at + since >= drawn_at + 1]
        if not after:
            continue
        since, est = after[0]
        remaining = visitor.wait - since
        if remaining >= COUNTED_WAIT_S / 2:
            errors.append(abs(est - remaining) / remaining)
    return {
        "drawn_counted": len(errors),
        "drawn_error_median": _round(quantile(errors, 0.5)),
        "drawn_error_p90": _round(quantile(errors, 0.9)),
    }


def _figures(crowd: list[Visitor]) -> dict[str, Any]:
    waited = [v for v in crowd if v.wait is not None and v.wait >= COUNTED_WAIT_S and not v.stopped]
    counted = [v for v in waited if v.told is not None]
    errors = [abs(v.told - v.wait) / v.wait for v in counted]  # type: ignore[operator]
    ratios = [v.told / v.wait for v in counted]  # type: ignore[operator]
    stages: dict[str, float | None] = {}
    for share in (0.25, 0.5, 0.75):
        later, seconds = [], []
        for visitor in counted:
            wait = visitor.wait or 0.0
            at = [(abs(since - share * wait), est, since) for since, est in visitor.seen]
            if at:
                _, est, since = min(at)
                remaining = wait - since
                if remaining >= 5:
                    later.append(abs(est - remaining) / remaining)
                    seconds.append(abs(est - remaining))
        stages[f"error_at_{int(share * 100)}pct"] = _round(statistics.median(later)) if later else None
        stages[f"error_s_at_{int(share * 100)}pct"] = _round(statistics.median(seconds)) if seconds else None
    ranged = [v for v in counted if v.told_range]
    within = [v for v in ranged if v.told_range[0] <= v.wait <= v.told_range[1]]  # type: ignore[index,operator]
    outcomes: dict[str, int] = {}
    for visitor in crowd:
        outcomes[visitor.outcome] = outcomes.get(visitor.outcome, 0) + 1
    return {
        "counted": len(counted),
        "told_nothing": len(waited) - len(counted),  # waited 10 s or more, told no estimate at the join
        "error_median": _round(quantile(errors, 0.5)),
        "error_p90": _round(quantile(errors, 0.9)),
        "told_over_had_p10": _round(quantile(ratios, 0.1)),
        "told_over_had_median": _round(quantile(ratios, 0.5)),
        "told_over_had_p90": _round(quantile(ratios, 0.9)),
        "within_range": _round(len(within) / len(ranged)) if ranged else None,
        "wait_median_s": _round(quantile([v.wait for v in counted], 0.5)),  # type: ignore[misc]
        **stages,
        "outcomes": outcomes,
    }


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# A queue's first sale on a product that has run none ("first"), a later sale of one queue, and the first
# sale of a new queue on a product whose other queues have run sales.
SALES = {"later": " (a later sale)", "new": " (a new queue)"}


def row(result: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value * 100:.0f} %"

    name = result["name"] + SALES.get(result.get("sale", "first"), "")
    return (
        f"| {name} | {result['visitors']} | {result['counted']} ({result['told_nothing']}) "
        f"| {result['wait_median_s']} s "
        f"| {pct(result['error_median'])} | {pct(result['error_p90'])} "
        f"| {result['told_over_had_p10']} · {result['told_over_had_median']} · {result['told_over_had_p90']} "
        f"| {pct(result['error_at_25pct'])} · {pct(result['error_at_50pct'])} · {pct(result['error_at_75pct'])} "
        f"| {_s(result['error_s_at_25pct'])} · {_s(result['error_s_at_50pct'])} · {_s(result['error_s_at_75pct'])} "
        f"| {pct(result['within_range'])} |"
    )


HEADER = (
    "| scenario | visitors | counted: waited ≥ 10 s, told a wait (told none) | median wait | error median | error p90 "
    "| told ÷ had p10 · median · p90 | error later: at ¼ · ½ · ¾ of the wait (of the wait left) "
    "| the same in seconds | within the range told |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def own_product(work: Path) -> tuple[Product, Callable[[], None]]:
    """The product as bin/run starts it, with a key prefix, database and ports of its own."""
    sys.path.insert(0, str(ROOT / "bench"))
    from http_bench import _delete_prefix, free_port, stack_env, start_stack, stop, wait_healthy

    from waitingroom_site import devredis

    redis_url = devredis.resolve()
    if redis_url is None:
        raise SystemExit("no Redis answers (start one, or set REDIS_URL)")
    prefix = f"wrsim{uuid.uuid4().hex[:6]}"
    env = stack_env(redis_url, work, prefix, uuid.uuid4().hex * 2)
    env["WR_RATE_LIMITS"] = json.dumps({**json.loads(env["WR_RATE_LIMITS"]), **LIMITS})
    port, ws_port = free_port(), free_port()
    process = start_stack(env, work, port=port, ws_port=ws_port, web_server="granian", web_workers=0)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(f"{url}/healthz")

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(done.stdout + done.stderr)
        return done.stdout

    def close() -> None:
        stop(process)
        _delete_prefix(redis_url, prefix)

    return Product(url, manage), close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", type=Path, default=SCENARIOS)
    parser.add_argument("--only", action="append", default=[], help="run only these scenarios (by name), in this order")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each scenario N times (seeds SEED, SEED+1, ...) and summarise their visitors pooled too: "
        "one two-minute sale counts 30-100 visitors, too few for its p90 to tell an estimator from a run's luck",
    )
    parser.add_argument(
        "--same-queue",
        action="store_true",
        help="with --repeat: the repeats are later sales of the scenario's first queue, which keeps its record "
        "(walking away, how long sessions last, the range) from the sales before; rows are pooled by first "
        "and later sales",
    )
    parser.add_argument("--out", type=Path, default=OUT / "estimate_sim.json", help="where every visitor's record goes")
    parser.add_argument("--again", type=Path, help="summarise the visitors of a saved run (its JSON) again")
    args = parser.parse_args()
    if args.again:
        again(args.again)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still stop the product, drop its keys
    every = json.loads(args.scenarios.read_text())
    # in the order --only names them: which queues ran sales before a new one makes its start
    scenarios = [s for name in args.only for s in every if s["name"] == name] if args.only else every
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wrsim-"))
    product, close = own_product(work)
    results: list[dict[str, Any]] = []
    try:
        for scenario in scenarios:
            slug = ""
            for run in range(args.repeat):
                others = len({r["slug"] for r in results})
                result = run_scenario(product, scenario, seed=args.seed + run, slug=slug, others=others)
                results.append(result)
                if args.same_queue:
                    slug = result["slug"]
                print(json.dumps({k: v for k, v in result.items() if k != "crowd"}), flush=True)
    finally:
        close()
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def report(results: list[dict[str, Any]]) -> None:
    """Each run's row; where a scenario ran more than once, a row of its runs' visitors pooled."""
    print()
    print(HEADER)
    for result in results:
        print(row(result))
    for name, runs in pooled(results).items():
        crowd = [visitor for result in runs for visitor in crowd_of(result)]
        print(row({**summarise(crowd), "name": f"{name}, {len(runs)} runs pooled", "visitors": len(crowd)}))
    _drawn_lines(results)
    _lengthened_lines(results)


def _lengthened_lines(results: list[dict[str, Any]]) -> None:
    for result in results:
        if result.get("lengthened"):
            figures = result["lengthened"]
            print(
                f"{result['name']}: left out, {figures['counted']} waits the pause lengthened: error median "
                f"{figures['error_median']}, p90 {figures['error_p90']}, told ÷ had {figures['told_over_had_median']}; "
                f"halfway through the wait, error {figures['error_at_50pct']}"
            )


def pooled(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs of each scenario that ran more than once, by name."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        name = result["name"] + SALES.get(result.get("sale", "first"), "").replace("a later sale", "later sales")
        runs.setdefault(name, []).append(result)
    return {name: group for name, group in runs.items() if len(group) > 1}


def _drawn_lines(results: list[dict[str, Any]]) -> None:
    for result in results:
        if result.get("drawn_at"):
            figures = {**result, **at_the_draw(crowd_of(result), result["drawn_at"])}
            print(
                f"{result['name']}: at the draw, the first estimate after it vs the wait left, "
                f"{figures['drawn_counted']} who joined before the start: error median "
                f"{figures['drawn_error_median']}, p90 {figures['drawn_error_p90']}"
            )


def crowd_of(result: dict[str, Any]) -> list[Visitor]:
    """The visitors of a scenario's result, as they were."""
    return [Visitor(**{**v, "seen": [tuple(x) for x in v["seen"]]}) for v in result["crowd"]]


def again(path: Path) -> None:
    """The figures of a saved run, summarised again (after the summary gained a figure)."""
    results = json.loads(path.read_text())
    report([{**result, **summarise(crowd_of(result))} for result in results])


if __name__ == "__main__":
    main()
