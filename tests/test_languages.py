"""Languages (issue 20, item 1): the waiting page in the visitor's language, negotiated from Accept-Language
or chosen with the page's switcher, with complete catalogs for German, French and Spanish (Arabic for the
right-to-left layout), the same words from the server and from the page's script."""

from __future__ import annotations

import gettext
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCALE = ROOT / "locale"
JOIN = {"en": "Join the line", "de": "In die Schlange stellen", "fr": "Rejoindre la file", "es": "Unirse a la fila"}


def page(client, slug, **headers):
    return client.get(f"/q/{slug}/", **headers).content.decode()


@pytest.mark.parametrize("language", ["de", "fr", "es"])
def test_the_waiting_page_speaks_the_language_the_browser_asks_for(client, make_queue, language):
    queue = make_queue(state="paused")
    text = page(client, queue.slug, HTTP_ACCEPT_LANGUAGE=f"{language}-XX,{language};q=0.9,en;q=0.5")
    assert f'<html lang="{language}" dir="ltr">' in text
    assert f'value="join">{JOIN[language]}</button>' in text
    assert "Join the line" not in text and "Your place in line" not in text
    assert f'src="/jsi18n/?l={language}"' in text  # the script's words, at an address per language


def test_without_a_language_asked_for_the_page_is_english(client, make_queue):
    text = page(client, make_queue(state="paused").slug)
    assert '<html lang="en" dir="ltr">' in text and f'value="join">{JOIN["en"]}</button>' in text


def test_the_switcher_keeps_the_chosen_language_over_the_browser_s(client, make_queue):
    queue = make_queue(state="paused")
    text = page(client, queue.slug, HTTP_ACCEPT_LANGUAGE="de")
    switcher = re.search(r'<form class="wr-languages" action="([^"]+)" method="post"', text)
    assert switcher and 'value="es" lang="es">Español</button>' in text
    answer = client.post(switcher.group(1), {"language": "es", "next": f"/q/{queue.slug}/"})
    assert answer.status_code == 302 and answer["Location"] == f"/q/{queue.slug}/"
    assert f'value="join">{JOIN["es"]}</button>' in page(client, queue.slug, HTTP_ACCEPT_LANGUAGE="de")


def test_a_right_to_left_language_turns_the_page_around(client, make_queue):
    text = page(client, make_queue(state="paused").slug, HTTP_ACCEPT_LANGUAGE="ar")
    assert '<html lang="ar" dir="rtl">' in text


def test_the_script_s_catalogue_is_the_language_s_and_kept_by_browsers(client, db):
    answer = client.get("/jsi18n/?l=fr", HTTP_ACCEPT_LANGUAGE="fr")
    assert answer.status_code == 200 and "javascript" in answer["Content-Type"]
    assert (
        "Vous \\u00eates dans la file." in answer.content.decode()
        or "Vous êtes dans la file." in answer.content.decode()
    )
    assert "max-age=3600" in answer["Cache-Control"] and "public" in answer["Cache-Control"]


def test_waits_are_worded_in_the_visitor_s_language(settings):
    from django.utils import translation

    from queueing.templatetags.waiting import countdown_text, wait_text

    with translation.override("de"):
        assert wait_text(30) == "weniger als eine Minute"
        assert wait_text(300) == "etwa 5 Minuten"
        assert wait_text(4500) == "etwa 1 Stunde 15 Minuten"
        assert countdown_text(2 * 86400 + 5) == "2 Tage 00:00:05"
    with translation.override("fr"):
        assert wait_text(300) == "environ 5 minutes" and wait_text(3 * 86400) == "plus de 3 jours"
    with translation.override("es"):
        assert wait_text(60) == "alrededor de un minuto"


def catalog(path: Path) -> dict[object, str]:
    with path.open("rb") as compiled:
        return dict(gettext.GNUTranslations(compiled)._catalog)  # type: ignore[attr-defined]


@pytest.mark.parametrize("language", ["de", "fr", "es", "ar"])
@pytest.mark.parametrize("domain", ["django", "djangojs"])
def test_every_catalog_is_complete_and_its_compiled_copy_is_up_to_date(tmp_path, language, domain):
    """Every visitor-facing message has a translation (nothing untranslated or fuzzy), and the .mo files
    the server reads are what the .po files say (compiled here with msgfmt, compared message by message)."""
    msgfmt = shutil.which("msgfmt")
    assert msgfmt, "msgfmt (Debian package gettext) is needed; bin/test installs it"
    source = LOCALE / language / "LC_MESSAGES" / f"{domain}.po"
    fresh = tmp_path / "fresh.mo"
    done = subprocess.run(
        [msgfmt, "--check", "--statistics", "-o", str(fresh), str(source)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "untranslated" not in done.stderr and "fuzzy" not in done.stderr, done.stderr
    assert catalog(source.with_suffix(".mo")) == catalog(fresh)


def test_the_error_pages_a_visitor_can_meet_are_in_their_language(client, make_queue, settings):
    settings.DEBUG = False
    missing = client.get("/q/no-such-queue/", HTTP_ACCEPT_LANGUAGE="de").content.decode()
    assert "Hier gibt es keine Seite" in missing and '<html lang="de"' in missing
    queue = make_queue(state="paused")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: the page's 503
    away = client.get(f"/q/{queue.slug}/", HTTP_ACCEPT_LANGUAGE="fr")
    text = away.content.decode()
    assert away.status_code == 503 and "De retour dans un instant" in text
    assert re.search(r"r\u00e9essaie d\u2019elle-m\u00eame dans \d+ secondes", text)


def test_the_operators_own_words_are_shown_in_the_visitors_language_where_given(admin_client, make_queue):
    """Issue 20: the queue's name, intro and closed page were the operator's words in one language. A queue
    may give them per language (admin's "texts in other languages"): audited, mirrored with the policy, shown
    to visitors who read that language; a word not given falls back to the queue's own."""
    from django.test import Client

    from queueing import services
    from queueing.models import QueueChange

    from .test_admin import FORM

    queue = make_queue(state="paused", name="Spring tour", intro="One order per person.")
    services.queue_configure(slug=queue.slug, changes={"closed_message": "Sold out."}, actor_label="tests")
    data = {k: v for k, v in FORM.items() if k != "slug"}
    data |= {
        "name": "Spring tour",
        "intro": "One order per person.",
        "closed_message": "Sold out.",
        "state": "paused",
        "priority_levels-TOTAL_FORMS": "0",
        "priority_levels-INITIAL_FORMS": "0",
        "texts-TOTAL_FORMS": "1",
        "texts-INITIAL_FORMS": "0",
        "texts-0-language": "de",
        "texts-0-name": "Frühjahrstour",
        "texts-0-intro": "Eine Bestellung pro Person.",
        "texts-0-closed_message": "Ausverkauft.",
        "texts-0-closed_link_text": "",
    }
    saved = admin_client.post(f"/admin/queueing/queue/{queue.pk}/change/", data)
    assert saved.status_code == 302, saved.content.decode()[:3000]
    entry = QueueChange.objects.get(queue=queue, action="texts")
    assert entry.summary().startswith("text de name Frühjahrstour, intro Eine Bestellung pro Person.")

    german = page(Client(), queue.slug, HTTP_ACCEPT_LANGUAGE="de")
    assert '<h1 id="wr-title">Frühjahrstour</h1>' in german and "Eine Bestellung pro Person." in german
    assert "<title>Frühjahrstour · " in german
    french = page(Client(), queue.slug, HTTP_ACCEPT_LANGUAGE="fr")
    assert '<h1 id="wr-title">Spring tour</h1>' in french and "One order per person." in french  # not given
    services.queue_configure(slug=queue.slug, changes={"state": "closed"}, actor_label="tests")
    assert "Ausverkauft." in page(Client(), queue.slug, HTTP_ACCEPT_LANGUAGE="de")
    assert "Sold out." in page(Client(), queue.slug, HTTP_ACCEPT_LANGUAGE="es")


def test_the_apis_error_messages_are_in_the_language_asked_for(client, make_queue, api):
    """Issue 20, item 1: the API's messages were English whatever the visitor read. Codes stay as they are;
    the message follows Accept-Language, on Django's path (DRF views) and on the hot path in front of it."""
    queue = make_queue(state="closed")
    joined = client.post(f"/api/v1/queues/{queue.slug}/join", "{}", "application/json", HTTP_ACCEPT_LANGUAGE="de")
    assert joined.json()["error"] == {
        "code": "queue_closed",
        "message": "Diese Schlange ist geschlossen und nimmt niemanden mehr auf.",
    }
    polled = client.get(
        f"/api/v1/queues/{queue.slug}/status", HTTP_AUTHORIZATION="Bearer nope", HTTP_ACCEPT_LANGUAGE="fr"
    )
    assert polled.json()["error"]["message"] == "Le ticket n'est pas valable pour cette file."
    missing = client.get("/api/v1/queues/no-such-queue/window", HTTP_ACCEPT_LANGUAGE="es")
    assert missing.json()["error"]["message"] == "La fila «no-such-queue» no es una fila sin estado (o no existe)."
    paused = make_queue(state="paused")
    ticket = client.post(f"/api/v1/queues/{paused.slug}/join", "{}", "application/json").json()["ticket"]
    notify = client.post(
        f"/api/v1/queues/{paused.slug}/notify",
        '{"email": "ada@example.com", "surprise": 1}',
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {ticket}",
        HTTP_ACCEPT_LANGUAGE="es",
    )
    assert notify.json()["error"]["message"] == "Campo(s) desconocido(s): surprise."  # a DRF view's
    english = client.post(f"/api/v1/queues/{queue.slug}/join", "{}", "application/json")
    assert english.json()["error"]["message"] == "This queue is closed and takes no new visitors."
