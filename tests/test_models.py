"""Queue configuration is validated in the model, so admin, API and commands refuse the same things."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from queueing import services
from queueing.models import PriorityCode, PriorityLevel, Queue


def configure(**changes):
    values = {"name": "Sale", "target_url": "https://shop.example/"}
    values.update(changes)
    return services.queue_configure(slug=changes.pop("slug", "sale"), changes=values)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"capacity": 0}, "capacity"),
        ({"outflow_per_minute": -5}, "outflow_per_minute"),
        ({"outflow_per_minute": 0}, "outflow_per_minute"),
        ({"burst": 0}, "burst"),
        ({"claim_ttl": 600, "session_ttl": 300}, "claim_ttl"),
        ({"presence_timeout": 120, "abandon_timeout": 60}, "abandon_timeout"),
        ({"session_ttl": 1}, "session_ttl"),
        ({"target_url": "ftp://x/"}, "target_url"),
        ({"target_url": "//evil.example/"}, "target_url"),
        ({"state": "melting"}, "state"),
        ({"capacity_source": "guessed"}, "capacity_source"),
    ],
)
def test_invalid_settings_are_refused_with_the_field_named(db, changes, field):
    with pytest.raises(ValidationError) as caught:
        configure(**changes)
    assert field in caught.value.message_dict
    assert not Queue.objects.exists()


@pytest.mark.parametrize("slug", ["Upper", "-lead", "trail-", "a" * 51, "sp ace", "dots.no"])
def test_bad_slugs_are_refused(db, slug):
    with pytest.raises(ValidationError):
        configure(slug=slug)


def test_a_new_queue_gets_the_four_default_priority_levels(db):
    queue, created = configure()
    assert created
    assert list(queue.priority_levels.values_list("level", "placement_fraction")) == [
        (0, 0.0),
        (1, 0.1),
        (2, 0.5),
        (3, 1.0),
    ]


def test_normal_level_must_stay_at_the_back(db):
    queue, _ = configure()
    level = queue.priority_levels.get(level=0)
    level.placement_fraction = 0.3
    with pytest.raises(ValidationError):
        level.full_clean()


def test_priority_fraction_stays_within_0_and_1(db):
    queue, _ = configure()
    level = queue.priority_levels.get(level=2)
    level.placement_fraction = 1.5
    with pytest.raises(ValidationError):
        level.full_clean()


def test_priority_codes_cannot_have_zero_uses_or_a_bad_shape(db):
    queue, _ = configure()
    with pytest.raises(ValidationError):
        PriorityCode(queue=queue, code="Spring-VIP-2026", level=2, max_uses=0).full_clean()
    with pytest.raises(ValidationError):
        PriorityCode(queue=queue, code="x y", level=2).full_clean()
    PriorityCode(queue=queue, code="Spring-VIP-2026", level=2, max_uses=10).full_clean()


def test_the_policy_mirrored_to_redis_includes_placement_fractions(db):
    queue, _ = configure()
    PriorityLevel.objects.filter(queue=queue, level=1).update(placement_fraction=0.2)
    policy = Queue.objects.get(pk=queue.pk).policy()
    assert (policy["pf1"], policy["pf2"], policy["pf3"]) == (0.2, 0.5, 1.0)
    assert policy["capacity"] == queue.capacity and policy["state"] == "open"
