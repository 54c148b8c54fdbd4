"""The staff login bin/run printed, again: passwords are kept hashed, so it gets a new one (printed once)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser

OPERATORS = "Queue operators"  # made by migration 0013 (queueing/migrations/0013_operator_groups.py)


def staff_login_set(username: str) -> str:
    """A new password for `username`, a staff login in the Queue operators group (made if missing): what
    the README's walk-through needs, and no more."""
    users = get_user_model()
    password = secrets.token_urlsafe(12)
    user = users.objects.filter(username=username).first()
    if user is None:
        user = users.objects.create_user(username=username, password=password, is_staff=True)
    else:
        user.set_password(password)
        user.is_staff = user.is_active = True
        user.save()
    user.groups.add(Group.objects.get(name=OPERATORS))
    return password


class Command(BaseCommand):
    help = "Give the staff login (default: staff, an operator) a new password and print it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="staff")

    def handle(self, *args: Any, **options: Any) -> None:
        password = staff_login_set(options["username"])
        self.stdout.write(self.style.SUCCESS(f"Staff login: username {options['username']}  password {password}"))
