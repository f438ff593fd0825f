// Live updates: the server says that something changed (server-sent events fed by the
// events exchange); the page then reloads its own list from the server. No other script.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  if (!live || !window.EventSource) { return; }
  var pending = null;
  var busy = false;
  var last = 0;
  function refresh() {
    pending = null;
    if (busy) { schedule(); return; }
    busy = true;
    last = Date.now();
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin" }).then(function (response) {
      if (response.status === 401) { window.location.reload(); return null; }
      return response.ok ? response.text() : null;
    }).then(function (html) {
      if (html !== null && html !== undefined) {
        live.innerHTML = html;
        live.setAttribute("data-updated", String(Date.now()));
      }
    }).catch(function () { /* the next event tries again */ }).finally(function () {
      busy = false;
    });
  }
  function schedule() {
    // At most one reload a second, however many events arrive.
    if (pending === null) {
      pending = setTimeout(refresh, Math.max(250, 1000 - (Date.now() - last)));
    }
  }
  var source = new EventSource("/events");
  source.onopen = function () { live.setAttribute("data-connected", "yes"); };
  source.onmessage = schedule;
  source.onerror = function () { live.setAttribute("data-connected", "no"); };
}());
