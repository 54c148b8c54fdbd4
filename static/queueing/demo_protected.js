// The demo protected page's session countdown (a file of its own: the pages' CSP allows no inline script).
(function () {
  var endAt = document.getElementById("session-end");
  if (!endAt) { return; }
  var end = Number(endAt.dataset.expiresAt) * 1000;
  var out = document.getElementById("session-left");
  endAt.textContent = new Date(end).toLocaleTimeString();
  function tick() {
    var left = Math.max(0, Math.round((end - Date.now()) / 1000));
    out.textContent = Math.floor(left / 60) + ":" + String(left % 60).padStart(2, "0");
    if (left === 0) { window.location.reload(); return; }
    setTimeout(tick, 1000);
  }
  tick();
})();
