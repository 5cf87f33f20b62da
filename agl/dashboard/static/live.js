// Live pages: a <main data-live="N"> is fetched again every N seconds and its content swapped in, so a running
// training shows up as it goes. Paused while the user is typing in a form, or when the tab is hidden.
(function () {
  "use strict";
  var page = document.getElementById("page");
  if (!page || !page.dataset.live) return;
  var every = Math.max(2, Number(page.dataset.live)) * 1000;
  function busy() {
    var el = document.activeElement;
    return document.hidden || (el && (el.tagName === "INPUT" || el.tagName === "SELECT"));
  }
  function refresh() {
    if (busy()) return;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null || busy()) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("page");
        if (fresh && fresh.innerHTML !== page.innerHTML) {
          page.innerHTML = fresh.innerHTML;
          page.dataset.refreshed = String(Date.now());
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  setInterval(refresh, every);
})();
