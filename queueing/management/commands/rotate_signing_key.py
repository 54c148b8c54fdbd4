from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from queueing import signing_keys


class Command(BaseCommand):
    help = "Publish a new access-token signing key; older keys retire once their tokens have expired."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--lead-seconds",
            type=int,
            default=None,
            help="Publish this long before the key signs (default WR_KEY_PUBLISH_LEAD_SECONDS)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lead = None if options["lead_seconds"] is None else timedelta(seconds=options["lead_seconds"])
        key = signing_keys.signing_key_rotate(lead=lead)
        self.stdout.write(f"New key {key.kid} signs from {key.signs_from.isoformat()}.")
