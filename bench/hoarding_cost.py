"""What one extra ticket costs a hoarder at a scheduled sale's default guards (issue 13, item 4): the
proof of work (16 bits by default) solved in Python, per ticket, and how many tickets one address (an
IPv4 address, or an IPv6 /64) can hold at once (the per-address cap, 20 by default).

    .venv/bin/python bench/hoarding_cost.py [--bits 12 14 16 18] [--tickets 30]

Prints the median and 90th percentile time per solved challenge. The browser's page solves the same work
with WebCrypto; a hoarder with native code and many cores solves faster, which the cap then bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")
os.environ.setdefault("DEBUG", "1")

import django

django.setup()

from queueing import pow  # noqa: E402
from queueing.services.config import PREQUEUE_GUARDS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, nargs="+", default=[12, 14, 16, 18])
    parser.add_argument("--tickets", type=int, default=30)
    args = parser.parse_args()
    solve_ms: dict[int, dict[str, float]] = {}
    results = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "defaults": PREQUEUE_GUARDS,
        "solve_ms": solve_ms,
    }
    for bits in args.bits:
        times = []
        for _ in range(args.tickets):
            challenge = pow.challenge_issue("bench", bits)["challenge"]
            started = time.perf_counter()
            pow.solve(challenge, bits)
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        solve_ms[bits] = {
            "median": round(statistics.median(times), 1),
            "p90": round(times[int(len(times) * 0.9) - 1], 1),
        }
        figures = solve_ms[bits]
        print(f"{bits} bits: median {figures['median']} ms, p90 {figures['p90']} ms")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
