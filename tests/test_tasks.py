"""Workers: the beat schedules exist in the database (and admin); tasks are thin and idempotent."""

from __future__ import annotations

import uuid

from django_celery_beat.models import PeriodicTask

from queueing import store, tasks
from queueing.schedules import BEAT_SCHEDULES


def test_beat_schedules_are_written_after_migrate(db):
    rows = {t.name: t for t in PeriodicTask.objects.all()}
    for spec in BEAT_SCHEDULES:
        row = rows[spec["name"]]
        assert row.task == spec["task"] and row.enabled
        assert row.interval.every == spec["every_seconds"] and row.interval.period == "seconds"
        assert row.expire_seconds == spec["expire_seconds"]
    assert rows["Admission tick"].interval.every == 1


def test_the_tick_task_admits_and_running_it_twice_does_no_harm(make_queue, api):
    queue = make_queue(state="paused", capacity=3, burst=3)
    for _ in range(5):
        api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    queue.state = "open"
    queue.save()  # bypassing the service: the tick re-mirrors the database's policy itself
    assert tasks.admission_tick.apply().get() == 3
    assert tasks.admission_tick.apply().get() == 0
    assert store.snapshot(queue.slug).admitted == 3


def test_closed_queues_are_not_ticked(make_queue, api):
    queue = make_queue(capacity=3, burst=3, state="paused")
    api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    queue.state = "closed"
    queue.save()
    assert tasks.admission_tick.apply().get() == 0


def test_the_cleanup_task_expires_and_is_idempotent(make_queue):
    make_queue()
    assert tasks.cleanup.apply().get() == 0
    assert tasks.cleanup.apply().get() == 0
