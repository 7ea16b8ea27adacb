/*
 * Tether console: the live sockets' bookkeeping on top of htmx's ws extension, the
 * objective's character count, and a guard against double-submitted forms.
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
      setStatus(el, "offline", seconds ? "offline: retrying in " + seconds + " s" : "offline: retrying…");
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
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
