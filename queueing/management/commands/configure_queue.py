"""Create or update a queue from the command line (for automation); prints the result."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from queueing import services
from queueing.models import Queue


def _bool(value: str) -> bool:
    if value.lower() in ("on", "true", "yes", "1"):
        return True
    if value.lower() in ("off", "false", "no", "0"):
        return False
    raise ValueError(value)


_bool.__name__ = "on/off"  # argparse names the type in its error message

OPTIONS: list[tuple[str, Callable[[str], Any], str]] = [
    ("name", str, "Display name"),
    ("target_url", str, "Where admitted visitors go (absolute URL or /path)"),
    ("intro", str, "Words of yours under the queue's name on the waiting page ('' for none)"),
    ("time_zone", str, "The zone of clock times visitors read without their browser's (e.g. Europe/Berlin)"),
    ("closed_message", str, "What visitors read once the line is closed ('' for the default)"),
    ("closed_link_url", str, "A page the closed line sends them on to (absolute URL or /path; '' for none)"),
    ("closed_link_text", str, "That link's words"),
    ("capacity", int, "Most visitors holding a slot at once"),
    ("capacity_source", str, "counted | reported"),
    ("outflow_per_minute", float, "Admissions per minute"),
    ("burst", int, "Most admitted at once after a quiet spell"),
    ("session_ttl", int, "Session length in seconds"),
    ("claim_ttl", int, "Seconds an admitted visitor has to arrive"),
    ("presence_timeout", int, "Seconds unseen before admission skips a visitor"),
    ("abandon_timeout", int, "Seconds unseen before a waiting ticket expires"),
    ("max_waiting", int, "Most visitors waiting (0: no limit)"),
    (
        "max_tickets_per_address",
        int,
        "Most live tickets per client address (0: no cap; counts tickets joined while on)",
    ),
    ("pow_difficulty", int, "Proof-of-work leading zero bits before a join (0: off)"),
    ("state", str, "open | paused | closed"),
    ("prequeue_opens_at", str, "When joins open, before the start (ISO 8601; 'none' to clear)"),
    ("starts_at", str, "When admission starts (ISO 8601, e.g. 2026-12-01T10:00:00Z; 'none' to clear)"),
    ("ends_at", str, "When the queue closes (ISO 8601; 'none' to clear)"),
    ("mode", str, "tracked | stateless"),
    ("window_size", int, "Stateless mode: numbers let in per step of the window"),
    ("window_interval", int, "Stateless mode: seconds between steps"),
    ("active_windows", int, "Stateless mode: steps a number stays active"),
    ("adaptive_outflow", _bool, "Follow the protected site's health: on | off"),
    ("outflow_min_per_minute", float, "Adaptive outflow: never below this"),
    ("outflow_max_per_minute", float, "Adaptive outflow: never above this"),
    ("health_latency_p95_ms", int, "Adaptive outflow: unhealthy above this p95 response time (ms)"),
    ("health_error_rate", float, "Adaptive outflow: unhealthy above this share of 5xx (0.05 = 5%%)"),
    ("adaptive_step_per_minute", float, "Adaptive outflow: added per adjustment while healthy"),
    ("adaptive_decrease_factor", float, "Adaptive outflow: multiplied by this per adjustment while unhealthy"),
    ("adaptive_interval_seconds", int, "Adaptive outflow: seconds between adjustments"),
    ("adaptive_min_requests", int, "Adaptive outflow: fewest responses in an interval to cut on"),
]


class Command(BaseCommand):
    help = "Create or update a queue. Prints the queue's settings as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        for name, kind, help_text in OPTIONS:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=help_text)

    def handle(self, *args: Any, **options: Any) -> None:
        changes = {name: options[name] for name, _, _ in OPTIONS if options.get(name) is not None}
        for moment in ("prequeue_opens_at", "starts_at", "ends_at"):
            if moment in changes:
                changes[moment] = _datetime(changes[moment], moment)
        if "target_url" not in changes and not Queue.objects.filter(slug=options["slug"]).exists():
            # A slug mistyped in a change ("sael --state closed") is not a new queue missing its target.
            raise CommandError(f"There is no queue '{options['slug']}'. To make one, give at least --target-url.")
        try:
            queue, created = services.queue_configure(
                slug=options["slug"], changes=changes, actor_label="configure_queue command"
            )
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
            raise CommandError(f"Invalid queue settings: {problems}") from exc
        self.stdout.write(json.dumps({"created": created, **queue_as_dict(queue)}, indent=2))


def _datetime(value: str, option: str) -> datetime | None:
    if value.lower() == "none":
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"--{option.replace('_', '-')}: not an ISO 8601 date and time: {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def queue_as_dict(queue: Queue) -> dict[str, Any]:
    values = {field: getattr(queue, field) for field in services.EDITABLE_FIELDS}
    return {"slug": queue.slug, **{k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}}
