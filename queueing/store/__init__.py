"""The only package that talks to Redis, one module per concern:

* `connection` the client (one per process) and the script loader; NOSCRIPT is handled there, once
* `keys`      the key builder (every key of a queue under its Redis Cluster hash tag) and ticket ids
* `tracked`   a visitor's transitions in tracked mode (join, status, leave, sessions), with their replies
* `admission` the leader lease, admission, cleanup, capacity reports, pre-queue reordering, adaptive outflow
* `state`     the mirrored policy and the live state's epoch; dropping a queue's state
* `inspect`   reads for stats, the dashboard and tools (snapshots, records, members, wait samples)
* `window`    stateless mode: the window HASH and its scripts
* `health`    the protected site's health counts, per second
* `limits`    the rate limiters' scripts
* `viewers`   websocket servers' socket counts
* `liveness`  when the beat last sent a tick and each worker last ran one

Each script's reply is parsed into named, typed fields next to the wrapper that runs it. Times cross
this boundary as integer milliseconds since the epoch, always supplied by the caller. This package
imports nothing else of the project's; callers use the names re-exported here.
"""

from .admission import (
    Admission,
    AdmitReply,
    CapacityReply,
    CleanupReply,
    OutflowAdaptReply,
    PrequeueEntry,
    admit,
    capacity_report,
    cleanup,
    leader,
    outflow_adapt,
    outflow_adapt_state,
    outflow_reset,
    prequeue_entries,
    reorder,
)
from .connection import LUA_DIR, client, script
from .health import KEEP_SECONDS as HEALTH_KEEP_SECONDS
from .health import HealthCounts, health_report, health_slice_key, health_window
from .inspect import (
    QueueSnapshot,
    TicketRecord,
    WaitSample,
    away_members,
    line_members,
    line_scores,
    sessions_list,
    slot_members,
    snapshot,
    ticket_records,
    wait_samples_drop,
    wait_samples_read,
)
from .keys import SEQ_DIGITS, QueueKeys, key_pattern, limit_key, parse_ticket_id, queue_keys, ticket_id
from .limits import LimitCall, LimitReply, limit_hit
from .liveness import alive_key, alive_mark, beat_lease
from .state import (
    LiveState,
    config_read,
    config_write,
    epoch_start,
    live_state,
    mode_state_clear,
    pow_difficulty,
    queue_delete,
    queue_slugs,
)
from .tracked import (
    NO_MOVES,
    NO_RESTORE,
    ChangeReply,
    CompleteReply,
    Moves,
    Neighbour,
    QueueFigures,
    Restore,
    SessionReply,
    TicketReply,
    TicketState,
    TicketStatus,
    complete,
    join,
    leave,
    neighbours,
    revoke,
    session_start,
    status,
    status_limited,
)
from .viewers import VIEWERS_FRESH_SECONDS, viewers_count, viewers_report
from .window import (
    WINDOW_FIELDS,
    Window,
    WindowStep,
    window_capacity_report,
    window_config_write,
    window_epoch_start,
    window_join,
    window_live_state,
    window_prequeue_close,
    window_read,
    window_read_limited,
    window_tick,
)

__all__ = [
    "HEALTH_KEEP_SECONDS",
    "LUA_DIR",
    "NO_MOVES",
    "NO_RESTORE",
    "SEQ_DIGITS",
    "VIEWERS_FRESH_SECONDS",
    "WINDOW_FIELDS",
    "Admission",
    "AdmitReply",
    "CapacityReply",
    "ChangeReply",
    "CleanupReply",
    "CompleteReply",
    "HealthCounts",
    "LimitCall",
    "LimitReply",
    "LiveState",
    "Moves",
    "Neighbour",
    "OutflowAdaptReply",
    "PrequeueEntry",
    "QueueFigures",
    "QueueKeys",
    "QueueSnapshot",
    "Restore",
    "SessionReply",
    "TicketRecord",
    "TicketReply",
    "TicketState",
    "TicketStatus",
    "WaitSample",
    "Window",
    "WindowStep",
    "admit",
    "alive_key",
    "alive_mark",
    "away_members",
    "beat_lease",
    "capacity_report",
    "cleanup",
    "client",
    "complete",
    "config_read",
    "config_write",
    "epoch_start",
    "health_report",
    "health_slice_key",
    "health_window",
    "join",
    "key_pattern",
    "leader",
    "leave",
    "limit_hit",
    "limit_key",
    "line_members",
    "line_scores",
    "live_state",
    "mode_state_clear",
    "neighbours",
    "outflow_adapt",
    "outflow_adapt_state",
    "outflow_reset",
    "parse_ticket_id",
    "pow_difficulty",
    "prequeue_entries",
    "queue_delete",
    "queue_keys",
    "queue_slugs",
    "reorder",
    "revoke",
    "script",
    "session_start",
    "sessions_list",
    "slot_members",
    "snapshot",
    "status",
    "status_limited",
    "ticket_id",
    "ticket_records",
    "viewers_count",
    "viewers_report",
    "wait_samples_drop",
    "wait_samples_read",
    "window_capacity_report",
    "window_config_write",
    "window_epoch_start",
    "window_join",
    "window_live_state",
    "window_prequeue_close",
    "window_read",
    "window_read_limited",
    "window_tick",
]
