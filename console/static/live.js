// Live updates for pages that show fleet state (console/live.py): when the console says the
// page's data changed, fetch the page again and swap its <main>. Without this script (or
// without JavaScript) the pages are the same, only static until a reload.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource || !window.fetch) {
    return;
  }
  var here = location.pathname + location.search;
  var pending = false;

  // An operator typing into a form (a filter, a note, a secret id) is never interrupted.
  function busy() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }

  function refresh() {
    if (busy()) {
      pending = true;
      return;
    }
    pending = false;
    fetch(here, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected) {  // the session ended: the reload lands on sign-in
          location.reload();
          return null;
        }
        if (!response.ok) {  // a passing failure: keep the page as it is; the next change retries
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (html === null) {
          return;
        }
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-live]");
        if (fresh) {
          main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
          main.setAttribute("data-updated", String(Date.now()));
        }
      });
  }

  main.addEventListener("focusout", function () {
    if (pending) {
      setTimeout(refresh, 0);
    }
  });
  var source = new EventSource("/live?path=" + encodeURIComponent(here));
  source.addEventListener("changed", refresh);
  source.addEventListener("signedout", function () {
    source.close();
    location.assign("/signin");
  });
})();
