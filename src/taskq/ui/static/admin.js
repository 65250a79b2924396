// taskq admin UI: live progress over Server-Sent Events and the select-all box.
// Plain DOM code, no dependencies; loaded with the page's CSP nonce.
"use strict";

function followProgress(section) {
  const url = section.dataset.progressUrl;
  const bar = section.querySelector("[data-progress-bar]");
  const text = section.querySelector("[data-progress-text]");
  const seqNote = section.querySelector("[data-progress-seq]");
  const statusEl = section.querySelector("[data-status]");
  const source = new EventSource(url);
  window.taskqProgress = { source: source, events: [] };
  source.onmessage = function (message) {
    const event = JSON.parse(message.data);
    window.taskqProgress.events.push(event.seq);
    const state = event.state || {};
    if (bar && typeof state.percent === "number") {
      bar.value = state.percent;
    }
    if (text) {
      const parts = [];
      if (typeof state.percent === "number") parts.push(state.percent + "%");
      if (typeof state.step === "number") parts.push("step " + state.step);
      if (state.detail) parts.push(state.detail);
      text.textContent = parts.join(" ");
    }
    if (seqNote && event.seq !== null) seqNote.textContent = "event " + event.seq;
    if (statusEl) {
      statusEl.textContent = event.status;
      statusEl.className = "status status-" + event.status;
    }
    if (event.terminal) {
      section.dataset.terminal = "";
      source.close();
      section.querySelectorAll("[data-action=cancel]").forEach(function (b) { b.disabled = true; });
      section.querySelectorAll("[data-cancel-note]").forEach(function (n) { n.remove(); });
    }
  };
}

document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-progress-url]").forEach(function (section) {
    if (!("terminal" in section.dataset)) followProgress(section);
  });
  document.querySelectorAll("[data-select-all]").forEach(function (box) {
    box.addEventListener("change", function () {
      const form = box.closest("form");
      form.querySelectorAll("input[name=job_id]").forEach(function (b) { b.checked = box.checked; });
    });
  });
});

// Pages that summarise (overview, queues, workers) re-read themselves every
// data-refresh seconds while the tab is visible, swapping in the new <main>.
document.addEventListener("DOMContentLoaded", function () {
  const main = document.querySelector("main[data-refresh]");
  if (!main) return;
  const seconds = Number(main.dataset.refresh) || 5;
  const url = new URL(window.location.href);
  url.searchParams.delete("msg");
  window.setInterval(async function () {
    if (document.hidden) return;
    try {
      const response = await fetch(url.toString(), { credentials: "same-origin" });
      if (!response.ok) return;
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = doc.querySelector("main");
      if (fresh) {
        main.replaceChildren(...Array.from(fresh.childNodes));
        main.dataset.refreshed = String(Number(main.dataset.refreshed || 0) + 1);
      }
    } catch (err) {
      // The server is restarting or unreachable: keep the page, try again next tick.
    }
  }, seconds * 1000);
});
