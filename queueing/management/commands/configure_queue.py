"""Create or update a queue from the command line (for automation); prints the result."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from queueing import policy_table, services
from queueing.models import Queue


def _bool(value: str) -> bool:
    if value.lower() in ("on", "true", "yes", "1"):
        return True
    if value.lower() in ("off", "false", "no", "0"):
        return False
    raise ValueError(value)


_bool.__name__ = "on/off"  # argparse names the type in its error message


_READ: dict[str, Callable[[str], Any]] = {"int": int, "small": int, "float": float, "bool": _bool}


def _option(setting: policy_table.Setting) -> tuple[str, Callable[[str], Any], str]:
    """A setting as the command line takes it: how its word is read (a moment's in `handle`: 'none' clears
    it), and its help."""
    about = setting.brief.replace("%", "%%")
    if setting.kind == "moment":
        about += " (ISO 8601, e.g. 2026-12-01T10:00:00Z; 'none' to clear)"
    elif setting.choices is not None:
        about += f" ({' | '.join(setting.choices.values)})"
    return setting.name, _READ.get(setting.kind, str), about


OPTIONS: list[tuple[str, Callable[[str], Any], str]] = [
    ("name", str, "Display name"),
    ("target_url", str, "Where admitted visitors go (absolute URL or /path)"),
    ("intro", str, "Words of yours under the queue's name on the waiting page ('' for none)"),
    ("time_zone", str, "The zone of clock times visitors read without their browser's (e.g. Europe/Berlin)"),
    ("closed_message", str, "What visitors read once the line is closed ('' for the default)"),
    ("closed_link_url", str, "A page the closed line sends them on to (absolute URL or /path; '' for none)"),
    ("closed_link_text", str, "That link's words"),
    ("state", str, "open | paused | closed"),
    # and every setting of the policy (queueing/policy_table.py)
    *(_option(setting) for setting in policy_table.SETTINGS),
]


class Command(BaseCommand):
    help = "Create or update a queue. Prints the queue's settings as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        for name, kind, help_text in OPTIONS:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=help_text)

    def handle(self, *args: Any, **options: Any) -> None:
        changes = {name: options[name] for name, _, _ in OPTIONS if options.get(name) is not None}
        for moment in (setting.name for setting in policy_table.SETTINGS if setting.kind == "moment"):
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
