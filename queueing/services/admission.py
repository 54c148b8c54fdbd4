"""Admission (SPEC 3.2): the leader lease, the tick (tracked: admit; stateless: move the window), what the
clock decides (the pre-queue shuffle at the start, closing at the end), the adaptive outflow and the
site's health reports. A freed slot runs queue_admit at once, not on the next tick (seed 004)."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Greatest

from .. import clock, health, instruments, logcontext, realtime, selectors, store
from ..models import PriorityCode, Queue, QueueShuffle
from .audit import queue_change_record
from .config import queue_update
from .recovery import needs_sync, queue_config_sync, with_policy
from .schedule import queue_prequeue_shuffle

logger = logging.getLogger(__name__)


def queue_admit(*, slug: str, now: float | None = None, leader_token: str = "") -> store.AdmitReply:
    """Admit as many as the policy allows. Without a leader token this is the immediate admission a
    freed slot triggers; the bucket and capacity still bound it, so it can never outrun the policy."""
    reply = with_policy(
        slug,
        lambda: store.admit(
            slug,
            now_ms=clock.now_ms(now),
            leader_token=leader_token,
            max_admit=settings.WR_ADMIT_MAX_PER_CALL,
            scan_limit=settings.WR_ADMIT_MAX_PER_CALL * 4,
            model_every_ms=int(settings.WR_MODEL_SECONDS * 1000),
        ),
        needs_sync,
    )
    messages: list[realtime.Message] = []
    if reply.figures is not None:
        admitted_ms = clock.now_ms(now)
        for admission in reply.admitted:
            if admission.est_wait_at_join_s is not None:  # the page's estimate, against the wait it was
                waited = (admitted_ms - admission.joined_ms) / 1000
                instruments.estimate_error.labels(slug).observe(waited - admission.est_wait_at_join_s)
            access_token, redirect_url = selectors.admission_link(
                slug,
                ticket_id=admission.ticket_id,
                fence=admission.fence,
                expires_ms=admission.expires_ms,
                target_url=reply.figures.target_url,
                epoch=reply.figures.epoch,
            )
            messages.append(
                realtime.admitted(
                    slug,
                    admission.ticket_id,
                    access_token=access_token,
                    redirect_url=redirect_url,
                    expires_at=admission.expires_ms // 1000,
                )
            )
        messages += realtime.queue_move(slug, reply.moves, reply.figures.waiting)
    messages += realtime.expired(slug, reply.expired, "expired")
    realtime.send(messages)
    return reply


@dataclass(frozen=True)
class OutflowStep:
    """One step of the adaptive outflow: what the site's health said, and what the script did."""

    outcome: str  # see lua/outflow_adapt.lua: adapted | not_admitting | not_limiting
    verdict: str  # increase | decrease | hold
    reason: str  # healthy | latency | errors | latency_and_errors | no_traffic | too_few_requests
    before: float
    after: float
    window: health.SiteHealth  # the site's health the verdict was judged on

    @property
    def changed(self) -> bool:
        return self.after != self.before


ADAPTIVE_ACTOR = "adaptive outflow"


def queue_outflow_adapt(*, slug: str, leader_token: str, now: float | None = None) -> OutflowStep | None:
    """Follow the protected site's health, once per adjustment interval (the tick calls this while it
    holds the queue's leader lease): cut the outflow by the decrease factor while the site's p95 response
    time or error rate is over its threshold, raise it by the step while healthy, never past the bounds.
    Every change of the rate is audited with the figures that caused it. None when nothing was due."""
    now = time.time() if now is None else now
    now_ms = clock.now_ms(now)
    config, adapted_at_ms = store.outflow_adapt_state(slug)
    if config.get("adaptive_outflow") != "1":
        return None
    interval = int(config.get("adaptive_interval_seconds") or 10)
    if adapted_at_ms and adapted_at_ms <= now_ms < adapted_at_ms + interval * 1000:
        return None  # not due: the script checks again, atomically; this spares reading the window
    window = selectors.site_health_get(slug=slug, now=now, window_seconds=interval)
    verdict, reason = health.outflow_verdict(window, health.Thresholds.from_config(config))
    reply = store.outflow_adapt(slug, now_ms=now_ms, leader_token=leader_token, verdict=verdict)
    if reply.outcome not in ("adapted", "not_admitting", "not_limiting"):
        return None
    before, after = reply.before, reply.after
    step = OutflowStep(reply.outcome, verdict, reason, before, after, window)
    if step.changed:
        queue = Queue.objects.filter(slug=slug).first()
        if queue is not None:
            queue_change_record(
                queue,
                action="outflow_adapted",
                before={"outflow_per_minute_effective": round(before, 3)},
                after={"outflow_per_minute_effective": round(after, 3), "reason": reason, **window.payload()},
                actor=None,
                actor_label=ADAPTIVE_ACTOR,
            )
    return step


def site_health_report(
    *, slug: str, requests: int, errors: int, latencies_ms: list[float], now: float | None = None
) -> None:
    """Count the protected site's responses (require_queue_access, or the health API): how many, how
    many failed (5xx), and their response times (all of them, or a sample standing for all)."""
    if not 0 <= errors <= requests or len(latencies_ms) > max(requests, 0):
        raise ValueError("a health report needs 0 <= errors <= requests and at most one time per request")
    store.health_report(
        slug,
        now_ms=clock.now_ms(now),
        requests=requests,
        errors=errors,
        buckets=health.histogram(latencies_ms, requests=requests),
    )


def instance_id() -> str:
    """This process's identity for leader election."""
    return f"{socket.gethostname()}-{os.getpid()}"


def queue_schedule_step(slug: str, *, now: float | None = None, queue: Queue | None = None) -> None:
    """What the clock decides, run by every tick: the shuffle at the start, closing at the end. `queue`: the
    row as this tick read it (queues_tick reads them all in one query), else it is read here."""
    now = time.time() if now is None else now
    if queue is None:
        queue = Queue.objects.filter(slug=slug).first()
    if queue is None or queue.state == Queue.State.CLOSED:
        return
    moment = datetime.fromtimestamp(now, tz=UTC)
    if queue.ends_at is not None and moment >= queue.ends_at:
        queue_update(queue, changes={"state": Queue.State.CLOSED}, actor_label="schedule: ends_at")
        # Closed queues get no periodic snapshot: tell the pages now that the line has closed.
        realtime.send([realtime.snapshot(slug, selectors.queue_stats_get(slug=slug, now=now))])
        return
    if queue.starts_at is not None and moment >= queue.starts_at:
        queue_prequeue_shuffle(queue, now=now)


def _lead(slug: str, *, instance: str | None, now: float | None, queue: Queue | None = None) -> str | None:
    """Take or keep the queue's leader lease (seed 000); its holder runs what the clock decides. The
    lease token, or None when another instance leads."""
    token = store.leader(slug, instance_id=instance or instance_id(), ttl_ms=settings.WR_LEADER_TTL_MS)
    if token is not None:
        queue_schedule_step(slug, now=now, queue=queue)
    return token


def queue_tick(
    *, slug: str, instance: str | None = None, now: float | None = None, queue: Queue | None = None
) -> store.AdmitReply | None:
    """One admission tick: only the holder of the queue's leader lease admits (SPEC 3.2). `queue`: the row
    as the caller read it this tick, if it did."""
    token = _lead(slug, instance=instance, now=now, queue=queue)
    if token is None:
        return None
    # A row that says the outflow is fixed spares the step its read of the mirrored policy (a whole HGETALL).
    if queue is None or queue.adaptive_outflow:
        try:
            queue_outflow_adapt(slug=slug, leader_token=token, now=now)
        except Exception:  # admission goes on at the rate in force: adapting is secondary to admitting
            logger.exception("adaptive outflow step failed for queue %s", slug)
    return queue_admit(slug=slug, now=now, leader_token=token)


def queue_window_tick(*, queue: Queue, leader_token: str = "", now: float | None = None) -> store.WindowStep:
    """One step of a stateless queue's window, if one is due (lua/window/tick.lua); tells the watchers
    when it moved, and keeps the database's note of where the window is (for lost state)."""
    step = with_policy(
        queue.slug,
        lambda: store.window_tick(queue.slug, now_ms=clock.now_ms(now), leader_token=leader_token),
        lambda reply: reply.outcome == "no_config",
    )
    if step.outcome != "ok":
        return step
    if step.stepped:
        public = with_policy(queue.slug, lambda: selectors.window_public_get(slug=queue.slug, now=now))
        realtime.send([realtime.window_moved(queue.slug, public)])
    if (step.active, step.issued) != (queue.window_active, queue.window_issued):
        Queue.objects.filter(pk=queue.pk).update(
            window_active=Greatest(F("window_active"), step.active),
            window_issued=Greatest(F("window_issued"), step.issued),
        )
        queue.window_active, queue.window_issued = step.active, step.issued
    return step


def queue_window_tick_lead(
    *, queue: Queue, instance: str | None = None, now: float | None = None
) -> store.WindowStep | None:
    """A stateless queue's tick: only the holder of the queue's leader lease moves its window (seed 000)."""
    token = _lead(queue.slug, instance=instance, now=now, queue=queue)
    return None if token is None else queue_window_tick(queue=queue, leader_token=token, now=now)


def queues_tick(*, instance: str | None = None, now: float | None = None) -> int:
    """Tick every queue that is not closed; returns how many visitors were admitted (tracked queues) or
    windows moved (stateless ones)."""
    admitted = 0
    queues = Queue.objects.exclude(state=Queue.State.CLOSED).prefetch_related(*Queue.MIRROR_READS)
    # Whether each offers a code box (Queue.takes_codes), in the same query rather than one a queue a tick.
    queues = queues.annotate(has_codes=Exists(PriorityCode.objects.filter(queue=OuterRef("pk"))))
    # Whether its pre-queue's draw is still to come (what the mirrored policy says), the same way.
    waits = QueueShuffle.objects.filter(queue=OuterRef("pk"), starts_at=OuterRef("starts_at"), revealed_at=None)
    queues = queues.annotate(shuffle_waits=Exists(waits))
    rows = list(queues)
    # What Redis holds of each (its mirror's digest, its live state, whether anybody is in it): one read for all.
    helds = store.configs_held([(queue.slug, queue.is_stateless) for queue in rows])
    for queue, held in zip(rows, helds, strict=True):
        with logcontext.about(queue=queue.slug):
            admitted += _queue_tick_any(queue, held, instance=instance, now=now)
    return admitted


def _queue_tick_any(queue: Queue, found: store.Held, *, instance: str | None, now: float | None) -> int:
    # Mirroring the policy whenever Redis does not hold the database's heals a Redis that lost it (a restart,
    # a failover) and a change saved around the service or not committed after Redis took it.
    held = queue_config_sync(queue, now=now, held=found)
    # Nobody in it: no lease to keep, nobody to admit, nothing to learn. Noted once (what the rounds would
    # have come to meanwhile: lua/idle.lua), then left alone until somebody comes; not noted (somebody came
    # since the read, what its line taught it is still fading): its round, as ever.
    if (
        held is not None
        and held.empty
        and _nothing_due(queue)
        and (held.idle or store.queue_idle(queue.slug, digest=held.digest, now_ms=clock.now_ms(now)))
    ):
        return 0
    if queue.is_stateless:
        step = queue_window_tick_lead(queue=queue, instance=instance, now=now)
        return int(step is not None and step.stepped)
    reply = queue_tick(slug=queue.slug, instance=instance, now=now, queue=queue)
    return 0 if reply is None else len(reply.admitted)


def _nothing_due(queue: Queue) -> bool:
    """Whether a queue nobody is in has nothing for its tick to do: no lease to keep (only admitting needs
    one, and the next tick with somebody in line takes it), nobody to admit, nothing to learn. Not so for a
    scheduled queue (its start's draw and its end are the lease holder's) or an adaptive outflow (it
    follows the site's health whoever is in line)."""
    return queue.starts_at is None and queue.ends_at is None and not queue.adaptive_outflow
