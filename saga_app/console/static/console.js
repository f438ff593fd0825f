// Times in the reader's own zone: the server writes UTC, says so, and gives the exact moment;
// here each is shown in this browser's zone, named, with the UTC kept in its title.
function localTimes(root) {
  "use strict";
  var zone = new Intl.DateTimeFormat([], { timeZoneName: "short" });
  root.querySelectorAll("time[datetime]").forEach(function (node) {
    var moment = new Date(node.getAttribute("datetime"));
    if (isNaN(moment.getTime())) { return; }
    var pad = function (n, w) { return String(n).padStart(w || 2, "0"); };
    var ms = node.textContent.indexOf(".") >= 0 ? "." + pad(moment.getMilliseconds(), 3) : "";
    var name = zone.formatToParts(moment).filter(function (p) {
      return p.type === "timeZoneName";
    }).map(function (p) { return p.value; }).join("");
    node.textContent = moment.getFullYear() + "-" + pad(moment.getMonth() + 1) + "-" +
      pad(moment.getDate()) + " " + pad(moment.getHours()) + ":" + pad(moment.getMinutes()) +
      ":" + pad(moment.getSeconds()) + ms + " " + name;
  });
}
localTimes(document);

// Live updates: the server says that something changed (server-sent events fed by the
// events exchange), or a page asks to be read again every few seconds (data-every, the Health
// page); the page then reloads its own list from the server.
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
        localTimes(live);
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
  var every = Number(live.getAttribute("data-every"));
  if (every > 0) { setInterval(schedule, every); }
  var source = new EventSource("/events");
  source.onopen = function () { live.setAttribute("data-connected", "yes"); };
  source.onmessage = schedule;
  source.onerror = function () { live.setAttribute("data-connected", "no"); };
}());
