"""Wording for the waiting page (the same rules as formatWait in static/queueing/waiting.js)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from django import template
from django.utils import dateformat, timezone
from django.utils.translation import gettext, ngettext

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
        return gettext("working it out…")
    if seconds < 60:
        return gettext("less than a minute")
    if seconds < 90:
        return gettext("about a minute")
    minutes = round(seconds / 60)
    if 10 <= minutes < 60:
        minutes = round(minutes / 5) * 5
    if minutes < 60:
        return ngettext("about %(n)s minute", "about %(n)s minutes", minutes) % {"n": minutes}
    if seconds >= 48 * 3600:
        days = seconds // 86400
        return ngettext("more than %(n)s day", "more than %(n)s days", days) % {"n": days}
    hours, rest = divmod(round(minutes / 5) * 5, 60)
    duration = ngettext("%(n)s hour", "%(n)s hours", hours) % {"n": hours}
    if rest:
        duration += " " + ngettext("%(n)s minute", "%(n)s minutes", rest) % {"n": rest}
    return gettext("about %(duration)s") % {"duration": duration}


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
    return gettext("(%(low)s–%(high)s minutes)") % {"low": lo, "high": hi}  # noqa: RUF001  (an en dash, as in waiting.js)


@register.filter
def countdown_text(value: object) -> str:
    seconds = _seconds(value)
    if not seconds:
        return ""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return ngettext("%(n)s day", "%(n)s days", days) % {"n": days} + f" {hours:02d}:{minutes:02d}:{secs:02d}"
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
