/*
 * Tether console: the live sockets' bookkeeping on top of htmx's ws extension, the
 * objective's character count, a guard against double-submitted forms, a message for
 * every action that fails (a refusal, offline, no answer in time), and the run page's
 * reading aids (follow the latest event, fold iterations, countdowns).
 *
 * A run page's socket element carries data-last-seq: the last event it shows. Every
 * (re)connect asks the server for the events after it (?after=N); a pushed event whose
 * seq is not above it is dropped (already shown), and one that skips a seq makes the
 * page reconnect from the last one it applied. When the socket is down the page says
 * so and retries with backoff, after any close except a refusal (4403, 4404).
 */
(function () {
  "use strict";

  var EXTENSION_RETRIES = [1006, 1011, 1012, 1013]; // the ws extension reconnects after these itself
  var REFUSALS = {
    4403: "signed out: sign in again to follow live",
    4404: "this run is not yours, or it no longer exists"
  };
  var MAX_DELAY_MS = 30000;
  var RESYNC_CODE = 4000;
  var pendingDelay = null;

  function backoff(attempt) {
    var cap = Math.min(MAX_DELAY_MS, 500 * Math.pow(2, attempt));
    return cap / 2 + Math.random() * cap / 2;
  }

  function liveElementFor(url) {
    var found = null;
    document.querySelectorAll("[ws-connect]").forEach(function (el) {
      var path = el.getAttribute("ws-connect");
      if (url.slice(-path.length) === path) found = el;
    });
    return found;
  }

  function setStatus(el, state, text) {
    el.setAttribute("data-state", state);
    var label = el.querySelector("[data-live-status]");
    if (label) label.textContent = text;
  }

  function countdown(el, delay) {
    clearInterval(el.tetherCountdown);
    var due = Date.now() + delay;
    function tick() {
      if (el.getAttribute("data-state") !== "offline") return clearInterval(el.tetherCountdown);
      var seconds = Math.max(0, Math.ceil((due - Date.now()) / 1000));
      setStatus(el, "offline", seconds ? "offline: reconnecting in " + seconds + " s" : "offline: reconnecting…");
    }
    setStatus(el, "offline", "offline");
    tick();
    el.tetherCountdown = setInterval(tick, 1000);
  }

  function reconnectSoon(el, wrapper, delay) {
    clearTimeout(el.tetherRetry);
    el.tetherRetry = setTimeout(function () {
      el.tetherRetry = null;
      wrapper.reconnect();
    }, delay);
    countdown(el, delay);
  }

  if (window.htmx) {
    htmx.config.wsReconnectDelay = function (retryCount) {
      pendingDelay = backoff(retryCount);
      return pendingDelay;
    };

    htmx.createWebSocket = function (url) {
      var el = liveElementFor(url);
      var full = url;
      if (el && el.hasAttribute("data-last-seq")) {
        full += (url.indexOf("?") < 0 ? "?" : "&") + "after=" + encodeURIComponent(el.getAttribute("data-last-seq"));
      }
      var socket = new WebSocket(full);
      socket.binaryType = htmx.config.wsBinaryType || "blob";
      if (el) el.tetherSocket = socket;
      return socket;
    };
  }

  document.addEventListener("htmx:wsConnecting", function (e) {
    setStatus(e.target, "connecting", "connecting…");
  });

  document.addEventListener("htmx:wsOpen", function (e) {
    var el = e.target;
    el.tetherRetries = 0;
    el.tetherWrapper = e.detail.socketWrapper;
    clearInterval(el.tetherCountdown);
    setStatus(el, "live", "live");
  });

  document.addEventListener("htmx:wsClose", function (e) {
    var el = e.target;
    var code = e.detail.event.code;
    var delay = pendingDelay;
    pendingDelay = null;
    el.tetherWrapper = e.detail.socketWrapper;
    if (REFUSALS[code]) {
      setStatus(el, "refused", REFUSALS[code]);
      return;
    }
    if (EXTENSION_RETRIES.indexOf(code) >= 0 && delay !== null) {
      countdown(el, delay);
      return;
    }
    var attempt = el.tetherRetries || 0;
    el.tetherRetries = attempt + 1;
    reconnectSoon(el, e.detail.socketWrapper, code === RESYNC_CODE ? 0 : backoff(attempt));
  });

  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    var el = e.target;
    var match = /^\s*<[^>]*\sdata-seq="(\d+)"/.exec(e.detail.message);
    if (!match || !el.hasAttribute("data-last-seq")) return; // a state block: replaced by its id
    var seq = parseInt(match[1], 10);
    var last = parseInt(el.getAttribute("data-last-seq"), 10) || 0;
    if (seq <= last) {
      e.preventDefault(); // shown already
    } else if (seq !== last + 1) {
      e.preventDefault(); // a gap: start again from the last event applied
      if (el.tetherSocket) el.tetherSocket.close(RESYNC_CODE, "resync");
    } else {
      el.setAttribute("data-last-seq", String(seq));
    }
  });

  // An iteration a viewer opened or closed under "Where the money went" stays so when a live update redraws it.
  var keptOpen = {};
  document.addEventListener("click", function (e) {
    var summary = e.target.closest && e.target.closest("details[data-keep] > summary");
    if (summary) keptOpen[summary.parentElement.id] = !summary.parentElement.open;
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    Object.keys(keptOpen).forEach(function (id) {
      var details = document.getElementById(id);
      if (details && details.open !== keptOpen[id]) details.open = keptOpen[id];
    });
  });

  // A phone that wakes or a laptop back online reconnects at once instead of waiting out the backoff.
  function reconnectIdle() {
    document.querySelectorAll("[ws-connect]").forEach(function (el) {
      var socket = el.tetherSocket;
      if (el.tetherWrapper && socket && socket.readyState === WebSocket.CLOSED && el.getAttribute("data-state") === "offline") {
        reconnectSoon(el, el.tetherWrapper, 0);
      }
    });
  }
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") reconnectIdle();
  });
  window.addEventListener("online", reconnectIdle);


  // --- a run page's actions follow the run ------------------------------------------------------
  // Every state push carries the actions block; it replaces the shown one only when what it
  // offers changed (its data-actions key), so a half-typed message survives other updates.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var incoming = e.detail.fragment && e.detail.fragment.querySelector ? e.detail.fragment : null;
    var target = e.detail.target;
    if (!target || !target.hasAttribute || !target.hasAttribute("data-actions")) return;
    var fresh = incoming && (incoming.hasAttribute && incoming.hasAttribute("data-actions") ? incoming : incoming.querySelector("[data-actions]"));
    if (fresh && fresh.getAttribute("data-actions") === target.getAttribute("data-actions")) {
      e.detail.shouldSwap = false;
      return;
    }
    var typed = {};
    target.querySelectorAll("textarea[name]").forEach(function (t) { if (t.value) typed[t.name] = t.value; });
    target.tetherTyped = typed;
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    document.querySelectorAll("[data-actions]").forEach(function (block) {
      var typed = block.tetherTyped;
      if (!typed) return;
      block.tetherTyped = null;
      block.querySelectorAll("textarea[name]").forEach(function (t) { if (!t.value && typed[t.name]) t.value = typed[t.name]; });
    });
  });

  // Forms drawn by a live update have no CSRF token of their own: use the page's.
  function pageCsrf() {
    var holder = document.querySelector("[data-csrf]");
    if (holder && holder.getAttribute("data-csrf")) return holder.getAttribute("data-csrf");
    var input = document.querySelector("input[name=csrfmiddlewaretoken][value]:not([value=''])");
    return input ? input.value : "";
  }
  document.addEventListener("htmx:configRequest", function (e) {
    if (!e.detail.parameters.csrfmiddlewaretoken) {
      var token = pageCsrf();
      if (token) e.detail.headers["X-CSRFToken"] = token;
    }
  });
  document.addEventListener("submit", function (e) {
    var input = e.target.querySelector && e.target.querySelector("input[name=csrfmiddlewaretoken]");
    if (input && !input.value) input.value = pageCsrf();
  }, true);

  // "Keep it running" closes the stop confirmation.
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-close-details]");
    if (!button) return;
    var details = button.closest("details");
    if (details) details.open = false;
  });

  // "Copy": puts the text of the element `data-copy` names on the clipboard, and says so.
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    var said = button.parentNode.querySelector("[data-copied]");
    if (!source || !navigator.clipboard) {
      if (said) said.textContent = "Select the text and copy it.";
      return;
    }
    navigator.clipboard.writeText(source.textContent.trim()).then(
      function () { if (said) said.textContent = "Copied."; },
      function () { if (said) said.textContent = "Could not copy: select the text and copy it."; }
    );
  });

  // --- a failed action always says so ---------------------------------------------------------------
  // How long an action waits for an answer: TETHER_CONSOLE_TIMEOUT_SECONDS, drawn on <body> (20 s).
  var REQUEST_TIMEOUT_MS = 1000 * (parseFloat(document.body.getAttribute("data-request-timeout")) || 20);
  if (window.htmx) htmx.config.timeout = REQUEST_TIMEOUT_MS;

  function errorSlot(elt) {
    var form = elt.closest ? (elt.closest("form, details, [data-error-anchor]") || elt) : elt;
    var slot = form.previousElementSibling;
    if (slot && slot.hasAttribute("data-action-error")) return slot;
    slot = document.createElement("p");
    slot.className = "errors action-error";
    slot.setAttribute("role", "alert");
    slot.setAttribute("data-action-error", "");
    form.parentNode.insertBefore(slot, form);
    return slot;
  }
  function showError(elt, text) {
    if (!elt || !elt.parentNode) elt = document.querySelector("main") || document.body;
    errorSlot(elt).textContent = text;
  }
  function clearError(elt) {
    // A new try makes earlier failures in the same block stale.
    var block = (elt.closest && elt.closest("[data-actions], section, main")) || document;
    block.querySelectorAll("[data-action-error]").forEach(function (slot) { slot.remove(); });
  }
  function serverWords(xhr) {
    var type = (xhr.getResponseHeader("Content-Type") || "").toLowerCase();
    var body = xhr.responseText || "";
    var text = "";
    try {
      if (type.indexOf("json") >= 0) text = JSON.parse(body).error || "";
      else if (type.indexOf("html") >= 0) {
        var doc = new DOMParser().parseFromString(body, "text/html");
        ["[data-error-message]", ".errors", "main h1", "h1", "title"].some(function (selector) {
          var found = doc.querySelector(selector);
          text = found ? found.textContent : "";
          return !!text.trim();
        });
      } else text = body;
    } catch (err) { text = ""; }
    text = text.replace(/\s+/g, " ").trim();
    return text.length > 300 ? text.slice(0, 299) + "…" : text;
  }
  var STATUS_WORDS = { 403: "not allowed (signed out? reload the page and sign in again)", 404: "not found", 409: "not possible now", 429: "too many tries; wait a moment", 503: "Tether is busy or reconnecting to its database; try again in a few seconds" };
  document.addEventListener("htmx:beforeRequest", function (e) { clearError(e.detail.elt); });
  document.addEventListener("htmx:responseError", function (e) {
    var xhr = e.detail.xhr;
    var words = serverWords(xhr) || STATUS_WORDS[xhr.status] || xhr.statusText || "the server refused it";
    showError(e.detail.elt, "Not done: " + words + " (HTTP " + xhr.status + ").");
  });
  // A signed-out session answers a post with the sign-in page: say so instead of drawing it in place.
  document.addEventListener("htmx:beforeSwap", function (e) {
    var url = e.detail.xhr && e.detail.xhr.responseURL;
    if (!url || !/\/login\/(\?|$)/.test(new URL(url, location.href).pathname + "?")) return;
    e.detail.shouldSwap = false;
    showError(e.detail.requestConfig ? e.detail.requestConfig.elt : e.detail.elt,
      "Not done: you are signed out. Reload the page and sign in again.");
  });
  document.addEventListener("htmx:sendError", function (e) {
    showError(e.detail.elt, navigator.onLine === false
      ? "Not sent: you are offline. Nothing changed; try again once you are back online."
      : "Not sent: Tether could not be reached (offline?). Check your connection and try again; this page shows the run's state as it changes.");
  });
  document.addEventListener("htmx:timeout", function (e) {
    showError(e.detail.elt, "No answer from Tether within " + REQUEST_TIMEOUT_MS / 1000 + " s: the action may or may not have been done. This page shows the run's state as it changes; try again if nothing moves.");
  });

  // --- countdowns ("lease expires in N s") ---------------------------------------------------------
  setInterval(function () {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var due = new Date(el.getAttribute("data-countdown"));
      if (isNaN(due)) return;
      var seconds = Math.max(0, Math.ceil((due - Date.now()) / 1000));
      el.textContent = seconds + " s";
    });
  }, 1000);

  // --- "live" only while the run can still change -------------------------------------------------
  function runEnded() {
    var summary = document.querySelector(".run-page .summary[data-live-run]");
    return !!summary && summary.getAttribute("data-live-run") === "false";
  }
  function markEnded() {
    document.querySelectorAll('.run-page [ws-connect][data-state="live"]').forEach(function (el) {
      if (runEnded()) {
        el.setAttribute("data-state", "ended");
        var label = el.querySelector("[data-live-status]");
        if (label) label.textContent = "finished: this run will not change";
      }
    });
  }
  document.addEventListener("htmx:wsOpen", function () { setTimeout(markEnded, 0); });
  document.addEventListener("htmx:wsAfterMessage", markEnded);


  // --- reading a long timeline: follow the latest, jump to it, fold iterations ---------------------
  // A live run opens following its newest events; a finished one opens at its top.
  var KEEP_UNFOLDED = 2; // the latest iterations stay open when older ones fold by themselves
  var folded = {};
  var following = false;
  var stoppedHere = false; // a stop sent from this page: its "Stopped by …" event is brought into view
  var followedY = null; // where following last put the page: scrolling above it is a person reading
  var unseen = 0;

  function timelineOf(tools) { return document.getElementById("run-" + tools.getAttribute("data-timeline-tools") + "-timeline"); }
  function latestAnchor() { return document.querySelector(".latest-anchor"); }

  function setFollow(on) {
    following = on;
    document.querySelectorAll("[data-follow]").forEach(function (b) {
      b.setAttribute("aria-pressed", on ? "true" : "false");
      b.textContent = on ? "Following latest" : "Follow latest";
    });
    if (on) scrollToLatest();
  }
  function scrollToLatest() {
    var anchor = latestAnchor();
    if (!anchor) return;
    anchor.scrollIntoView({ block: "end" });
    followedY = window.scrollY;
    unseen = 0;
    updateJump();
  }
  function latestInView() {
    var anchor = latestAnchor();
    if (!anchor) return true;
    var box = anchor.getBoundingClientRect();
    return box.top <= window.innerHeight + 40;
  }
  // The floating "Jump to latest" never covers a control: where it would, it stays hidden.
  var CONTROLS = ".run-page [data-actions] button, .run-page [data-actions] summary, .run-page [data-actions] textarea, " +
    ".run-page [data-actions] input, [data-timeline-tools] button, [data-timeline-tools] .button";
  function coversControl(jump) {
    var box = jump.getBoundingClientRect();
    var margin = 8;
    return Array.prototype.some.call(document.querySelectorAll(CONTROLS), function (c) {
      var r = c.getBoundingClientRect();
      return r.width > 0 && r.height > 0 && r.left < box.right + margin && r.right > box.left - margin &&
        r.top < box.bottom + margin && r.bottom > box.top - margin;
    });
  }
  function updateJump() {
    var jump = document.querySelector("[data-jump-latest]");
    if (!jump) return;
    var count = jump.querySelector("[data-new-count]");
    if (count) count.textContent = unseen ? "(" + unseen + " new)" : "";
    jump.hidden = runEnded() || latestInView();
    if (!jump.hidden && coversControl(jump)) jump.hidden = true;
  }

  function fold(timeline, number, on) {
    folded[number] = on;
    timeline.querySelectorAll('article[data-iteration="' + number + '"]').forEach(function (a) {
      if (a.getAttribute("data-kind") === "iteration.started") {
        var toggle = a.querySelector("[data-iter-toggle]");
        if (toggle) toggle.setAttribute("aria-expanded", on ? "false" : "true");
        a.classList.toggle("folded", on);
      } else {
        a.hidden = on;
      }
    });
  }
  function iterationNumbers(timeline) {
    var seen = [];
    timeline.querySelectorAll('article[data-kind="iteration.started"][data-iteration]').forEach(function (a) {
      var n = a.getAttribute("data-iteration");
      if (seen.indexOf(n) < 0) seen.push(n);
    });
    return seen;
  }
  function finishedIteration(timeline, n) {
    return !!timeline.querySelector('article[data-kind="iteration.finished"][data-iteration="' + n + '"]');
  }
  function foldOlder(timeline, keep) {
    var numbers = iterationNumbers(timeline);
    numbers.slice(0, Math.max(0, numbers.length - keep)).forEach(function (n) {
      if (finishedIteration(timeline, n) && folded[n] === undefined) fold(timeline, n, true);
    });
  }

  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target : null;
    if (!t) return;
    var toggle = t.closest("[data-iter-toggle]");
    if (toggle) {
      var timeline = toggle.closest(".timeline");
      var n = toggle.getAttribute("data-iter-toggle");
      fold(timeline, n, !folded[n]);
      return;
    }
    var tools = t.closest("[data-timeline-tools]");
    if (!tools) return;
    var line = timelineOf(tools);
    if (t.closest("[data-follow]")) setFollow(!following);
    else if (t.closest("[data-fold-all]")) iterationNumbers(line).forEach(function (n) { if (finishedIteration(line, n)) fold(line, n, true); });
    else if (t.closest("[data-unfold-all]")) iterationNumbers(line).forEach(function (n) { fold(line, n, false); });
  });

  // A person who scrolls up to read stops following. Only a move above where following put the
  // page counts (not a timer): a new event's own scroll, however late, is never taken for a person's.
  window.addEventListener("scroll", function () {
    // (A block above that shrinks moves the page too, but keeps the latest in view: still following.)
    if (following && followedY !== null && window.scrollY < followedY - 40 && !latestInView()) setFollow(false);
    if (latestInView()) unseen = 0;
    updateJump();
  }, { passive: true });
  window.addEventListener("resize", updateJump);
  document.addEventListener("toggle", updateJump, true); // a stop confirmation opened or closed

  // "Jump to latest" puts the newest event in view (a plain link to the anchor would put the anchor
  // at the top of the window, the newest event above it, out of sight).
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest('.run-page a[href$="-latest"]');
    var anchor = latestAnchor();
    if (!link || !anchor || link.getAttribute("href") !== "#" + anchor.id) return;
    e.preventDefault();
    scrollToLatest();
    anchor.focus({ preventScroll: true });
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (e.detail.elt && e.detail.elt.matches && e.detail.elt.matches("form.stop")) stoppedHere = true;
  });

  document.addEventListener("htmx:wsAfterMessage", function (e) {
    var message = e.detail && e.detail.message;
    if (typeof message !== "string" || !/^\s*<div hx-swap-oob="beforeend:#run-\d+-timeline" data-seq=/.test(message)) return;
    var timeline = document.querySelector(".run-page .timeline");
    if (timeline) {
      var match = /data-iteration="(\d+)"/.exec(message);
      if (match && folded[match[1]]) fold(timeline, match[1], true);
    }
    if (following || stoppedHere) scrollToLatest();
    else if (!latestInView()) { unseen += 1; updateJump(); }
  });
  document.addEventListener("htmx:wsAfterMessage", updateJump);

  function readyTimeline() {
    document.querySelectorAll("[data-timeline-tools]").forEach(function (tools) {
      tools.querySelectorAll("[hidden]").forEach(function (b) { b.hidden = false; });
      var line = timelineOf(tools);
      if (line) foldOlder(line, KEEP_UNFOLDED);
      setFollow(!runEnded());
    });
    updateJump();
  }

  // The objective's character count against the instance's cap.
  function count(area) {
    var shown = document.querySelector('[data-count-for="' + area.id + '"]');
    if (!shown) return;
    var n = Array.from(area.value.trim()).length;
    var max = parseInt(area.getAttribute("data-max-chars"), 10);
    shown.querySelector("[data-count-value]").textContent = n.toLocaleString("en-US");
    var over = n > max;
    shown.classList.toggle("over", over);
    var warning = shown.querySelector("[data-count-over]");
    if (warning) warning.hidden = !over;
  }
  document.addEventListener("input", function (e) {
    if (e.target.matches && e.target.matches("textarea[data-max-chars]")) count(e.target);
  });

  // Plain forms: one submit per page view (htmx forms disable their own buttons).
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (e.defaultPrevented || form.hasAttribute("hx-post")) return;
    if (form.getAttribute("data-submitting")) {
      e.preventDefault();
      return;
    }
    form.setAttribute("data-submitting", "1");
    setTimeout(function () {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    }, 0);
  });
  window.addEventListener("pageshow", function (e) {
    if (!e.persisted) return;
    document.querySelectorAll("form[data-submitting]").forEach(function (form) {
      form.removeAttribute("data-submitting");
      form.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
    });
  });

  // Times are rendered in UTC; show them in the viewer's own time zone (the UTC text stays as the title).
  var TIME_FORMATS = {
    time: { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" },
    seconds: { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" },
    minutes: { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23" }
  };
  function localizeTimes() {
    document.querySelectorAll("time[datetime]:not([data-local])").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when)) return;
      el.setAttribute("data-local", "");
      el.title = el.textContent.trim() + " UTC";
      el.textContent = when.toLocaleString([], TIME_FORMATS[el.getAttribute("data-format")] || TIME_FORMATS.minutes);
    });
  }
  document.addEventListener("htmx:wsAfterMessage", localizeTimes);
  document.addEventListener("htmx:afterSettle", localizeTimes);

  function ready() {
    document.querySelectorAll("textarea[data-max-chars]").forEach(count);
    localizeTimes();
    readyTimeline();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
