"""What a service refuses with; the API and the pages map each to their answer."""

from __future__ import annotations


class QueueNotOpen(Exception):
    """The queue's pre-queue has not opened yet."""


class ProofOfWorkRequired(Exception):
    """The queue's gate is on and the join showed no (or too little) proof of work. `bits`: what the gate asks
    of this client (more than the queue's difficulty for an address holding live tickets); 0: the queue's."""

    def __init__(self, slug: str, bits: int = 0) -> None:
        super().__init__(slug)
        self.bits = bits


class ProofOfWorkReused(Exception):
    """The challenge was already spent on a join."""


class TicketCapReached(Exception):
    """The client address already holds the queue's max_tickets_per_address live tickets."""


class QueueNotFound(Exception):
    pass


class QueueClosed(Exception):
    pass


class QueueFull(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__("The queue is full.")
        self.retry_after = retry_after


class InvalidPriorityCode(Exception):
    pass


class TicketNotFound(Exception):
    pass


class NotInLine(Exception):
    """The ticket is admitted, in a session or finished: what was asked moves only visitors in line."""


class NoticesFull(Exception):
    """The queue keeps as many turn notices as it may (WR_NOTIFY_MAX_PER_QUEUE): no new address is kept."""


class NotInStatelessMode(Exception):
    """What was asked needs per-visitor state, which a stateless queue does not keep."""


class WrongMode(Exception):
    """The queue runs in the other mode (it changed a moment ago): join it the other way (modes.py)."""


class NoPriorityLanes(InvalidPriorityCode):
    """A stateless queue has no priority lanes, so no code can place anyone."""


# What a join may be refused with (the API maps each to its error code). WrongMode reaches a caller only
# when the queue changed mode twice during one join (modes.join retries once): try again.
JOIN_REFUSALS = (
    QueueNotOpen,
    ProofOfWorkRequired,
    ProofOfWorkReused,
    TicketCapReached,
    QueueNotFound,
    QueueClosed,
    QueueFull,
    InvalidPriorityCode,
    WrongMode,
)
