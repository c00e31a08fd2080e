// The console's one script: refreshes each element marked data-live="/ui/fragments/..."
// from that URL every 5 s. Without it, every page is complete as served (docs/console.md
// says why polling and not server-sent events).
"use strict";
(function () {
  const PERIOD_MS = 5000;

  async function refresh(element) {
    const url = element.getAttribute("data-live");
    // Only the console's own fragments: the attribute is the server's, never a value's.
    if (!url || !url.startsWith("/ui/fragments/")) return;
    // A box ticked or a field being typed in would be lost: wait for the next turn.
    if (element.contains(document.activeElement) || element.querySelector("input:checked")) return;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      // The session ended (a redirect to the login): the whole page goes there, not the
      // login form into this element.
      if (response.redirected) { window.location.assign(response.url); return; }
      if (!response.ok) { element.classList.add("stale"); return; }
      // The fragment is rendered and escaped by the server, as the page was.
      element.innerHTML = await response.text();
      element.classList.remove("stale");
    } catch (error) {
      element.classList.add("stale");
    }
  }

  function tick() {
    if (document.hidden) return;
    document.querySelectorAll("[data-live]").forEach(refresh);
  }

  document.addEventListener("DOMContentLoaded", function () {
    window.setInterval(tick, PERIOD_MS);
  });
})();
