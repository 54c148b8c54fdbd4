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

from queueing import policy_table

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


# How far ahead a joiner of each level is placed when the queue names no level of its own (PriorityLevel).
DEFAULT_FRACTIONS = {0: 0.0, 1: 0.1, 2: 0.5, 3: 1.0}


def _field(name: str) -> Any:
    """The model field of one of the policy's settings, as its entry in the table describes it."""
    setting = policy_table.BY_NAME[name]
    options: dict[str, Any] = {"help_text": setting.help}
    if setting.label:
        options["verbose_name"] = setting.label
    if setting.default is None:
        options.update(null=True, blank=True)
    else:
        options["default"] = setting.default
    validators: list[MinValueValidator | MaxValueValidator] = []
    if setting.low is not None and not (setting.kind in ("int", "small") and setting.low == 0):
        validators.append(MinValueValidator(setting.low))  # (a positive integer field is 0 or more already)
    if setting.high is not None:
        validators.append(MaxValueValidator(setting.high))
    if validators:
        options["validators"] = validators
    if setting.kind == "choice":
        assert setting.choices is not None
        return models.CharField(max_length=10, choices=setting.choices.choices, **options)
    field = {
        "int": models.PositiveIntegerField,
        "small": models.PositiveSmallIntegerField,
        "float": models.FloatField,
        "bool": models.BooleanField,
        "moment": models.DateTimeField,
    }[setting.kind]
    return field(**options)


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

    CapacitySource = policy_table.CapacitySource
    Mode = policy_table.Mode

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
    # The policy's settings: each one's type, default, bounds and help are its entry in queueing/policy_table.py.
    capacity: int = _field("capacity")
    capacity_source: str = _field("capacity_source")
    outflow_per_minute: float = _field("outflow_per_minute")
    burst: int = _field("burst")
    session_ttl: int = _field("session_ttl")
    claim_ttl: int = _field("claim_ttl")
    presence_timeout: int = _field("presence_timeout")
    abandon_timeout: int = _field("abandon_timeout")
    max_waiting: int = _field("max_waiting")
    max_tickets_per_address: int = _field("max_tickets_per_address")
    pow_difficulty: int = _field("pow_difficulty")
    prequeue_opens_at: datetime | None = _field("prequeue_opens_at")
    starts_at: datetime | None = _field("starts_at")
    ends_at: datetime | None = _field("ends_at")
    adaptive_outflow: bool = _field("adaptive_outflow")
    outflow_min_per_minute: float | None = _field("outflow_min_per_minute")
    outflow_max_per_minute: float | None = _field("outflow_max_per_minute")
    health_latency_p95_ms: int = _field("health_latency_p95_ms")
    health_error_rate: float = _field("health_error_rate")
    adaptive_step_per_minute: float = _field("adaptive_step_per_minute")
    adaptive_decrease_factor: float = _field("adaptive_decrease_factor")
    adaptive_interval_seconds: int = _field("adaptive_interval_seconds")
    adaptive_min_requests: int = _field("adaptive_min_requests")

    # Lost Redis state (SPEC 3.6): the epoch in every ticket; a loss starts the next one. Redis issues
    # ticket sequence numbers only up to `seq_reserved`, reserved here first in blocks, so after a loss
    # numbering resumes above every number that may have been issued: none is issued twice.
    epoch = models.PositiveIntegerField(default=1, editable=False)
    seq_reserved = models.PositiveBigIntegerField(default=0, editable=False)
    # Counts the operators' changes (queue_configure, priority levels). Mirrored with the policy: a process
    # holding an older copy (a tick that read the queue before a pause) cannot write its settings back
    # over a newer one's (lua/config.lua).
    revision = models.PositiveBigIntegerField(default=0, editable=False)

    mode: str = _field("mode")
    window_size: int = _field("window_size")
    window_interval: int = _field("window_interval")
    active_windows: int = _field("active_windows")
    # Stateless mode, as the tick last saw it: the window's last active place and the last place issued
    # (where the window and the places resume after lost state), and per epoch the numbers it skipped
    # (a ticket's place is its number less its epoch's gap).
    window_active = models.PositiveBigIntegerField(default=0, editable=False)
    window_issued = models.PositiveBigIntegerField(default=0, editable=False)
    window_gaps = models.JSONField(default=dict, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The policy's settings by group (queueing/policy_table.py; each group a fieldset of its own in admin).
    ADAPTIVE_FIELDS = policy_table.names("adaptive")
    STATELESS_FIELDS = policy_table.names("stateless")
    # The admission policy, as operators edit it (admin, configure_queue, the staff API).
    POLICY_FIELDS = policy_table.names()
    # What the waiting page says when the line is closed (a fieldset of their own in admin).
    CLOSED_FIELDS = ("closed_message", "closed_link_url", "closed_link_text")
    # Words of the operator's own that the waiting page shows, and those a QueueText may give per language.
    TEXT_FIELDS = ("intro", "time_zone", *CLOSED_FIELDS)
    TRANSLATED_FIELDS = ("name", "intro", "closed_message", "closed_link_text")

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

    # What its mirror reads of other tables, read for many queues at once: `Queue.objects.prefetch_related(
    # *Queue.MIRROR_READS)`. Into lists (to_attr): prefetched into the related managers, Django built a
    # queryset for each row and each relation, about half of the tick's CPU with a thousand idle queues.
    MIRROR_READS = (
        models.Prefetch("priority_levels", to_attr="levels_read"),
        models.Prefetch("texts", to_attr="texts_read"),
    )

    def _read(self, relation: str, read: str) -> list[Any]:
        found = getattr(self, read, None)
        return list(getattr(self, relation).all()) if found is None else found

    def policy(self) -> dict[str, Any]:
        """What the Redis scripts need to know about this queue (mirrored into Redis)."""
        fractions = dict(DEFAULT_FRACTIONS)
        fractions.update({lvl.level: lvl.placement_fraction for lvl in self._read("priority_levels", "levels_read")})
        return {
            # Every setting, by its name in the cfg hash (policy_table.Setting.mirror).
            **{setting.mirror: setting.mirrored(getattr(self, setting.name)) for setting in policy_table.SETTINGS},
            "pf1": fractions[1],
            "pf2": fractions[2],
            "pf3": fractions[3],
            "state": self.state,
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
                    for text in self._read("texts", "texts_read")
                },
                separators=(",", ":"),
                sort_keys=True,
            ),
            "codes": "1" if self.takes_codes() else "0",
            "epoch": self.epoch,
            "revision": self.revision,
            "name": self.name,
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
