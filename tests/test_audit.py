"""The audit log cannot be edited or deleted from admin, and it outlives its queue (issue 13, item 10)."""

from __future__ import annotations

from queueing.models import Queue, QueueChange


def test_admin_cannot_delete_an_audit_entry(admin_client, make_queue):
    queue = make_queue()
    entry = QueueChange.objects.filter(queue=queue).first()
    assert entry is not None
    url = f"/admin/queueing/queuechange/{entry.pk}/delete/"
    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    listing = admin_client.post(
        "/admin/queueing/queuechange/", {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"}
    )
    assert listing.status_code in (200, 302)
    assert QueueChange.objects.filter(pk=entry.pk).exists()


def test_deleting_a_queue_keeps_its_audit_log_and_says_who_deleted_it(admin_client, make_queue):
    queue = make_queue()
    slug = queue.slug
    assert admin_client.post(f"/admin/queueing/queue/{queue.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Queue.objects.filter(slug=slug).exists()
    actions = list(
        QueueChange.objects.filter(queue_slug=slug).order_by("created_at", "id").values_list("action", flat=True)
    )
    assert actions == ["create", "delete"]
    assert QueueChange.objects.get(queue_slug=slug, action="delete").actor_label == "admin"


def test_a_change_inside_a_group_of_values_and_a_time_read_as_words():
    """Issue 19: the dashboard's log showed a priority level's change as two Python dicts, and times
    without their zone."""
    levels = QueueChange(
        action="priority_levels",
        before={"2": {"name": "VIP", "placement_fraction": 0.5, "group": None}},
        after={"2": {"name": "VIP", "placement_fraction": 0.6, "group": "Members"}, "3": {"name": "Premium"}},
    )
    assert levels.summary() == "level 2 placement fraction 0.5 → 0.6, level 2 group — → Members, level 3 name Premium"
    assert levels.action_words == "priority levels"
    ends = QueueChange(action="update", before={"ends_at": None}, after={"ends_at": "2031-03-01T18:00:00Z"})
    assert ends.summary() == "ends at — → 2031-03-01 18:00:00 UTC"
