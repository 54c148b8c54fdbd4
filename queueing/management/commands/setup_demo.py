"""The demo: a queue `demo` aimed at the demo protected page, and a staff login in the Queue operators group
(printed once)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from queueing import services, signing_keys
from queueing.models import Queue

from .staff_login import staff_login_set


class Command(BaseCommand):
    help = "Create the demo queue and a staff login if missing; prints the login once, when created."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="staff")

    def handle(self, *args: Any, **options: Any) -> None:
        if not Queue.objects.filter(slug="demo").exists():
            services.queue_configure(
                slug="demo",
                changes={
                    "name": "Demo sale",
                    "target_url": "/demo/protected/",
                    "capacity": 5,
                    "outflow_per_minute": 12,
                    "burst": 2,
                    "session_ttl": 300,
                    "claim_ttl": 60,
                },
                actor_label="setup_demo command",
            )
            self.stdout.write("Created the demo queue: /api/v1/queues/demo/join")
        signing_keys.jwks()  # creates the first access-token signing key if there is none

        if not get_user_model().objects.filter(username=options["username"]).exists():
            password = staff_login_set(options["username"])
            self.stdout.write(
                self.style.SUCCESS(
                    f"Staff login (shown once; bin/run --login gives it a new password): "
                    f"username {options['username']}  password {password}"
                )
            )
