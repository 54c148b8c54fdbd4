"""Check a queue's pre-queue shuffle: the revealed seed hashes to the commitment published before the
pre-queue opened, and gives exactly the published order (queueing/shuffle.py says how).

    manage.py verify_shuffle SLUG                      # the record in this installation's database
    manage.py verify_shuffle SLUG --file shuffle.json  # a record fetched from GET /api/v1/queues/SLUG/shuffle
    manage.py verify_shuffle SLUG --number N           # a stateless queue: the place ticket N was given

Exits 0 and prints the order when it checks out; exits 1 and says what does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing import shuffle
from queueing.models import Queue, QueueShuffle


class Command(BaseCommand):
    help = "Verify a queue's auditable pre-queue shuffle from its revealed seed and published tickets."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--file", help="A published record (JSON) instead of this database's.")
        parser.add_argument("--number", type=int, help="A stateless queue: print the place this ticket got.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["file"]:
            record = json.loads(Path(options["file"]).read_text())
        else:
            if not Queue.objects.filter(slug=options["slug"]).exists():
                raise CommandError(f"There is no queue '{options['slug']}'.")
            found = QueueShuffle.objects.filter(queue__slug=options["slug"]).order_by("-starts_at").first()
            if found is None:
                raise CommandError(f"Queue '{options['slug']}' has no scheduled start, so no shuffle.")
            record = shuffle.public_record(found)
        if options["number"] is not None and record.get("method") == shuffle.STATELESS_METHOD:
            first, last = record["numbers"] or [1, 0]
            if not first <= options["number"] <= last:
                raise CommandError(f"Ticket {options['number']} was not in the pre-queue ({first}..{last}).")
            record["places"] = {options["number"]: shuffle.place(record["seed"], first, last, options["number"])}
            self.stdout.write(f"Ticket {options['number']} got place {record['places'][options['number']]}.")
        problems = shuffle.verify(record)
        if problems:
            raise CommandError("The shuffle does NOT check out: " + " ".join(problems), returncode=1)
        if record.get("method") == shuffle.STATELESS_METHOD:
            first, last = record["numbers"] or [1, 0]
            shown = ", ".join(str(n) for n in shuffle.stateless_order(record["seed"], first, last)[:20])
            self.stdout.write(
                f"OK: seed {record['seed']} hashes to the commitment {record['commitment']}. The stateless "
                f"pre-queue's numbers {first}..{last} are placed by shuffle.place(seed, {first}, {last}, number); "
                f"the first places go to: {shown}{', ...' if last - first >= 20 else ''}"
            )
            return
        order = record["order"]
        shown = ", ".join(str(s) for s in order[:20]) + (", ..." if len(order) > 20 else "")
        self.stdout.write(
            f"OK: seed {record['seed']} hashes to the commitment {record['commitment']}, and puts the "
            f"{len(order)} pre-queue tickets in the published order: {shown}"
        )
