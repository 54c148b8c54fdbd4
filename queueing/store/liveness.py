"""Liveness marks: when the beat last sent an admission tick, and when each Celery worker last ran one;
and the lease that lets only one beat send the periodic tasks.

Plain strings with an expiry, one per process role and name (no hash tag: each is read on its own). They
are read without Django by `waitingroom_site/liveness.py`, which builds the same names from the same
prefix, to tell a stalled worker from a healthy one; tests check that the two agree.
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

from .connection import client, clustered, run

# A mark outlives any staleness threshold an operator would choose, then goes with its process.
KEEP_SECONDS = 600


def alive_key(role: str, name: str = "") -> str:
    """`<prefix>:alive:beat`, `<prefix>:alive:worker:<node name>`."""
    return f"{settings.WR_REDIS_PREFIX}:alive:{role}" + (f":{name}" if name else "")


def alive_mark(role: str, name: str = "", *, now_ms: int) -> None:
    client().set(alive_key(role, name), now_ms, ex=KEEP_SECONDS)


def beat_lease(name: str, *, lease_ms: int) -> str:
    """Take or keep the beat's lease for `name`; the name of the beat holding it afterwards."""
    return str(run("beat/lease", [f"{settings.WR_REDIS_PREFIX}:beat:lease"], [name, lease_ms]))


def alive_mark_read(role: str, name: str = "") -> int | None:
    """When `role` (and `name`) last left its mark (ms), if it has."""
    marked = client().get(alive_key(role, name))
    return int(marked) if marked else None


def ping() -> str:
    """Ask the live state's Redis whether it serves: PING on a single Redis; on a cluster, CLUSTER INFO of
    any node, which says ok only while every slot is served (a master down before its replica takes over
    says fail). Raises a Redis error when it does not; returns what it said."""
    if not clustered():
        client().ping()
        return "PONG"
    cluster: Any = client()  # a redis.RedisCluster here
    info = cluster.execute_command("CLUSTER INFO", target_nodes=redis.RedisCluster.RANDOM)
    state = info.get("cluster_state") if isinstance(info, dict) else str(info)
    if state != "ok":
        raise redis.exceptions.ClusterDownError(f"cluster_state:{state}")
    return "cluster_state:ok"


def cluster_epoch() -> int | None:
    """The Redis Cluster's current epoch as a node tells it (CLUSTER INFO; a failover moves it on), or None
    on a single Redis."""
    if not clustered():
        return None
    cluster: Any = client()
    info = cluster.execute_command("CLUSTER INFO", target_nodes=redis.RedisCluster.RANDOM)
    return int(info["cluster_current_epoch"]) if isinstance(info, dict) else None
