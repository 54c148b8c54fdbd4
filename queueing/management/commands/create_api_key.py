"""Create an API key for a queue's protected site. The key is printed once and stored only hashed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing import services
from queueing.models import Queue


class Command(BaseCommand):
    help = "Create an API key for the queue's protected site and print it (shown once, stored hashed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="protected site", help="A label for the key")

    def handle(self, *args: Any, **options: Any) -> None:
        queue = Queue.objects.filter(slug=options["slug"]).first()
        if queue is None:
            raise CommandError(f"There is no queue '{options['slug']}'.")
        _, key = services.api_key_create(queue, name=options["name"])
        self.stdout.write(key)
