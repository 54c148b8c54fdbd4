"""The websocket server's event-loop watch (issue 15): a pause of the loop is measured and reported."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from queueing import loopwatch

pytestmark = pytest.mark.asyncio


async def test_a_stalled_loop_is_reported_as_a_warning_with_how_long_it_stopped(settings, caplog):
    settings.WR_WS_REPORT_SECONDS = 1
    watch = loopwatch.LoopWatch()
    caplog.set_level(logging.INFO, logger="queueing.loopwatch")
    watch.ensure(lambda: "3 sockets over 1 queues")
    await asyncio.sleep(0.2)
    time.sleep(0.4)  # holds the loop, as a synchronous call by mistake would
    deadline = time.monotonic() + 5
    while watch.reports < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert watch._task is not None
    watch._task.cancel()
    [record] = [r for r in caplog.records if r.name == "queueing.loopwatch"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "3 sockets over 1 queues" in message and loopwatch.MARK in message
    pause = float(message.split(loopwatch.MARK)[1].split("ms")[0])
    assert 350 <= pause < 1000


async def test_a_quiet_loop_is_reported_at_info_and_the_watch_can_be_turned_off(settings, caplog):
    settings.WR_WS_REPORT_SECONDS = 1
    caplog.set_level(logging.INFO, logger="queueing.loopwatch")
    watch = loopwatch.LoopWatch()
    watch.ensure(lambda: "")
    deadline = time.monotonic() + 5
    while watch.reports < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert watch._task is not None
    watch._task.cancel()
    assert [r.levelno for r in caplog.records if r.name == "queueing.loopwatch"] == [logging.INFO]
    settings.WR_WS_REPORT_SECONDS = 0
    off = loopwatch.LoopWatch()
    off.ensure(lambda: "")
    assert off._task is None
