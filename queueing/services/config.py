"""Queue configuration: create, update, pause and resume (validated and audited, mirrored to Redis at once),
priority levels, a change of mode, API keys, deletion."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from .. import caching, clock, realtime, store
from ..models import PriorityLevel, Queue, QueueAPIKey, QueueText
from .audit import EDITABLE_FIELDS, audit_change, queue_change_record, queue_values
from .recovery import queue_config_sync, queue_live_state_ensure
from .schedule import shuffle_commit_ensure


def queue_priority_levels_ensure(queue: Queue) -> None:
    for level, fraction in PriorityLevel.DEFAULT_FRACTIONS.items():
        PriorityLevel.objects.get_or_create(
            queue=queue,
            level=level,
            defaults={"name": PriorityLevel.Level(level).label, "placement_fraction": fraction},
        )


def _priority_levels(queue: Queue) -> dict[str, dict[str, Any]]:
    return {
        str(level.level): {
            "name": level.name,
            "placement_fraction": level.placement_fraction,
            "group": level.group.name if level.group else None,
        }
        for level in PriorityLevel.objects.filter(queue=queue).select_related("group")
    }


def queue_priority_levels_edit(queue: Queue, *, save: Callable[[], None], actor: Any = None) -> None:
    """Run `save` (admin's inline formsets), then audit the levels and the texts in other languages it
    changed and mirror them into Redis. Levels decide where joiners are placed, so they are audited like the
    queue; so are the words visitors read."""
    before = {"priority_levels": _priority_levels(queue), "texts": _texts(queue)}
    save()
    after = {"priority_levels": _priority_levels(queue), "texts": _texts(queue)}
    revised = False
    for action, was in before.items():
        now = after[action]
        changed = sorted(key for key in was.keys() | now.keys() if was.get(key) != now.get(key))
        if changed:
            queue_change_record(
                queue,
                action=action,
                before={key: was[key] for key in changed if key in was},
                after={key: now[key] for key in changed if key in now},
                actor=actor,
            )
            revised = True
    if revised:
        Queue.objects.filter(pk=queue.pk).update(revision=F("revision") + 1)
    queue_config_sync(Queue.objects.prefetch_related(*Queue.MIRROR_READS).get(pk=queue.pk))


def _texts(queue: Queue) -> dict[str, dict[str, str]]:
    """The queue's words per language (QueueText), as the audit log keeps them."""
    return {
        text.language: {field: getattr(text, field) for field in Queue.TRANSLATED_FIELDS}
        for text in QueueText.objects.filter(queue=queue)
    }


def queue_configure(
    *, slug: str, changes: dict[str, Any], actor: Any = None, actor_label: str = ""
) -> tuple[Queue, bool]:
    """Create or update a queue; validates like the admin does, audits, and syncs Redis on commit. A
    scheduled start brings the hoarding guards' defaults (PREQUEUE_GUARDS) unless `changes` sets them."""
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationError(dict.fromkeys(sorted(unknown), "Not a queue setting."))
    with transaction.atomic():
        queue = Queue.objects.select_for_update().filter(slug=slug).first()
        created = queue is None
        if queue is None:
            queue = Queue(slug=slug, name=slug)
        before = {} if created else queue_values(queue)
        for field, value in changes.items():
            setattr(queue, field, value)
        _prequeue_guards(queue, before, changes)
        queue.full_clean()
        queue.revision += 1  # under the row's lock: one number per change
        queue.save()
        if created:
            queue_priority_levels_ensure(queue)
        elif before["mode"] != queue.mode:
            _mode_switch(queue)
        shuffle_commit_ensure(queue)
        audit_change(
            queue,
            action="create" if created else "update",
            before=before,
            actor=actor,
            actor_label=actor_label,
        )
        # Redis takes the change before it commits: a Redis that cannot take it fails the change as a
        # whole (nothing saved or audited; the caller answers 503), never "retry" for a change that was
        # made. Should the commit itself fail afterwards, the next tick re-mirrors the database's policy
        # within a second.
        queue_config_sync(Queue.objects.prefetch_related(*Queue.MIRROR_READS).get(pk=queue.pk))
        if not created and any(before[f] != getattr(queue, f) for f in OUTFLOW_POLICY_FIELDS):
            outflow_adaptation_reset(queue, actor=actor, actor_label=actor_label)
        if not created and any(before[f] != getattr(queue, f) for f in SCHEDULE_FIELDS):
            # Told once committed; a Redis that cannot take the event is logged, the change stands (polls tell).
            times = {f: _epoch(getattr(queue, f)) for f in SCHEDULE_FIELDS}
            transaction.on_commit(lambda: realtime.send([realtime.queue_schedule(slug, times)]), robust=True)
    caching.forget(caching.window_refused_key(slug))  # a new queue, or one that now runs stateless
    return queue, created


OUTFLOW_POLICY_FIELDS = ("outflow_per_minute", "adaptive_outflow", "outflow_min_per_minute", "outflow_max_per_minute")
SCHEDULE_FIELDS = ("prequeue_opens_at", "starts_at", "ends_at")  # pushed to every page when one changes


def _epoch(moment: Any) -> float | None:
    return None if moment is None else moment.timestamp()


# A scheduled sale's pre-queue (everyone who joins before the start is shuffled) is where hoarding pays:
# each ticket is its own draw. So a queue that gets a scheduled start also gets these guards, unless the
# same change sets them (0 turns one off). The cost they put on each extra ticket is in bench/RESULTS.md.
PREQUEUE_GUARDS = {"max_tickets_per_address": 20, "pow_difficulty": 16}


def _prequeue_guards(queue: Queue, before: dict[str, Any], changes: dict[str, Any]) -> None:
    """The one place the guards' defaults are applied, however the queue is configured (admin, the API,
    configure_queue). A guard changed to None (admin's empty field) is set to its default as the queue now
    stands: on with a scheduled start, off without one."""
    first_start = bool(queue.starts_at) and not before.get("starts_at")  # not one whose guards were chosen
    for field, value in PREQUEUE_GUARDS.items():
        if field in changes and changes[field] is None:
            setattr(queue, field, value if queue.starts_at else 0)
        elif first_start and field not in changes and not getattr(queue, field):
            setattr(queue, field, value)


def outflow_adaptation_reset(
    queue: Queue, *, actor: Any = None, actor_label: str = "", now: float | None = None
) -> None:
    """The operator re-tuned the outflow (or turned adaptation on or off): admission follows the
    configured outflow again, and the adaptation, if on, starts from it a full interval later. The jump
    of the rate in force is audited."""
    adapted = store.outflow_reset(queue.slug, now_ms=clock.now_ms(now))
    if adapted is not None and adapted != queue.outflow_per_minute:
        queue_change_record(
            queue,
            action="outflow_reset",
            before={"outflow_per_minute_effective": round(adapted, 3)},
            after={
                "outflow_per_minute_effective": queue.outflow_per_minute,
                "adaptive_outflow": queue.adaptive_outflow,
            },
            actor=actor,
            actor_label=actor_label,
        )


def _mode_switch(queue: Queue) -> None:
    """A queue changes mode (inside the row lock): the other mode's live state goes, and a new epoch
    starts, so numbering continues above every number issued and nothing of the old mode is restored."""
    queue.epoch += 1
    queue.window_active = queue.window_issued = 0
    queue.window_gaps = {}
    queue.save(update_fields=["epoch", "window_active", "window_issued", "window_gaps"])
    store.mode_state_clear(queue.slug, keep_window=queue.is_stateless)
    queue_live_state_ensure(queue.pk, switched=True)


def queue_update(queue: Queue, *, changes: dict[str, Any], actor: Any = None, actor_label: str = "") -> Queue:
    """Change a queue's settings (the staff API, pause and resume); takes effect on the next tick."""
    updated, _ = queue_configure(slug=queue.slug, changes=changes, actor=actor, actor_label=actor_label)
    return updated


def queue_pause(queue: Queue, *, actor: Any = None, actor_label: str = "") -> Queue:
    return queue_update(queue, changes={"state": Queue.State.PAUSED}, actor=actor, actor_label=actor_label)


def queue_resume(queue: Queue, *, actor: Any = None, actor_label: str = "") -> Queue:
    return queue_update(queue, changes={"state": Queue.State.OPEN}, actor=actor, actor_label=actor_label)


def api_key_create(queue: Queue, *, name: str, actor: Any = None) -> tuple[QueueAPIKey, str]:
    """A new API key for the queue's protected site; the key itself is returned once, never stored.
    Audited with its name and prefix (the prefix names a key without revealing it)."""
    api_key, key = QueueAPIKey.objects.create_key(queue=queue, name=name)
    if actor is not None:
        queue_change_record(
            queue, action="api_key_created", before={}, after={"api_key": f"{name} ({api_key.prefix})"}, actor=actor
        )
    return cast(QueueAPIKey, api_key), key


def api_key_revoke(queue: Queue, *, prefix: str, actor: Any = None) -> QueueAPIKey:
    """Revoke one of the queue's API keys (QueueAPIKey.DoesNotExist: no such key); its site is refused at once.
    Revoking a revoked key changes nothing and is not audited again."""
    api_key = QueueAPIKey.objects.get(queue=queue, prefix=prefix)
    if not api_key.revoked:
        api_key.revoked = True
        api_key.save(update_fields=["revoked"])
        queue_change_record(
            queue, action="api_key_revoked", before={"api_key": f"{api_key.name} ({prefix})"}, after={}, actor=actor
        )
    return api_key


def queue_priority_levels_update(queue: Queue, *, levels: list[dict[str, Any]], actor: Any = None) -> None:
    """Change some of a queue's priority levels (name, placement fraction, group by name): validated as in
    admin, all or none, audited and mirrored into Redis as admin's edits are."""
    known = {level.level: level for level in PriorityLevel.objects.filter(queue=queue)}
    problems: dict[str, list[str]] = {}
    changed = []
    for change in levels:
        level = known.get(change["level"])
        if level is None:
            problems.setdefault("levels", []).append(f"level {change['level']}: no such level (0 to 3).")
            continue
        for field in ("name", "placement_fraction"):
            if field in change:
                setattr(level, field, change[field])
        if "group" in change:
            group = Group.objects.filter(name=change["group"]).first() if change["group"] else None
            if change["group"] and group is None:
                problems.setdefault("levels", []).append(f"level {level.level}: no group named “{change['group']}”.")
            level.group = group
        try:
            level.full_clean()
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                problems.setdefault("levels", []).extend(f"level {level.level} {field}: {m}" for m in messages)
        changed.append(level)
    if problems:
        raise ValidationError(problems)

    def save() -> None:
        with transaction.atomic():
            for level in changed:
                level.save()

    queue_priority_levels_edit(queue, save=save, actor=actor)


def queue_delete(queue: Queue, *, actor: Any = None, actor_label: str = "") -> None:
    """Delete a queue and everything it has in Redis (its line, tickets and sessions end with it). Its
    audit log stays, with an entry saying who deleted it. All or nothing: Redis is emptied before the
    database commits, so a Redis that does not answer leaves the queue as it was (it was deleted from the
    database first, and its live state stayed behind)."""
    slug = queue.slug
    with transaction.atomic():
        queue_change_record(
            queue, action="delete", before=queue_values(queue), after={}, actor=actor, actor_label=actor_label
        )
        queue.delete()
        store.queue_delete(slug)
    caching.forget(caching.shuffle_key(slug), caching.window_refused_key(slug))
