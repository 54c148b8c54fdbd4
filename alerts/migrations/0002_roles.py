"""The roles of queueing's 0013 learn the alerts: operators set up hooks and read the delivery log; viewers
read the log (a hook holds its webhook's secret, so viewers do not see hooks)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

GRANTS = {
    "Queue operators": {"alerthook": ("add", "change", "delete", "view"), "alertdelivery": ("change", "view")},
    "Queue viewers": {"alertdelivery": ("view",)},
}


def grant(apps: Any, schema_editor: Any) -> None:
    from django.contrib.auth.management import create_permissions

    # Permissions are made after migrations (post_migrate); a fresh database has none yet.
    app_config = apps.get_app_config("alerts")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for name, models in GRANTS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        codenames = [f"{action}_{model}" for model, actions in models.items() for action in actions]
        group.permissions.add(*permission_model.objects.filter(content_type__app_label="alerts", codename__in=codenames))


def revoke(apps: Any, schema_editor: Any) -> None:
    permission_model = apps.get_model("auth", "Permission")
    for group in apps.get_model("auth", "Group").objects.filter(name__in=list(GRANTS)):
        group.permissions.remove(*permission_model.objects.filter(content_type__app_label="alerts"))


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial"), ("queueing", "0013_operator_groups")]

    operations = [migrations.RunPython(grant, revoke)]
