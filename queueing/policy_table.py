"""A queue's settings, one entry each: the one table that the model's fields and mirrored policy, the staff
API's fields, configure_queue's options and the scripts' decoder of the packed policy are made from.

Adding a setting is one entry here plus its use: the model gets its field (then `makemigrations`), admin
its form field, the staff API and `configure_queue` their own, and, with `lua` set, the scripts find it as
`p.<lua>` in the policy they read (lua/_policy.lua). A setting the scripts read from the queue's cfg hash
themselves (the adaptive outflow's) needs no `lua`: every setting is mirrored there by its `mirror` name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from django.db import models

Kind = Literal["int", "small", "float", "bool", "choice", "moment"]
Group = Literal["admission", "adaptive", "stateless"]

# Bounds of a queue's adaptive outflow adjustment interval (health.py judges the site over one interval).
ADAPTIVE_INTERVAL_MIN_SECONDS = 2
ADAPTIVE_INTERVAL_MAX_SECONDS = 120
POW_MAX_BITS = 32  # about 4 x 10^9 hashes on average: far beyond any honest client


class CapacitySource(models.TextChoices):
    COUNTED = "counted", "Counted by the waiting room"
    REPORTED = "reported", "Reported by the protected site"


class Mode(models.TextChoices):
    TRACKED = "tracked", "Tracked: every visitor's place, presence and session in Redis"
    STATELESS = "stateless", "Stateless: a numbered ticket and a sliding window (the largest drops)"


@dataclass(frozen=True)
class Setting:
    """One of a queue's settings. `kind`: int (a positive integer), small (a positive small integer), float,
    bool, choice (one of `choices`), moment (a date and time, or none). `default` None: none unless given
    (nullable). `low` and `high` bound it wherever it is taken. `help` is admin's; `brief`, one line, the
    command line's and the API's. `lua`: the name the scripts read it by (`p.<lua>`), with `lua_default`
    when the packed policy lacks it (a state written before the setting existed); '' when no script
    reads it from the packed policy."""

    name: str
    kind: Kind
    default: Any
    help: str
    brief: str
    label: str = ""
    low: float | None = None
    high: float | None = None
    choices: type[models.TextChoices] | None = None
    group: Group = "admission"
    lua: str = ""
    lua_default: Any = None

    @property
    def mirror(self) -> str:
        """Its name in the queue's cfg hash in Redis (a moment as milliseconds since the epoch)."""
        return f"{self.name}_ms" if self.kind == "moment" else self.name

    def mirrored(self, value: Any) -> Any:
        """Its value as the cfg hash holds it: a moment in milliseconds (0: none), a bool "1" or "0", an
        empty value ""."""
        if self.kind == "moment":
            return int(value.timestamp() * 1000) if value else 0
        if self.kind == "bool":
            return "1" if value else "0"
        return "" if value is None else value

    @property
    def text(self) -> bool:
        """Whether the scripts read it as text (else as a number)."""
        return self.kind in ("bool", "choice")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "capacity",
        "int",
        100,
        "Most visitors on the protected site at once (let in and not yet finished). The next one goes in when "
        "one finishes or their time runs out.",
        "Most visitors holding a slot at once",
        low=1,
        high=10_000_000,
        lua="capacity",
        lua_default=1,
    ),
    Setting(
        "capacity_source",
        "choice",
        CapacitySource.COUNTED.value,
        "Counted: the waiting room counts who is on the site (let in until they finish or their time runs out). "
        "Reported: the site tells it its own count (PUT /api/v1/queues/<slug>/capacity).",
        "Who counts the sessions on the site: the waiting room (counted) or the site itself (reported)",
        choices=CapacitySource,
        lua="capacity_source",
    ),
    Setting(
        "outflow_per_minute",
        "float",
        60.0,
        "Most visitors let in per minute, spread evenly. Pause the queue to let nobody in.",
        "Admissions per minute",
        low=0.1,
        high=1_000_000,
        lua="outflow_configured",
    ),
    Setting(
        "burst",
        "int",
        10,
        "Most visitors let in at once after a quiet spell (paused, nobody waiting, or the site full). A late "
        "admission round still lets in those the outflow owes.",
        "Most admitted at once after a quiet spell",
        low=1,
        high=1_000_000,
        lua="burst",
        lua_default=1,
    ),
    Setting(
        "session_ttl",
        "int",
        900,
        "Hard length of a session, counted from admission.",
        "Session length in seconds",
        label="session TTL (s)",
        low=10,
        high=7 * 24 * 3600,
        lua="session_ttl",
    ),
    Setting(
        "claim_ttl",
        "int",
        120,
        "Time an admitted visitor has to reach the protected site before the slot is freed.",
        "Seconds an admitted visitor has to arrive",
        label="claim TTL (s)",
        low=5,
        lua="claim_ttl",
    ),
    Setting(
        "presence_timeout",
        "int",
        60,
        "A waiting visitor unseen this long is skipped by admission (keeps its place).",
        "Seconds unseen before admission skips a visitor",
        label="presence timeout (s)",
        low=5,
        lua="presence_timeout",
    ),
    Setting(
        "abandon_timeout",
        "int",
        600,
        "A waiting visitor unseen this long leaves the queue.",
        "Seconds unseen before a waiting ticket expires",
        label="abandon timeout (s)",
        low=10,
        lua="abandon_timeout",
    ),
    Setting(
        "max_waiting",
        "int",
        0,
        "Joins beyond this many waiting get 'queue_full'. 0 means no limit.",
        "Most visitors waiting (0: no limit)",
        low=0,
        lua="max_waiting",
    ),
    Setting(
        "max_tickets_per_address",
        "int",
        0,
        "Joins from an address that already holds this many live tickets for this queue are refused "
        "('ticket_cap_reached'). 0 means no cap; mind shared networks (offices, mobile carriers).",
        "Most live tickets per client address (0: no cap; counts the tickets joined while a cap is on)",
        label="live tickets per client address",
        low=0,
        lua="max_per_address",
    ),
    Setting(
        "pow_difficulty",
        "small",
        0,
        "Before joining, a client must find a nonce whose SHA-256 has this many leading zero bits (each bit "
        "doubles the work: 16 takes a phone about a second). 0 turns the gate off. Raise it live during a flood.",
        "Proof-of-work leading zero bits before a join (0: off)",
        label="proof-of-work difficulty (bits)",
        low=0,
        high=POW_MAX_BITS,
        lua="pow_difficulty",
    ),
    Setting(
        "prequeue_opens_at",
        "moment",
        None,
        "Joins before this time are refused with the time it opens (needs a start time).",
        "When joins open, before the start; those before are refused with the time it opens",
        label="pre-queue opens at",
        lua="prequeue_opens_ms",
    ),
    Setting(
        "starts_at",
        "moment",
        None,
        "Admission starts at this time; visitors who join before wait in the pre-queue with a countdown, and at "
        "this time are put in a random order that anyone can check afterwards (its commitment is published "
        "while they wait).",
        "When admission starts; those who joined before are drawn in order",
        lua="starts_at_ms",
    ),
    Setting(
        "ends_at",
        "moment",
        None,
        "The queue closes at this time; visitors still waiting are told.",
        "When the queue closes",
        lua="ends_ms",
    ),
    # Adaptive outflow (optional): the admission tick follows the protected site's health within bounds.
    Setting(
        "adaptive_outflow",
        "bool",
        False,
        "Let the admission tick adapt the outflow to the protected site's reported response times and errors: "
        "a step up while healthy, a cut by the decrease factor when the p95 latency or the error rate passes its "
        "threshold, always between the minimum and the maximum below.",
        "Follow the protected site's health (adaptive outflow): on | off",
        group="adaptive",
        lua="adaptive",
    ),
    Setting(
        "outflow_min_per_minute",
        "float",
        None,
        "The adaptive outflow never goes below this (required when adaptive outflow is on).",
        "Adaptive outflow: never below this",
        label="outflow minimum (a minute)",
        low=0.1,
        high=1_000_000,
        group="adaptive",
    ),
    Setting(
        "outflow_max_per_minute",
        "float",
        None,
        "The adaptive outflow never goes above this (required when adaptive outflow is on).",
        "Adaptive outflow: never above this",
        label="outflow maximum (a minute)",
        low=0.1,
        high=1_000_000,
        group="adaptive",
    ),
    Setting(
        "health_latency_p95_ms",
        "int",
        1000,
        "The site is unhealthy when the 95th percentile of its response times passes this.",
        "Adaptive outflow: unhealthy above this p95 response time (ms)",
        label="p95 latency threshold (ms)",
        low=1,
        high=600_000,
        group="adaptive",
    ),
    Setting(
        "health_error_rate",
        "float",
        0.05,
        "The site is unhealthy when this share of its responses (0.05 = 5%) are server errors (5xx).",
        "Adaptive outflow: unhealthy above this share of 5xx (0.05 = 5%)",
        label="error rate threshold",
        low=0.001,
        high=1.0,
        group="adaptive",
    ),
    Setting(
        "adaptive_step_per_minute",
        "float",
        6.0,
        "Added to the outflow at each adjustment while the site is healthy and visitors are waiting.",
        "Adaptive outflow: added per adjustment while healthy",
        label="increase step (a minute)",
        low=0.1,
        high=1_000_000,
        group="adaptive",
    ),
    Setting(
        "adaptive_decrease_factor",
        "float",
        0.7,
        "The outflow is multiplied by this (between 0 and 1) at each adjustment while the site is unhealthy.",
        "Adaptive outflow: multiplied by this per adjustment while unhealthy",
        label="decrease factor",
        low=0.01,
        high=0.99,
        group="adaptive",
    ),
    Setting(
        "adaptive_interval_seconds",
        "int",
        10,
        "At most one adjustment this often, judged on the site's reports of the last interval.",
        "Adaptive outflow: seconds between adjustments",
        label="adjustment interval (s)",
        low=ADAPTIVE_INTERVAL_MIN_SECONDS,
        high=ADAPTIVE_INTERVAL_MAX_SECONDS,
        group="adaptive",
    ),
    Setting(
        "adaptive_min_requests",
        "int",
        20,
        "Fewer reported requests than this in an interval are too few to cut the outflow on (one slow request "
        "of two must not halve it).",
        "Adaptive outflow: fewest responses in an interval to cut on",
        label="minimum requests",
        low=1,
        group="adaptive",
    ),
    # Stateless mode: a numbered ticket and a window of numbers (lua/window/ reads these from cfg).
    Setting(
        "mode",
        "choice",
        Mode.TRACKED.value,
        "Tracked (the default) keeps each visitor's place, presence and session. Stateless keeps nothing per "
        "visitor, for the largest drops: a ticket is its number, and a window of numbers moves forward by the "
        "window size every window interval. Stateless has no priorities, presence, capacity counting, "
        "revocation or neighbours. Switching the mode of a queue with people in it sends them to join again.",
        "Tracked (each visitor's place and session), or stateless (a numbered ticket and a sliding window, "
        "for the largest drops)",
        choices=Mode,
        group="stateless",
        lua="mode",
    ),
    Setting(
        "window_size",
        "int",
        100,
        "Stateless mode: how many numbers each step of the window lets in.",
        "Stateless mode: numbers let in per step of the window",
        low=1,
        high=10_000_000,
        group="stateless",
    ),
    Setting(
        "window_interval",
        "int",
        10,
        "Stateless mode: seconds between two steps of the window (outflow = size / interval).",
        "Stateless mode: seconds between steps",
        label="window interval (s)",
        low=1,
        high=3600,
        group="stateless",
    ),
    Setting(
        "active_windows",
        "small",
        2,
        "Stateless mode: a number stays active for this many steps (at least 2 lets a visitor who joined just "
        "before a step still get through).",
        "Stateless mode: steps a number stays active",
        low=1,
        high=100,
        group="stateless",
    ),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


def names(group: Group | None = None) -> tuple[str, ...]:
    """The settings' names, in the table's order (of one group)."""
    return tuple(setting.name for setting in SETTINGS if group is None or setting.group == group)


def _lua_literal(value: Any) -> str:
    if value is None or value is False:
        return "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def lua_layout() -> str:
    """The settings the scripts read from the packed policy, as lua/_policy.lua takes them:
    `{cfg field, the policy's name, default when absent, text}` each."""
    rows = []
    for setting in SETTINGS:
        if not setting.lua:
            continue
        default = setting.lua_default if setting.lua_default is not None else setting.default
        if setting.kind == "moment":
            default = 0
        elif setting.kind == "bool":
            default = "1" if default else "0"
        rows.append(
            f"{{{_lua_literal(setting.mirror)}, {_lua_literal(setting.lua)}, {_lua_literal(default)}, "
            f"{'true' if setting.text else 'false'}}}"
        )
    return "{\n  " + ",\n  ".join(rows) + ",\n}"
