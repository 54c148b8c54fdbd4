"""The waiting page in real headless Chromium against the running stack (gunicorn, uvicorn websockets,
Celery worker and beat): joining, moving up, being sent through, fallbacks, every state on screen."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect

from .conftest import accessible, wait_until

pytestmark = pytest.mark.browser

# Close the page's socket and make every new one fail to open.
KILL_SOCKETS = (
    "() => { window.WebSocket = function () { throw new Error('down'); }; window.waitingRoom.socket.close(); }"
)


def api_join(stack: Any, slug: str) -> dict[str, Any]:
    with stack.client() as client:
        response = client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})
        assert response.status_code in (200, 201), response.text
        return dict(response.json())


def status_of(stack: Any, slug: str, ticket: str) -> dict[str, Any]:
    with stack.client() as client:
        return dict(client.get(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {ticket}"}).json())


def complete(stack: Any, slug: str, key: str, access_token: str) -> None:
    with stack.client() as client:
        response = client.post(
            f"/api/v1/queues/{slug}/sessions/complete",
            json={"access_token": access_token},
            headers={"Authorization": f"Api-Key {key}"},
        )
        assert response.status_code == 204, response.text


def state(page: Page) -> str | None:
    return page.locator("#wr").get_attribute("data-state")


def expect_state(page: Page, name: str) -> None:
    expect(page.locator("#wr")).to_have_attribute("data-state", name)


def test_a_visitor_moves_up_is_sent_through_finishes_and_the_next_is_admitted_at_once(stack, visitor, screenshot):
    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=5, state="paused")
    key = stack.manage("create_api_key", slug).strip()
    ahead = [api_join(stack, slug) for _ in range(3)]
    first, second = visitor(), visitor()
    first.goto(f"{stack.url}/q/{slug}/")
    expect(first.locator("#wr-position")).to_have_text("4")
    second.goto(f"{stack.url}/q/{slug}/")
    expect(second.locator("#wr-position")).to_have_text("5")
    expect(first.locator("#wr-line li.you")).to_contain_text("You")
    expect(first.locator("#wr-line-wrap")).to_be_visible()  # "Around you", once there is someone to show
    screenshot(first, "flow-1-waiting")

    stack.configure(slug, state="open")  # the beat's next tick admits the first in line (capacity 1)
    seen, announced = ["4"], []
    for position, visitor_ahead in zip(("3", "2", "1"), ahead, strict=True):
        expect(first.locator("#wr-position")).to_have_text(position, timeout=10_000)
        seen.append(first.locator("#wr-position").inner_text())
        announced.append(first.locator("#wr-live").inner_text())  # what screen readers heard
        deadline = time.time() + 10
        while (info := status_of(stack, slug, visitor_ahead["ticket"]))["status"] != "admitted":
            assert time.time() < deadline, info
            time.sleep(0.2)
        complete(stack, slug, key, info["access_token"])  # the site is done with them: the next goes in
    assert seen == ["4", "3", "2", "1"]
    assert all(announced), announced

    first.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=10_000)  # token already out of the URL
    expect(first.get_by_role("heading", name="You're in")).to_be_visible()
    screenshot(first, "flow-2-protected")
    expect(second.locator("#wr-position")).to_have_text("1")

    finished_at = time.monotonic()
    first.get_by_role("button", name="Finish and let the next visitor in").click()
    expect(first.get_by_role("heading", name="Thanks, you're done")).to_be_visible()
    second.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=5_000)
    # Pushed at once, not at the next poll: within a second of the click, as the issue asks (measured
    # 0.15-0.18 s here, the protected page's load included).
    assert time.monotonic() - finished_at < 1.0
    screenshot(second, "flow-3-next-visitor-in")


def test_a_visitor_back_from_a_finished_visit_reads_that_it_is_complete_and_may_join_again(stack, visitor):
    """Issue 47, item 13: a visitor who went in, finished and came back to the waiting page read "Your
    place has expired"."""
    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=5)
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    page.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=10_000)
    page.get_by_role("button", name="Finish and let the next visitor in").click()
    expect(page.get_by_role("heading", name="Thanks, you're done")).to_be_visible()
    page.get_by_role("link", name="Back to the queue").click()
    expect_state(page, "expired")
    expect(page.locator("#wr")).not_to_contain_text("Your place has expired")
    expect(page.get_by_role("heading", name="Your visit is complete")).to_be_visible()
    expect(page.locator("#wr-expired-why")).to_have_text("Thank you!")
    accessible(page)
    page.get_by_role("button", name="Join again").click()  # a new ticket: the slot is free, so in at once
    page.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=10_000)


def test_around_you_counts_as_the_place_does_while_those_ahead_leave_and_go_in(stack, visitor):
    """Issue 47, item 10: "place 1 · 0 people ahead" beside "#1 Guest, #2 You", place 20 beside "#22 You":
    the list was asked for again only once the place had moved by three, so a move of one or two left it
    behind the place. Its own row carries the place, the rows above count down from it."""
    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=1, state="paused")
    names = ["Ann", "Bo", "Cy", "Di"]
    with stack.client() as client:
        tickets = [
            client.post(
                f"/api/v1/queues/{slug}/join", json={"display_name": name}, headers={"X-Visitor-Id": str(uuid.uuid4())}
            ).json()["ticket"]
            for name in names
        ]
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    rows = page.locator("#wr-line li")
    expect(page.locator("#wr-position")).to_have_text("5")
    expect(rows).to_have_text(["#2Bo", "#3Cy", "#4Di", "#5You"])

    with stack.client() as client:  # one ahead leaves: a move of one
        left = client.post(f"/api/v1/queues/{slug}/leave", headers={"Authorization": f"Bearer {tickets[1]}"})
        assert left.status_code == 204, left.text
    expect(page.locator("#wr-position")).to_have_text("4")
    expect(rows).to_have_text(["#1Ann", "#2Cy", "#3Di", "#4You"])

    stack.configure(slug, state="open")  # the beat's next tick lets Ann in (capacity 1): another move of one
    expect(page.locator("#wr-position")).to_have_text("3")
    expect(rows).to_have_text(["#1Cy", "#2Di", "#3You"])
    expect(page.locator("#wr-line li.you b")).to_have_text("#3")


def test_reloading_or_a_second_tab_keeps_the_same_ticket(stack, contexts):
    slug = stack.new_queue(state="paused")
    context = contexts()
    page = context.new_page()
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")
    ticket_id = page.evaluate("window.waitingRoom.ticketId")
    assert ticket_id
    page.reload()
    expect_state(page, "paused")  # rendered by the server: the page's script may still be joining
    wait_until(page, "window.waitingRoom.ticketId !== null && window.waitingRoom.ticketId !== undefined")
    assert page.evaluate("window.waitingRoom.ticketId") == ticket_id
    other_tab = context.new_page()
    other_tab.goto(f"{stack.url}/q/{slug}/")
    expect(other_tab.locator("#wr-position")).to_have_text("1")
    assert other_tab.evaluate("window.waitingRoom.ticketId") == ticket_id


def test_with_the_socket_gone_the_page_still_gets_through_by_polling(stack, visitor):
    slug = stack.new_queue(capacity=5, outflow_per_minute=600, burst=5, state="paused")
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    wait_until(page, "window.waitingRoom.socketOpen === true")
    # Kill the socket and make every reconnection fail: only polling is left.
    page.evaluate(KILL_SOCKETS)
    wait_until(page, "window.waitingRoom.socketOpen === false")
    stack.configure(slug, state="open")
    page.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=15_000)
    expect(page.get_by_role("heading", name="You're in")).to_be_visible()


def test_a_pause_and_a_resume_show_on_the_page_at_once_without_a_poll(stack, visitor):
    """Issue 51: the page hears a change of the queue's state over its socket when it is made (it heard it
    only from the next snapshot, every 5 s, which made it poll: 2.5-4.2 s after the API's answer)."""
    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=1, state="paused")
    api_join(stack, slug)  # someone ahead, who takes the one slot once the line opens
    page = visitor()
    polls: list[str] = []
    page.on("request", lambda request: polls.append(request.url) if "/status" in request.url else None)
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")
    wait_until(page, "window.waitingRoom.socketOpen === true")
    polls.clear()
    for state, shown in (("open", "waiting"), ("paused", "paused"), ("closed", "closed")):
        stack.configure(slug, state=state)
        expect(page.locator("#wr")).to_have_attribute("data-state", shown, timeout=3_000)
    assert polls == []  # told by the push, not found by a poll


def test_without_javascript_a_visitor_still_gets_through(stack, visitor, screenshot):
    slug = stack.new_queue(capacity=5, outflow_per_minute=600, burst=5, state="paused")
    page = visitor(java_script_enabled=False)
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "join")
    screenshot(page, "nojs-1-join")
    page.get_by_role("button", name="Join the line").click()
    expect_state(page, "paused")
    expect(page.locator("#wr-position")).to_have_text("1")
    expect(page.locator("#wr-line-wrap")).to_be_hidden()  # issue 20: no empty "Around you" without script
    expect(page.get_by_text("you are in a fair line")).to_be_visible()
    screenshot(page, "nojs-2-waiting")
    stack.configure(slug, state="open")
    # The page refreshes itself; once admitted it forwards to the site, which keeps the token in a cookie.
    page.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=20_000)
    expect(page.get_by_role("heading", name="You're in")).to_be_visible()


def test_without_javascript_a_full_line_joins_by_itself_once_there_is_room(stack, visitor, screenshot):
    # Outflow 6,000 a minute: a full line's retry comes after its shortest wait, 5 s.
    slug = stack.new_queue(state="paused", max_waiting=1, outflow_per_minute=6000)
    api_join(stack, slug)
    page = visitor(java_script_enabled=False)
    page.goto(f"{stack.url}/q/{slug}/")
    page.get_by_role("button", name="Join the line").click()
    expect_state(page, "full")
    expect(page.locator("#wr-full-retry")).to_have_text(re.compile(r"^Trying again in \d+ s\.$"))
    screenshot(page, "nojs-3-full")
    stack.configure(slug, max_waiting=0)  # room now; nobody touches the page
    # Its own refresh retries the join (within the 5 s it announced, and the time the page takes).
    expect(page.locator("#wr")).to_have_attribute("data-state", "paused", timeout=20_000)
    expect(page.locator("#wr-position")).to_have_text("2")


def test_an_open_page_learns_that_the_draw_s_seed_was_revealed_at_the_start(stack, visitor):
    """Issue 20: the page kept saying "the seed is revealed at the start" after the start until reloaded."""
    starts = datetime.now(UTC) + timedelta(seconds=8)
    slug = stack.new_queue(starts_at=starts.strftime("%Y-%m-%dT%H:%M:%SZ"))
    page = visitor()
    page.route(f"**/demo/{slug}/**", lambda route: route.fulfill(status=204))  # let in: a 204 keeps the page
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "prequeue")
    expect(page.locator("[data-shuffle=before]")).to_be_visible()
    expect(page.locator("[data-shuffle=after]")).to_be_hidden()
    expect(page.locator("#wr")).not_to_have_attribute("data-state", "prequeue", timeout=30_000)
    expect(page.locator("[data-shuffle=after]")).to_be_visible()
    expect(page.locator("[data-shuffle=before]")).to_be_hidden()


def test_an_open_page_counts_down_to_a_start_the_operator_moved_at_once(stack, visitor):
    """Issue 51: an operator moving a sale's start was seen by an open page only at its next poll, far apart
    before a start (the countdown kept the old time). The change is pushed, and the page asks for its status."""
    starts = datetime.now(UTC) + timedelta(hours=2)
    slug = stack.new_queue(starts_at=starts.strftime("%Y-%m-%dT%H:%M:%SZ"))
    page = visitor()
    seen: list[str] = []  # what the page heard and asked, in order: socket events by type, and its polls

    def heard(payload: Any) -> None:
        with contextlib.suppress(ValueError, AttributeError):  # (a frame that is not an event)
            seen.append(str(json.loads(payload).get("type")))

    page.on("websocket", lambda socket: socket.on("framereceived", heard))
    page.on("request", lambda request: seen.append("poll") if "/status" in request.url else None)
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "prequeue")
    expect(page.locator("#wr-opens-in")).to_have_text(re.compile(r"^(1:59|2:00):\d{2}$"))
    wait_until(page, "window.waitingRoom.socketOpen === true")
    moved = datetime.now(UTC) + timedelta(minutes=10)
    stack.configure(slug, starts_at=moved.strftime("%Y-%m-%dT%H:%M:%SZ"))
    expect(page.locator("#wr-opens-in")).to_have_text(re.compile(r"^(9|10):\d{2}$"), timeout=5_000)
    after = seen[seen.index("schedule") :]
    assert after[: after.index("poll")].count("snapshot") == 0, seen  # asked because told, not at a snapshot


# The browser's notifications and vibration, recorded (headless Chromium has neither to show), and a tab
# in the background, as on a phone whose visitor went elsewhere while waiting.
CALL_BACK_STUBS = """
  window.__told = { vibrations: [], notifications: [], asked: 0 };
  navigator.vibrate = (pattern) => { window.__told.vibrations.push(pattern); return true; };
  class Note {
    constructor(title, options) { window.__told.notifications.push([title, options && options.body]); }
    close() {}
  }
  Note.permission = "default";
  Note.requestPermission = () => {
    window.__told.asked += 1;
    Note.permission = "granted";
    return Promise.resolve("granted");
  };
  window.Notification = Note;
  Object.defineProperty(document, "hidden", { get: () => window.__background === true });
  window.__told.titles = [];
  const title = Object.getOwnPropertyDescriptor(Document.prototype, "title");
  Object.defineProperty(document, "title", {
    get: () => title.get.call(document),
    set: (value) => { window.__told.titles.push(value); title.set.call(document, value); },
  });
"""


def test_a_visitor_in_a_background_tab_is_called_back_at_their_turn_and_sees_it_held(stack, visitor):
    """Issue 20, item 5: admitted on a phone in a background tab, nothing called the visitor back. The tab's
    title says it is their turn, the phone vibrates, a notification comes if they asked for one (the
    page's button), and the admitted card counts down how long their turn is held."""
    slug = stack.new_queue(capacity=1, state="paused", claim_ttl=120)
    page = visitor()
    page.add_init_script(CALL_BACK_STUBS)
    page.route(f"**/demo/{slug}/**", lambda route: route.fulfill(status=204))  # stay on the page
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")
    button = page.locator("#wr-notify")
    expect(button).to_be_visible()
    button.click()
    expect(button).to_be_hidden()
    expect(page.locator("#wr-notify-said")).to_have_text("We will notify you when it is your turn.")
    title = page.title()
    page.evaluate("() => { window.__background = true; }")
    stack.configure(slug, state="open")
    expect_state(page, "admitted")
    told = page.evaluate("() => window.__told")
    # (as set by the page: while the hand-over loads, Chromium may show "Loading …" as the tab's title)
    assert told["titles"][-1] == f"\u25b6 It's your turn \u00b7 {title}"
    assert told["asked"] == 1 and told["vibrations"] == [[200, 100, 200]]
    assert [note[0] for note in told["notifications"]] == ["It's your turn"]
    held = page.locator("#wr-held")
    expect(held).to_have_text(re.compile(r"Your turn is held for [12]:\d\d\."))
    first = held.inner_text()
    expect(held).not_to_have_text(first, timeout=3_000)  # it counts down


def test_a_visitor_who_did_not_ask_is_not_notified_and_the_button_is_gone_once_answered(stack, visitor):
    slug = stack.new_queue(capacity=1, state="paused")
    page = visitor()
    page.add_init_script(CALL_BACK_STUBS + "Note.permission = 'denied';")
    page.route(f"**/demo/{slug}/**", lambda route: route.fulfill(status=204))
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")
    expect(page.locator("#wr-notify")).to_be_hidden()  # the visitor said no before: never asked again
    page.evaluate("() => { window.__background = true; }")
    stack.configure(slug, state="open")
    expect_state(page, "admitted")
    assert page.evaluate("() => window.__told.notifications") == []


def test_the_estimate_counts_down_smoothly_between_updates(stack, visitor):
    slug = stack.new_queue(capacity=100, outflow_per_minute=1, burst=1)
    for _ in range(5):
        api_join(stack, slug)
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "waiting")
    wait_until(page, "window.waitingRoom.position !== null")
    first = page.evaluate("document.getElementById('wr-eta').textContent")
    assert "minute" in first
    # With its range, in minutes people read (issue 18): "(3-8 minutes)", an en dash between
    expect(page.locator("#wr-eta-range")).to_have_text(re.compile("^\\(\\d+\u2013\\d+ minutes\\)$"))
    # The shown figure ticks down by itself, never up while nothing changes.
    shown = []
    for _ in range(3):
        time.sleep(1.1)
        shown.append(page.evaluate("Math.round(window.waitingRoomEta.shown)"))
    assert shown == sorted(shown, reverse=True) and shown[0] > shown[-1]


def test_the_estimate_never_flickers_up_on_one_higher_figure_but_follows_two_and_glides_down(stack, visitor):
    """The rule in waiting.js (window.waitingRoomEta), run in the page's own engine: figures within 15 %
    (or 10 s) change nothing; a lower one is glided to; a higher one is believed only when the next agrees."""
    slug = stack.new_queue(state="closed")  # a page whose own updates leave the estimate alone
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "closed")
    steps = page.evaluate(
        """() => {
          const eta = window.waitingRoomEta, seen = [];
          const step = (estimate) => { eta.update(estimate); seen.push([estimate, eta.shown, eta.target]); };
          eta.update(null); eta.higher = 0;
          step(600);          // the first figure is shown as it is
          step(650);          // within 15 %: nothing changes
          step(900);          // higher, once: not believed yet
          step(610);          // back within tolerance: the higher one is forgotten
          step(900);          // higher, once again: still not believed
          step(880);          // higher, twice in a row: believed
          eta.shown = 880; eta.target = null;
          step(300);          // lower: glided to
          const glide = [];
          for (let i = 0; i < 3; i++) { eta.tick(1); glide.push(eta.shown); }
          eta.update(null);
          return { seen, glide };
        }"""
    )
    seen = steps["seen"]
    assert [s[1] for s in seen[:6]] == [600, 600, 600, 600, 600, 600]  # nothing jumped while it was unsure
    assert [s[2] for s in seen[:6]] == [None, None, None, None, None, 880]  # ... until two higher agreed
    assert seen[6][2] == 300  # a lower figure becomes the target at once
    glide = steps["glide"]
    assert 300 < glide[2] < glide[1] < glide[0] < 880  # moving smoothly towards it, not jumping


# --- Every state, on a phone-sized screen -------------------------------------------------------------


def test_every_state_renders(stack, visitor, screenshot):
    url = f"{stack.url}/q/{{}}/"

    waiting = stack.new_queue(capacity=100, outflow_per_minute=1, burst=1)
    for _ in range(8):
        api_join(stack, waiting)
    page = visitor()
    page.goto(url.format(waiting))
    expect_state(page, "waiting")
    expect(page.locator("#wr-eta")).to_contain_text("minute")
    page.wait_for_timeout(800)
    screenshot(page, "state-waiting")
    accessible(page)  # issue 20: axe-core clean in every state

    paused = stack.new_queue(state="paused")
    page = visitor()
    page.goto(url.format(paused))
    expect_state(page, "paused")
    expect(page.locator(".wr-note")).to_contain_text("The line is paused")
    screenshot(page, "state-paused")
    accessible(page)  # issue 20: axe-core clean in every state

    prequeue = stack.new_queue(starts_at="2099-01-01T00:00:00Z")
    page = visitor()
    page.goto(url.format(prequeue))
    expect_state(page, "prequeue")
    expect(page.locator("#wr-opens-in")).to_have_text(re.compile(r"^\d+ days \d{2}:\d{2}:\d{2}$"))
    expect(page.locator("#wr-eta")).to_have_text(re.compile(r"^more than \d+ days$"))
    # Issue 18: no "place 1, 0 ahead" and full bar before the draw; how many have a ticket, and that the
    # order is drawn at the start.
    expect(page.locator("#wr-position")).to_be_hidden()
    expect(page.locator("#wr-progress")).to_be_hidden()
    expect(page.locator(".wr-drawn")).to_be_visible()
    expect(page.locator(".wr-drawn")).to_contain_text("1 person has a ticket so far")
    expect(page.locator(".wr-drawn")).to_contain_text("drawn at random")
    screenshot(page, "state-prequeue")
    accessible(page)  # issue 20: axe-core clean in every state
    expect(page.locator("#wr-shuffle")).to_contain_text("SHA-256")  # the shuffle's commitment is shown

    notyet = stack.new_queue(prequeue_opens_at="2098-12-31T12:00:00Z", starts_at="2099-01-01T00:00:00Z")
    page = visitor()
    page.goto(url.format(notyet))
    expect_state(page, "notyet")
    # In the visitor's time zone and language's format (issue 20): here en-US, as Intl words it.
    local = page.evaluate(
        "() => new Intl.DateTimeFormat('en', {dateStyle: 'long', timeStyle: 'short'})"
        ".format(new Date('2098-12-31T12:00:00Z'))"
    )
    expect(page.locator("#wr-opens-at")).to_have_text(local)
    assert "2098" in local
    screenshot(page, "state-notyet")
    accessible(page)  # issue 20: axe-core clean in every state

    admitted = stack.new_queue(capacity=5, burst=5)
    page = visitor()
    # Answer the site's page with 204 No Content, so the browser stays to show the state it left from.
    page.route(re.compile(rf"/demo/{admitted}/protected/"), lambda route: route.fulfill(status=204))
    page.goto(url.format(admitted))
    expect_state(page, "admitted")
    expect(page.get_by_role("heading", name="It's your turn")).to_be_visible()
    screenshot(page, "state-admitted")
    accessible(page)  # issue 20: axe-core clean in every state

    expired = stack.new_queue(state="paused")
    key = stack.manage("create_api_key", expired).strip()
    page = visitor()
    page.goto(url.format(expired))
    wait_until(page, "window.waitingRoom.socketOpen === true")
    with stack.client() as client:
        ticket_id = page.evaluate("window.waitingRoom.ticketId")
        client.post(
            f"/api/v1/queues/{expired}/sessions/revoke",
            json={"ticket_id": ticket_id},
            headers={"Authorization": f"Api-Key {key}"},
        )
    expect_state(page, "expired")
    expect(page.locator("#wr-expired-why")).to_have_text("Your place was withdrawn.")
    screenshot(page, "state-expired")
    accessible(page)  # issue 20: axe-core clean in every state
    page.get_by_role("button", name="Join again").click()
    expect_state(page, "paused")  # a new ticket

    closed = stack.new_queue(state="closed")
    page = visitor()
    page.goto(url.format(closed))
    expect_state(page, "closed")
    screenshot(page, "state-closed")
    accessible(page)  # issue 20: axe-core clean in every state

    full = stack.new_queue(state="paused", max_waiting=1)
    api_join(stack, full)
    page = visitor()
    page.goto(url.format(full))
    expect_state(page, "full")
    expect(page.locator("#wr-full-retry")).to_contain_text("Trying again in")
    screenshot(page, "state-full")
    accessible(page)  # issue 20: axe-core clean in every state

    limited = stack.new_queue(state="paused")
    page = visitor()

    joins: list[float] = []

    def too_many_once(route: Route) -> None:
        joins.append(time.monotonic())
        if len(joins) > 1:
            route.continue_()  # the retry reaches the server
            return
        body = '{"error": {"code": "rate_limited", "message": "Too many requests.", "retry_after_seconds": 3}}'
        route.fulfill(status=429, body=body, headers={"Retry-After": "3", "Content-Type": "application/json"})

    page.route(re.compile(r"/api/v1/queues/[^/]+/join$"), too_many_once)
    page.goto(url.format(limited))
    expect_state(page, "limited")
    expect(page.locator("#wr-limited-in")).to_have_text(re.compile(r"^[1-3]$"))
    screenshot(page, "state-limited")
    accessible(page)  # issue 20: axe-core clean in every state
    # It retries by itself once the Retry-After has passed, and joins.
    expect(page.locator("#wr")).to_have_attribute("data-state", "paused", timeout=10_000)
    assert len(joins) == 2 and 2.5 <= joins[1] - joins[0] <= 6
    assert stack.waiting(limited) == 1

    offline = stack.new_queue(state="paused")
    page = visitor()
    page.goto(url.format(offline))
    wait_until(page, "window.waitingRoom.socketOpen === true")
    page.route(re.compile(r"/api/v1/queues/[^/]+/status$"), lambda route: route.abort())
    page.evaluate(
        "() => { window.WebSocket = function () { throw new Error('down'); }; window.waitingRoom.socket.close(); }"
    )
    expect_state(page, "offline")
    screenshot(page, "state-offline")
    accessible(page)  # issue 20: axe-core clean in every state


def test_the_page_fits_a_phone_screen(stack, visitor):
    slug = stack.new_queue(state="paused")
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
    assert page.locator("#wr-live").get_attribute("aria-live") == "polite"
    assert page.locator("#wr-progress").get_attribute("role") == "progressbar"


def test_with_the_proof_of_work_gate_on_the_page_solves_the_puzzle_in_a_worker_and_joins(stack, visitor, screenshot):
    slug = stack.new_queue(state="paused", pow_difficulty=15)
    page = visitor()
    # Every state the page takes, recorded as it happens: the puzzle may be solved before a look could
    # catch the page in "pow" (CI's run did).
    page.add_init_script(
        """window.__states = [];
        document.addEventListener("readystatechange", () => {
          const wr = document.getElementById("wr");
          if (document.readyState !== "interactive" || !wr) return;
          window.__states.push(wr.dataset.state);
          new MutationObserver(() => window.__states.push(wr.dataset.state))
            .observe(wr, { attributes: true, attributeFilter: ["data-state"] });
        });"""
    )
    page.goto(f"{stack.url}/q/{slug}/")
    expect_state(page, "paused")  # solved, joined
    states = page.evaluate("() => window.__states")
    assert "pow" in states and states.index("pow") < states.index("paused"), states  # asked, then solved
    screenshot(page, "state-pow-solved")
    expect(page.locator("#wr-position")).to_have_text("1")
    assert page.evaluate("document.getElementById('wr-pow-bar').style.width") == "100%"
    assert stack.waiting(slug) == 1
    page.reload()  # the visitor's ticket comes back without another puzzle
    wait_until(page, "window.waitingRoom.ticketId !== null && window.waitingRoom.ticketId !== undefined")
    expect_state(page, "paused")
    assert stack.waiting(slug) == 1


def test_a_stateless_queues_page_follows_the_window_and_goes_through_without_polling_its_status(
    stack, visitor, screenshot
):
    slug = stack.new_queue(mode="stateless", window_size=2, window_interval=2, state="paused")
    for _ in range(4):
        api_join(stack, slug)  # numbers 1-4, ahead of the page
    page = visitor()
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url.split("?")[0].rsplit("/", 1)[-1]))
    page.goto(f"{stack.url}/q/{slug}/")
    expect(page.locator("#wr-position")).to_have_text("5")
    expect(page.locator("#wr-number")).to_have_text("5")
    expect_state(page, "paused")
    screenshot(page, "stateless-1-waiting")

    stack.configure(slug, state="open")  # the beat's tick moves the window by 2 every 2 s
    expect(page.locator("#wr-position")).to_have_text("3", timeout=10_000)
    screenshot(page, "stateless-2-moving")
    page.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"), timeout=15_000)
    expect(page.get_by_role("heading", name="You're in")).to_be_visible()
    # It learnt every move from the window (pushed, or read from the public endpoint) and asked for its
    # own status only when the window reached it, for the access token.
    assert asked.count("status") <= 2, asked


def test_an_admissions_link_opened_in_a_second_browser_is_refused_with_the_reason(stack, contexts, screenshot):
    """Seen: one `?wr_access=` link opened in three browsers let all three in, at once, until it expired."""
    # One slot: the second browser, sent to the waiting page, joins the line there and stays to read why.
    slug = stack.new_queue(capacity=1, outflow_per_minute=600, burst=5)
    admitted = api_join(stack, slug)
    assert admitted["status"] == "admitted", admitted
    link = admitted["redirect_url"]
    link = f"{stack.url}{link}" if link.startswith("/") else link

    first = contexts().new_page()
    first.goto(link)
    first.wait_for_url(re.compile(rf"/demo/{slug}/protected/$"))
    expect(first.get_by_role("heading", name="You're in")).to_be_visible()

    second = contexts().new_page()  # another browser: its own cookies
    second.goto(link)
    second.wait_for_url(re.compile(rf"/q/{slug}/\?reason=bound_elsewhere$"))
    expect(second.get_by_text("already used in another browser")).to_be_visible()
    screenshot(second, "link-used-in-another-browser")

    first.reload()
    expect(first.get_by_role("heading", name="You're in")).to_be_visible()  # the first keeps its session
