"""The one-off move of a line kept in one ZSET (the releases before the buckets) into buckets, on a dedicated
redis-server this script starts: --tickets visitors join a paused queue, the state is turned back into the
old layout (one ZSET at `line`, a policy packed without the layout), and the policy write that moves it is
timed (wall clock and the server's own time for the call). Then every visitor's place is checked.

    .venv/bin/python bench/line_upgrade.py [--tickets 100000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_bench import dedicated_redis, django_on  # noqa: E402  (it puts the project root on sys.path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tickets", type=int, default=100_000)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="wrbench-upgrade-"))
    server, url = dedicated_redis(directory)
    try:
        django_on(url)
        from queueing import store, tokens

        client = store.client()
        policy = {"state": "paused", "capacity": 10, "outflow_per_minute": 60, "burst": 1, "epoch": 1}
        store.config_write("up", policy)
        store.epoch_start("up", epoch=1, floor=0, seq_max=10**9)
        keys = store.queue_keys("up").script_keys()
        join = store.library().function("join")
        now = int(time.time() * 1000)
        for batch in range(args.tickets // 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(1000):
                pipe.fcall(join, len(keys), *keys, tokens.visitor_key(f"up:{batch * 1000 + i}"), now, 0, "")
            pipe.execute()
        before = store.line_read("up")[1]

        # The layout of the releases before the buckets.
        qkeys = store.queue_keys("up")
        client.delete(*store.line_keys("up"))
        for start in range(0, len(before), 10_000):
            client.zadd(qkeys.line, dict(before[start : start + 10_000]))
        packed = json.loads(str(client.hget(qkeys.cfg, "packed")))
        client.hset(qkeys.cfg, "packed", json.dumps(packed[:-1]))
        client.hdel(qkeys.cfg, "line_layout")

        client.config_resetstat()
        started = time.perf_counter()
        store.config_write("up", policy)
        wall_ms = (time.perf_counter() - started) * 1000
        server_ms = client.info("commandstats")["cmdstat_fcall"]["usec"] / 1000
        after = store.line_read("up")[1]
        print(
            json.dumps(
                {
                    "tickets": len(before),
                    "upgrade_wall_ms": round(wall_ms, 1),
                    "upgrade_server_ms": round(server_ms, 1),
                    "server_us_per_ticket": round(server_ms * 1000 / max(1, len(before)), 2),
                    "same_line_after": after == before,
                    "old_zset_left": bool(client.exists(qkeys.line)),
                },
                indent=2,
            )
        )
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
