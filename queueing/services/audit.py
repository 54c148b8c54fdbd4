"""The audit log: who changed what of a queue, before and after, and when."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from ..models import Queue, QueueChange

EDITABLE_FIELDS = ("name", "target_url", "state", *Queue.TEXT_FIELDS, *Queue.POLICY_FIELDS)


def queue_values(queue: Queue) -> dict[str, Any]:
    return {field: getattr(queue, field) for field in EDITABLE_FIELDS}


def audit_change(queue: Queue, *, action: str, before: dict[str, Any], actor: Any, actor_label: str) -> None:
    after = queue_values(queue)
    if action == "create":  # nothing before: the entry records every value the queue was created with
        changed_before, changed_after = {}, after
    else:
        changed_before = {k: v for k, v in before.items() if after.get(k) != v}
        changed_after = {k: after[k] for k in changed_before}
    if not changed_before and action == "update":
        return
    queue_change_record(
        queue, action=action, before=changed_before, after=changed_after, actor=actor, actor_label=actor_label
    )


def queue_change_record(
    queue: Queue, *, action: str, before: dict[str, Any], after: dict[str, Any], actor: Any, actor_label: str = ""
) -> QueueChange:
    """Write one entry of the audit log (who, what, before, after, when). The actor is a user, or one that
    says who it is (`audit_label`: a management key), or nobody ("system")."""
    user = actor if isinstance(actor, get_user_model()) else None
    actor_label = actor_label or getattr(actor, "audit_label", "")
    return QueueChange.objects.create(
        queue=queue,
        queue_slug=queue.slug,
        actor=user,
        actor_label=actor_label or (user.get_username() if user else "system"),
        action=action,
        before=before,
        after=after,
    )
