"""Workers: the beat schedules exist in the database (and admin); tasks are thin and idempotent."""

from __future__ import annotations

import dataclasses
import time
import uuid

from django_celery_beat.models import PeriodicTask

from queueing import store, tasks
from queueing.schedules import BEAT_SCHEDULES

from .factories import join


def test_beat_schedules_are_written_after_migrate(db):
    rows = {t.name: t for t in PeriodicTask.objects.all()}
    for spec in BEAT_SCHEDULES:
        row = rows[spec["name"]]
        assert row.task == spec["task"] and row.enabled
        assert row.interval.every == spec["every_seconds"] and row.interval.period == "seconds"
        assert row.expire_seconds == spec["expire_seconds"]
    assert rows["Admission tick"].interval.every == 1


def test_the_admission_tick_has_a_celery_queue_of_its_own_and_a_plain_worker_takes_both(settings):
    """Issue 50, item 3: the tick shared one queue with every periodic job (runstack runs a worker for each
    queue: tests/e2e/test_supervisor.py keeps ticks on time under a flood of jobs)."""
    from waitingroom_site.celery import app

    def queue_of(task: str) -> str:
        return str(app.amqp.router.route({}, task)["queue"].name)

    assert queue_of("queueing.tasks.admission_tick") == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-ticks"
    for name in ("cleanup", "turn_notices", "realtime_snapshots"):
        assert queue_of(f"queueing.tasks.{name}") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert {q.name for q in app.conf.task_queues} == {  # what `celery worker` without -Q consumes
        settings.CELERY_TASK_DEFAULT_QUEUE,
        f"{settings.CELERY_TASK_DEFAULT_QUEUE}-ticks",
    }


def test_the_tick_task_admits_and_running_it_twice_does_no_harm(make_queue, api):
    queue = make_queue(state="paused", capacity=3, burst=3)
    for _ in range(5):
        api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    queue.state = "open"
    queue.save()  # bypassing the service: the tick re-mirrors the database's policy itself
    assert tasks.admission_tick.apply().get() == 3
    assert tasks.admission_tick.apply().get() == 0
    assert store.snapshot(queue.slug).admitted == 3


def test_a_tick_reads_the_database_the_same_number_of_times_for_any_number_of_queues(make_queue, db):
    """Issue 49: each queue's tick read its row again (to see whether its schedule said to start or close),
    though the tick had just read every row in one query: 2.3 ms of a worker's CPU per idle queue a second
    (0.66 ms without it), which a test stack with 30 queues of earlier tests paid all run long."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queueing import services

    def queries_of_a_tick() -> int:
        services.queues_tick(instance="counting")  # first: whatever a queue's first tick sets up
        with CaptureQueriesContext(connection) as queries:
            services.queues_tick(instance="counting")
        return len(queries)

    make_queue()
    one = queries_of_a_tick()
    for _ in range(4):
        make_queue()
    assert queries_of_a_tick() == one <= 3, one  # the queues, their levels, their texts; no query per queue


def test_closed_queues_are_not_ticked(make_queue, api):
    queue = make_queue(capacity=3, burst=3, state="paused")
    api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    queue.state = "closed"
    queue.save()
    assert tasks.admission_tick.apply().get() == 0


def test_the_cleanup_task_expires_what_is_overdue_and_running_it_again_does_no_harm(make_queue):
    queue = make_queue(capacity=1, burst=1, claim_ttl=60, presence_timeout=60, abandon_timeout=300)
    long_ago = time.time() - 400  # past the claim window and the abandon timeout
    holder = join(queue.slug, "holder", now=long_ago)  # admitted at once, never claimed its slot
    assert holder.status == store.TicketStatus.ADMITTED
    for name in ("gone-1", "gone-2", "gone-3"):
        join(queue.slug, name, now=long_ago)  # waited, then left the page for good
    fresh = join(queue.slug, "fresh")  # here now, behind them
    assert tasks.cleanup.apply().get() == 4  # one claim expired, three abandoned
    assert tasks.cleanup.apply().get() == 0  # nothing left to expire: the second run changes nothing
    snap = store.snapshot(queue.slug)
    assert (snap.waiting, snap.admitted) == (0, 1)
    assert store.slot_members(queue.slug)[0] == [fresh.ticket_id]  # the freed slot went to the next at once
    assert (snap.stats["expired_claim"], snap.stats["abandoned"]) == ("1", "3")


def test_a_change_redis_took_whose_commit_failed_is_undone_by_a_tick_once_its_grace_has_passed(make_queue, clock):
    """The other healing the tick's mirror is for (lua/config.lua REVISION_GRACE): a pause Redis took before
    its commit, the commit then failing. Redis holds the pause's digest, not the database's, so the tick
    writes the database's policy, which Redis takes once the grace for a newer revision has passed."""
    from django.db import transaction

    from queueing import services

    queue = make_queue(capacity=10)
    services.queues_tick(instance="healing", now=clock())
    try:
        with transaction.atomic():
            services.queue_pause(queue)
            assert store.config_read(queue.slug)["state"] == "paused"
            raise RuntimeError("the commit fails")
    except RuntimeError:
        pass
    queue.refresh_from_db()
    assert queue.state == "open"
    services.queues_tick(instance="healing", now=clock.advance(1))
    assert store.config_read(queue.slug)["state"] == "paused"  # a newer revision than the database's, for now
    services.queues_tick(instance="healing", now=clock.advance(30))
    assert store.config_read(queue.slug)["state"] == "open"
    digest = store.config_read(queue.slug)["digest"]
    services.queues_tick(instance="healing", now=clock.advance(1))
    assert store.config_read(queue.slug)["digest"] == digest  # held now: the next tick writes nothing


def test_a_new_release_s_scripts_have_every_queue_s_policy_written_again_at_the_next_tick(
    make_queue, clock, monkeypatch
):
    """Found in review: the digest stood for the database's row only, so a release whose scripts keep the
    policy otherwise (another packed layout: lua/_policy.lua) found every queue's policy "held" and never
    wrote it in its own way. The digest is of the row and the scripts' library: a new one writes each once."""
    from queueing import services

    queue = make_queue(capacity=10)
    services.queues_tick(instance="release", now=clock())
    written = store.config_read(queue.slug)["digest"]
    services.queues_tick(instance="release", now=clock.advance(1))
    assert store.config_read(queue.slug)["digest"] == written  # held: nothing written
    library = store.library()
    monkeypatch.setattr(store, "library", lambda: dataclasses.replace(library, name="waitingroom_nextrelease"))
    services.queues_tick(instance="release", now=clock.advance(1))
    assert store.config_read(queue.slug)["digest"] != written


def test_a_policy_write_redis_takes_only_in_part_leaves_no_digest_and_the_next_tick_writes_it_whole(make_queue, clock):
    """Found in review: a tick's copy of the queue read before an operator's change writes as older
    (lua/config.lua keeps the newer revision, but takes the copy's epoch and reserved numbers), and left the
    newer write's digest in place: every later tick then took Redis for holding the database's policy, and
    the reserved numbers the old copy wrote back were not put right until a join ran out of them."""
    from queueing import services
    from queueing.models import Queue

    queue = make_queue(capacity=10)
    stale = Queue.objects.get(pk=queue.pk)  # as a tick read it, before the change
    services.queue_pause(queue)
    assert store.config_read(queue.slug).get("digest")
    services.queue_config_sync(stale, now=clock(), unless_held=True)
    held = store.config_read(queue.slug)
    assert held["state"] == "paused" and "digest" not in held
    services.queues_tick(instance="digest", now=clock.advance(1))  # the row read afresh: written whole
    assert store.config_read(queue.slug).get("digest")
