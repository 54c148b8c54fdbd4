"""One table of a queue's settings (queueing/policy_table.py, issue 49): the model's fields and mirrored
policy, the staff API's fields, configure_queue's options and the scripts' packed policy are all made from
it, so a setting is spelled once and each of them takes it within the same bounds."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.validators import MaxValueValidator, MinValueValidator

from queueing import policy_table, store
from queueing.management.commands.configure_queue import Command as ConfigureQueue
from queueing.models import Queue

from .factories import join, status

SETTINGS = policy_table.SETTINGS


def test_the_model_s_fields_are_the_table_s_and_its_migrations_are_up_to_date(db):
    """The table changed with no migration beside it would leave the database behind the model."""
    call_command("makemigrations", "queueing", "--check", "--dry-run", stdout=StringIO())  # SystemExit(1) if not
    for setting in SETTINGS:
        field: Any = Queue._meta.get_field(setting.name)
        assert field.help_text == setting.help
        assert field.null is (setting.default is None)
        assert setting.default is None or field.default == setting.default
        bounds = {
            type(v): v.limit_value for v in field.validators if isinstance(v, MinValueValidator | MaxValueValidator)
        }
        if setting.high is not None:
            assert bounds[MaxValueValidator] == setting.high, setting.name
        assert bounds.get(MinValueValidator, 0) == (setting.low or 0), setting.name
    assert policy_table.names() == Queue.POLICY_FIELDS


def _below(setting: policy_table.Setting) -> float:
    assert setting.low is not None
    return setting.low - (1 if setting.kind in ("int", "small") else setting.low / 2)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.low], ids=lambda s: s.name)
def test_the_staff_api_refuses_a_setting_below_its_bound_and_takes_its_bound(setting, staff_api, make_queue):
    queue = make_queue(claim_ttl=5, presence_timeout=5)  # (each lowest: the others' own bounds hold at theirs)
    url = f"/api/v1/queues/{queue.slug}"
    refused = staff_api.patch(url, {setting.name: _below(setting)}, format="json")
    assert refused.status_code == 400, refused.content
    assert setting.name in json.dumps(refused.json())
    if setting.group == "adaptive":
        return  # (its bound alone is judged with the rest of the adaptive settings: test_adaptive.py)
    taken = staff_api.patch(url, {setting.name: setting.low}, format="json")
    assert taken.status_code == 200, taken.content
    assert getattr(Queue.objects.get(pk=queue.pk), setting.name) == setting.low


def test_the_staff_api_shows_and_changes_every_setting_a_stateless_queue_s_included(staff_api, make_queue):
    """Before the table the staff API had no mode or window settings: a stateless queue could be neither
    made nor read there."""
    queue = make_queue()
    changed = staff_api.patch(
        f"/api/v1/queues/{queue.slug}",
        {"mode": "stateless", "window_size": 7, "window_interval": 3, "active_windows": 4},
        format="json",
    )
    assert changed.status_code == 200, changed.content
    shown = staff_api.get(f"/api/v1/queues/{queue.slug}").json()
    assert set(policy_table.names()) <= set(shown)
    assert (shown["mode"], shown["window_size"], shown["window_interval"], shown["active_windows"]) == (
        "stateless",
        7,
        3,
        4,
    )


def test_configure_queue_has_every_setting_with_its_help_and_reads_each_by_its_kind(db):
    parser = ConfigureQueue().create_parser("manage.py", "configure_queue")
    options = {action.dest: action for action in parser._actions}
    for setting in SETTINGS:
        assert setting.brief.split(" (")[0] in (options[setting.name].help or "").replace("%%", "%"), setting.name
    out = StringIO()
    call_command(
        "configure_queue",
        "cli-table",
        "--target-url=/demo",
        "--pow-difficulty=3",
        "--adaptive-outflow=off",
        "--health-error-rate=0.2",
        "--starts-at=2031-01-02T03:04:05Z",
        "--mode=stateless",
        stdout=out,
    )
    made = json.loads(out.getvalue())
    assert (made["pow_difficulty"], made["adaptive_outflow"], made["health_error_rate"]) == (3, False, 0.2)
    assert (made["starts_at"], made["mode"]) == ("2031-01-02T03:04:05+00:00", "stateless")


def test_every_setting_is_mirrored_to_redis_by_its_name_there(make_queue):
    queue = make_queue(pow_difficulty=5, max_waiting=77, adaptive_outflow=False, health_error_rate=0.25)
    held = store.config_read(queue.slug)
    for setting in SETTINGS:
        value = setting.mirrored(getattr(queue, setting.name))
        assert held[setting.mirror] == str(value), setting.name


def test_a_policy_packed_by_an_earlier_library_is_packed_again_where_a_script_first_reads_it(make_queue, clock):
    """The packed policy's layout is the table's: a copy an earlier library packed in another layout (as the
    release before the table did: no tag, 32 places) would be read at the wrong places. The first script
    that finds it packs it again from the cfg hash, and reads it right."""
    queue = make_queue(state="paused")
    first = join(queue.slug, "v1", now=clock())
    client, keys = store.client(), store.queue_keys(queue.slug)
    tagged = json.loads(client.hget(keys.cfg, "packed"))  # type: ignore[arg-type]
    earlier = ["paused", "1", "1", 600, "0", 10, "counted", 10, 600, 60, 60, 300] + [0] * 20
    client.hset(keys.cfg, "packed", json.dumps(earlier))
    assert status(queue.slug, first, now=clock()).rank == 0
    assert json.loads(client.hget(keys.cfg, "packed")) == tagged  # type: ignore[arg-type]
