"""Create a management key: automation calls the management API with it, no staff login needed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from queueing.models import ManagementKey


class Command(BaseCommand):
    help = (
        "Create a key for the management API (`Authorization: Api-Key <key>`) and print it (shown once, stored "
        "hashed). An operator key may do what the Queue operators group may; a viewer key only read."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what holds it, e.g. 'terraform'")
        parser.add_argument("--role", choices=[role.value for role in ManagementKey.Role], default="operator")

    def handle(self, *args: Any, **options: Any) -> None:
        _, key = ManagementKey.objects.create_key(name=options["name"], role=options["role"])
        self.stdout.write(key)
