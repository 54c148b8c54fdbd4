/*
 * The waiting page, live. Plain JavaScript, no build step.
 *
 * On arrival it joins through the API (the visitor cookie makes that idempotent: a reload or a second
 * tab gets the same ticket back), then listens on the websocket: `admitted` sends the visitor through
 * at once, `queue_move` moves its place (ops applied in event-sequence order; a gap means an event was
 * missed, so it asks for the truth), `position` and `snapshot` refresh the figures, `state` says at once
 * that the line paused, resumed, closed or opened, `schedule` that its times moved (it asks for its
 * status then). Polling the status
 * API is the safety net: rarely while the socket is healthy, at the server's `poll_after_seconds` (which
 * carries jitter) whenever it is not. The estimated wait counts down smoothly between updates and only
 * moves up again when two updates in a row say so.
 */
(function () {
  "use strict";

  var root = document.getElementById("wr");
  var configNode = document.getElementById("wr-config");
  if (!root || !configNode) return;
  var config = JSON.parse(configNode.textContent);

  var SAFETY_POLL_SECONDS = 30;
  var MAX_RECONNECT_MS = 30000;
  var ANNOUNCE_EVERY_MS = 15000;

  var S = {
    ticket: null,
    ticketId: null,
    wsUrl: null,
    status: null,
    position: null,
    queueLength: null,
    queueState: null,
    seq: 0,
    epoch: null, // event sequences start again when a new epoch begins (Redis lost the queue's state)
    pollAfter: 5,
    pollTimer: null,
    socket: null,
    socketOpen: false,
    reconnectMs: 1000,
    reconnectTimer: null,
    opensAt: null,
    rate: null, // admissions per second, from snapshots
    stateless: config.mode === "stateless", // a numbered ticket and a sliding window (SPEC 4)
    place: null, // stateless: the ticket's place, compared with the window's active_from..active_to
    range: null, // [low, high] seconds around the estimate it came with (rangeFor)
    drawn: false, // in a pre-queue: places are drawn at the start
    rangeFor: null,
    window: null, // stateless: the window as last heard (the public window endpoint, or a `window` event)
    lastNeighbours: null, // the place the list of those around was last asked for at
    neighboursAt: 0,
    neighboursAsked: 0, // answers to an earlier ask than the last are dropped
    neighboursTimer: null,
    line: null, // the last list of those around (the neighbours answer)
    announced: { text: "", at: 0 },
    redirecting: false,
    stopped: false,
    title: document.title,
    queueName: (document.getElementById("wr-title") || {}).textContent || "",
  };

  // Words in the page's language: Django's JavaScript catalogue (/jsi18n/), else English as written here.
  var _ = window.gettext || function (text) { return text; };
  var ngettext = window.ngettext || function (one, other, n) { return n === 1 ? one : other; };
  var LANG = document.documentElement.lang || "en";
  function fill(text, values) {
    return text.replace(/%\((\w+)\)s/g, function (all, name) { return String(values[name]); });
  }

  function $(id) { return document.getElementById(id); }
  function setText(id, text) { var node = $(id); if (node) node.textContent = text; }

  // --- The estimated wait -------------------------------------------------------------------------

  function formatWait(seconds) {
    if (seconds === null || seconds === undefined) return _("working it out…");
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return _("less than a minute");
    if (seconds < 90) return _("about a minute");
    var minutes = Math.round(seconds / 60);
    if (minutes >= 10 && minutes < 60) minutes = Math.round(minutes / 5) * 5;
    if (minutes < 60) return fill(ngettext("about %(n)s minute", "about %(n)s minutes", minutes), { n: minutes });
    if (seconds >= 48 * 3600) {
      var days = Math.floor(seconds / 86400);
      return fill(ngettext("more than %(n)s day", "more than %(n)s days", days), { n: days });
    }
    var total = Math.round(minutes / 5) * 5, hours = Math.floor(total / 60), rest = total % 60;
    var duration = fill(ngettext("%(n)s hour", "%(n)s hours", hours), { n: hours });
    if (rest) duration += " " + fill(ngettext("%(n)s minute", "%(n)s minutes", rest), { n: rest });
    return fill(_("about %(duration)s"), { duration: duration });
  }

  // "(4–8 minutes)": the range the queue's own record gives the estimate (about 8 in 10 of its waits
  // fell within it), scaled as the shown figure is (it counts down and glides), in the units people read:
  // whole minutes, fives past ten; nothing under a minute and a half, nothing past two hours.
  function windowText(w) {
    return fill(_("in groups of %(size)s every %(seconds)s seconds"), { size: w.window_size, seconds: Math.round(w.window_interval) });
  }

  function updatedText() {
    return fill(_("Updated %(time)s."), { time: new Date().toLocaleTimeString(LANG) });
  }

  function formatRange(shown) {
    var range = S.range, told = S.rangeFor;
    if (!range || shown === null || shown === undefined || !told) return "";
    var low = shown * range[0] / told, high = shown * range[1] / told;
    if (high < 90 || high > 7200) return "";
    var unit = high < 600 ? 1 : 5;
    var lo = Math.floor(low / 60 / unit) * unit, hi = Math.max(lo + unit, Math.ceil(high / 60 / unit) * unit);
    return fill(_("(%(low)s–%(high)s minutes)"), { low: lo, high: hi });
  }

  // 4:05, 1:02:03, or with days: 3 days 04:05:06
  function formatCountdown(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    var d = Math.floor(seconds / 86400), h = Math.floor((seconds % 86400) / 3600);
    var m = Math.floor((seconds % 3600) / 60), s = seconds % 60, two = function (n) { return String(n).padStart(2, "0"); };
    if (d) return fill(ngettext("%(n)s day", "%(n)s days", d), { n: d }) + " " + two(h) + ":" + two(m) + ":" + two(s);
    return (h ? h + ":" + two(m) : String(m)) + ":" + two(s);
  }

  // Counts down by itself; new estimates within 15% (or 10 s) change nothing; lower ones are glided to;
  // a higher one is believed only when the next update agrees, so the figure never flickers up and down.
  var eta = {
    shown: null,
    target: null,
    higher: 0,
    update: function (estimate) {
      if (estimate === null || estimate === undefined) { this.shown = null; this.target = null; return; }
      if (this.shown === null) { this.shown = estimate; this.target = null; return; }
      var tolerance = Math.max(10, this.shown * 0.15);
      if (estimate < this.shown - tolerance) { this.target = estimate; this.higher = 0; }
      else if (estimate > this.shown + tolerance) {
        this.higher += 1;
        if (this.higher >= 2) { this.target = estimate; this.higher = 0; }
      } else { this.higher = 0; this.target = null; }
    },
    tick: function (dt) {
      if (this.shown === null) return;
      if (this.target !== null) {
        this.target = Math.max(0, this.target - dt);
        this.shown += (this.target - this.shown) / 3;
        if (Math.abs(this.target - this.shown) < 1) { this.shown = this.target; this.target = null; }
      } else {
        this.shown = Math.max(0, this.shown - dt);
      }
    },
  };

  // --- Drawing ----------------------------------------------------------------------------------

  // The pre-queue's draw: once the line has opened (the page leaves the pre-queue), its seed has been
  // revealed; the page says so without a reload.
  function shuffleRevealed() {
    var before = document.querySelector("[data-shuffle=before]"), after = document.querySelector("[data-shuffle=after]");
    if (before && after && after.hidden) { before.hidden = true; after.hidden = false; }
  }

  // `said`: what to announce instead of the state's usual words.
  function setState(name, said) {
    if (root.dataset.state === "prequeue" && name !== "prequeue" && name !== "offline") shuffleRevealed();
    if (root.dataset.state !== name) {
      root.dataset.state = name;
      var messages = {
        waiting: _("You are in line."),
        paused: _("The line is paused. You keep your place."),
        prequeue: _("You have your ticket. The line opens soon."),
        admitted: _("It's your turn. Taking you to the site."),
        expired: _("Your place has expired."),
        closed: _("This line is closed."),
        full: _("The line is full. Trying again shortly."),
        offline: _("Reconnecting to the waiting room."),
        pow: _("Checking your browser before you join."),
        notyet: _("This line has not opened yet."),
      };
      if (said || messages[name]) announce(said || messages[name], true);
    }
  }

  function announce(text, now) {
    var t = Date.now();
    if (!now && (text === S.announced.text || t - S.announced.at < ANNOUNCE_EVERY_MS)) return;
    S.announced = { text: text, at: t };
    setText("wr-live", text);
  }

  function drawPosition() {
    if (S.position === null) return;
    var ahead = Math.max(0, S.position - 1);
    setText("wr-position", String(S.position));
    setText("wr-ahead", String(ahead));
    setText("wr-ahead-label", ngettext("person", "people", ahead));
    var key = "wr:first:" + S.ticketId, first = null;
    try {
      first = Number(localStorage.getItem(key)) || null;
      if (!first || S.position > first) { first = S.position; localStorage.setItem(key, String(first)); }
    } catch (e) { first = first || S.position; }
    var done = first > 1 ? Math.round(((first - S.position) / (first - 1)) * 100) : 100;
    var bar = $("wr-progress-bar"), progress = $("wr-progress");
    if (bar) bar.style.width = done + "%";
    if (progress) progress.setAttribute("aria-valuenow", String(done));
    var range = formatRange(eta.shown);
    var wait = formatWait(eta.shown) + (range ? " " + range : "");
    announce(fill(_("You are number %(position)s in line. Estimated wait %(wait)s."), { position: S.position, wait: wait }));
    if (S.stateless) return; // a stateless queue knows numbers, not people: no picture of the line
    drawLine();
    if (S.lastNeighbours !== S.position) fetchNeighbours();
  }

  // "Around you" counts as the place does (issue 47): the visitor's own row carries the place shown above
  // it and the rows around count from there, those ahead of the first place dropped. The list is asked for
  // again whenever the place changes (at most every 3 s), so between two answers its names may be one
  // move behind, never its numbers.
  function drawLine() {
    var list = $("wr-line");
    if (!list || S.line === null || S.position === null) return;
    var me = null;
    S.line.forEach(function (n) { if (n.you) me = n.position; });
    var shift = me === null ? 0 : S.position - me;
    var rows = me === null ? [] : S.line.filter(function (n) { return n.position + shift >= 1; });
    var wrap = $("wr-line-wrap");
    if (wrap) wrap.hidden = rows.length === 0;
    list.textContent = "";
    rows.forEach(function (n) {
      var item = document.createElement("li");
      if (n.you) item.className = "you";
      var number = document.createElement("b");
      number.textContent = "#" + (n.position + shift);
      var name = document.createElement("span");
      name.textContent = n.you ? _("You") : (n.display_name || _("Guest"));
      item.appendChild(number);
      item.appendChild(name);
      list.appendChild(item);
    });
  }

  function everySecond() {
    eta.tick(1);
    if (S.position !== null || S.drawn) {
      setText("wr-eta", formatWait(eta.shown));
      setText("wr-eta-range", formatRange(eta.shown));
    }
    if (S.opensAt !== null) {
      var left = (S.opensAt - Date.now()) / 1000;
      setText("wr-opens-in", formatCountdown(left));
      if (left <= 0) { S.opensAt = null; poll(); }
    }
  }

  // --- What the server says -----------------------------------------------------------------------

  // A join, status or position answer (they share a shape).
  function apply(info) {
    if (S.stopped) return;
    if (info.epoch !== undefined && info.epoch !== S.epoch) { S.epoch = info.epoch; S.seq = info.event_seq || 0; }
    if (info.event_seq !== undefined && info.event_seq > S.seq) S.seq = info.event_seq;
    if (info.poll_after_seconds) S.pollAfter = info.poll_after_seconds;
    if (info.mode === "stateless") {
      S.stateless = true;
      if (info.place !== undefined && info.place !== null) S.place = info.place;
      if (info.number !== undefined) setText("wr-number", String(info.number));
      if (info.window) {
        S.window = info.window;
        setText("wr-window-desc", windowText(info.window));
      }
    }
    S.status = info.status;
    if (info.redirect_url && (info.status === "admitted" || info.status === "active")) {
      goThrough(info.redirect_url, info.expires_at);
      return;
    }
    if (info.status === "completed" || info.status === "expired") {
      finished(info.reason, info.queue_state);
      return;
    }
    S.queueLength = info.queue_length;
    S.queueState = info.queue_state;
    S.drawn = info.place_drawn_at_start === true; // a pre-queue: no place until the draw at the start
    if (S.drawn) {
      S.position = null;
      setText("wr-prequeue-count", String(info.queue_length));
      setText("wr-prequeue-label", ngettext("person has", "people have", info.queue_length));
    } else if (info.position !== null && info.position !== undefined) S.position = info.position;
    eta.update(info.estimated_wait_seconds);
    showGoneSlot(info.held_slot_ends_at);
    S.range = info.estimated_wait_range || null;
    S.rangeFor = info.estimated_wait_seconds || null;
    if (info.opens_in_seconds) S.opensAt = Date.now() + info.opens_in_seconds * 1000;
    else S.opensAt = null;
    showQueueState();
    drawPosition();
    everySecond();
  }

  // What the queue's state (open, paused, closed) means for a visitor in line.
  function showQueueState() {
    if (S.queueState === "closed") setState("closed");
    else if (S.opensAt !== null) setState("prequeue");
    else setState(S.queueState === "paused" ? "paused" : "waiting");
    setText("wr-updated", updatedText());
  }

  // The queue's state changed (an operator paused, resumed, closed or opened it): shown at once, as the
  // next status would show it (that status follows at its usual time, and is the truth). A stateless
  // queue's page, or one not in line, asks.
  function onState(event) {
    if (!event.state || event.state === S.queueState || S.status === null) return;
    if (S.stateless || S.status !== "waiting") { poll(); return; }
    S.queueState = event.state;
    showQueueState();
  }

  // The wait rests on a slot held far longer than this queue's visitors hold theirs (issue 47): someone who
  // may have left the site without finishing. Say so, and by when it frees at the latest (its session's end).
  function showGoneSlot(endsAt) {
    var note = $("wr-gone-slot"), at = $("wr-gone-slot-at");
    if (!note || !at) return;
    note.hidden = !endsAt;
    if (!endsAt) return;
    at.setAttribute("datetime", new Date(endsAt * 1000).toISOString());
    localTime(at);
  }

  // Admitted: call the visitor back wherever they are (a background tab on a phone): the tab's title, a
  // vibration where the browser allows one, a notification if they allowed them; the admitted card counts
  // down the time their turn is held (the claim window), in case the hand-over does not happen by itself.
  function callBack() {
    document.title = "\u25B6 " + _("It's your turn") + " \u00B7 " + S.title;
    try { if (navigator.vibrate) navigator.vibrate([200, 100, 200]); } catch (e) { /* not allowed here */ }
    if ("Notification" in window && window.Notification.permission === "granted" && document.hidden) {
      try {
        var body = fill(_("%(queue)s: come back to go through."), { queue: S.queueName });
        var note = new window.Notification(_("It's your turn"), { body: body, tag: "wr-" + config.slug, lang: LANG });
        note.onclick = function () { window.focus(); note.close(); };
      } catch (e) { /* some browsers only notify from a service worker */ }
    }
  }

  function heldFor(expiresAt) {
    if (!expiresAt || !config.sessionTtl) return;
    var heldUntil = expiresAt - config.sessionTtl + config.claimTtl; // the token runs for the session
    var tick = function () {
      var left = Math.max(0, Math.round(heldUntil - Date.now() / 1000));
      var time = Math.floor(left / 60) + ":" + String(left % 60).padStart(2, "0");
      setText("wr-held", left > 0 ? fill(_("Your turn is held for %(time)s."), { time: time }) : _("Your turn has passed."));
      if (left > 0) setTimeout(tick, 1000);
    };
    tick();
  }

  function goThrough(url, expiresAt) {
    if (S.redirecting) return;
    S.redirecting = true;
    S.stopped = true;
    var link = $("wr-go");
    if (link) link.href = url;
    setState("admitted");
    closeSocket();
    callBack();
    heldFor(expiresAt);
    window.location.replace(url);
  }

  // "Tell me when it's my turn": the browser's own notifications, asked for only when the visitor wants.
  function offerNotifications() {
    var button = $("wr-notify");
    if (!button || !("Notification" in window) || window.Notification.permission !== "default") return;
    button.hidden = false;
    button.addEventListener("click", function () {
      window.Notification.requestPermission().then(function (answer) {
        button.hidden = true;
        setText("wr-notify-said", answer === "granted" ? _("We will notify you when it is your turn.") : "");
      });
    });
  }

  // A finished ticket, worded for why it finished: a completed visit is not an expired place (issue 47,
  // item 13). Joining again is offered while the line takes people.
  function finished(reason, queueState) {
    S.stopped = true;
    closeSocket();
    clearTimeout(S.pollTimer);
    var why = {
      abandoned: _("You were away from this page for too long."),
      completed: _("Thank you!"),
      revoked: _("Your place was withdrawn."),
      left: _("You left the line."),
    };
    var complete = reason === "completed";
    setText("wr-expired-title", complete ? _("Your visit is complete") : _("Your place has expired"));
    setText("wr-expired-why", why[reason] || _("Your ticket is no longer valid."));
    var rejoin = $("wr-rejoin-form");
    if (rejoin) rejoin.hidden = (queueState || S.queueState) === "closed";
    setState("expired", complete ? _("Your visit is complete.") + " " + _("Thank you!") : null);
  }

  function onEvent(event) {
    if (S.stopped) return;
    if (event.type === "admitted") { goThrough(event.redirect_url, event.expires_at); return; }
    if (event.type === "expired") { finished(event.reason); return; }
    if (event.type === "position") { apply(event); return; }
    if (event.type === "queue_move") { onMove(event); return; }
    if (event.type === "snapshot") { onSnapshot(event); return; }
    if (event.type === "state") { onState(event); return; }
    if (event.type === "schedule") { if (S.status !== null) poll(); return; }  // its times moved: ask for the truth
    if (event.type === "window") { onWindow(event); return; }
  }

  function onMove(event) {
    if (event.seq <= S.seq) return; // already reflected in what we have
    if (event.seq > S.seq + 1) { // missed something: ask for the truth
      S.seq = event.seq;
      askStatus();
      return;
    }
    S.seq = event.seq;
    if (event.queue_length !== undefined) S.queueLength = event.queue_length;
    if (S.position === null) return;
    var rank = S.position - 1, left = false;
    event.ops.forEach(function (op) {
      var kind = op[0], at = op[1], count = op[2];
      if (kind === "-" && at <= rank && rank < at + count) left = true;
      else if (kind === "-" && at < rank) rank = Math.max(at, rank - count);
      else if (kind === "+" && at <= rank) rank += count;
    });
    if (left) { askStatus(); return; } // our own ticket left the line: admitted (or expired) - ask now
    if (rank + 1 !== S.position) {
      var moved = S.position - (rank + 1);
      S.position = rank + 1;
      if (S.rate && moved > 0 && eta.shown !== null) eta.update(Math.max(0, eta.shown - moved / S.rate));
      drawPosition();
    }
  }

  // --- Stateless mode: the ticket's state follows from its place and the public window -------------

  // The window moved (a `window` event, or a read of the cacheable window endpoint): tell our own state
  // without asking the server; only an active ticket asks (for its access token).
  function onWindow(w) {
    if (S.stopped || S.place === null) return;
    S.window = w;
    if (w.event_seq !== undefined && w.event_seq > S.seq) S.seq = w.event_seq;
    if (w.admitted_per_minute > 0) S.rate = w.admitted_per_minute / 60;
    if (S.place <= w.active_to && w.opens_in_seconds === null) { poll(); return; } // our turn (or passed): ask
    S.queueLength = w.queue_length;
    S.queueState = w.state;
    var position = Math.max(1, S.place - w.active_to);
    if (w.state === "open") {
      var steps = Math.ceil(position / w.window_size), next = w.next_step_in === null ? w.window_interval : w.next_step_in;
      eta.update((w.opens_in_seconds || 0) + (steps - 1) * w.window_interval + next);
    } else {
      eta.update(null);
    }
    if (position !== S.position) { S.position = position; drawPosition(); }
    if (S.queueState === "closed") setState("closed");
    else if (w.opens_in_seconds) setState("prequeue");
    else setState(S.queueState === "paused" ? "paused" : "waiting");
    setText("wr-window-desc", windowText(w));
    setText("wr-updated", updatedText());
    everySecond();
  }

  // The public window, without the ticket (so that a cache or CDN can answer for everyone).
  function pollWindow() {
    clearTimeout(S.pollTimer);
    if (S.stopped) return;
    fetch(config.windowUrl, { headers: { "Accept": "application/json" }, credentials: "omit" })
      .then(function (response) { return response.ok ? response.json() : Promise.reject(response.status); })
      .then(function (w) { onWindow(w); if (!S.stopped && !S.redirecting) schedulePoll(); })
      .catch(function () { setState("offline"); schedulePoll(); });
  }

  // Stateless: wait for the window's next step when it may reach us, else the server's advice.
  function windowPollSeconds() {
    var w = S.window;
    if (!w || w.next_step_in === null || S.place === null) return S.pollAfter;
    var stepsAway = Math.ceil(Math.max(1, S.place - w.active_to) / w.window_size);
    if (stepsAway <= 1) return Math.max(1, w.next_step_in + 0.3 + Math.random());
    return Math.max(1, Math.min(S.pollAfter, w.next_step_in + (stepsAway - 1) * w.window_interval));
  }

  function onSnapshot(event) {
    if (event.epoch !== undefined && S.epoch !== null && event.epoch !== S.epoch) { askStatus(); return; }
    if (event.seq > S.seq + 1) askStatus();
    if (event.admitted_per_minute > 0) S.rate = event.admitted_per_minute / 60;
    if (event.viewers) {
      setText("wr-viewers", fill(ngettext("%(n)s person watching this line.", "%(n)s people watching this line.", event.viewers), { n: event.viewers }));
    }
    // A snapshot read before a state change can arrive after its `state` event: ask over the socket (not
    // a poll) for the truth.
    if (event.state && event.state !== S.queueState) askStatus();
  }

  // --- Talking to the server -----------------------------------------------------------------------

  function csrfToken() {
    var match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function request(method, url, body) {
    var headers = { "Accept": "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
    if (S.ticket && url !== config.joinUrl) headers["Authorization"] = "Bearer " + S.ticket; // a join is by identity
    return fetch(url, {
      method: method,
      headers: headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        return { status: response.status, data: data, retryAfter: Number(response.headers.get("Retry-After")) || null };
      });
    });
  }

  function join(proof) {
    S.stopped = false;
    request("POST", config.joinUrl, proof || {}).then(function (r) {
      if (r.status === 200 || r.status === 201) {
        if (proof && proof.priority_code) codeSaid(_("Your code worked: you joined the line with priority."));
        S.ticket = r.data.ticket;
        S.ticketId = r.data.ticket_id;
        S.wsUrl = r.data.ws_url;
        apply(r.data);
        if (!S.stopped) { connect(); schedulePoll(); }
        return;
      }
      var code = r.data && r.data.error ? r.data.error.code : "";
      if (code === "queue_closed") { setState("closed"); return; }
      if (code === "queue_full") { retryLater("full", "wr-full-retry", r.retryAfter || 30, join); return; }
      if (code === "rate_limited" || code === "ticket_cap_reached") {
        retryLater("limited", "wr-limited-in", r.retryAfter || 5, join);
        return;
      }
      if (code === "proof_of_work_required") { solveThenJoin(r.data.error); return; }
      if (code === "queue_not_open") { retryLater("notyet", null, Math.min(r.retryAfter || 30, 300), join); return; }
      if (code === "proof_of_work_reused" || code === "invalid_proof_of_work") { join(); return; } // a new challenge
      if (code === "invalid_priority_code") { // a code entered with the join: say so, and offer the join again
        setState("join");
        codeSaid(codeRefusal(r));
        return;
      }
      retryLater("offline", null, r.retryAfter || 5, join);
    }).catch(function () { retryLater("offline", null, 5, join); });
  }

  // --- An invite or priority code (POST …/code): moves a waiting visitor up, never back -------------

  function codeSaid(text) {
    var node = $("wr-code-said");
    if (!node) return;
    node.textContent = text;
    node.hidden = !text;
    if (text) announce(text, true);
  }

  function codeRefusal(r) {
    var code = r.data && r.data.error ? r.data.error.code : "";
    if (code === "invalid_priority_code" || code === "invalid_request") {
      return _("That code did not work: it is unknown, used up or expired. Codes are case-sensitive; check it and try again.");
    }
    if (code === "rate_limited") return _("Too many codes were tried from here. Please wait a few minutes and try again.");
    if (code === "not_in_line" || code === "ticket_not_found") {
      return _("Codes only move people waiting in line, and you are no longer waiting.");
    }
    return _("Your code could not be checked just now. Please try again in a moment.");
  }

  function enterCode(event) {
    event.preventDefault();
    var input = $("wr-code"), button = $("wr-code-use");
    var code = input.value.trim();
    if (!code) { codeSaid(_("Type your code first.")); input.focus(); return; }
    if (!S.ticket) { join({ priority_code: code }); return; }
    button.disabled = true;
    request("POST", config.codeUrl, { code: code }).then(function (r) {
      button.disabled = false;
      if (r.status !== 200) { codeSaid(codeRefusal(r)); return; }
      S.ticket = r.data.ticket; // signed again with the new level
      input.value = "";
      if (r.data.place_drawn_at_start) { // a pre-queue: no place yet; the code's level counts at the draw
        codeSaid(r.data.promoted
          ? _("Your code worked: when the line opens and places are drawn, you will be placed ahead of everyone with a lower priority.")
          : _("This code's priority is already applied to your ticket: when the line opens and places are drawn, you will be placed ahead of everyone with a lower priority."));
      } else if (!r.data.promoted) {
        codeSaid(_("You already have the place this code gives, so it did not move you and was not used up."));
      } else {
        codeSaid(fill(_("Your code worked: you moved up from place %(before)s to place %(now)s."),
          { before: r.data.position_before, now: r.data.position }));
      }
      apply(r.data);
    }).catch(function () {
      button.disabled = false;
      codeSaid(_("Your code could not be checked just now. Please try again in a moment."));
    });
  }

  // --- "E-mail me" (POST …/notify): the turn's nearness and the turn itself, by e-mail ---------------

  function emailSaid(text) {
    var node = $("wr-email-said");
    if (!node) return;
    node.textContent = text;
    node.hidden = !text;
    if (text) announce(text, true);
  }

  function leaveEmail(event) {
    event.preventDefault();
    var input = $("wr-email"), button = $("wr-email-use");
    if (!S.ticket) return;
    button.disabled = true;
    request("POST", config.notifyUrl, { email: input.value.trim() }).then(function (r) {
      button.disabled = false;
      var code = r.data && r.data.error ? r.data.error.code : "";
      if (r.status === 201) {
        emailSaid(_("We will e-mail you when your turn is near, and again when it comes. You may leave this page."));
      } else if (code === "invalid_request") {
        emailSaid(_("That does not look like an e-mail address. Please check it and try again."));
      } else if (code === "rate_limited") {
        emailSaid(_("Too many addresses were left from here. Please wait a few minutes and try again."));
      } else if (code === "not_in_line" || code === "ticket_not_found") {
        emailSaid(_("Only people waiting in line can be e-mailed, and you are no longer waiting."));
      } else {
        emailSaid(_("Your address could not be kept just now. Please try again in a moment."));
      }
    }).catch(function () {
      button.disabled = false;
      emailSaid(_("Your address could not be kept just now. Please try again in a moment."));
    });
  }

  // The queue's proof-of-work gate: solve the challenge in a Web Worker, showing progress, then join.
  function solveThenJoin(challenge) {
    setState("pow");
    var bar = document.getElementById("wr-pow-bar");
    var worker = new Worker(config.powWorkerUrl);
    worker.onmessage = function (event) {
      if (event.data.nonce === undefined) {
        var share = 1 - Math.exp(-event.data.tries / event.data.expected); // expected progress, never 100 %
        if (bar) bar.style.width = Math.round(share * 100) + "%";
        return;
      }
      worker.terminate();
      if (bar) bar.style.width = "100%";
      join({ pow_challenge: challenge.challenge, pow_nonce: event.data.nonce });
    };
    worker.onerror = function () { worker.terminate(); retryLater("offline", null, 5, join); };
    worker.postMessage({ challenge: challenge.challenge, difficulty: challenge.difficulty });
  }

  function retryLater(state, counterId, seconds, then) {
    setState(state);
    var left = Math.max(1, Math.round(seconds));
    var count = function () {
      if (counterId) setText(counterId, state === "full" ? fill(_("Trying again in %(seconds)s s."), { seconds: left }) : String(left));
      if (left-- <= 0) { then(); return; }
      setTimeout(count, 1000);
    };
    count();
  }

  function poll() {
    clearTimeout(S.pollTimer);
    if (S.stopped || !S.ticket) return;
    request("GET", config.statusUrl).then(function (r) {
      if (r.status === 200) { apply(r.data); }
      else if (r.status === 401) { S.ticket = null; join(); return; } // the ticket is no longer good: start again
      else if (r.status === 429) { retryLater("limited", "wr-limited-in", r.retryAfter || 5, poll); return; }
      else { setState("offline"); }
      schedulePoll(r.retryAfter);
    }).catch(function () { setState("offline"); schedulePoll(); });
  }

  function schedulePoll(retryAfter) {
    clearTimeout(S.pollTimer);
    if (S.stopped) return;
    // The socket carries the news while it is open; polls then only guard against a silent socket.
    // A stateless ticket waiting in line reads the public window instead of its status.
    var byWindow = S.stateless && S.place !== null && S.status === "waiting";
    var seconds = S.socketOpen ? Math.max(SAFETY_POLL_SECONDS, S.pollAfter * 3)
      : (retryAfter || (byWindow ? windowPollSeconds() : S.pollAfter));
    S.pollTimer = setTimeout(byWindow ? pollWindow : poll, seconds * 1000);
  }

  function askStatus() {
    if (S.socketOpen) S.socket.send(JSON.stringify({ type: "status" }));
    else poll();
  }

  function fetchNeighbours() {
    if (!S.ticket || S.stopped || S.position === null || S.lastNeighbours === S.position) return;
    var wait = S.neighboursAt + 3000 - Date.now();
    if (wait > 0) { // asked a moment ago: ask again once the moment is over, for the place then
      if (S.neighboursTimer === null) {
        S.neighboursTimer = setTimeout(function () { S.neighboursTimer = null; fetchNeighbours(); }, wait);
      }
      return;
    }
    S.neighboursAt = Date.now();
    S.lastNeighbours = S.position;
    var asked = ++S.neighboursAsked;
    request("GET", config.neighboursUrl).then(function (r) {
      if (asked !== S.neighboursAsked || r.status !== 200 || !r.data.neighbours) return;
      S.line = r.data.neighbours;
      drawLine();
    }).catch(function () {});
  }

  // --- The websocket ------------------------------------------------------------------------------

  function connect() {
    if (!S.wsUrl || !S.ticket || !("WebSocket" in window) || S.stopped) return;
    clearTimeout(S.reconnectTimer);
    var socket;
    try { socket = new WebSocket(S.wsUrl); } catch (e) { reconnect(); return; }
    S.socket = socket;
    // The ticket goes in the first message, not the URL (URLs end up in proxies' logs). The socket
    // counts as open once the server says `ready`: a refused one (a bad ticket, too many tabs) closes
    // without resetting the reconnection back-off.
    socket.onopen = function () {
      socket.send(JSON.stringify({ type: "hello", ticket: S.ticket }));
    };
    socket.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; } // a malformed event is ignored
      if (event.type === "ready") {
        S.socketOpen = true;
        S.reconnectMs = 1000;
        if (root.dataset.state === "offline") poll();
        schedulePoll();
        return;
      }
      try { onEvent(event); } catch (e) { /* nor is one we cannot apply */ }
    };
    socket.onclose = function () {
      var wasOpen = S.socketOpen;
      S.socketOpen = false;
      if (S.socket === socket) S.socket = null;
      if (S.stopped) return;
      if (wasOpen) poll(); // fall back to polling at once, then keep trying to reconnect
      reconnect();
    };
    socket.onerror = function () { /* onclose follows */ };
  }

  // Reconnection attempts leave polling alone: re-arming the poll timer on each failed attempt would
  // keep pushing the fallback poll back for as long as the socket stays down.
  function reconnect() {
    if (S.stopped) return;
    clearTimeout(S.reconnectTimer);
    var delay = S.reconnectMs * (0.8 + Math.random() * 0.4);
    S.reconnectMs = Math.min(MAX_RECONNECT_MS, S.reconnectMs * 2);
    S.reconnectTimer = setTimeout(connect, delay);
  }

  function closeSocket() {
    clearTimeout(S.reconnectTimer);
    if (S.socket) { S.socket.onclose = null; S.socket.close(); S.socket = null; }
    S.socketOpen = false;
  }

  // --- Start ---------------------------------------------------------------------------------------

  ["wr-join-form", "wr-rejoin-form"].forEach(function (id) {
    var form = $(id);
    if (!form) return;
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var code = form.querySelector("input[name=code]");
      join(code && code.value.trim() ? { priority_code: code.value.trim() } : undefined);
    });
  });
  if ($("wr-code-form")) $("wr-code-form").addEventListener("submit", enterCode);
  if ($("wr-email-form")) $("wr-email-form").addEventListener("submit", leaveEmail);
  setInterval(everySecond, 1000);
  // A finished ticket waits for the visitor to choose to join again; otherwise join (or get the ticket back).
  // Times the server wrote in its own zone ("31 December 2098, 12:00 UTC"), shown in the visitor's zone
  // and the page language's format.
  function localTime(el) {
    var styles = { "date-time": { dateStyle: "long", timeStyle: "short" }, time: { timeStyle: "medium" } };
    var when = new Date(el.getAttribute("datetime"));
    var style = styles[el.getAttribute("data-local")];
    if (isNaN(when.getTime()) || !style || !window.Intl) return;
    try { el.textContent = new Intl.DateTimeFormat(LANG, style).format(when); } catch (e) { /* as written */ }
  }

  function localTimes() {
    document.querySelectorAll("time[data-local]").forEach(localTime);
  }

  localTimes();
  offerNotifications();
  if (config.state !== "expired" && config.state !== "closed") join();
  window.waitingRoom = S; // for the curious (and for tests)
  window.waitingRoomEta = eta;
})();
