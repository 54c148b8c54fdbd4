"""Queue configuration: rooms, priority levels and codes, API keys, signing keys, the change log.

Live state (who waits, who holds a slot) is in Redis, never here. Nothing in `save()` has side effects:
services write a queue and then mirror its policy to Redis (`services.queue_config_sync`).

By concern: `queue` (a queue's policy, schedule, mode and page), `access` (priority levels and codes, API
keys, signing keys), `records` (the change log, finished tickets, draws, turn notices, texts per language).
Migrations name validators and defaults by this package's names, so they are all here.
"""

from queueing.policy_table import ADAPTIVE_INTERVAL_MAX_SECONDS, ADAPTIVE_INTERVAL_MIN_SECONDS, POW_MAX_BITS

from .access import (
    PRIORITY_CODE_BYTES,
    ManagementKey,
    PriorityCode,
    PriorityLevel,
    QueueAPIKey,
    SigningKey,
    priority_code_new,
)
from .queue import (
    SLUG_VALIDATOR,
    Queue,
    _server_time_zone,
    validate_target_url,
    validate_time_zone,
)
from .records import FinishedTicket, PlaceLink, QueueChange, QueueShuffle, QueueText, TurnNotice

__all__ = [
    "ADAPTIVE_INTERVAL_MAX_SECONDS",
    "ADAPTIVE_INTERVAL_MIN_SECONDS",
    "POW_MAX_BITS",
    "PRIORITY_CODE_BYTES",
    "SLUG_VALIDATOR",
    "FinishedTicket",
    "ManagementKey",
    "PlaceLink",
    "PriorityCode",
    "PriorityLevel",
    "Queue",
    "QueueAPIKey",
    "QueueChange",
    "QueueShuffle",
    "QueueText",
    "SigningKey",
    "TurnNotice",
    "_server_time_zone",
    "priority_code_new",
    "validate_target_url",
    "validate_time_zone",
]
