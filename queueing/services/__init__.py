"""Every write, one module per concern. A service performs one transition (one Lua script via `store`)
and afterwards whatever that transition causes: a freed slot runs admission at once (seed 004) rather
than waiting for the tick, and the live events go out (`realtime`: admitted, expired, queue_move).
Services take `now` (seconds since the epoch) so that tests can drive the clock; callers in production
leave it out.

* `errors`    what a service refuses with
* `audit`     the audit log of queue changes
* `recovery`  the policy mirrored into Redis, epochs and restored places after lost state (SPEC 3.6)
* `schedule`  the committed seed of a scheduled start and the pre-queue shuffle (SPEC 3.3)
* `config`    create, update, pause, resume, priority levels, mode switches, API keys, deletion
* `admission` the leader lease, ticks (admit, or move the window), the adaptive outflow, site health
* `joins`     joins (tracked and stateless), priority codes, the proof-of-work challenge, leaving
* `sessions`  verify, complete and revoke sessions; the site's capacity reports
* `cleanup`   expiry in bounded rounds, orphaned state, periodic snapshots
* `viewers`   websocket servers' socket counts
* `liveness`  the marks that tell a stalled worker or beat from a healthy one
"""

from .admission import (
    ADAPTIVE_ACTOR,
    OutflowStep,
    instance_id,
    queue_admit,
    queue_outflow_adapt,
    queue_schedule_step,
    queue_tick,
    queue_window_tick,
    queue_window_tick_lead,
    queues_tick,
    site_health_report,
)
from .audit import (
    EDITABLE_FIELDS,
    audit_change,
    queue_change_record,
    queue_values,
)
from .cleanup import (
    ORPHAN_GRACE_SECONDS,
    queue_cleanup,
    queues_cleanup,
    queues_orphans_delete,
    queues_snapshot_broadcast,
    wait_samples_drop,
)
from .codes import (
    PRIORITY_CODES_MAX,
    Promotion,
    priority_code_release,
    priority_code_reserve,
    priority_codes_generate,
    priority_for_user,
    ticket_promote,
)
from .config import (
    OUTFLOW_POLICY_FIELDS,
    api_key_create,
    api_key_revoke,
    outflow_adaptation_reset,
    queue_configure,
    queue_delete,
    queue_pause,
    queue_priority_levels_edit,
    queue_priority_levels_ensure,
    queue_priority_levels_update,
    queue_resume,
    queue_update,
)
from .errors import (
    JOIN_REFUSALS,
    InvalidPriorityCode,
    NoPriorityLanes,
    NoticesFull,
    NotInLine,
    NotInStatelessMode,
    ProofOfWorkRequired,
    ProofOfWorkReused,
    QueueClosed,
    QueueFull,
    QueueNotFound,
    QueueNotOpen,
    TicketCapReached,
    TicketNotFound,
    WrongMode,
)
from .joins import (
    JoinResult,
    join_plan,
    pow_challenge_issue,
    pow_difficulty_get,
    queue_join,
    queue_join_flow,
    queue_join_stateless,
    stateless_join_flow,
    stateless_join_plan,
    ticket_leave,
)
from .liveness import beat_alive_mark, beat_lease_hold, worker_alive_mark
from .notices import PlaceOffer, place_link_read, place_link_take, turn_notice_request, turn_notices_send
from .recovery import (
    needs_sync,
    policy_flow,
    queue_config_sync,
    queue_live_state_ensure,
    with_policy,
)
from .schedule import (
    queue_prequeue_shuffle,
    shuffle_commit_ensure,
)
from .sessions import (
    BROWSER_SECRET_MAX,
    VerifyResult,
    browser_digest,
    capacity_report,
    session_complete,
    session_revoke,
    session_verify,
)

__all__ = [
    "ADAPTIVE_ACTOR",
    "BROWSER_SECRET_MAX",
    "EDITABLE_FIELDS",
    "JOIN_REFUSALS",
    "ORPHAN_GRACE_SECONDS",
    "OUTFLOW_POLICY_FIELDS",
    "PRIORITY_CODES_MAX",
    "InvalidPriorityCode",
    "JoinResult",
    "NoPriorityLanes",
    "NotInLine",
    "NotInStatelessMode",
    "NoticesFull",
    "OutflowStep",
    "PlaceOffer",
    "Promotion",
    "ProofOfWorkRequired",
    "ProofOfWorkReused",
    "QueueClosed",
    "QueueFull",
    "QueueNotFound",
    "QueueNotOpen",
    "TicketCapReached",
    "TicketNotFound",
    "VerifyResult",
    "WrongMode",
    "api_key_create",
    "api_key_revoke",
    "audit_change",
    "beat_alive_mark",
    "beat_lease_hold",
    "browser_digest",
    "capacity_report",
    "instance_id",
    "join_plan",
    "needs_sync",
    "outflow_adaptation_reset",
    "place_link_read",
    "place_link_take",
    "policy_flow",
    "pow_challenge_issue",
    "pow_difficulty_get",
    "priority_code_release",
    "priority_code_reserve",
    "priority_codes_generate",
    "priority_for_user",
    "queue_admit",
    "queue_change_record",
    "queue_cleanup",
    "queue_config_sync",
    "queue_configure",
    "queue_delete",
    "queue_join",
    "queue_join_flow",
    "queue_join_stateless",
    "queue_live_state_ensure",
    "queue_outflow_adapt",
    "queue_pause",
    "queue_prequeue_shuffle",
    "queue_priority_levels_edit",
    "queue_priority_levels_ensure",
    "queue_priority_levels_update",
    "queue_resume",
    "queue_schedule_step",
    "queue_tick",
    "queue_update",
    "queue_values",
    "queue_window_tick",
    "queue_window_tick_lead",
    "queues_cleanup",
    "queues_orphans_delete",
    "queues_snapshot_broadcast",
    "queues_tick",
    "session_complete",
    "session_revoke",
    "session_verify",
    "shuffle_commit_ensure",
    "site_health_report",
    "stateless_join_flow",
    "stateless_join_plan",
    "ticket_leave",
    "ticket_promote",
    "turn_notice_request",
    "turn_notices_send",
    "wait_samples_drop",
    "with_policy",
    "worker_alive_mark",
]
