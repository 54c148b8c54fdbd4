"""Check a queue's pre-queue shuffle: the revealed seed hashes to the commitment published before the
pre-queue opened, and gives exactly the published order (queueing/shuffle.py says how).

    manage.py verify_shuffle SLUG                      # the record in this installation's database
    manage.py verify_shuffle SLUG --file shuffle.json  # a record fetched from GET /api/v1/queues/SLUG/shuffle

Exits 0 and prints the order when it checks out; exits 1 and says what does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing import shuffle
from queueing.models import QueueShuffle


class Command(BaseCommand):
    help = "Verify a queue's auditable pre-queue shuffle from its revealed seed and published tickets."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--file", help="A published record (JSON) instead of this database's.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["file"]:
            record = json.loads(Path(options["file"]).read_text())
        else:
            found = QueueShuffle.objects.filter(queue__slug=options["slug"]).order_by("-starts_at").first()
            if found is None:
                raise CommandError(f"Queue '{options['slug']}' has no scheduled start, so no shuffle.")
            record = found.public()
        problems = shuffle.verify(record)
        if problems:
            raise CommandError("The shuffle does NOT check out: " + " ".join(problems), returncode=1)
        order = record["order"]
        shown = ", ".join(str(s) for s in order[:20]) + (", ..." if len(order) > 20 else "")
        self.stdout.write(
            f"OK: seed {record['seed']} hashes to the commitment {record['commitment']}, and puts the "
            f"{len(order)} pre-queue tickets in the published order: {shown}"
        )
