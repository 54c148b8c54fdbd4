"""Random sequences of joins, polls, leaves, ticks, verifies, completes, revokes, pauses and time passing,
against the real scripts in Redis; after every step the engine's invariants must hold."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from queueing import services, store, tokens
from queueing.store import TicketStatus

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)

VISITORS = [f"visitor-{i}" for i in range(12)]
CAPACITY = 3
POLICY = {
    "state": "open",
    "capacity": CAPACITY,
    "capacity_source": "counted",
    "outflow_per_minute": 30,
    "burst": 2,
    "session_ttl": 60,
    "claim_ttl": 20,
    "presence_timeout": 30,
    "abandon_timeout": 90,
    "max_waiting": 0,
    "target_url": "/x",
    "epoch": 1,
    "pf1": 0.1,
    "pf2": 0.5,
    "pf3": 1.0,
}
FINISHED_REASONS = ("completed", "expired_claim", "expired_session", "abandoned", "left", "revoked")


class QueueMachine(RuleBasedStateMachine):
    @initialize()
    def open_queue(self) -> None:
        self.slug = f"hyp-{uuid.uuid4().hex[:10]}"
        store.config_write(self.slug, dict(POLICY))
        store.epoch_start(self.slug, epoch=1, floor=0, seq_max=10**9)
        # A whole second (presence works in whole seconds) a year ahead: access tokens carry expiries on
        # this clock, and PyJWT checks them against real time, which must never catch up mid-run.
        self.now = float(int(time.time())) + 365 * 86400 + 0.25
        self.tickets: dict[str, store.TicketState] = {}
        self.paused = False

    def vk(self, name: str) -> str:
        return tokens.visitor_key(f"{self.slug}:{name}")

    def current(self, name: str) -> store.TicketState | None:
        known = self.tickets.get(name)
        if known is None:
            return None
        reply = store.status(self.slug, visitor_key=self.vk(name), seq=known.seq, now_ms=int(self.now * 1000))
        if reply.ticket is not None:
            self.tickets[name] = reply.ticket
        return reply.ticket

    def access_token(self, ticket: store.TicketState) -> str:
        return tokens.access_token_issue(
            slug=self.slug, ticket_id=ticket.ticket_id, fence=ticket.fence, expires_ms=ticket.expires_ms
        )

    @rule(name=st.sampled_from(VISITORS), priority=st.sampled_from([0, 0, 1, 2, 2, 3]))
    def join(self, name: str, priority: int) -> None:
        result = services.queue_join(slug=self.slug, visitor_key=self.vk(name), priority=priority, now=self.now)
        previous = self.tickets.get(name)
        if not result.created:
            assert previous is not None and result.ticket.ticket_id == previous.ticket_id
        self.tickets[name] = result.ticket

    @rule(name=st.sampled_from(VISITORS))
    def poll(self, name: str) -> None:
        self.current(name)

    @rule(name=st.sampled_from(VISITORS))
    def leave(self, name: str) -> None:
        ticket = self.tickets.get(name)
        if ticket is not None:
            store.leave(self.slug, visitor_key=self.vk(name), seq=ticket.seq, now_ms=int(self.now * 1000))

    @rule(names=st.lists(st.sampled_from(VISITORS), min_size=2, max_size=6))
    def crowd_joins(self, names: list[str]) -> None:
        for i, name in enumerate(names):
            self.join(name, 2 if i % 3 == 2 else 0)

    @rule()
    def tick(self) -> None:
        services.queue_admit(slug=self.slug, now=self.now)

    @rule(seconds=st.sampled_from([1, 2, 4]))
    def beat(self, seconds: int) -> None:
        """What the worker does: time passes and the admission tick runs."""
        self.now += seconds
        services.queue_admit(slug=self.slug, now=self.now)

    @rule()
    def cleanup(self) -> None:
        services.queue_cleanup(slug=self.slug, now=self.now)

    @rule(name=st.sampled_from(VISITORS))
    def verify(self, name: str) -> None:
        ticket = self.current(name)
        if ticket is not None and ticket.status.holds_slot:
            result = services.session_verify(slug=self.slug, raw_token=self.access_token(ticket), now=self.now)
            assert result.valid

    @rule(name=st.sampled_from(VISITORS))
    def complete(self, name: str) -> None:
        ticket = self.current(name)
        if ticket is not None and ticket.status.holds_slot:
            claims = tokens.access_token_decode(self.access_token(ticket), slug=self.slug)
            assert services.session_complete(slug=self.slug, claims=claims, now=self.now) == "completed"

    @rule(name=st.sampled_from(VISITORS))
    def revoke(self, name: str) -> None:
        ticket = self.tickets.get(name)
        if ticket is not None:
            services.session_revoke(slug=self.slug, ticket_id=ticket.ticket_id, now=self.now)

    @rule(seconds=st.sampled_from([1, 5, 15, 25, 35, 65, 100]))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds

    @precondition(lambda self: hasattr(self, "slug"))
    @rule()
    def pause_or_resume(self) -> None:
        self.paused = not self.paused
        store.config_write(self.slug, {"state": "paused" if self.paused else "open"})

    # --- invariants ------------------------------------------------------------------------------------

    def state(
        self,
    ) -> tuple[list[str], dict[str, float], list[str], list[str], list[store.TicketRecord], dict[str, str]]:
        """(waiting: in line or parked, the line's scores, claims, sessions, records, counters)."""
        scores = dict(store.line_read(self.slug)[1])
        line = list(scores) + store.away_members(self.slug)
        claims, sessions = store.slot_members(self.slug)
        return line, scores, claims, sessions, store.ticket_records(self.slug), store.snapshot(self.slug).stats

    @invariant()
    def the_engine_s_invariants_hold(self) -> None:
        """Read once per step (a step's reads were a third of the test's time when each invariant read the
        whole state again), then each invariant in turn."""
        if not hasattr(self, "slug"):
            return
        line, scores, claims, sessions, records, stats = self.state()
        self.slots_never_exceed_capacity(claims, sessions)
        self.every_ticket_is_in_exactly_the_place_its_status_says(line, claims, sessions, records)
        self.first_come_first_served_within_a_priority_level(records, scores)
        self.counters_add_up(line, claims, sessions, stats)

    @staticmethod
    def slots_never_exceed_capacity(claims: list[str], sessions: list[str]) -> None:
        assert len(claims) + len(sessions) <= CAPACITY

    @staticmethod
    def every_ticket_is_in_exactly_the_place_its_status_says(
        line: list[str], claims: list[str], sessions: list[str], records: list[store.TicketRecord]
    ) -> None:
        assert len(line) == len(set(line)), "a ticket both in line and parked"
        assert not set(line) & (set(claims) | set(sessions)), "a ticket both waiting and admitted"
        assert not set(claims) & set(sessions)
        where = {
            TicketStatus.WAITING: set(line),
            TicketStatus.ADMITTED: set(claims),
            TicketStatus.ACTIVE: set(sessions),
        }
        for record in records:
            for status, members in where.items():
                assert (record.ticket_id in members) == (record.status == status), (record, status)
        live = {r.ticket_id for r in records if r.status <= TicketStatus.ACTIVE}
        assert live == set(line) | set(claims) | set(sessions)

    @staticmethod
    def first_come_first_served_within_a_priority_level(
        all_records: list[store.TicketRecord], scores: dict[str, float]
    ) -> None:
        # Parked tickets count at the place they will return to: the line score kept in their record.
        records = {r.ticket_id: r for r in all_records if r.status == TicketStatus.WAITING}
        place = {tid: (scores.get(tid, r.line_score), tid) for tid, r in records.items()}
        assert all(score is not None for score, _ in place.values())
        order = sorted(records, key=lambda tid: place[tid])
        for priority in range(4):
            seqs = [records[t].seq for t in order if records[t].priority == priority]
            assert seqs == sorted(seqs), f"level {priority} out of order: {seqs}"

    @staticmethod
    def counters_add_up(line: list[str], claims: list[str], sessions: list[str], stats: dict[str, str]) -> None:
        finished = sum(int(stats.get(reason, 0)) for reason in FINISHED_REASONS)
        assert int(stats.get("joined", 0)) == len(line) + len(claims) + len(sessions) + finished
        assert int(stats.get("seq", 0)) == int(stats.get("joined", 0))
        admitted_then_finished = int(stats.get("admitted", 0)) - len(claims) - len(sessions)
        assert 0 <= admitted_then_finished <= finished

    def teardown(self) -> None:
        if hasattr(self, "slug"):
            store.queue_delete(self.slug)


@pytest.mark.django_db
def test_random_sequences_keep_the_engine_invariants(live_state):
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            # The same scripts on either: on the cluster, fewer sequences check the routing (each costs more).
            max_examples=80 if live_state == "redis" else 25,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
