"""The hot path's copy of its settings (queueing.conf) follows every change of a setting."""

from __future__ import annotations

from django.test import override_settings

from queueing import conf


def test_the_copy_follows_a_changed_setting(settings):
    assert conf.hot() is conf.hot()  # copied once
    settings.WR_REDIS_PREFIX = "elsewhere"
    assert conf.hot().WR_REDIS_PREFIX == "elsewhere"
    with override_settings(ALLOWED_HOSTS=["shop.example"]):
        assert conf.hot().ALLOWED_HOSTS == ["shop.example"]
    assert conf.hot().ALLOWED_HOSTS != ["shop.example"]


def test_every_hot_setting_is_a_setting():
    for name in conf.HOT:
        assert hasattr(conf.hot(), name)
