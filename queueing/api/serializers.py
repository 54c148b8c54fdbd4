"""Request and response shapes. Requests are strict: unknown fields and wrong JSON types are refused
(DRF would otherwise read 123 as "123" and "5" as 5), so a client's mistake is a clear 400."""

from __future__ import annotations

import unicodedata
from typing import Any

from django.utils.translation import gettext_noop
from rest_framework import serializers
from rest_framework_simplejwt.serializers import TokenObtainPairSerializer, TokenRefreshSerializer

from .. import health
from ..models import Queue
from .errors import ERROR_CODES, ApiError, unknown_fields


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class BoundedListField(serializers.ListField):
    """A list whose length is checked before its items are (a huge list is refused at once)."""

    def to_internal_value(self, data: Any) -> list[Any]:
        if isinstance(data, list) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return list(super().to_internal_value(data))


class RefusesUnknownFields:
    """Refuses a body that is not an object, or that has fields the operation does not know."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": [gettext_noop("The body must be a JSON object.")]}, code="invalid"
            )
        unknown = set(data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {name: ["This field is not accepted here."] for name in sorted(unknown)}, code="unknown_field"
            )
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictSerializer(RefusesUnknownFields, serializers.Serializer):
    """A request body: an object with only the fields the operation knows (400 unknown_fields otherwise)."""


class StaffTokenObtainSerializer(RefusesUnknownFields, TokenObtainPairSerializer):
    """POST /api/v1/auth/token: username and password, nothing else (settings.SIMPLE_JWT)."""


class StaffTokenRefreshSerializer(RefusesUnknownFields, TokenRefreshSerializer):
    """POST /api/v1/auth/token/refresh: the refresh token, nothing else."""


def _clean_display_name(value: str) -> str:
    # Shown to other visitors later (the line around you): no control or format characters.
    cleaned = "".join(ch for ch in value if unicodedata.category(ch)[0] != "C").strip()
    return " ".join(cleaned.split())


PRIORITY_CODE_MAX = 64
DISPLAY_NAME_MAX = 40
POW_FIELD_MAX = 200


class JoinRequestSerializer(StrictSerializer):
    """The join body, for the schema. Joins are validated by join_request_validate (same rules, no
    per-request deep copy of serializer fields: joins come in by the thousand per second)."""

    priority_code = StrictCharField(required=False, max_length=PRIORITY_CODE_MAX, allow_blank=True)
    display_name = StrictCharField(required=False, max_length=DISPLAY_NAME_MAX, allow_blank=True)
    pow_challenge = StrictCharField(
        required=False, max_length=POW_FIELD_MAX, help_text="A challenge from POST .../challenge (gate on)."
    )
    pow_nonce = StrictCharField(
        required=False,
        max_length=64,
        help_text="A nonce such that SHA-256(pow_challenge + ':' + pow_nonce) starts with `difficulty` zero bits.",
    )


def _text_problem(value: str) -> str | None:
    """What DRF's CharField refuses besides length: NUL (which PostgreSQL cannot store) and lone
    surrogates (which cannot be encoded, so would fail deep in hashing, signing or SQL)."""
    if "\x00" in value:
        return "Null characters are not allowed."
    try:
        value.encode()
    except UnicodeEncodeError:
        return "Surrogate characters are not allowed."
    return None


def join_request_validate(data: Any) -> dict[str, str]:
    """The join body's fields, or an ApiError as StrictSerializer would raise it (unknown_fields, invalid_request)."""
    if not isinstance(data, dict):
        raise ApiError(
            "invalid_request",
            gettext_noop("The body must be a JSON object."),
            fields={"non_field_errors": [gettext_noop("The body must be a JSON object.")]},
        )
    unknown = sorted(set(data) - {"priority_code", "display_name", "pow_challenge", "pow_nonce"})
    if unknown:
        raise ApiError("unknown_fields", unknown_fields(unknown), fields=unknown)
    problems: dict[str, list[str]] = {}
    limits = (
        ("priority_code", PRIORITY_CODE_MAX),
        ("display_name", DISPLAY_NAME_MAX),
        ("pow_challenge", POW_FIELD_MAX),
        ("pow_nonce", 64),
    )
    for name, limit in limits:
        value = data.get(name, "")
        if not isinstance(value, str):
            problems[name] = ["Not a valid string."]
        elif len(value) > limit:
            problems[name] = [f"Ensure this field has no more than {limit} characters."]
        elif problem := _text_problem(value):
            problems[name] = [problem]
    if problems:
        raise ApiError("invalid_request", gettext_noop("The request has invalid fields."), fields=problems)
    return {
        "priority_code": data.get("priority_code", ""),
        "display_name": _clean_display_name(data.get("display_name", "")),
        "pow_challenge": data.get("pow_challenge", ""),
        "pow_nonce": data.get("pow_nonce", ""),
    }


class CodeRequestSerializer(StrictSerializer):
    code = StrictCharField(max_length=PRIORITY_CODE_MAX, help_text="The invite or priority code (case counts).")


def _one_text_field(data: Any, name: str, limit: int) -> str:
    """A body of one required text field, or an ApiError as StrictSerializer would raise it (the waiting
    page's forms answer through these outside DRF)."""
    if not isinstance(data, dict):
        raise ApiError(
            "invalid_request",
            gettext_noop("The body must be a JSON object."),
            fields={"non_field_errors": [gettext_noop("The body must be a JSON object.")]},
        )
    unknown = sorted(set(data) - {name})
    if unknown:
        raise ApiError("unknown_fields", unknown_fields(unknown), fields=unknown)
    value = data.get(name)
    if value is None or value == "":
        problem: str | None = "This field is required."
    elif not isinstance(value, str):
        problem = "Not a valid string."
    elif len(value) > limit:
        problem = f"Ensure this field has no more than {limit} characters."
    else:
        problem = _text_problem(value)
    if problem:
        raise ApiError("invalid_request", gettext_noop("The request has invalid fields."), fields={name: [problem]})
    return str(value)


def code_request_validate(data: Any) -> str:
    """The code a waiting visitor entered."""
    return _one_text_field(data, "code", PRIORITY_CODE_MAX)


EMAIL_MAX = 254


class NotifyRequestSerializer(StrictSerializer):
    email = StrictCharField(
        max_length=EMAIL_MAX, help_text="Where to tell the visitor that their turn is near, and come."
    )


def notify_request_validate(data: Any) -> str:
    """The address a waiting visitor left for its turn notices (checked as an address by the service)."""
    return _one_text_field(data, "email", EMAIL_MAX)


class AccessTokenSerializer(StrictSerializer):
    access_token = StrictCharField(max_length=4096)


class VerifyRequestSerializer(AccessTokenSerializer):
    browser = StrictCharField(
        max_length=200,
        required=False,
        help_text=(
            "A secret of the browser presenting the token (e.g. a random value the site keeps in an HttpOnly "
            "cookie). The first verify that sends one binds the session to that browser; afterwards the "
            "token is valid only with it (reason `bound_elsewhere`), so one admission lets in one browser."
        ),
    )
    rebind = StrictBooleanField(
        required=False,
        default=False,
        help_text="Hand the session over to `browser` on purpose (e.g. the visitor signed in on another device).",
    )


class RevokeSerializer(StrictSerializer):
    ticket_id = StrictCharField(max_length=100)


class CapacitySerializer(StrictSerializer):
    in_use = StrictIntegerField(min_value=0, max_value=1_000_000_000)


class HealthReportSerializer(StrictSerializer):
    requests = StrictIntegerField(
        min_value=0, max_value=health.REPORT_MAX_REQUESTS, help_text="Responses served since the last report."
    )
    # DRF's metaclass takes declared fields off the class, so `.errors` stays the serializer's property.
    errors = StrictIntegerField(  # type: ignore[assignment]
        min_value=0,
        max_value=health.REPORT_MAX_REQUESTS,
        help_text="Of those, server errors (HTTP 5xx, or the request failed). At most `requests`.",
    )
    latency_ms = BoundedListField(
        child=StrictFloatField(min_value=0, max_value=health.LATENCY_MAX_MS),
        required=False,
        max_length=health.REPORT_MAX_SAMPLES,
        help_text=(
            "Their response times in milliseconds: all of them, or a random sample (at most "
            f"{health.REPORT_MAX_SAMPLES:,}) that then stands for all `requests`. At most `requests` entries."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["errors"] > attrs["requests"]:
            raise serializers.ValidationError({"errors": ["Cannot be more than requests."]})
        if len(attrs.get("latency_ms", [])) > attrs["requests"]:
            raise serializers.ValidationError({"latency_ms": ["At most one response time per request."]})
        return attrs


class QueuePatchSerializer(StrictSerializer):
    name = StrictCharField(required=False, max_length=120)
    target_url = StrictCharField(required=False, max_length=500, help_text="Where admitted visitors are sent.")
    intro = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="Words of yours under the queue's name."
    )
    time_zone = StrictCharField(
        required=False,
        max_length=64,
        help_text="The zone of clock times shown without the browser's (e.g. Europe/Berlin).",
    )
    closed_message = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="What visitors read once the line is closed."
    )
    closed_link_url = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="A page to send them on to from there."
    )
    closed_link_text = StrictCharField(required=False, allow_blank=True, max_length=100, help_text="That link's words.")
    capacity_source = serializers.ChoiceField(choices=Queue.CapacitySource.choices, required=False)
    session_ttl = StrictIntegerField(required=False, min_value=1)
    claim_ttl = StrictIntegerField(required=False, min_value=1)
    presence_timeout = StrictIntegerField(required=False, min_value=1)
    abandon_timeout = StrictIntegerField(required=False, min_value=1)
    prequeue_opens_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Joins before this are refused with the time it opens."
    )
    starts_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Admission starts; those who joined before are drawn in order."
    )
    ends_at = serializers.DateTimeField(required=False, allow_null=True, help_text="The queue closes.")
    capacity = StrictIntegerField(required=False, min_value=1)
    outflow_per_minute = StrictFloatField(required=False, min_value=0.1)
    burst = StrictIntegerField(required=False, min_value=1)
    max_waiting = StrictIntegerField(required=False, min_value=0)
    max_tickets_per_address = StrictIntegerField(
        required=False,
        min_value=0,
        help_text="Most live tickets per client address (0: no cap). Counts the tickets joined while a cap is "
        "on; tickets joined before are not counted.",
    )
    pow_difficulty = StrictIntegerField(required=False, min_value=0, max_value=32)
    adaptive_outflow = StrictBooleanField(required=False)
    outflow_min_per_minute = StrictFloatField(required=False, min_value=0.1)
    outflow_max_per_minute = StrictFloatField(required=False, min_value=0.1)
    health_latency_p95_ms = StrictIntegerField(required=False, min_value=1)
    health_error_rate = StrictFloatField(required=False, min_value=0.001, max_value=1)
    adaptive_step_per_minute = StrictFloatField(required=False, min_value=0.1)
    adaptive_decrease_factor = StrictFloatField(required=False, min_value=0.01, max_value=0.99)
    adaptive_interval_seconds = StrictIntegerField(
        required=False, min_value=health.INTERVAL_MIN_SECONDS, max_value=health.INTERVAL_MAX_SECONDS
    )
    adaptive_min_requests = StrictIntegerField(required=False, min_value=1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Give at least one of: " + ", ".join(self.fields) + ".")
        return attrs


class QueueCreateSerializer(QueuePatchSerializer):
    """A new queue: its slug, name and target, and any of the settings QueuePatchSerializer takes, and
    its first state (the rest take their defaults, as in admin)."""

    slug = StrictCharField(max_length=64, help_text="Lowercase letters, digits and '-'; the queue's address.")
    name = StrictCharField(max_length=120)
    target_url = StrictCharField(max_length=500, help_text="Where admitted visitors are sent.")
    state = serializers.ChoiceField(choices=["open", "paused", "closed"], required=False)


class CodesRequestSerializer(StrictSerializer):
    count = StrictIntegerField(min_value=1, max_value=10_000)
    level = StrictIntegerField(min_value=1, max_value=3, help_text="1 elevated, 2 VIP, 3 premium.")
    max_uses = StrictIntegerField(required=False, min_value=1, help_text="Joins per code; absent: unlimited.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class CodesResponseSerializer(serializers.Serializer):
    codes = serializers.ListField(child=serializers.CharField(), help_text="Shown this once: hand them out.")
    level = serializers.IntegerField()
    max_uses = serializers.IntegerField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)


class LevelChangeSerializer(StrictSerializer):
    level = StrictIntegerField(min_value=0, max_value=3, help_text="0 normal, 1 elevated, 2 VIP, 3 premium.")
    name = serializers.CharField(required=False, max_length=50)
    placement_fraction = serializers.FloatField(
        required=False, min_value=0.0, max_value=1.0, help_text="Share of the line a joiner is placed ahead of."
    )
    group = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=150, help_text="A group's name; null: none."
    )


class LevelsPatchSerializer(StrictSerializer):
    levels = LevelChangeSerializer(many=True, allow_empty=False, help_text="The levels to change; others stay.")


class LevelSerializer(serializers.Serializer):
    level = serializers.IntegerField()
    name = serializers.CharField()
    placement_fraction = serializers.FloatField()
    group = serializers.CharField(allow_null=True)


class ApiKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=50, help_text="Which site or service holds it.")
    expiry_date = serializers.DateTimeField(required=False, allow_null=True, help_text="Absent: never expires.")


class ApiKeySerializer(serializers.Serializer):
    prefix = serializers.CharField(help_text="Names the key without revealing it (the start of the key).")
    name = serializers.CharField()
    created = serializers.DateTimeField()
    expiry_date = serializers.DateTimeField(allow_null=True)
    revoked = serializers.BooleanField()


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="Shown this once: the site sends it as `Authorization: Api-Key <key>`.")


# --- Responses (documentation for the schema; views build plain dicts) ------------------------------


class ErrorDetailSerializer(serializers.Serializer):
    """Some codes carry more fields (`fields`, `retry_after_seconds`, `reason`, `opens_at`, a challenge)."""

    code = serializers.ChoiceField(choices=list(ERROR_CODES))
    message = serializers.CharField()
    retry_after_seconds = serializers.IntegerField(required=False, help_text="With Retry-After: seconds to wait.")
    # DRF's metaclass takes declared fields off the class, so `.fields` stays the serializer's property.
    fields = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="invalid_request: the problems per field; unknown_fields: the names refused."
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class WindowResponseSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["stateless"])
    state = serializers.ChoiceField(choices=["open", "paused", "closed"])
    epoch = serializers.IntegerField()
    active_from = serializers.IntegerField(help_text="The lowest active place.")
    active_to = serializers.IntegerField(help_text="The highest active place: places above it wait.")
    issued = serializers.IntegerField(help_text="The last place handed out.")
    queue_length = serializers.IntegerField(help_text="Places handed out above the window.")
    window_size = serializers.IntegerField()
    window_interval = serializers.FloatField(help_text="Seconds between two steps of the window.")
    active_windows = serializers.IntegerField(help_text="A place stays active for this many steps.")
    moved_at = serializers.FloatField(help_text="When the window last moved (epoch s).")
    next_step_in = serializers.FloatField(allow_null=True, help_text="Seconds to the next step; null: standing.")
    opens_in_seconds = serializers.IntegerField(allow_null=True, help_text="Before a scheduled start.")
    admitted_per_minute = serializers.FloatField(help_text="Observed, recently.")
    event_seq = serializers.IntegerField()


class TicketResponseSerializer(serializers.Serializer):
    ticket_id = serializers.CharField()
    status = serializers.ChoiceField(choices=["waiting", "admitted", "active", "completed", "expired"])
    position = serializers.IntegerField(allow_null=True, help_text="1 = next in line; null unless waiting.")
    queue_length = serializers.IntegerField(help_text="Visitors waiting in the queue.")
    estimated_wait_seconds = serializers.IntegerField(
        allow_null=True, help_text="Null when unknown (the queue is paused) or not waiting."
    )
    estimated_wait_range = serializers.ListField(
        child=serializers.IntegerField(),
        min_length=2,
        max_length=2,
        allow_null=True,
        help_text="[low, high] seconds around the estimate: about 8 in 10 of this queue's recent waits fell "
        "within the range its estimate gave (wide until the queue has a record). Null with the estimate.",
    )
    poll_after_seconds = serializers.FloatField(help_text="Poll again after this long (jittered).")
    access_token = serializers.CharField(required=False, help_text="When admitted: show it to the site.")
    redirect_url = serializers.CharField(required=False, help_text="When admitted: go here.")
    expires_at = serializers.IntegerField(required=False, help_text="When admitted: session end (epoch s).")
    reason = serializers.ChoiceField(
        choices=["completed", "left", "abandoned", "expired_claim", "expired_session", "revoked", "expired_window"],
        required=False,
        help_text="When completed or expired: why.",
    )
    queue_state = serializers.ChoiceField(choices=["open", "paused", "closed"])
    opens_in_seconds = serializers.IntegerField(
        required=False, help_text="Before a scheduled start: seconds until admission begins (the pre-queue)."
    )
    place_drawn_at_start = serializers.BooleanField(
        required=False,
        help_text="In a pre-queue (true when present): places are drawn at random at the start, so position "
        "is null until then; the estimate is for the pre-queue's middle place and its range runs from the "
        "first place to the last.",
    )
    event_seq = serializers.IntegerField(
        help_text="The queue's live-event sequence at this answer; websocket events continue from it."
    )
    epoch = serializers.IntegerField(
        help_text="The queue's epoch: a new one begins when Redis lost the queue's state, and event "
        "sequences start again with it. Tickets of earlier epochs get their places back."
    )
    mode = serializers.ChoiceField(choices=["stateless"], required=False, help_text="Stateless queues only.")
    number = serializers.IntegerField(required=False, help_text="Stateless: the ticket's number (its subject).")
    place = serializers.IntegerField(
        required=False, help_text="Stateless: the ticket's place, to compare with the window's active_from/active_to."
    )
    window = WindowResponseSerializer(required=False, help_text="Stateless: the window when this was read.")


class JoinResponseSerializer(TicketResponseSerializer):
    ticket = serializers.CharField(help_text="Send as `Authorization: Bearer <ticket>` to poll.")
    ws_url = serializers.CharField(help_text="Websocket for live updates.")


class StatusResponseSerializer(TicketResponseSerializer):
    ahead = serializers.IntegerField(allow_null=True, help_text="Visitors ahead; null unless waiting.")


class NotifyResponseSerializer(serializers.Serializer):
    email = serializers.CharField(help_text="The address kept (until the turn is told or the ticket ends).")
    near_places = serializers.IntegerField(help_text="Told the turn is near once this few are ahead...")
    near_seconds = serializers.IntegerField(help_text="...or the estimate is this short.")


class CodeResponseSerializer(StatusResponseSerializer):
    ticket = serializers.CharField(help_text="The ticket signed again with its new level: hold this one from now.")
    promoted = serializers.BooleanField(help_text="False when the ticket had the code's level (or higher) already.")
    priority = serializers.IntegerField(help_text="The ticket's priority level now.")
    position_before = serializers.IntegerField(help_text="The place in line before the code (1 = next).")


class NeighbourSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    display_name = serializers.CharField(allow_blank=True)
    you = serializers.BooleanField()


class NeighboursResponseSerializer(serializers.Serializer):
    neighbours = NeighbourSerializer(many=True, help_text="In line order; empty when not waiting.")


class VerifyResponseSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    ticket_id = serializers.CharField(required=False)
    expires_at = serializers.IntegerField(required=False)
    reason = serializers.ChoiceField(
        choices=["expired", "superseded", "revoked", "full", "bound_elsewhere", "invalid"], required=False
    )


class CapacityResponseSerializer(serializers.Serializer):
    capacity = serializers.IntegerField()
    in_use = serializers.IntegerField()
    capacity_source = serializers.CharField()


class QueueSerializer(serializers.ModelSerializer):
    """A queue's admission policy as the staff API shows it."""

    class Meta:
        model = Queue
        fields = (
            "slug",
            "name",
            "target_url",
            "state",
            "intro",
            "time_zone",
            "closed_message",
            "closed_link_url",
            "closed_link_text",
            "mode",
            "capacity",
            "capacity_source",
            "session_ttl",
            "claim_ttl",
            "presence_timeout",
            "abandon_timeout",
            "prequeue_opens_at",
            "starts_at",
            "ends_at",
            "outflow_per_minute",
            "burst",
            "max_waiting",
            "max_tickets_per_address",
            "pow_difficulty",
            *Queue.ADAPTIVE_FIELDS,
        )
        read_only_fields = fields


class SiteHealthSerializer(serializers.Serializer):
    window_seconds = serializers.IntegerField(help_text="The figures cover this many last seconds.")
    requests = serializers.IntegerField(help_text="Responses the site reported in the window.")
    errors = serializers.IntegerField(help_text="Of those, server errors (5xx).")  # type: ignore[assignment]
    error_rate = serializers.FloatField(allow_null=True, help_text="errors / requests; null without requests.")
    p95_latency_ms = serializers.FloatField(
        allow_null=True, help_text="95th percentile response time; null when no times were reported."
    )


class ShuffleResponseSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    commitment = serializers.CharField(help_text="SHA-256 (hex) of the seed, published before the pre-queue.")
    committed_at = serializers.DateTimeField()
    revealed = serializers.BooleanField()
    seed = serializers.CharField(required=False, help_text="From the start on.")
    revealed_at = serializers.DateTimeField(required=False)
    tickets = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()),
        required=False,
        help_text="[sequence number, priority level] of every pre-queue ticket.",
    )
    order = serializers.ListField(child=serializers.IntegerField(), required=False)


class ChallengeResponseSerializer(serializers.Serializer):
    challenge = serializers.CharField(help_text="Opaque, signed; send it back as pow_challenge.")
    difficulty = serializers.IntegerField(help_text="Leading zero bits the hash must have (0: gate off).")
    algorithm = serializers.CharField(help_text="Always sha256.")
    expires_in = serializers.IntegerField(help_text="Seconds the challenge stays valid.")


class StatsResponseSerializer(serializers.Serializer):
    slug = serializers.CharField()
    state = serializers.CharField()
    waiting = serializers.IntegerField(help_text="Visitors in line, including those parked as absent.")
    waiting_away = serializers.IntegerField(help_text="Of those, parked: absent when they reached the head.")
    head_position = serializers.IntegerField(
        allow_null=True,
        help_text="The sequence number (ticket number, the digits before the dot of a ticket id) of the "
        "visitor at the head of the line, next to be let in; null when nobody waits.",
    )
    admitted = serializers.IntegerField()
    active = serializers.IntegerField()
    capacity = serializers.IntegerField()
    capacity_in_use = serializers.IntegerField()
    outflow_per_minute_configured = serializers.FloatField()
    outflow_per_minute_observed = serializers.FloatField()
    outflow_per_minute_effective = serializers.FloatField(
        help_text="The outflow admission follows now: the adapted one when adaptive outflow is on, else the "
        "configured one."
    )
    adaptive_outflow = serializers.BooleanField()
    site_health = SiteHealthSerializer(
        help_text="The protected site's reported responses over the adjustment interval (adaptive outflow)."
    )
    average_wait_seconds = serializers.FloatField(allow_null=True)
    average_service_seconds = serializers.FloatField(allow_null=True)
    viewers = serializers.IntegerField(help_text="Websockets watching the queue now (summed over servers).")
    epoch = serializers.IntegerField(help_text="The live state's epoch: it grows when Redis lost the queue's state.")
    totals = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Since the epoch began: joined, admitted, completed, expired, ..., and restored (tickets of "
        "an earlier epoch given their places back), restored_sessions and leader_terms (leader leases taken).",
    )
