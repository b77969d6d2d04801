// babysit web: keep <main> up to date from the server's event stream (server-sent events).
// The server renders and escapes every fragment; this file only swaps it in. No other script runs.
(function () {
  "use strict";
  var main = document.getElementById("live");
  var conn = document.getElementById("conn");
  if (!main || !main.dataset.stream || !window.EventSource) { return; }
  var source = new EventSource(main.dataset.stream);
  source.addEventListener("update", function (event) {
    var open = {};
    main.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
    main.innerHTML = event.data;
    main.querySelectorAll("details[id]").forEach(function (d) { if (d.id in open) { d.open = open[d.id]; } });
    if (conn) { conn.textContent = "live"; conn.className = "conn ok"; }
    document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
  });
  source.onerror = function () {
    if (conn) { conn.textContent = "reconnecting…"; conn.className = "conn lost"; }
  };
})();
