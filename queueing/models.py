"""Queue configuration: rooms, priority levels and codes, API keys, signing keys, the change log.

Live state (who waits, who holds a slot) is in Redis, never here. Nothing in `save()` has side effects:
services write a queue and then mirror its policy to Redis (`services.queue_config_sync`).
"""

from __future__ import annotations

import json
import secrets
import zoneinfo
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import dateformat, timezone
from rest_framework_api_key.models import AbstractAPIKey

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
        fractions = dict(PriorityLevel.DEFAULT_FRACTIONS)
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
    def is_stateless(self) -> bool:
        return self.mode == self.Mode.STATELESS

    def takes_codes(self) -> bool:
        """Whether the waiting page offers its code box: a tracked queue that has priority codes (a queue
        read with `with_codes_known` knows without a query)."""
        if self.is_stateless:
            return False
        known = getattr(self, "has_codes", None)
        return bool(self.priority_codes.exists() if known is None else known)


class PriorityLevel(models.Model):
    """How far ahead a joiner of this level is placed (seed 003).

    `placement_fraction` is the share of the current line the joiner is placed ahead of, counted from the
    back: 0 = back of the queue, 0.1 = ahead of the last 10%, 1 = the front. Level 3 (premium) is also
    admitted at once when a slot is free.
    """

    class Level(models.IntegerChoices):
        NORMAL = 0, "Normal"
        ELEVATED = 1, "Elevated"
        VIP = 2, "VIP"
        PREMIUM = 3, "Premium"

    DEFAULT_FRACTIONS = {0: 0.0, 1: 0.1, 2: 0.5, 3: 1.0}

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="priority_levels")
    level = models.PositiveSmallIntegerField(choices=Level.choices)
    name = models.CharField(max_length=50)
    placement_fraction = models.FloatField(
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of the line (from the back) a joiner is placed ahead of: 0 back, 1 front.",
    )
    group = models.ForeignKey(
        Group,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Signed-in members of this group join at this level.",
    )

    class Meta:
        ordering = ("queue", "level")
        constraints = [models.UniqueConstraint(fields=("queue", "level"), name="unique_priority_level_per_queue")]

    def __str__(self) -> str:
        return f"{self.queue.slug}: {self.level} {self.name}"

    def clean(self) -> None:
        if self.level == self.Level.NORMAL and self.placement_fraction not in (0, 0.0, None):
            raise ValidationError({"placement_fraction": "Normal joiners always go to the back (0)."})


PRIORITY_CODE_BYTES = 12  # 96 bits: a code cannot be guessed (joins that try codes are rate-limited too)


def priority_code_new() -> str:
    """A fresh priority code: 16 URL-safe characters, 96 random bits (an operator may type their own)."""
    return secrets.token_urlsafe(PRIORITY_CODE_BYTES)


class PriorityCode(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="priority_codes")
    code = models.CharField(
        max_length=64,
        default=priority_code_new,
        help_text='What visitors send with their join (priority_code in the API). Case counts ("vip" is '
        'not "VIP"). Leave the generated one (96 random bits) unless you need a memorable code: a short or '
        "guessable code will be guessed. To make many at once, use the queue list's \"Generate priority "
        'codes" action.',
        validators=[RegexValidator(r"^[A-Za-z0-9_-]{4,64}$", "4-64 letters, digits, '-' or '_'.")],
    )
    level = models.PositiveSmallIntegerField(choices=[c for c in PriorityLevel.Level.choices if c[0] > 0])
    max_uses = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How many joins may use this code; after that it is refused. Empty means unlimited.",
    )
    uses = models.PositiveIntegerField(default=0, editable=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this time the code is refused. Empty means it never expires."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("queue", "code")
        constraints = [models.UniqueConstraint(fields=("queue", "code"), name="unique_priority_code_per_queue")]

    def __str__(self) -> str:
        return f"{self.queue.slug}: {self.code}"

    def clean(self) -> None:
        if self.max_uses == 0:
            raise ValidationError({"max_uses": "Leave empty for unlimited; 0 would never be usable."})


class QueueAPIKey(AbstractAPIKey):
    """A protected site's key for one queue: stored hashed (SHA-512), shown once on creation."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API key"
        verbose_name_plural = "API keys"


class ManagementKey(AbstractAPIKey):
    """A key for automation (Terraform, CI, a script): the management API without a staff login
    (`Authorization: Api-Key <key>`). It may do what its role's group may (README "Roles"): an operator
    key what Queue operators may, a viewer key what Queue viewers may. Stored hashed, shown once."""

    class Role(models.TextChoices):
        OPERATOR = "operator", "Operator (what the Queue operators group may do)"
        VIEWER = "viewer", "Viewer (reads only, as the Queue viewers group)"

    role = models.CharField(max_length=10, choices=Role.choices, default=Role.OPERATOR)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "management key"
        verbose_name_plural = "management keys"


class SigningKey(models.Model):
    """An Ed25519 key that signs access tokens, published at /.well-known/jwks.json.

    Rotation with overlap: a new key is published `WR_KEY_PUBLISH_LEAD` before it starts signing, and the
    key it replaces stays published until every token it signed has expired.
    """

    kid = models.CharField(max_length=40, unique=True)
    private_key_pem = models.TextField()
    public_jwk = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    signs_from = models.DateTimeField(default=timezone.now)
    retires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-signs_from",)

    def __str__(self) -> str:
        return self.kid


class QueueChange(models.Model):
    """The audit log: who changed what on a queue, with the values before and after. It outlives its queue
    (the entry keeps the slug) and cannot be edited or deleted from admin."""

    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    queue_slug = models.CharField(max_length=64, default="", help_text="The queue's slug when the entry was made.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=150, help_text="Who, when there is no user (a command).")
    action = models.CharField(max_length=40)
    before = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    after = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.queue_slug} {self.action} by {self.actor_label}"

    def summary(self) -> str:
        """What changed, as people read it: "capacity 3 → 5, state open → paused" (a creation: what it was
        created with; an entry without values: its action; a change inside a group of values, such as a
        priority level's: "level 2 placement fraction 0.5 → 0.6")."""
        if self.action == "create":
            return "created: " + ", ".join(f"{_words(k)} {_shown(v)}" for k, v in sorted(self.after.items()))
        group = {"priority_levels": "level ", "texts": "text "}.get(self.action, "")
        parts: list[str] = []
        for key in dict.fromkeys([*self.before, *self.after]):
            before, after = self.before.get(key), self.after.get(key)
            if isinstance(before, dict) and isinstance(after, dict):
                parts += [
                    f"{group}{_words(key)} {_words(inner)} {_shown(before.get(inner))} → {_shown(after.get(inner))}"
                    for inner in dict.fromkeys([*before, *after])
                    if before.get(inner) != after.get(inner)
                ]
            elif key in self.before:
                parts.append(f"{group}{_words(key)} {_shown(before)} → {_shown(after)}")
            else:
                parts.append(f"{group}{_words(key)} {_shown(after)}")
        return ", ".join(parts) or self.action_words

    @property
    def action_words(self) -> str:
        return _words(self.action)


def _words(name: str) -> str:
    return name.replace("_", " ")


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{_words(k)} {_shown(v)}" for k, v in value.items())
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:  # a time (ISO 8601, as the log's JSON keeps it): shown as the dashboard shows every time
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return dateformat.format(timezone.localtime(moment) if timezone.is_aware(moment) else moment, "Y-m-d H:i:s T")
    return str(value)


class FinishedTicket(models.Model):
    """A ticket that finished (left, expired, completed, revoked), noted from Redis by the cleanup task
    every few seconds, so that if Redis loses the queue's state the ticket is not given back a place or a
    session (SPEC 3.6). Kept a day; only the sequence number (unique per queue across epochs) is needed."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="finished_tickets")
    seq = models.BigIntegerField()
    noted_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "seq"], name="one_note_per_finished_ticket")]

    def __str__(self) -> str:
        return f"{self.queue.slug} #{self.seq}"


class QueueShuffle(models.Model):
    """The auditable pre-queue shuffle of one scheduled start (SPEC 3.3).

    When the schedule is set the queue commits to a random seed by publishing its SHA-256
    (`commitment`); at the start the seed is revealed with the pre-queue's tickets (sequence number and
    priority level) and the order they were put in, which anyone can recompute (queueing/shuffle.py,
    `manage.py verify_shuffle`; shuffle.public_record is what is published)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="shuffles")
    starts_at = models.DateTimeField(help_text="The start this shuffle is for.")
    seed = models.CharField(max_length=64, editable=False)
    commitment = models.CharField(max_length=64, editable=False, help_text="SHA-256 of the seed, published.")
    committed_at = models.DateTimeField(default=timezone.now)
    revealed_at = models.DateTimeField(null=True, blank=True)
    tickets = models.JSONField(default=list, help_text="[[sequence number, priority level], ...] in the pre-queue.")
    order = models.JSONField(default=list, help_text="Their sequence numbers in the order they were put in.")
    # A stateless queue's pre-queue is a range of numbers, shuffled number by number (shuffle.place).
    numbers = models.JSONField(null=True, blank=True, help_text="Stateless mode: [first, last] number shuffled.")

    class Meta:
        ordering = ("-starts_at",)
        constraints = [models.UniqueConstraint(fields=["queue", "starts_at"], name="one_shuffle_per_start")]

    def __str__(self) -> str:
        return f"{self.queue.slug} start {self.starts_at:%Y-%m-%d %H:%M:%S}"


class TurnNotice(models.Model):
    """A waiting visitor's e-mail address, to tell them when their turn is near and when it comes (issue 20,
    "Notify me"). Kept only while the ticket waits: deleted once the turn is told, the ticket ends without
    one, or the ticket's lifetime is over (services.turn_notices_send). One per ticket."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="turn_notices")
    ticket_id = models.CharField(max_length=100)
    epoch = models.PositiveIntegerField()
    email = models.EmailField()
    language = models.CharField(max_length=10, default="en")
    # The link that takes the visitor back to their place in any browser (it carries their identity, signed).
    link = models.URLField(max_length=1000)
    near_sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("created_at",)
        constraints = [models.UniqueConstraint(fields=["queue", "ticket_id"], name="one_notice_per_ticket")]

    def __str__(self) -> str:
        return f"{self.queue.slug} {self.ticket_id[:10]}"


class QueueText(models.Model):
    """A queue's own words in one language (issue 20): its name, intro and closed-page texts as visitors who
    read that language see them. A word left empty falls back to the queue's own."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="texts")
    language = models.CharField(max_length=10, choices=settings.LANGUAGES)
    name = models.CharField(max_length=120, blank=True)
    intro = models.TextField(max_length=500, blank=True)
    closed_message = models.TextField("closed message", max_length=500, blank=True)
    closed_link_text = models.CharField("closed page's link text", max_length=100, blank=True)

    class Meta:
        ordering = ("queue", "language")
        constraints = [models.UniqueConstraint(fields=("queue", "language"), name="one_text_per_language")]
        verbose_name = "text in another language"
        verbose_name_plural = "texts in other languages"

    def __str__(self) -> str:
        return f"{self.queue.slug} ({self.language})"
