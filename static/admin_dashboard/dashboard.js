/* Staff dashboard: live figures over ws /ws/dashboard/ (polling the JSON endpoints when the socket is
 * down), charts drawn with the vendored uPlot, and controls posted with fetch (plain forms without JS). */
(function () {
  "use strict";
  // Read from the page's data attributes (its CSP allows no inline script).
  var holder = document.getElementById("dashboard-config");
  var config = holder ? {
    page: holder.dataset.page, slug: holder.dataset.slug, socketUrl: holder.dataset.socketUrl,
    liveUrl: holder.dataset.liveUrl, dataUrl: holder.dataset.dataUrl
  } : {};
  var POLL_MS = 5000;
  var state = { socket: null, socketOpen: false, retry: 1000, pollTimer: null, data: null, charts: [] };
  var link = document.getElementById("dash-link");

  function setLink(text, value) {
    if (!link) return;
    link.textContent = text;
    link.setAttribute("data-state", value);
  }

  function show(value) {
    if (value === null || value === undefined) return "–";
    return typeof value === "number" && !Number.isInteger(value) ? String(Math.round(value * 10) / 10) : String(value);
  }

  function fill(root, figures) {
    root.querySelectorAll("[data-field]").forEach(function (el) {
      var name = el.getAttribute("data-field");
      if (!(name in figures)) return;
      el.textContent = show(figures[name]);
      if (name === "phase_words") el.className = "state state-" + figures.phase;
    });
  }

  function onLive(queues) {
    queues.forEach(function (figures) {
      if (config.page === "index") {
        var card = document.querySelector('.card[data-slug="' + figures.slug + '"]');
        if (card) fill(card, figures);
      } else if (figures.slug === config.slug) {
        fill(document.getElementById("q-live"), figures);
        fill(document.querySelector("h1"), figures);
        controlsFor(figures.state);
        // Someone was admitted, started, finished or was dropped: the sessions table follows.
        var held = figures.admitted + "/" + figures.active;
        if (state.held !== undefined && held !== state.held && document.getElementById("q-sessions")) {
          refresh().catch(function () {});
        }
        state.held = held;
      }
    });
  }

  // --- Charts --------------------------------------------------------------------------------------

  function column(series, name) {
    return series.map(function (p) { return p[name]; });
  }

  // A line may name a second scale (its own axis on the right), e.g. a percentage beside milliseconds.
  // The time axis in 24-hour time in the server's time zone, as every other time on the page (one way of
  // showing a time; the zone is named above the charts).
  var charts = document.querySelector(".charts[data-time-zone]");
  var clockFormat = new Intl.DateTimeFormat("en-GB", {
    timeZone: (charts && charts.getAttribute("data-time-zone")) || "UTC", hour: "2-digit", minute: "2-digit", hourCycle: "h23",
  });

  function clockTimes(u, splits) {
    return splits.map(function (t) { return clockFormat.format(new Date(t * 1000)); });
  }

  // The time axis spans the chosen period (the last 15 min … 24 h) whatever the points: one point alone
  // drew an axis of years.
  function chart(el, series, lines, hours) {
    var data = [column(series, "t")];
    var uSeries = [{}];
    var axes = [{ values: clockTimes }, { size: 50 }];
    lines.forEach(function (line) {
      data.push(line.values ? line.values(series) : column(series, line.name));
      uSeries.push({ label: line.label, stroke: line.color, width: 2, dash: line.dash, spanGaps: true, scale: line.scale || "y" });
      if (line.scale) axes.push({ scale: line.scale, side: 1, size: 50, grid: { show: false } });
    });
    // As wide as its box, and never wider than the screen (a phone: no sideways scrolling).
    var room = document.documentElement.clientWidth - 24;
    var width = Math.max(200, Math.min(el.clientWidth || (el.parentNode && el.parentNode.clientWidth) || 600, room));
    var end = Date.now() / 1000, start = end - (hours || 1) * 3600;
    var scales = { x: { time: true, range: function () { return [start, end]; } } };
    return new window.uPlot({ width: width, height: 200, series: uSeries, axes: axes, scales: scales, legend: { live: false } }, data, el);
  }

  function percent(name) {
    return function (s) { return s.map(function (p) { return p[name] === null || p[name] === undefined ? null : p[name] * 100; }); };
  }

  function drawCharts(series, hours) {
    if (!window.uPlot) return;
    state.charts.forEach(function (c) { c.destroy(); });
    state.charts = [];
    var empty = document.getElementById("chart-empty");
    if (empty) empty.hidden = series.length > 0;
    var specs = [
      ["chart-waiting", [{ name: "waiting", label: "waiting", color: "#2457d6" }]],
      ["chart-outflow", [
        { name: "outflow_configured", label: "configured", color: "#8a94a6", dash: [6, 4] },
        { name: "outflow_effective", label: "in force", color: "#2457d6" },
        { name: "outflow_observed", label: "observed", color: "#1f9d55" }]],
      ["chart-capacity", [
        { label: "admitted + active", color: "#d97706", values: function (s) { return s.map(function (p) { return p.admitted + p.active; }); } },
        { name: "capacity", label: "capacity", color: "#8a94a6", dash: [6, 4] }]],
      ["chart-wait", [{ name: "average_wait_seconds", label: "average wait", color: "#7c3aed" }]],
      ["chart-health", [
        { name: "health_p95_ms", label: "p95 ms", color: "#d97706" },
        { label: "errors %", color: "#dc2626", scale: "%", values: percent("health_error_rate") }]],
    ];
    specs.forEach(function (spec) {
      var el = document.getElementById(spec[0]);
      if (el) state.charts.push(chart(el, series, spec[1], hours));
    });
  }

  // Each admission a dot: the wait told at its join across, the wait it had up; the diagonal is "as told"
  // (above it: waited longer than told). Plain canvas: uPlot draws lines over time.
  function drawScatter(points) {
    var canvas = document.getElementById("chart-estimates");
    if (!canvas || !canvas.getContext) return;
    var width = Math.max(280, canvas.parentNode.clientWidth || 600), height = 240, pad = 36;
    canvas.width = width;
    canvas.height = height;
    var ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    var most = 10;
    (points || []).forEach(function (p) { most = Math.max(most, p[0], p[1]); });
    most *= 1.05;
    var x = function (v) { return pad + (v / most) * (width - pad - 8); };
    var y = function (v) { return height - pad - (v / most) * (height - pad - 8); };
    ctx.strokeStyle = "#8a94a6";
    ctx.fillStyle = "#5b6475";
    ctx.font = "11px sans-serif";
    ctx.beginPath(); ctx.moveTo(x(0), y(0)); ctx.lineTo(x(most), y(0)); ctx.moveTo(x(0), y(0)); ctx.lineTo(x(0), y(most)); ctx.stroke();
    ctx.setLineDash([6, 4]);
    ctx.beginPath(); ctx.moveTo(x(0), y(0)); ctx.lineTo(x(most), y(most)); ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillText("told " + Math.round(most) + " s", width - 70, height - 12);
    ctx.fillText("had", 4, 14);
    ctx.fillStyle = "rgba(36, 87, 214, 0.55)";
    (points || []).forEach(function (p) { ctx.beginPath(); ctx.arc(x(p[0]), y(p[1]), 2.5, 0, 2 * Math.PI); ctx.fill(); });
  }

  function onData(data) {
    state.data = data;
    onLive([data.live]);
    if (data.sessions) drawSessions(data.sessions);
    var truth = document.getElementById("q-truth");
    if (truth) truth.querySelectorAll("[data-truth]").forEach(function (el) {
      el.textContent = show(data.truth[el.getAttribute("data-truth")]);
    });
    drawCharts(data.series, data.hours);
    drawScatter(data.truth.points);
  }

  function fetchJson(url) {
    return fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    });
  }

  function refresh() {
    if (config.page === "queue") return fetchJson(config.dataUrl).then(onData);
    return fetchJson(config.liveUrl).then(function (body) { onLive(body.queues); });
  }

  // --- Live: socket first, polling when it is down ---------------------------------------------------

  function startPolling() {
    if (state.pollTimer) return;
    setLink("polling every " + POLL_MS / 1000 + " s", "polling");
    state.pollTimer = setInterval(function () { refresh().catch(function () { setLink("offline, retrying", "offline"); }); }, POLL_MS);
  }

  function stopPolling() {
    if (state.pollTimer) clearInterval(state.pollTimer);
    state.pollTimer = null;
  }

  function connect() {
    var socket;
    try { socket = new WebSocket(config.socketUrl); } catch (e) { startPolling(); return; }
    state.socket = socket;
    socket.onopen = function () {
      state.socketOpen = true;
      state.retry = 1000;
      stopPolling();
      setLink("live", "live");
    };
    socket.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      if (event.type === "live") onLive(event.queues);
      else if (event.type === "snapshot" && config.page === "queue" && event.slug === config.slug) refresh().catch(function () {});
    };
    socket.onclose = function () {
      state.socketOpen = false;
      startPolling();
      setTimeout(connect, state.retry);
      state.retry = Math.min(state.retry * 2, 30000);
    };
  }

  // --- Controls ----------------------------------------------------------------------------------------

  // Pause while open, resume while not: the other button is off.
  function controlsFor(queueState) {
    var pause = document.getElementById("q-pause"), resume = document.getElementById("q-resume");
    if (!pause || !resume || !queueState) return;
    pause.disabled = queueState !== "open";
    resume.disabled = queueState === "open";
  }

  var PAUSE_QUESTION = "Pause this queue? Nobody is let in until you resume; everyone waiting keeps their place.";
  // Revoke asks too (issue 47, item 13), and says yes to the server in so many words: a revoke without
  // `confirm=yes` is only asked about (the page without JavaScript shows the question as a page).
  var REVOKE_QUESTION = "Revoke ticket %s? The visitor's session ends at once and their slot goes to the next in line.";

  function csrf(form) {
    var input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  // The sessions table, redrawn from the page's data: one row per admitted or active ticket.
  function drawSessions(sessions) {
    var table = document.getElementById("q-sessions"), none = document.getElementById("q-sessions-none");
    var template = document.querySelector("form[data-control]");
    if (!table || !template) return;
    var body = table.querySelector("tbody");
    body.textContent = "";
    sessions.forEach(function (s) {
      var row = document.createElement("tr");
      row.setAttribute("data-ticket", s.ticket_id);
      var ticket = document.createElement("td"), code = document.createElement("code");
      code.textContent = s.ticket_id;
      ticket.appendChild(code);
      var status = document.createElement("td");
      status.textContent = s.status;
      var until = document.createElement("td"), time = document.createElement("time");
      time.setAttribute("datetime", s.until);
      time.textContent = s.until_shown;  // as the server shows every time (views.SHOWN_TIME_FORMAT)
      until.appendChild(time);
      var cell = document.createElement("td"), form = document.createElement("form");
      form.method = "post";
      form.setAttribute("action", template.getAttribute("action"));
      form.setAttribute("data-control", "");
      form.innerHTML = '<input type="hidden" name="csrfmiddlewaretoken"><input type="hidden" name="ticket_id">' +
        '<button class="button danger" name="action" value="revoke">Revoke</button>';
      form.querySelector("[name=csrfmiddlewaretoken]").value = csrf(template);
      form.querySelector("[name=ticket_id]").value = s.ticket_id;
      wire(form);
      cell.appendChild(form);
      [ticket, status, until, cell].forEach(function (td) { row.appendChild(td); });
      body.appendChild(row);
    });
    table.hidden = sessions.length === 0;
    if (none) none.hidden = sessions.length > 0;
  }

  document.querySelectorAll("form[data-control]").forEach(wire);

  function wire(form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var asked = event.submitter ? event.submitter.value : "";
      if (asked === "pause" && !window.confirm(PAUSE_QUESTION)) return;
      var ticket = form.querySelector("[name=ticket_id]");
      if (asked === "revoke" && !window.confirm(REVOKE_QUESTION.replace("%s", ticket ? ticket.value : ""))) return;
      var body = new FormData(form);
      if (event.submitter && event.submitter.name) body.set(event.submitter.name, event.submitter.value);
      if (asked === "revoke") body.set("confirm", "yes");
      var result = document.getElementById("q-control-result");
      fetch(form.getAttribute("action"), { // not form.action: a button is named "action"
        method: "POST", body: body, credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrf(form) },
      }).then(function (r) { return r.json().then(function (json) { return { ok: r.ok, json: json }; }); })
        .then(function (answer) {
          if (answer.ok) {
            result.textContent = answer.json.done;
            onLive([answer.json.live]);
            refresh().catch(function () {});
          } else {
            result.textContent = (answer.json.error && answer.json.error.message) || "Not saved.";
          }
        }).catch(function () { result.textContent = "Not saved: the server did not answer."; });
    });
  }

  // The schedule's times count down: "(in 4 min 10 s)", "(passed)".
  function countdowns() {
    document.querySelectorAll("time[data-countdown]").forEach(function (el) {
      var left = Math.round((Date.parse(el.getAttribute("datetime")) - Date.now()) / 1000);
      var note = el.nextElementSibling && el.nextElementSibling.classList.contains("countdown")
        ? el.nextElementSibling : null;
      if (!note) {
        note = document.createElement("span");
        note.className = "countdown";
        el.insertAdjacentElement("afterend", note);
      }
      if (isNaN(left)) return;
      var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
      note.textContent = left <= 0 ? " (passed)"
        : " (in " + (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s)";
    });
  }
  countdowns();
  setInterval(countdowns, 1000);

  if (config.page === "queue") {
    var initial = document.getElementById("dash-data");
    if (initial) onData(JSON.parse(initial.textContent));
  }
  window.dashboard = state;
  if ("WebSocket" in window) connect(); else startPolling();
})();
