"""Response shapes: documentation for the schema (views build plain dicts, and tests check them against
these)."""

from __future__ import annotations

from rest_framework import serializers

from ..models import Queue
from .errors import ERROR_CODES


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


# Why a ticket finished (the API's `reason`; its schema's FinishReasonEnum, waitingroom_site/apischema.py).
FINISH_REASONS = [
    "completed",
    "left",
    "abandoned",
    "expired_claim",
    "expired_session",
    "revoked",
    "expired_window",
    "expired_epoch",
]


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
        choices=FINISH_REASONS,
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
    held_slot_ends_at = serializers.IntegerField(
        required=False,
        help_text="While waiting, when the estimate rests on a slot held far longer than this queue's visitors "
        "hold theirs (someone who seems to have left the site without finishing): that slot frees at the "
        "latest at this time (epoch s), sooner if they finish; the range then starts at 0.",
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
    position_before = serializers.IntegerField(
        allow_null=True,
        help_text="The place in line before the code (1 = next); null in a pre-queue (`place_drawn_at_start`), "
        "where the code's level puts the ticket ahead of every lower level when the places are drawn at the start.",
    )


class NeighbourSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    display_name = serializers.CharField(allow_blank=True)
    you = serializers.BooleanField()


class NeighboursResponseSerializer(serializers.Serializer):
    neighbours = NeighbourSerializer(
        many=True,
        help_text="In line order; empty when not waiting, and before a scheduled start (the draw makes the order).",
    )


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
            *Queue.POLICY_FIELDS,
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
