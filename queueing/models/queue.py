"""A queue's configuration: its policy, schedule, mode, texts and page, mirrored to Redis by services."""

from __future__ import annotations

import json
import zoneinfo
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

# Bounds of a queue's adaptive outflow adjustment interval (health.py judges the site over one interval).
ADAPTIVE_INTERVAL_MIN_SECONDS = 2
ADAPTIVE_INTERVAL_MAX_SECONDS = 120

SLUG_VALIDATOR = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "Use 1-50 lowercase letters, digits and inner hyphens.",
)


def validate_target_url(value: str) -> None:
    """An absolute http(s) URL, or a path on this site (for the demo protected page)."""
    if value.startswith("/") and not value.startswith("//"):
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError("Enter an absolute http(s) URL or a path starting with '/'.")


def _ms(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment else 0


# How far ahead a joiner of each level is placed when the queue names no level of its own (PriorityLevel).
DEFAULT_FRACTIONS = {0: 0.0, 1: 0.1, 2: 0.5, 3: 1.0}

POW_MAX_BITS = 32  # about 4 x 10^9 hashes on average: far beyond any honest client


def _server_time_zone() -> str:
    return str(settings.TIME_ZONE)


def validate_time_zone(value: str) -> None:
    """An IANA time zone name this machine knows (zoneinfo)."""
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ValidationError(f"“{value}” is not a time zone name such as Europe/Berlin or UTC.") from exc


class Queue(models.Model):
    class State(models.TextChoices):
        OPEN = "open", "Open"
        PAUSED = "paused", "Paused (accepts joins, admits nobody)"
        CLOSED = "closed", "Closed (accepts no joins)"

    class CapacitySource(models.TextChoices):
        COUNTED = "counted", "Counted by the waiting room"
        REPORTED = "reported", "Reported by the protected site"

    class Mode(models.TextChoices):
        TRACKED = "tracked", "Tracked: every visitor's place, presence and session in Redis"
        STATELESS = "stateless", "Stateless: a numbered ticket and a sliding window (the largest drops)"

    slug = models.CharField(max_length=50, unique=True, validators=[SLUG_VALIDATOR])
    name = models.CharField(max_length=120)
    target_url = models.CharField(
        max_length=500,
        validators=[validate_target_url],
        help_text="Where admitted visitors are sent: a page of the protected site (https://shop.example/sale) "
        "or a path on this server. That page must accept this queue's access tokens (see the queue's page: "
        '"Protecting your site").',
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    # What visitors read under the queue's name, and when the line is closed (by hand, or at the schedule's
    # end): issue 20. Each may be given per language too (QueueText).
    intro = models.TextField(
        max_length=500,
        blank=True,
        help_text="A few words of yours under the queue's name on the waiting page, e.g. “Tickets for the spring "
        "tour. One order per person.” Empty: only the waiting room's own words.",
    )
    closed_message = models.TextField(
        max_length=500,
        blank=True,
        help_text="What visitors read when the line is closed or the sale has ended, e.g. “Sold out: thank you for "
        "waiting.” Empty: “It is not taking anyone new right now.”",
    )
    closed_link_url = models.CharField(
        "closed page's link",
        max_length=500,
        blank=True,
        validators=[validate_target_url],
        help_text="A page to send them on to from there (the shop, a follow-up page), https://… or a /path. "
        "Empty: no link.",
    )
    time_zone = models.CharField(
        max_length=64,
        default=_server_time_zone,
        validators=[validate_time_zone],
        help_text="The time zone of the clock times visitors read where their browser does not turn them into its own "
        "(the page without JavaScript, the e-mails telling them their turn), e.g. Europe/Berlin.",
    )
    closed_link_text = models.CharField(
        "closed page's link text",
        max_length=100,
        blank=True,
        help_text="The link's words, e.g. “See what is still available”. Empty: “Continue”.",
    )
    mode = models.CharField(
        max_length=10,
        choices=Mode.choices,
        default=Mode.TRACKED,
        help_text="Tracked (the default) keeps each visitor's place, presence and session. Stateless keeps "
        "nothing per visitor, for the largest drops: a ticket is its number, and a window of numbers moves "
        "forward by the window size every window interval. Stateless has no priorities, presence, capacity "
        "counting, revocation or neighbours. Switching the mode of a queue with people in it sends them to "
        "join again.",
    )

    capacity = models.PositiveIntegerField(
        default=100,
        validators=[MinValueValidator(1), MaxValueValidator(10_000_000)],
        help_text="Most visitors on the protected site at once (let in and not yet finished). The next one "
        "goes in when one finishes or their time runs out.",
    )
    capacity_source = models.CharField(
        max_length=10,
        choices=CapacitySource.choices,
        default=CapacitySource.COUNTED,
        help_text="Counted: the waiting room counts who is on the site (let in until they finish or their time "
        "runs out). Reported: the site tells it its own count (PUT /api/v1/queues/<slug>/capacity).",
    )
    outflow_per_minute = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1), MaxValueValidator(1_000_000)],
        help_text="Most visitors let in per minute, spread evenly. Pause the queue to let nobody in.",
    )
    burst = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text=(
            "Most visitors let in at once after a quiet spell (paused, nobody waiting, or the site "
            "full). A late admission round still lets in those the outflow owes."
        ),
    )
    session_ttl = models.PositiveIntegerField(
        "session TTL (s)",
        default=900,
        validators=[MinValueValidator(10), MaxValueValidator(7 * 24 * 3600)],
        help_text="Hard length of a session, counted from admission.",
    )
    claim_ttl = models.PositiveIntegerField(
        "claim TTL (s)",
        default=120,
        validators=[MinValueValidator(5)],
        help_text="Time an admitted visitor has to reach the protected site before the slot is freed.",
    )
    presence_timeout = models.PositiveIntegerField(
        "presence timeout (s)",
        default=60,
        validators=[MinValueValidator(5)],
        help_text="A waiting visitor unseen this long is skipped by admission (keeps its place).",
    )
    abandon_timeout = models.PositiveIntegerField(
        "abandon timeout (s)",
        default=600,
        validators=[MinValueValidator(10)],
        help_text="A waiting visitor unseen this long leaves the queue.",
    )
    max_waiting = models.PositiveIntegerField(
        default=0, help_text="Joins beyond this many waiting get 'queue_full'. 0 means no limit."
    )
    max_tickets_per_address = models.PositiveIntegerField(
        "live tickets per client address",
        default=0,
        help_text="Joins from an address that already holds this many live tickets for this queue are "
        "refused ('ticket_cap_reached'). 0 means no cap; mind shared networks (offices, mobile carriers).",
    )
    pow_difficulty = models.PositiveSmallIntegerField(
        "proof-of-work difficulty (bits)",
        default=0,
        validators=[MaxValueValidator(POW_MAX_BITS)],
        help_text="Before joining, a client must find a nonce whose SHA-256 has this many leading zero bits "
        "(each bit doubles the work: 16 takes a phone about a second). 0 turns the gate off. Raise it live "
        "during a flood.",
    )
    prequeue_opens_at = models.DateTimeField(
        "pre-queue opens at",
        null=True,
        blank=True,
        help_text="Joins before this time are refused with the time it opens (needs a start time).",
    )
    starts_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Admission starts at this time; visitors who join before wait in the pre-queue with a countdown, "
        "and at this time are put in a random order that anyone can check afterwards (its commitment is "
        "published while they wait).",
    )
    ends_at = models.DateTimeField(
        null=True, blank=True, help_text="The queue closes at this time; visitors still waiting are told."
    )
    # Adaptive outflow (optional): the admission tick follows the protected site's health within bounds.
    adaptive_outflow = models.BooleanField(
        default=False,
        help_text="Let the admission tick adapt the outflow to the protected site's reported response times and "
        "errors: a step up while healthy, a cut by the decrease factor when the p95 latency or the error rate "
        "passes its threshold, always between the minimum and the maximum below.",
    )
    outflow_min_per_minute = models.FloatField(
        "outflow minimum (a minute)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.1), MaxValueValidator(1_000_000)],
        help_text="The adaptive outflow never goes below this (required when adaptive outflow is on).",
    )
    outflow_max_per_minute = models.FloatField(
        "outflow maximum (a minute)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.1), MaxValueValidator(1_000_000)],
        help_text="The adaptive outflow never goes above this (required when adaptive outflow is on).",
    )
    health_latency_p95_ms = models.PositiveIntegerField(
        "p95 latency threshold (ms)",
        default=1000,
        validators=[MinValueValidator(1), MaxValueValidator(600_000)],
        help_text="The site is unhealthy when the 95th percentile of its response times passes this.",
    )
    health_error_rate = models.FloatField(
        "error rate threshold",
        default=0.05,
        validators=[MinValueValidator(0.001), MaxValueValidator(1.0)],
        help_text="The site is unhealthy when this share of its responses (0.05 = 5%) are server errors (5xx).",
    )
    adaptive_step_per_minute = models.FloatField(
        "increase step (a minute)",
        default=6.0,
        validators=[MinValueValidator(0.1), MaxValueValidator(1_000_000)],
        help_text="Added to the outflow at each adjustment while the site is healthy and visitors are waiting.",
    )
    adaptive_decrease_factor = models.FloatField(
        "decrease factor",
        default=0.7,
        validators=[MinValueValidator(0.01), MaxValueValidator(0.99)],
        help_text="The outflow is multiplied by this (between 0 and 1) at each adjustment while the site is unhealthy.",
    )
    adaptive_interval_seconds = models.PositiveIntegerField(
        "adjustment interval (s)",
        default=10,
        validators=[
            MinValueValidator(ADAPTIVE_INTERVAL_MIN_SECONDS),
            MaxValueValidator(ADAPTIVE_INTERVAL_MAX_SECONDS),
        ],
        help_text="At most one adjustment this often, judged on the site's reports of the last interval.",
    )
    adaptive_min_requests = models.PositiveIntegerField(
        "minimum requests",
        default=20,
        validators=[MinValueValidator(1)],
        help_text="Fewer reported requests than this in an interval are too few to cut the outflow on (one slow "
        "request of two must not halve it).",
    )
    # Lost Redis state (SPEC 3.6): the epoch in every ticket; a loss starts the next one. Redis issues
    # ticket sequence numbers only up to `seq_reserved`, reserved here first in blocks, so after a loss
    # numbering resumes above every number that may have been issued: none is issued twice.
    epoch = models.PositiveIntegerField(default=1, editable=False)
    seq_reserved = models.PositiveBigIntegerField(default=0, editable=False)
    # Counts the operators' changes (queue_configure, priority levels). Mirrored with the policy: a process
    # holding an older copy (a tick that read the queue before a pause) cannot write its settings back
    # over a newer one's (lua/config.lua).
    revision = models.PositiveBigIntegerField(default=0, editable=False)

    window_size = models.PositiveIntegerField(
        default=100,
        validators=[MinValueValidator(1), MaxValueValidator(10_000_000)],
        help_text="Stateless mode: how many numbers each step of the window lets in.",
    )
    window_interval = models.PositiveIntegerField(
        "window interval (s)",
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="Stateless mode: seconds between two steps of the window (outflow = size / interval).",
    )
    active_windows = models.PositiveSmallIntegerField(
        default=2,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Stateless mode: a number stays active for this many steps (at least 2 lets a visitor who "
        "joined just before a step still get through).",
    )
    # Stateless mode, as the tick last saw it: the window's last active place and the last place issued
    # (where the window and the places resume after lost state), and per epoch the numbers it skipped
    # (a ticket's place is its number less its epoch's gap).
    window_active = models.PositiveBigIntegerField(default=0, editable=False)
    window_issued = models.PositiveBigIntegerField(default=0, editable=False)
    window_gaps = models.JSONField(default=dict, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The adaptive outflow's settings (part of the policy; a fieldset of their own in admin).
    ADAPTIVE_FIELDS = (
        "adaptive_outflow",
        "outflow_min_per_minute",
        "outflow_max_per_minute",
        "health_latency_p95_ms",
        "health_error_rate",
        "adaptive_step_per_minute",
        "adaptive_decrease_factor",
        "adaptive_interval_seconds",
        "adaptive_min_requests",
    )
    # What the waiting page says when the line is closed (a fieldset of their own in admin).
    CLOSED_FIELDS = ("closed_message", "closed_link_url", "closed_link_text")
    # Words of the operator's own that the waiting page shows, and those a QueueText may give per language.
    TEXT_FIELDS = ("intro", "time_zone", *CLOSED_FIELDS)
    TRANSLATED_FIELDS = ("name", "intro", "closed_message", "closed_link_text")
    # Stateless mode's settings (part of the policy; a fieldset of their own in admin).
    STATELESS_FIELDS = ("mode", "window_size", "window_interval", "active_windows")
    # The admission policy, as operators edit it (admin, configure_queue, the staff API).
    POLICY_FIELDS = (
        "capacity",
        "capacity_source",
        "outflow_per_minute",
        "burst",
        "session_ttl",
        "claim_ttl",
        "presence_timeout",
        "abandon_timeout",
        "max_waiting",
        "max_tickets_per_address",
        "pow_difficulty",
        "prequeue_opens_at",
        "starts_at",
        "ends_at",
        *ADAPTIVE_FIELDS,
        *STATELESS_FIELDS,
    )

    class Meta:
        ordering = ("slug",)

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.claim_ttl and self.session_ttl and self.claim_ttl > self.session_ttl:
            errors["claim_ttl"] = "The claim TTL cannot be longer than the session TTL."
        if self.presence_timeout and self.abandon_timeout and self.abandon_timeout < self.presence_timeout:
            errors["abandon_timeout"] = "The abandon timeout cannot be shorter than the presence timeout."
        if self.prequeue_opens_at and not self.starts_at:
            errors["prequeue_opens_at"] = "A pre-queue needs a start time."
        if self.prequeue_opens_at and self.starts_at and self.prequeue_opens_at > self.starts_at:
            errors["prequeue_opens_at"] = "The pre-queue must open before the start."
        if self.mode == self.Mode.STATELESS and self.adaptive_outflow:
            errors["adaptive_outflow"] = "A stateless queue's outflow is its window (size / interval): not adapted."
        if self.ends_at and self.starts_at and self.ends_at <= self.starts_at:
            errors["ends_at"] = "The end must come after the start."
        errors.update(self._adaptive_errors())
        if errors:
            raise ValidationError(errors)

    def _adaptive_errors(self) -> dict[str, str]:
        if not self.adaptive_outflow:
            return {}
        low, high, outflow = self.outflow_min_per_minute, self.outflow_max_per_minute, self.outflow_per_minute
        errors = {}
        if low is None:
            errors["outflow_min_per_minute"] = "Adaptive outflow needs a minimum."
        if high is None:
            errors["outflow_max_per_minute"] = "Adaptive outflow needs a maximum."
        if errors or outflow is None:
            return errors
        assert low is not None and high is not None
        if low > high:
            errors["outflow_min_per_minute"] = "The minimum cannot be above the maximum."
        elif not low <= outflow <= high:
            errors["outflow_per_minute"] = (
                "With adaptive outflow on, the outflow must lie between the minimum and the maximum "
                "(the adaptation starts from it)."
            )
        return errors

    def policy(self) -> dict[str, Any]:
        """What the Redis scripts need to know about this queue (mirrored into Redis)."""
        fractions = dict(DEFAULT_FRACTIONS)
        fractions.update({lvl.level: lvl.placement_fraction for lvl in self.priority_levels.all()})
        return {
            "pf1": fractions[1],
            "pf2": fractions[2],
            "pf3": fractions[3],
            "state": self.state,
            "capacity": self.capacity,
            "capacity_source": self.capacity_source,
            "outflow_per_minute": self.outflow_per_minute,
            "burst": self.burst,
            "session_ttl": self.session_ttl,
            "claim_ttl": self.claim_ttl,
            "presence_timeout": self.presence_timeout,
            "abandon_timeout": self.abandon_timeout,
            "max_waiting": self.max_waiting,
            "max_tickets_per_address": self.max_tickets_per_address,
            "pow_difficulty": self.pow_difficulty,
            "target_url": self.target_url,
            "closed_message": self.closed_message,
            "closed_link_url": self.closed_link_url,
            "closed_link_text": self.closed_link_text,
            "intro": self.intro,
            "time_zone": self.time_zone,
            # Per language (QueueText): {"de": {"name": ..., "intro": ...}, ...}, only the words given.
            "texts": json.dumps(
                {
                    text.language: {f: getattr(text, f) for f in self.TRANSLATED_FIELDS if getattr(text, f)}
                    for text in self.texts.all()
                },
                separators=(",", ":"),
                sort_keys=True,
            ),
            "codes": "1" if self.takes_codes() else "0",
            "epoch": self.epoch,
            "revision": self.revision,
            "name": self.name,
            "starts_at_ms": _ms(self.starts_at),
            "prequeue_opens_at_ms": _ms(self.prequeue_opens_at),
            "ends_at_ms": _ms(self.ends_at),
            # The scripts use the adapted outflow (st.outflow_effective) only while this is "1".
            "adaptive_outflow": "1" if self.adaptive_outflow else "0",
            "outflow_min_per_minute": self.outflow_min_per_minute or "",
            "outflow_max_per_minute": self.outflow_max_per_minute or "",
            "health_latency_p95_ms": self.health_latency_p95_ms,
            "health_error_rate": self.health_error_rate,
            "adaptive_step_per_minute": self.adaptive_step_per_minute,
            "adaptive_decrease_factor": self.adaptive_decrease_factor,
            "adaptive_interval_seconds": self.adaptive_interval_seconds,
            "adaptive_min_requests": self.adaptive_min_requests,
            "mode": self.mode,
            "window_size": self.window_size,
            "window_interval": self.window_interval,
            "active_windows": self.active_windows,
        }

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The time zone its times are typed and shown in to staff (admin, dashboard): its own, else the
        server's for a name this machine does not know."""
        try:
            return zoneinfo.ZoneInfo(self.time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            return zoneinfo.ZoneInfo(settings.TIME_ZONE)

    @property
    def is_stateless(self) -> bool:
        return self.mode == self.Mode.STATELESS

    def takes_codes(self) -> bool:
        """Whether the waiting page offers its code box: a tracked queue that has priority codes (a queue
        read with `with_codes_known` knows without a query)."""
        if self.is_stateless:
            return False
        known = getattr(self, "has_codes", None)
        return bool(self.priority_codes.exists() if known is None else known)
