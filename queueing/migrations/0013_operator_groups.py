"""The two roles an installation starts with, as groups (issue 19): "Queue operators" run sales (queues,
priority levels and codes, API keys, schedules: every queue field; the audit log and the dashboard), and
"Queue viewers" look at them without changing anything. Signing keys stay with superusers. Members must
also be staff to log in to admin and the dashboard."""

from __future__ import annotations

from typing import Any

from django.db import migrations

OPERATORS, VIEWERS = "Queue operators", "Queue viewers"

# group -> (app label, model) -> the actions its members may take on it
ROLES: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
    OPERATORS: {
        ("queueing", "queue"): ("add", "change", "delete", "view"),
        ("queueing", "prioritylevel"): ("add", "change", "delete", "view"),
        ("queueing", "prioritycode"): ("add", "change", "delete", "view"),
        ("queueing", "queueapikey"): ("add", "change", "delete", "view"),
        ("queueing", "queuechange"): ("view",),
        ("queueing", "queueshuffle"): ("view",),
        ("admin_dashboard", "queuesnapshot"): ("view",),
        ("admin_dashboard", "waitsample"): ("view",),
    },
    VIEWERS: {
        ("queueing", "queue"): ("view",),
        ("queueing", "prioritylevel"): ("view",),
        ("queueing", "queuechange"): ("view",),
        ("queueing", "queueshuffle"): ("view",),
        ("admin_dashboard", "queuesnapshot"): ("view",),
        ("admin_dashboard", "waitsample"): ("view",),
    },
}


def make_groups(apps: Any, schema_editor: Any) -> None:
    from django.contrib.auth.management import create_permissions

    # Permissions are made after migrations (post_migrate); a fresh database has none yet.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for name, models in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=name)
        for (app_label, model), actions in models.items():
            codenames = [f"{action}_{model}" for action in actions]
            group.permissions.add(
                *permission_model.objects.filter(content_type__app_label=app_label, codename__in=codenames)
            )


def drop_groups(apps: Any, schema_editor: Any) -> None:
    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("queueing", "0012_queue_revision"),
        ("admin_dashboard", "0002_adaptive_outflow"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(make_groups, drop_groups)]
