"""A worker does not outlive its parent (waitingroom_site/orphans.py), here in this process with the parent's
id and the process's exit in the test's hands. The whole story, with real processes and a real SIGKILL of
the supervisor, is test_runstack's; these run the watch where coverage sees it."""

from __future__ import annotations

import signal
import sys
import threading
import types
from collections.abc import Iterator

import pytest

from waitingroom_site import orphans


class FakeOs(types.SimpleNamespace):
    """The parent's id as the test sets it, and exits recorded rather than made."""

    def __init__(self, parent: int) -> None:
        super().__init__()
        self.parent = parent
        self.exits: list[int] = []
        self.exited = threading.Event()

    def getppid(self) -> int:
        return self.parent

    def _exit(self, code: int) -> None:
        self.exits.append(code)
        self.exited.set()


@pytest.fixture
def fake_os(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOs]:
    fake = FakeOs(parent=4242)
    monkeypatch.setattr(orphans, "os", fake)
    yield fake
    fake.parent = -1  # any watch still running sees its parent gone and ends (recorded, not made)


def test_a_worker_whose_parent_is_gone_ends_itself_once_the_grace_has_passed(fake_os):
    watch = orphans.exit_when_orphaned(0.2, every=0.01)
    assert watch is not None and watch.daemon
    assert not fake_os.exited.wait(0.3)  # its parent is there: it runs on
    fake_os.parent = 1  # the parent died: the process was handed to init
    assert fake_os.exited.wait(5)
    assert fake_os.exits == [1]
    watch.join(5)
    assert not watch.is_alive()


def test_a_grace_of_zero_means_never(fake_os):
    assert orphans.exit_when_orphaned(0) is None
    assert orphans.exit_when_orphaned(-1) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_the_kernel_is_asked_for_a_signal_at_the_parent_s_death_and_a_parent_already_gone_ends_it(fake_os):
    # Signal 0 asks for none: the call is made for real without arming this test process.
    assert orphans.die_with_parent(0) is True
    assert fake_os.exits == []
    ids = iter([4242, 1])  # the parent died between the id read and the call

    fake_os.getppid = lambda: next(ids)
    assert orphans.die_with_parent(0) is True
    assert fake_os.exits == [1]


def test_elsewhere_than_linux_no_signal_is_asked_for(monkeypatch, fake_os):
    monkeypatch.setattr(orphans, "sys", types.SimpleNamespace(platform="darwin"))
    assert orphans.die_with_parent(signal.SIGKILL) is False
    assert fake_os.exits == []


def test_a_celery_worker_starts_the_watch_and_each_pool_process_asks_for_the_signal(monkeypatch, settings):
    from waitingroom_site import celery

    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(orphans, "exit_when_orphaned", lambda grace: calls.append(("watch", grace)))
    monkeypatch.setattr(orphans, "die_with_parent", lambda: calls.append(("signal",)))
    settings.WR_WORKER_ORPHAN_GRACE_SECONDS = 7
    celery._worker_started()  # worker_init's receiver
    celery._pool_process_started()  # worker_process_init's
    assert calls == [("watch", 7), ("signal",)]
