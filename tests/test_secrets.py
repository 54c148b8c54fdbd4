"""Secrets stay secret: out of git and the image, private on disk, one key per purpose, rotation without
throwing visitors out (issue 13, item 9)."""

from __future__ import annotations

import secrets
import stat
from pathlib import Path

import jwt
import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory

from queueing import tokens
from queueing.visitors import visitor_cookie_set, visitor_identity
from waitingroom_site.environment import generated_secret, private_file

from .factories import decode_ticket
from .test_deploy import manage, production_env

ROOT = Path(__file__).resolve().parent.parent
TID = "0000000007.AbCdEfGhIjKlMnOp"
OLD_KEY = "old-secret-" + "o" * 50
NEW_KEY = "new-secret-" + "n" * 50


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def ignored(name: str) -> list[str]:
    return [line.strip() for line in (ROOT / name).read_text().splitlines()]


def test_env_files_stay_out_of_git_and_out_of_the_image():
    assert ".env*" in ignored(".gitignore")
    dockerignore = ignored(".dockerignore")
    assert {".env*", "var", ".venv", "**/__pycache__"} <= set(dockerignore)


def test_the_generated_secret_key_and_the_sqlite_database_are_their_owners_only(tmp_path):
    """With an ordinary umask (022) both would be world-readable; the database holds the private keys that
    sign access tokens."""
    env = production_env(tmp_path)
    del env["SECRET_KEY"]
    env["WR_ALLOW_GENERATED_SECRET"] = "1"
    code = (
        "from django.conf import settings; from django.db import connection; "
        "connection.cursor().execute('create table t (x int)'); print(settings.SECRET_KEY)"
    )
    result = manage("shell", "--no-imports", "-c", code, env=env, umask=0o022)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (tmp_path / "secret_key").read_text().strip()
    assert mode(tmp_path / "secret_key") == 0o600
    database = sorted(tmp_path.glob("db.sqlite3*"))
    assert database and {path.name: mode(path) for path in database} == {path.name: 0o600 for path in database}


def test_files_made_before_are_narrowed_and_a_generated_key_is_kept(tmp_path):
    older = tmp_path / "db.sqlite3"
    older.write_text("")
    older.chmod(0o644)
    private_file(older)
    assert mode(older) == 0o600

    key_file = tmp_path / "secret_key"
    key = generated_secret(key_file)
    key_file.chmod(0o644)
    assert generated_secret(key_file) == key and len(key) >= 50
    assert mode(key_file) == 0o600


def test_staff_tokens_are_signed_with_a_key_derived_for_them_not_the_secret_key(staff_user, settings):
    answer = Client().post(
        "/api/v1/auth/token", {"username": "staffer", "password": "pw-staff-123"}, content_type="application/json"
    )
    access = answer.json()["access"]
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(access, settings.SECRET_KEY, algorithms=["HS256"])
    signing_key = settings.SIMPLE_JWT["SIGNING_KEY"]
    assert len(signing_key) == 64 and signing_key not in (settings.SECRET_KEY, tokens._ticket_signing_key())
    assert jwt.decode(access, signing_key, algorithms=["HS256"])["user_id"] == str(staff_user.pk)


@pytest.fixture
def rotated(settings):
    """SECRET_KEY was OLD_KEY; `rotate()` makes it NEW_KEY with OLD_KEY as its fallback."""
    settings.WR_TICKET_SIGNING_KEY = ""
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = OLD_KEY, []

    def rotate(*, fallbacks: list[str]) -> None:
        settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW_KEY, fallbacks

    return rotate


def test_tickets_signed_before_a_rotation_are_accepted_while_the_old_key_is_a_fallback(rotated):
    ticket = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=0, epoch=1)
    numbered = tokens.position_issue(slug="sale", number=12, epoch=1)
    rotated(fallbacks=[OLD_KEY])
    assert decode_ticket(ticket, slug="sale").ticket_id == TID
    position = tokens.visitor_ticket_decode(numbered, slug="sale")
    assert isinstance(position, tokens.PositionClaims) and position.number == 12
    fresh = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=0, epoch=1)

    rotated(fallbacks=[])  # the fallback dropped: the old ticket is refused, the new one was signed anew
    with pytest.raises(tokens.InvalidTicket):
        decode_ticket(ticket, slug="sale")
    assert decode_ticket(fresh, slug="sale").ticket_id == TID


def test_a_forged_ticket_is_refused_with_fallbacks_configured(rotated):
    rotated(fallbacks=[OLD_KEY])
    forged = jwt.encode({"tid": TID}, secrets.token_hex(32), algorithm="HS256")
    with pytest.raises(tokens.InvalidTicket):
        decode_ticket(forged, slug="sale")


def test_the_visitor_cookie_signed_before_a_rotation_still_identifies_the_visitor(rotated, settings):
    response = HttpResponse()
    visitor_cookie_set(response, "c" * 22)
    signed = response.cookies[settings.WR_VISITOR_COOKIE].value
    rotated(fallbacks=[OLD_KEY])
    request = RequestFactory().get("/", HTTP_COOKIE=f"{settings.WR_VISITOR_COOKIE}={signed}")
    assert visitor_identity(request).new_cookie is None  # the same visitor, not a fresh identity


def test_secret_key_fallbacks_come_from_the_environment_and_keep_check_deploy_clean(tmp_path):
    env = production_env(tmp_path)
    fallbacks = [secrets.token_urlsafe(50), secrets.token_urlsafe(50)]
    env["SECRET_KEY_FALLBACKS"] = ",".join(fallbacks)
    result = manage(
        "shell", "--no-imports", "-c", "from django.conf import settings as s; print(*s.SECRET_KEY_FALLBACKS)", env=env
    )
    assert result.stdout.split() == fallbacks, result.stderr
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_visitor_who_comes_back_with_only_their_cookie_after_a_rotation_keeps_their_place(make_queue, settings):
    """Left over from item 9: tickets survived a rotation of SECRET_KEY, but a visitor known only by their
    cookie (a rejoin, the no-JavaScript page) was given a new ticket at the back."""
    from django.test import Client

    queue = make_queue(state="paused")
    url = f"/api/v1/queues/{queue.slug}/join"
    visitor = Client()
    first = visitor.post(url, data={}, content_type="application/json").json()
    others = [Client().post(url, data={}, content_type="application/json").json() for _ in range(3)]
    assert first["position"] == 1 and others[-1]["position"] == 4

    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "rotated-" + "n" * 50, [old]
    again = visitor.post(url, data={}, content_type="application/json")
    assert again.status_code == 200 and again.json()["ticket_id"] == first["ticket_id"]
    assert again.json()["position"] == 1
    page = visitor.get(f"/q/{queue.slug}/")  # the no-JavaScript page finds it too
    assert page.status_code == 200 and b'id="wr-position">1<' in page.content
