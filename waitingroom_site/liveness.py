"""Is the Celery worker (or beat) doing its work? Judged from the marks they leave in Redis
(queueing/store/liveness.py; on the Redis Cluster when REDIS_CLUSTER_NODES names one): the beat notes every
admission tick it sends, a worker every tick it has
run. A worker is stalled when ticks are being sent and it has run none for `stale` seconds; the beat is
stalled when it has sent none for that long. No Django here: the supervisor (runstack) asks every few
seconds, and a container's health check runs it as a command:

    python -m waitingroom_site.liveness worker [--name celery@host]   # exit 0 alive, 1 stalled
    python -m waitingroom_site.liveness beat
    python -m waitingroom_site.liveness worker --ready   # and its broker answers (compose's health check)

When Redis cannot be asked, or no ticks are being sent (then the beat is the one to blame), there is no
verdict on the worker: that is reported and answered as alive, since replacing it would not help.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass

import redis
from redis.cluster import ClusterNode
from redis.exceptions import RedisClusterException

DEFAULT_STALE_SECONDS = 30.0


@dataclass(frozen=True)
class Verdict:
    alive: bool | None  # None: cannot tell (Redis unreachable, or nothing to judge the worker by)
    reason: str


def alive_key(prefix: str, role: str, name: str = "") -> str:
    """The same names as queueing/store/liveness.py builds (tests hold the two together)."""
    return f"{prefix}:alive:{role}" + (f":{name}" if name else "")


def worker_node(name: str = "") -> str:
    """A worker's node name as Celery expands it (`%h`: this host): `name`, else $WR_WORKER_NAME (what
    runstack passes as `-n`), else Celery's own default, celery@<host>."""
    name = name or os.environ.get("WR_WORKER_NAME") or "celery@%h"
    return name.replace("%h", socket.gethostname())


def _age(marked: str | None, now: float) -> float | None:
    return None if marked is None else max(0.0, now - int(marked) / 1000)


def _marks(url: str, nodes: str, keys: list[str]) -> list[str | None]:
    """The marks, from where the live state is: the Redis Cluster at `nodes` (host:port,…; each key read on
    its own, they are in different slots) if given, else the Redis at `url`."""
    if not nodes:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            return list(client.mget(keys))
    startup = [ClusterNode(*node.strip().rsplit(":", 1)) for node in nodes.split(",") if node.strip()]  # type: ignore[no-untyped-call]
    with redis.RedisCluster(startup_nodes=startup, socket_timeout=2, socket_connect_timeout=2) as cluster:
        return [cluster.get(key) for key in keys]


def verdict(
    role: str,
    *,
    name: str = "",
    url: str | None = None,
    prefix: str | None = None,
    stale: float = DEFAULT_STALE_SECONDS,
    now: float | None = None,
    nodes: str | None = None,
) -> Verdict:
    url = url or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    nodes = os.environ.get("REDIS_CLUSTER_NODES", "") if nodes is None else nodes
    prefix = prefix or os.environ.get("WR_REDIS_PREFIX", "wr")
    now = time.time() if now is None else now
    try:
        beat, worker = _marks(url, nodes, [alive_key(prefix, "beat"), alive_key(prefix, "worker", name)])
    except (redis.RedisError, RedisClusterException, OSError) as exc:
        return Verdict(None, f"Redis cannot be asked ({exc.__class__.__name__}): no verdict")
    sent = _age(beat, now)
    if role == "beat":
        if sent is None or sent > stale:
            return Verdict(False, "no admission tick sent " + ("yet" if sent is None else f"for {sent:.0f} s"))
        return Verdict(True, f"last tick sent {sent:.1f} s ago")
    if sent is None or sent > stale:
        return Verdict(None, "no admission ticks are being sent (is the beat running?): no verdict on the worker")
    ran = _age(worker, now)
    if ran is None or ran > stale:
        since = "has run none yet" if ran is None else f"has run none for {ran:.0f} s"
        return Verdict(False, f"ticks are being sent but {name or 'the worker'} {since}")
    return Verdict(True, f"last tick run {ran:.1f} s ago")


def broker(url: str | None = None, *, timeout: int = 3) -> Verdict:
    """Does the Celery broker answer (CELERY_BROKER_URL, else REDIS_URL, as settings.py chooses)? A worker
    without it is alive and useless: not ready. Not part of the supervisor's verdict: a new worker would not
    reach the broker either."""
    from kombu import Connection

    url = url or os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        with Connection(url, connect_timeout=timeout) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
            transport = connection.transport_cls
    except Exception as exc:  # kombu raises its own errors, the transport's or OSError, by transport
        return Verdict(False, f"the broker does not answer ({exc.__class__.__name__})")
    return Verdict(True, f"the broker ({transport}) answers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=["worker", "beat"])
    parser.add_argument("--name", default="", help="the worker's node name (default: $WR_WORKER_NAME, else celery@%%h)")
    parser.add_argument(
        "--stale-seconds", type=float, default=float(os.environ.get("WR_LIVENESS_STALE_SECONDS", DEFAULT_STALE_SECONDS))
    )
    parser.add_argument("--ready", action="store_true", help="a worker: its broker must answer too")
    args = parser.parse_args(argv)
    name = worker_node(args.name) if args.role == "worker" else ""
    result = verdict(args.role, name=name, stale=args.stale_seconds)
    word = {True: "alive", False: "STALLED", None: "unknown"}[result.alive]
    print(f"{args.role}: {word}: {result.reason}")
    if args.ready and args.role == "worker" and result.alive is not False:
        reached = broker()
        print(f"{args.role}: {'ready' if reached.alive else 'NOT READY'}: {reached.reason}")
        return 0 if reached.alive else 1
    return 1 if result.alive is False else 0


if __name__ == "__main__":
    sys.exit(main())
