"""Alerts: look at every queue for every hook, keep what was seen, and deliver what changed.

`alerts_check` runs every few seconds (the "Alerts" periodic task). It reads each queue's live figures once,
and for each hook that covers the queue compares them with what that hook last saw (`AlertWatch`, locked
while compared, so two checks running at once announce a change once). Each event a hook wants becomes one
`AlertDelivery` per channel, written in the same transaction; deliveries are attempted by the
`alert_deliver` task and, if an attempt fails, again after 5 s, 10 s, 20 s … (RETRY_MAX_ATTEMPTS in all).
A delivery is claimed before it is attempted, so it is never sent twice at once; a receiver may still see
one twice (an answer lost on the way back) and can tell by its X-WaitingRoom-Delivery id.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import F, Max, Q
from django.urls import reverse
from redis.exceptions import RedisError

from queueing import health, phases, selectors
from queueing.models import Queue, QueueChange

from . import events, names
from .models import RETRY_MAX_ATTEMPTS, AlertDelivery, AlertHook, AlertWatch

logger = logging.getLogger(__name__)

CLAIM_SECONDS = 60  # an attempt that has not finished by then (a worker that died) is due again
WEBHOOK_TIMEOUT_SECONDS = 5
ANSWER_KEEP_CHARS = 300  # of our own words about a failure (a status, a refused connection)


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, tz=UTC)


def queue_figures(queue: Queue, *, now: float) -> events.Figures | None:
    """A queue as the alerts see it; None when Redis cannot tell (the next check looks again)."""
    try:
        stats = selectors.queue_stats_get(slug=queue.slug, now=now)
    except RedisError as exc:
        logger.warning("alerts: cannot read queue %s (%s)", queue.slug, exc.__class__.__name__)
        return None
    schedule = phases.schedule_at(now=now, prequeue_opens_at=queue.prequeue_opens_at, starts_at=queue.starts_at)
    thresholds = health.Thresholds(
        p95_ms=float(queue.health_latency_p95_ms),
        error_rate=float(queue.health_error_rate),
        min_requests=int(queue.adaptive_min_requests),
    )
    return figures_from_stats(stats, state=queue.state, schedule=schedule, thresholds=thresholds)


def figures_from_stats(
    stats: dict[str, Any], *, state: str, schedule: str, thresholds: health.Thresholds
) -> events.Figures:
    """The figures a check judges, from a queue's live figures (selectors.queue_stats_get: the same the
    metrics export, so the webhook's judgement and the Prometheus rule's read one source)."""
    site = stats["site_health"]
    capacity = int(stats.get("capacity") or 0)
    return events.Figures(
        phase=phases.phase_of(state=state, schedule=schedule),
        schedule=schedule,
        waiting=int(stats.get("waiting") or 0),
        waiting_here=int(stats.get("waiting") or 0) - int(stats.get("waiting_away") or 0),
        admitted_total=int(stats.get("totals", {}).get("admitted") or 0),
        room=float(stats.get("outflow_per_minute_effective") or 0) > 0
        and (capacity == 0 or int(stats.get("capacity_in_use") or 0) < capacity),
        site=health.SiteHealth(
            window_seconds=int(site["window_seconds"]),
            requests=int(site["requests"]),
            errors=int(site["errors"]),
            latency_samples=0,
            p95_ms=site["p95_latency_ms"],
        ),
        thresholds=thresholds,
        stats=stats,
    )


def _link(path: str) -> str:
    return settings.WR_PUBLIC_URL.rstrip("/") + path


def alert_payload(
    hook: AlertHook,
    queue: Queue | None,
    event: str,
    figures: events.Figures | None,
    now: float,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON a webhook receives (and what an e-mail says, in words)."""
    about: dict[str, Any] | None = None
    if queue is not None:
        about = {
            "slug": queue.slug,
            "name": queue.name,
            "dashboard_url": _link(reverse("dashboard:queue", args=[queue.slug])),
            "waiting_page_url": _link(reverse("waiting-page", args=[queue.slug])),
        }
    what = f"A test alert from the hook “{hook.name}”" if event == names.TEST else names.EVENTS[event]
    stats = dict(figures.stats) if figures else {}
    return {
        "event": event,
        "summary": f"{queue.name}: {what}" if queue is not None else what,
        "occurred_at": _at(now).isoformat(),
        "queue": about,
        "figures": {
            name: stats.get(name)
            for name in (
                "state",
                "waiting",
                "admitted",
                "active",
                "capacity",
                "capacity_in_use",
                "outflow_per_minute_effective",
                "outflow_per_minute_observed",
                "site_health",
            )
        }
        if stats
        else None,
        "phase": figures.phase if figures else None,
        "details": details or {},
        "thresholds": {"waiting": hook.waiting_threshold, "stall_seconds": hook.stall_seconds},
    }


def _deliveries_create(
    hook: AlertHook, queue: Queue | None, event: str, payload: dict[str, Any], now: float
) -> list[AlertDelivery]:
    channels = ([AlertDelivery.Channel.WEBHOOK] if hook.url else []) + (
        [AlertDelivery.Channel.EMAIL] if hook.email_list else []
    )
    made = []
    for channel in channels:
        delivery = AlertDelivery(
            hook=hook, queue=queue, event=event, channel=channel, payload={}, next_attempt_at=_at(now)
        )
        delivery.payload = {"id": str(delivery.id), **payload}
        delivery.save()
        made.append(delivery)
    return made


def _hooks_for(queue: Queue, hooks: list[AlertHook]) -> list[AlertHook]:
    return [hook for hook in hooks if hook.queue_id is None or hook.queue_id == queue.pk]


def alerts_check(*, now: float | None = None) -> list[AlertDelivery]:
    """Look at every queue for every enabled hook; returns the deliveries made (one per event and channel)."""
    hooks = list(AlertHook.objects.filter(enabled=True))
    if not hooks:
        return []
    made: list[AlertDelivery] = []
    for queue in Queue.objects.order_by("slug"):
        watching = _hooks_for(queue, hooks)
        if not watching:
            continue
        at = time.time() if now is None else now
        figures = queue_figures(queue, now=at)
        if figures is None:
            continue
        for hook in watching:
            made += _watch(hook, queue, figures, at)
    return made


def _watch(hook: AlertHook, queue: Queue, figures: events.Figures, now: float) -> list[AlertDelivery]:
    rules = events.Rules(waiting_threshold=hook.waiting_threshold, stall_seconds=hook.stall_seconds)
    made: list[AlertDelivery] = []
    with transaction.atomic():
        watch, _ = AlertWatch.objects.select_for_update().get_or_create(hook=hook, queue=queue)
        if float(watch.seen.get("seen_at", 0)) > now:
            return []  # a later look was kept already (two checks at once, this one read first)
        first = not watch.seen
        changes = [] if first else state_changes(queue, after_id=int(watch.seen.get("change_id") or 0))
        watch.seen, happened = events.observe(watch.seen, figures, rules, now, changes)
        if first:
            watch.seen["change_id"] = QueueChange.objects.filter(queue=queue).aggregate(last=Max("id"))["last"] or 0
        watch.save(update_fields=["seen", "updated_at"])
        for event, details in happened:
            if hook.wants(event):
                payload = alert_payload(hook, queue, event, figures, now, details)
                made += _deliveries_create(hook, queue, event, payload, now)
    for delivery in made:
        logger.info("alert %s for queue %s to hook %s (%s)", delivery.event, queue.slug, hook.name, delivery.channel)
    return made


def state_changes(queue: Queue, *, after_id: int) -> list[events.StateChange]:
    """The queue's state changes audited after entry `after_id`, oldest first."""
    entries = QueueChange.objects.filter(queue=queue, id__gt=after_id, after__has_key="state").order_by("id")
    return [
        events.StateChange(
            id=entry.id, state=str(entry.after["state"]), by=entry.actor_label, at=entry.created_at.isoformat()
        )
        for entry in entries
        if entry.before.get("state") != entry.after["state"]
    ]


def alert_test_send(hook: AlertHook, *, now: float | None = None) -> list[AlertDelivery]:
    """The admin's “Send a test alert”: one delivery per channel, attempted at once."""
    now = time.time() if now is None else now
    queue = hook.queue
    figures = queue_figures(queue, now=now) if queue is not None else None
    with transaction.atomic():
        made = _deliveries_create(hook, queue, names.TEST, alert_payload(hook, queue, names.TEST, figures, now), now)
    return [delivery_attempt(delivery.pk, now=now) or delivery for delivery in made]


def deliveries_due(*, now: float | None = None, limit: int = 100) -> list[str]:
    """Deliveries waiting for an attempt (new ones, retries whose time has come, claims that lapsed)."""
    at = _at(time.time() if now is None else now)
    due = AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, next_attempt_at__lte=at)
    return [str(pk) for pk in due.order_by("next_attempt_at", "created_at").values_list("pk", flat=True)[:limit]]


def retry_delay_seconds(attempts: int) -> float:
    """Before attempt attempts + 1: the base (WR_ALERT_RETRY_SECONDS), doubled each time, at most 10 minutes."""
    return float(min(600.0, settings.WR_ALERT_RETRY_SECONDS * 2 ** max(0, attempts - 1)))


def delivery_attempt(delivery_id: Any, *, now: float | None = None) -> AlertDelivery | None:
    """Attempt one delivery if it is due and nobody else is attempting it; record the outcome.
    None when it was not ours to attempt."""
    now = time.time() if now is None else now
    claimed = AlertDelivery.objects.filter(
        Q(pk=delivery_id), Q(status=AlertDelivery.Status.PENDING), Q(next_attempt_at__lte=_at(now))
    ).update(attempts=F("attempts") + 1, next_attempt_at=_at(now + CLAIM_SECONDS))
    if not claimed:
        return None
    delivery = AlertDelivery.objects.select_related("hook").get(pk=delivery_id)
    try:
        code = _send(delivery, now=now)
        error = ""
    except DeliveryFailed as exc:
        code, error = exc.status_code, str(exc)
    delivery.last_status_code = code
    delivery.last_error = error[:ANSWER_KEEP_CHARS]
    if not error:
        delivery.status = AlertDelivery.Status.DELIVERED
        delivery.delivered_at = _at(time.time())
    elif delivery.attempts >= RETRY_MAX_ATTEMPTS:
        delivery.status = AlertDelivery.Status.FAILED
        logger.warning(
            "alert %s to hook %s failed %d times, giving up: %s",
            delivery.event,
            delivery.hook,
            delivery.attempts,
            error,
        )
    else:
        delivery.next_attempt_at = _at(now + retry_delay_seconds(delivery.attempts))
    delivery.save(update_fields=["last_status_code", "last_error", "status", "delivered_at", "next_attempt_at"])
    return delivery


class DeliveryFailed(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer other than 2xx: tried again later, never followed


class PrivateTarget(OSError):
    """A webhook whose host is a private, loopback, link-local or otherwise non-public address."""


def _peer_checked(sock: socket.socket) -> None:
    """Refuse a connection to an address that is not public (issue 50: a hook could reach the servers
    around this one), unless WR_ALERT_PRIVATE_TARGETS allows it. The address connected to is judged, not a
    name looked up before: a name that resolves otherwise the second time changes nothing."""
    address = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
    if not address.is_global and not settings.WR_ALERT_PRIVATE_TARGETS:
        sock.close()
        raise PrivateTarget(f"{address} is not a public address (WR_ALERT_PRIVATE_TARGETS allows such hooks)")


class _PublicHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _peer_checked(self.sock)


class _PublicHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:  # (the check is made before any of the request is sent)
        super().connect()
        _peer_checked(self.sock)


class _PublicHTTP(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_PublicHTTPConnection, req)


class _PublicHTTPS(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        return self.do_open(_PublicHTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


_opener = urllib.request.build_opener(_NoRedirects, _PublicHTTP, _PublicHTTPS)


def _send(delivery: AlertDelivery, *, now: float) -> int | None:
    if delivery.channel == AlertDelivery.Channel.EMAIL:
        _email(delivery)
        return None
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    if not delivery.hook.url.lower().startswith(("http://", "https://")):
        raise DeliveryFailed("the webhook URL must start with http:// or https://")
    request = urllib.request.Request(  # noqa: S310  (http or https, checked above)
        delivery.hook.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "WaitingRoom-Alerts/1",
            "X-WaitingRoom-Event": delivery.event,
            "X-WaitingRoom-Delivery": str(delivery.pk),
            "X-WaitingRoom-Signature": events.signature(delivery.hook.secret, int(now), body),
        },
    )
    try:
        with _opener.open(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:  # its status only: what the receiver wrote is not kept (issue 50)
        raise DeliveryFailed(f"HTTP {exc.code} {exc.reason}".strip(), exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryFailed(f"{exc.__class__.__name__}: {reason}") from None


def _email(delivery: AlertDelivery) -> None:
    payload = delivery.payload
    lines = [payload["summary"], "", f"When: {payload['occurred_at']}"]
    if payload.get("queue"):
        lines += [
            f"Dashboard: {payload['queue']['dashboard_url']}",
            f"Waiting page: {payload['queue']['waiting_page_url']}",
        ]
    for name, value in (payload.get("figures") or {}).items():
        lines.append(f"{name.replace('_', ' ')}: {value}")
    message = EmailMessage(
        subject=f"[Waiting Room] {payload['summary']}",
        body="\n".join(lines) + "\n",
        from_email=settings.WR_ALERT_FROM_EMAIL,
        to=delivery.hook.email_list,
        headers={"X-WaitingRoom-Event": delivery.event, "X-WaitingRoom-Delivery": str(delivery.pk)},
        connection=get_connection(timeout=WEBHOOK_TIMEOUT_SECONDS * 2),
    )
    try:
        message.send()
    except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors
        raise DeliveryFailed(f"{exc.__class__.__name__}: {exc}") from None


def deliveries_prune(*, older_than_days: int = 30, now: float | None = None) -> int:
    """The delivery log is kept for a month."""
    cutoff = _at(time.time() if now is None else now) - timedelta(days=older_than_days)
    deleted, _ = (
        AlertDelivery.objects.filter(created_at__lt=cutoff).exclude(status=AlertDelivery.Status.PENDING).delete()
    )
    return deleted
