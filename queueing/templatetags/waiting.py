"""Wording for the waiting page (the same rules as formatWait in static/queueing/waiting.js)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from django import template
from django.utils import dateformat, timezone

register = template.Library()


def _seconds(value: object) -> int | None:
    """A number of seconds, or None (a missing template variable arrives as '')."""
    try:
        return max(0, int(float(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@register.filter
def wait_text(value: object) -> str:
    seconds = _seconds(value)
    if seconds is None:
        return "working it out…"
    if seconds < 60:
        return "less than a minute"
    if seconds < 90:
        return "about a minute"
    minutes = round(seconds / 60)
    if minutes < 10:
        return f"about {minutes} minutes"
    if minutes < 60:
        return f"about {round(minutes / 5) * 5} minutes"
    if seconds >= 48 * 3600:
        return f"more than {seconds // 86400} days"
    hours, rest = divmod(round(minutes / 5) * 5, 60)
    hour_text = "1 hour" if hours == 1 else f"{hours} hours"
    return f"about {hour_text}" + (f" {rest} minutes" if rest else "")


@register.filter
def wait_range_text(view: object) -> str:
    """The estimate's range, "(4-8 minutes)" with an en dash, as formatRange in waiting.js words it (the page's first
    paint; the script keeps it up to date)."""
    range_ = getattr(view, "estimated_wait_range", None)
    if not range_:
        return ""
    low, high = range_
    if high < 90 or high > 7200:
        return ""
    unit = 1 if high < 600 else 5
    lo = math.floor(low / 60 / unit) * unit
    hi = max(lo + unit, math.ceil(high / 60 / unit) * unit)
    return f"({lo}\u2013{hi} minutes)"


@register.filter
def countdown_text(value: object) -> str:
    seconds = _seconds(value)
    if not seconds:
        return ""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} day{'s' if days > 1 else ''} {hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _moment(value: object) -> datetime | None:
    seconds = _seconds(value)
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


@register.filter
def epoch_iso(value: object) -> str:
    """A Unix time as ISO 8601 (a <time> element's datetime)."""
    moment = _moment(value)
    return moment.isoformat() if moment else ""


@register.filter
def epoch_clock(value: object) -> str:
    """A Unix time as people read it on a page without JavaScript: the clock in the server's time zone,
    named ("21:48:37 UTC"), never the raw number."""
    moment = _moment(value)
    return dateformat.format(timezone.localtime(moment), "H:i:s T") if moment else ""
