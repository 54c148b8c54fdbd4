"""Sessions at the protected site: verify (first use), complete, revoke, fencing, reported capacity."""

from __future__ import annotations

from typing import Any

import pytest

from queueing import services, store, tokens
from queueing.store import TicketStatus

from .factories import access_claims, access_token, join, status, ticket_claims

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def admitted(make_queue, clock, **policy):
    queue = make_queue(**{"capacity": 1, "burst": 5, **policy})
    ticket = join(queue.slug, "shopper", now=clock())
    assert ticket.status == TicketStatus.ADMITTED
    return queue, ticket


def test_verify_turns_admitted_into_active_and_stays_valid(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    token = access_token(queue.slug, ticket)
    first = services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(2))
    assert first.valid and first.ticket_id == ticket.ticket_id
    assert first.expires_at == ticket.expires_ms // 1000
    assert status(queue.slug, ticket, now=clock()).status == TicketStatus.ACTIVE
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(2)).valid
    assert store.slot_members(queue.slug) == ([], [ticket.ticket_id])
    assert store.snapshot(queue.slug).stats["activated"] == "1"


def test_an_active_session_is_not_subject_to_the_claim_ttl(make_queue, clock):
    queue, ticket = admitted(make_queue, clock, claim_ttl=10, session_ttl=300)
    token = access_token(queue.slug, ticket)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(5)).valid
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(60)).valid


def test_verify_rejects_an_unclaimed_admission_past_its_claim_ttl(make_queue, clock):
    queue, ticket = admitted(make_queue, clock, claim_ttl=10)
    result = services.session_verify(slug=queue.slug, raw_token=access_token(queue.slug, ticket), now=clock.advance(11))
    assert (result.valid, result.reason) == (False, "expired")


def test_verify_rejects_a_forged_token(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    token = access_token(queue.slug, ticket)
    header, payload, signature = token.split(".")
    forged = f"{header}.{payload}.{signature[:-4]}AAAA"
    assert services.session_verify(slug=queue.slug, raw_token=forged).reason == "invalid"
    assert services.session_verify(slug=queue.slug, raw_token="not-a-token").reason == "invalid"


def test_verify_rejects_another_queues_token(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    other = make_queue()
    assert services.session_verify(slug=other.slug, raw_token=access_token(queue.slug, ticket)).reason == "invalid"


def test_complete_frees_the_slot_and_admits_the_next_visitor_without_a_tick(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    nxt = join(queue.slug, "next", now=clock())
    assert nxt.status == TicketStatus.WAITING
    assert (
        services.session_complete(slug=queue.slug, claims=access_claims(queue.slug, ticket), now=clock.advance(30))
        == "completed"
    )
    assert status(queue.slug, nxt, now=clock()).status == TicketStatus.ADMITTED
    assert status(queue.slug, ticket, now=clock()).status == TicketStatus.COMPLETED
    # Completing twice is harmless; the completed token no longer verifies.
    assert (
        services.session_complete(slug=queue.slug, claims=access_claims(queue.slug, ticket), now=clock()) == "already"
    )
    assert services.session_verify(slug=queue.slug, raw_token=access_token(queue.slug, ticket)).reason == "expired"
    assert float(store.snapshot(queue.slug).stats["ema_service_ms"]) == 30000


def test_a_newer_session_supersedes_the_older_token(make_queue, clock):
    queue, ticket = admitted(make_queue, clock, capacity=2)
    old_token = access_token(queue.slug, ticket)
    services.ticket_leave(slug=queue.slug, claims=ticket_claims(queue.slug, ticket), now=clock.advance(1))
    again = join(queue.slug, "shopper", now=clock.advance(1))
    assert again.status == TicketStatus.ADMITTED and again.fence != ticket.fence
    assert services.session_verify(slug=queue.slug, raw_token=old_token).reason == "superseded"
    assert services.session_verify(slug=queue.slug, raw_token=access_token(queue.slug, again)).valid


def test_a_revoked_session_is_rejected_and_its_slot_goes_to_the_next_visitor(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    nxt = join(queue.slug, "next", now=clock())
    token = access_token(queue.slug, ticket)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    assert services.session_revoke(slug=queue.slug, ticket_id=ticket.ticket_id, now=clock()) == "revoked"
    assert services.session_verify(slug=queue.slug, raw_token=token).reason == "revoked"
    assert status(queue.slug, nxt, now=clock()).status == TicketStatus.ADMITTED
    assert services.session_revoke(slug=queue.slug, ticket_id=ticket.ticket_id, now=clock()) == "already"


def test_revoking_an_unknown_ticket_says_so(make_queue):
    queue = make_queue()
    for bad in ("0000000099.AAAAAAAAAAAAAAAA", "nonsense"):
        try:
            services.session_revoke(slug=queue.slug, ticket_id=bad)
        except services.TicketNotFound:
            continue
        raise AssertionError(f"{bad} should not be found")


def test_an_expired_access_token_is_rejected_as_expired(make_queue, clock):
    queue, ticket = admitted(make_queue, clock)
    stale = tokens.access_token_issue(
        slug=queue.slug, ticket_id=ticket.ticket_id, fence=ticket.fence, expires_ms=int((clock() - 5) * 1000)
    )
    assert services.session_verify(slug=queue.slug, raw_token=stale).reason == "expired"


def test_reported_capacity_counts_the_sites_own_figure_plus_arrivals_not_yet_seen(make_queue, clock):
    queue = make_queue(state="paused", capacity=10, burst=10, capacity_source="reported")
    for i in range(10):
        join(queue.slug, f"v{i}", now=clock())
    services.queue_resume(queue)
    services.capacity_report(slug=queue.slug, in_use=7, now=clock())
    # The report itself ran admission: 3 free slots went out.
    assert store.snapshot(queue.slug).admitted == 3
    assert services.queue_admit(slug=queue.slug, now=clock.advance(5)).admitted == []
    # Absolute reports: the site's count drops (sessions ended) and admission follows at once.
    capacity, used, source = services.capacity_report(slug=queue.slug, in_use=2, now=clock.advance(1))
    assert (capacity, source) == (10, "reported")
    assert used == 10
    assert store.snapshot(queue.slug).admitted == 8


def test_leaving_gives_up_the_ticket_and_leaving_twice_is_harmless(make_queue, clock):
    queue = make_queue(state="paused")
    first = join(queue.slug, "a", now=clock())
    second = join(queue.slug, "b", now=clock())
    claims = ticket_claims(queue.slug, first)
    assert services.ticket_leave(slug=queue.slug, claims=claims, now=clock())
    assert not services.ticket_leave(slug=queue.slug, claims=claims, now=clock())
    assert status(queue.slug, second, now=clock()).rank == 0
    assert status(queue.slug, first, now=clock()).reason == "left"


def test_the_first_browser_to_verify_holds_the_session_and_the_site_may_hand_it_over(make_queue, clock):
    queue = make_queue(capacity=2)
    ticket = join(queue.slug, "v", now=clock())
    token = tokens.access_token_issue(
        slug=queue.slug, ticket_id=ticket.ticket_id, fence=ticket.fence, expires_ms=ticket.expires_ms, epoch=1
    )

    def verify(browser: str, rebind: bool = False, server: bool = False) -> services.VerifyResult:
        return services.session_verify(
            slug=queue.slug, raw_token=token, browser=browser, rebind=rebind, server=server, now=clock()
        )

    assert verify("").valid  # nobody has bound it yet: a verify without a secret binds nothing
    assert verify("browser-a" * 3).valid
    assert verify("browser-a" * 3).valid
    assert verify("browser-b" * 3).reason == "bound_elsewhere"
    # Issue 50: once bound, a verify without the browser's secret is refused (a recipe that sent none let a
    # shared link into a second browser), unless it is the site's own server-side check.
    assert verify("").reason == "bound_elsewhere"
    assert verify("", server=True).valid
    assert verify("browser-b" * 3, rebind=True).valid  # the site hands it over on purpose
    assert verify("browser-a" * 3).reason == "bound_elsewhere"
    assert store.snapshot(queue.slug).active == 1


def test_a_completed_session_s_binding_goes_with_it_and_binds_no_later_visit(make_queue, clock):
    """Issue 50, item 11: the binding key outlived a completed session (until its token's expiry), and was
    the visitor's, not the ticket's: the same visitor's next visit was bound to the first one's browser."""
    queue, ticket = admitted(make_queue, clock, capacity=2)
    token = access_token(queue.slug, ticket)
    assert services.session_verify(slug=queue.slug, raw_token=token, browser="browser-a" * 3, now=clock()).valid
    bindings = list(store.client().scan_iter(match=store.queue_keys(queue.slug).tagged("bind:*")))
    assert len(bindings) == 1
    assert services.session_complete(slug=queue.slug, claims=access_claims(queue.slug, ticket), now=clock()) == (
        "completed"
    )
    assert store.client().exists(*bindings) == 0  # gone with its session
    again = join(queue.slug, "shopper", now=clock.advance(1))  # the same visitor, a new visit
    assert again.seq != ticket.seq and again.status == TicketStatus.ADMITTED
    later = access_token(queue.slug, again)
    assert services.session_verify(slug=queue.slug, raw_token=later, browser="browser-b" * 3, now=clock()).valid


def commands_of(client: Any) -> dict[str, int]:
    """The commands a server has run since its counts were reset (scripts' own included), by name."""
    found = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in client.info("commandstats").items()}
    return {name: calls for name, calls in found.items() if name not in {"config|resetstat", "info"}}


def test_a_completion_runs_its_budget_of_redis_commands(redis_of_its_own, make_queue, clock):
    """The hot path's budget, held deterministically: the Redis commands one completion runs, counted on a
    server of the test's own. Its record is read once (it was read twice: once to see whether a failover
    had taken the admission, again by the session lookup)."""
    queue, ticket = admitted(make_queue, clock)
    claims = access_claims(queue.slug, ticket)
    client = store.client()
    client.config_resetstat()
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1)) == "completed"
    ran = commands_of(client)
    # Two round trips (the completion, then the admission its freed slot allows, with nobody waiting) and
    # 26 commands in all: 25, and since issue 50 the DEL of the session's binding to a browser (it outlived
    # the session). With the record read twice (two HGETs more) there were 27 before the DEL.
    assert ran["fcall"] == 2 and sum(ran.values()) <= 26 and ran["del"] == 1, ran
