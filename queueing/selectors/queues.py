"""A queue as staff and the pages see it: its live figures, the protected site's health, its policy and
mode as mirrored in Redis, its sessions, wait samples and the pre-queue shuffle's public record."""

from __future__ import annotations

import time
from typing import Any

from .. import caching, clock, health, shuffle, store
from ..models import Queue, QueueShuffle
from ..phases import phase_from_policy
from .tickets import PolicyMissing
from .windows import observed_per_minute, window_public


def outflow_in_force(config: dict[str, str], stats: dict[str, str]) -> float:
    """The outflow admission follows now: the adapted one while adaptive outflow is on and has adapted,
    else the configured one (as lua/_policy.lua policy() reads it)."""
    configured = float(config.get("outflow_per_minute", 0) or 0)
    if config.get("adaptive_outflow") == "1" and stats.get("outflow_effective"):
        return float(stats["outflow_effective"])
    return configured


def health_window_seconds(config: dict[str, str]) -> int:
    """The site's health is judged, and shown, over the queue's adjustment interval."""
    return int(config.get("adaptive_interval_seconds") or 10)


def site_health_get(*, slug: str, now: float | None = None, window_seconds: int | None = None) -> health.SiteHealth:
    """The protected site's reported responses over the queue's adjustment interval (or `window_seconds`)."""
    if window_seconds is None:
        window_seconds = health_window_seconds(store.config_read(slug))
    now_ms = clock.now_ms(now)
    counts = store.health_window(slug, now_ms=now_ms, seconds=window_seconds)
    return health.SiteHealth.from_counts(
        window_seconds=counts.window_seconds, requests=counts.requests, errors=counts.errors, buckets=counts.buckets
    )


def queue_stats_get(*, slug: str, now: float | None = None) -> dict[str, Any]:
    """The live figures of one queue, for staff (a Redis round trip for the queue, one for the site's
    health, one for the viewers)."""
    snap = store.snapshot(slug)
    st, cfg = snap.stats, snap.config
    if cfg.get("mode") == "stateless":
        return _window_stats(slug, cfg, now)
    site = site_health_get(slug=slug, now=now, window_seconds=health_window_seconds(cfg))

    def count(name: str) -> int:
        return int(st.get(name, 0))

    capacity = int(cfg.get("capacity", 0) or 0)
    used = snap.admitted + snap.active
    if cfg.get("capacity_source") == "reported":
        used = count("reported_in_use") + snap.admitted
    observed = observed_per_minute(float(st.get("ema_rate", 0) or 0), int(float(st.get("ema_ts", 0) or 0)), now)
    expired = count("expired_claim") + count("expired_session") + count("abandoned") + count("left")
    return {
        "slug": slug,
        "state": cfg.get("state", "unknown"),
        "phase": phase_from_policy(cfg, now=time.time() if now is None else now),
        "waiting": snap.waiting,
        "waiting_away": snap.away,
        "head_position": snap.head_seq,
        "admitted": snap.admitted,
        "active": snap.active,
        "capacity": capacity,
        "capacity_source": cfg.get("capacity_source", "counted"),
        "capacity_in_use": used,
        "capacity_use": round(used / capacity, 4) if capacity else None,
        "reported_in_use": count("reported_in_use") if "reported_in_use" in st else None,
        "outflow_per_minute_configured": float(cfg.get("outflow_per_minute", 0) or 0),
        "outflow_per_minute_observed": round(observed, 3),
        "outflow_per_minute_effective": round(outflow_in_force(cfg, st), 3),
        "adaptive_outflow": cfg.get("adaptive_outflow") == "1",
        "site_health": site.payload(),
        "average_wait_seconds": round(float(st["ema_wait_ms"]) / 1000, 1) if "ema_wait_ms" in st else None,
        # the mean hold the estimates take (svm: slots still held counted), else that of the holds given back
        "average_service_seconds": (
            round(float(st.get("svm") or st["ema_service_ms"]) / 1000, 1)
            if "svm" in st or "ema_service_ms" in st
            else None
        ),
        # slots held far longer than the queue's holds, by visitors who seem to have left the site without
        # finishing (lua/_holds.lua returns_look, sampled): how many, and when the first of them frees
        **_held_by_gone(st.get("svo")),
        "totals": {
            "joined": count("joined"),
            "admitted": count("admitted"),
            "activated": count("activated"),
            "completed": count("completed"),
            "expired": expired,
            "left": count("left"),
            "abandoned": count("abandoned"),
            "expired_claim": count("expired_claim"),
            "expired_session": count("expired_session"),
            "revoked": count("revoked"),
            "restored": count("restored"),
            "restored_sessions": count("restored_sessions"),
            "leader_terms": count("leader_term"),
        },
        "event_seq": count("evseq"),
        "epoch": int(cfg.get("epoch") or 1),
        "viewers": store.viewers_count(slug, now=time.time() if now is None else now),
    }


def _held_by_gone(svo: str | None) -> dict[str, Any]:
    count, ends_ms = (float(v) for v in (svo or "0 0").split()[:2])
    return {"slots_held_by_gone": round(count), "first_gone_slot_frees_at": round(ends_ms / 1000) if count else None}


def _window_stats(slug: str, cfg: dict[str, str], now: float | None) -> dict[str, Any]:
    """queue_stats_get for a stateless queue: what a window can know (no presence, sessions or waits)."""
    now = time.time() if now is None else now
    window = store.window_read(slug)
    in_window = max(0, min(window.active, window.issued) - max(0, window.active - window.windows * window.size))
    capacity = int(cfg.get("capacity", 0) or 0)
    observed = observed_per_minute(window.ema_rate, window.ema_ts_ms, now)
    configured = window.size / (window.interval_ms / 60000)
    return {
        "slug": slug,
        "mode": "stateless",
        "state": cfg.get("state", "unknown"),
        "phase": phase_from_policy(cfg, now=now),
        "waiting": max(0, window.issued - window.active),
        "waiting_away": 0,
        "head_position": window.active + 1,
        "admitted": 0,
        "active": in_window,
        "capacity": capacity,
        "capacity_source": cfg.get("capacity_source", "counted"),
        "capacity_in_use": in_window,
        "capacity_use": round(in_window / capacity, 4) if capacity else None,
        "reported_in_use": None,
        "outflow_per_minute_configured": round(configured, 3),
        "outflow_per_minute_observed": round(observed, 3),
        "outflow_per_minute_effective": round(configured, 3),
        "adaptive_outflow": False,
        "site_health": site_health_get(slug=slug, now=now, window_seconds=health_window_seconds(cfg)).payload(),
        "average_wait_seconds": None,
        "average_service_seconds": None,
        "totals": {
            "joined": window.issued,
            "admitted": window.admitted,
            "activated": 0,
            "completed": 0,
            "expired": 0,
            "left": 0,
            "abandoned": 0,
            "expired_claim": 0,
            "expired_session": 0,
            "revoked": 0,
            "restored": 0,
            "restored_sessions": 0,
        },
        "event_seq": window.evseq,
        "epoch": window.epoch,
        "viewers": store.viewers_count(slug, now=now),
        "window": window_public(window, now_ms=int(now * 1000)),
    }


def queue_snapshot_get(slug: str) -> store.QueueSnapshot:
    """A tracked queue's counters and sizes in one round trip (admin's list)."""
    return store.snapshot(slug)


def queue_sessions_get(slug: str, *, limit: int) -> list[tuple[str, str, int]]:
    """(ticket id, 'admitted' | 'active', claim deadline or session end in ms), soonest first."""
    return store.sessions_list(slug, limit=limit)


def wait_samples_get(slug: str, *, limit: int = 10000) -> list[store.WaitSample]:
    """The oldest wait samples admissions left in Redis (kept there until services.wait_samples_drop)."""
    return store.wait_samples_read(slug, limit=limit)


def queue_policy_get(slug: str) -> dict[str, str]:
    """The queue's policy as mirrored in Redis (no SQL); PolicyMissing when Redis has none."""
    policy = store.config_read(slug)
    if not policy:
        raise PolicyMissing(slug)
    return policy


# The columns a page needs of a shuffle: never `tickets` and `order`, which hold the whole pre-queue
# (megabytes for a big sale) and would be read on every page load at the moment everyone reloads.
SHUFFLE_SUMMARY_FIELDS = ("starts_at", "seed", "commitment", "committed_at", "revealed_at", "numbers")


def queue_shuffle_summary_get(*, slug: str) -> dict[str, Any] | None:
    """The public record of the queue's latest scheduled start's shuffle without its lists: the commitment,
    the seed once revealed and the times (what the waiting page shows), from the cache (the schedule's
    services drop it when the record changes)."""

    def read() -> dict[str, Any] | None:
        latest = QueueShuffle.objects.filter(queue__slug=slug).order_by("-starts_at")
        row = latest.values(*SHUFFLE_SUMMARY_FIELDS).first()
        if row is None:
            return None
        body = shuffle.public_record(QueueShuffle(**row))  # its lists left empty: dropped here
        return {k: v for k, v in body.items() if k not in ("tickets", "order")}

    return caching.remembered(caching.shuffle_key(slug), read, caching.SHUFFLE_SECONDS)


def queue_shuffle_etag(summary: dict[str, Any]) -> str:
    """A validator of the full public record: it changes only with the commitment or the reveal."""
    return f'"{summary["commitment"][:32]}-{"r" if summary["revealed"] else "c"}"'


def queue_shuffle_get(*, slug: str) -> dict[str, Any] | None:
    """The whole public record of the queue's latest scheduled start's shuffle (commitment; seed and lists
    once revealed). A revealed record never changes, so its lists are cached under its commitment for
    long; only the small summary is dropped when the schedule changes."""
    summary = queue_shuffle_summary_get(slug=slug)
    if summary is None or not summary["revealed"] or "method" in summary:  # a stateless record has no lists
        return summary

    def lists() -> dict[str, Any]:
        tickets, order = (
            QueueShuffle.objects.filter(queue__slug=slug, commitment=summary["commitment"])
            .values_list("tickets", "order")
            .get()
        )
        return {"tickets": tickets, "order": order}

    key = caching.shuffle_lists_key(slug, summary["commitment"])
    return {**summary, **caching.remembered(key, lists, caching.SHUFFLE_REVEALED_SECONDS)}


MODE_CACHE_SECONDS = 2.0


_modes: dict[str, tuple[float, str]] = {}


def queue_mode_get(slug: str) -> str:
    """A queue's mode (tracked | stateless), as mirrored in Redis; remembered per process for a moment
    (a join must know which way to go; the scripts refuse the wrong one, so a stale answer costs a retry)."""
    known = queue_mode_known(slug)
    if known is not None:
        return known
    mode = store.config_read(slug).get("mode")
    if mode is None:
        queue = Queue.objects.filter(slug=slug).only("mode").first()
        mode = queue.mode if queue is not None else Queue.Mode.TRACKED
    if len(_modes) > 10_000:
        _modes.clear()
    _modes[slug] = (time.monotonic(), mode)
    return mode


def queue_mode_known(slug: str) -> str | None:
    """The queue's mode if this process remembers it (no I/O; None: it does not, or no longer)."""
    cached = _modes.get(slug)
    if cached is not None and time.monotonic() - cached[0] < MODE_CACHE_SECONDS:
        return cached[1]
    return None


def queue_mode_forget(slug: str) -> None:
    _modes.pop(slug, None)
