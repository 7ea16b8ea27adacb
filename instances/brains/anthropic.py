"""The `anthropic` brain and the `llm` decider: Claude, through the official SDK, with the user's key.

Runs in the worker; holds no database transaction and makes network calls. The only
module that imports `anthropic`; provider words (`tool_use`, `end_turn`, HTTP 529) stop here.

`AnthropicBrain(instance).act(request)` is one bounded tool-use exchange: the instance's
system prompt and the run's objective (the stable, cached prefix), then the compacted
history of earlier iterations, the latest checks and the instruction; the instance's
tools; at most `max_tool_turns` tool turns and `max_output_tokens` output tokens. The
assistant's content is sent back exactly as received (the raw JSON blocks) before the
tool results. A stop request is honoured between tool turns, during a tool and by
abandoning the model call in flight (the call runs in a worker thread that is polled).

With a journal (`request.journal`, loops.journal in a run) every tool call, built-in or MCP,
and every approved call run at the start (turn 0) is recorded under an idempotency key (run,
iteration, turn, call: "r12-i3-t2-c0") before it runs and again with its result. A re-run of
the iteration after its worker died rebuilds the conversation from the journal: the model's
journaled answers verbatim (it is not asked again), finished calls' recorded results, and for a
call started but never finished an error result saying it was interrupted and its effect is
unknown; calls of a journaled turn that never started run now, then the act goes on as usual.
A call that cannot be journaled is not run: the act fails.

`decide(instance, snapshot)` asks Claude for `{verdict, reason, next_instruction}` through an
optional (`auto`) tool, and returns the raw answer text for `loops.decision.parse`.

Errors: a missing key, 401/403, or a billing refusal (402, or a 400 whose message says
"credit balance") raise `CredentialError` at once, with no retry. 408/409/429/5xx/529,
timeouts and dropped connections are retried with jittered exponential backoff, at most
`TETHER_ANTHROPIC_RETRIES` retries per act; past that `ProviderError`. Other 4xx raise
`ProviderError` without retry. Every raised error carries the usage of every call made.

Keys: the SDK is always given `api_key` and `base_url` explicitly (it never reads the
environment or local profiles); the key is scrubbed from every text this module returns,
raises or logs, and tools never see it (commands get a minimal environment).

Settings (declared, with their defaults, in tether/settings.py): TETHER_ANTHROPIC_RETRIES,
TETHER_ANTHROPIC_BACKOFF_SECONDS, TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS,
TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS, TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL,
TETHER_ANTHROPIC_DEFAULT_MODEL, TETHER_CONTEXT_BUDGET_TOKENS (the history's share of the prompt),
TETHER_CONTEXT_RECENT.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
from django.conf import settings

from budgets import grants
from instances import credentials, sandbox
from instances.brains.base import (
    ActRequest,
    BrainError,
    BudgetExhausted,
    CredentialError,
    DelegateRefused,
    JournaledTurn,
    JournalError,
    Meter,
    ProviderError,
    Reply,
    Usage,
    check_delegate,
    trace_call,
)
from instances.pinned import Pinned
from instances.tools import ToolContext, ToolResult, definitions, run_tool
from instances.tools.mcp import McpTools, is_mcp_name
from tether import redaction, tracing

log = logging.getLogger(__name__)

CACHE = {"type": "ephemeral"}
BILLING_CODES = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
        "organization_on_hold",
    }
)
DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous agent run by Tether. Each turn of the loop you receive an instruction; "
    "work toward the objective with the tools you have, inside your workspace, then reply with a "
    "short account of what you did and what remains."
)
INTERRUPTED = (
    "interrupted: a previous attempt of this act started this call and was cut off before it finished; "
    "its effect is unknown — check before repeating it"
)
DECIDER_PROMPT = """You are the judge of an autonomous agent loop run by Tether.
After each iteration you see the objective, what the agent was told and answered, the results of the
machine checks, and a summary of earlier iterations. Decide what happens next:

- "done": the objective is met and the evidence (fresh check results, the agent's account) shows it;
- "continue": progress is possible; give the precise next instruction for the agent;
- "escalate": a person is needed (missing information, a decision, access the agent lacks);
- "failed": the objective cannot be reached (impossible, or the same failure repeats without progress).

Never call a run done while a required check fails. Prefer a different next instruction to repeating one
that did not work. Answer by calling the record_decision tool once. If you cannot call it, answer with only
a JSON object: {"verdict": "...", "reason": "...", "next_instruction": "..."}."""
DECISION_TOOL = {
    "name": "record_decision",
    "description": "Record the verdict on the iteration just finished, the reason, and the next instruction.",
    "input_schema": {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["continue", "done", "escalate", "failed"]},
            "reason": {"type": "string", "description": "one or two sentences of evidence"},
            "next_instruction": {"type": "string", "description": "what the agent does next (for continue)"},
        },
        "required": ["verdict", "reason"],
    },
}


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    retries: int
    backoff: float
    backoff_max: float
    call_timeout: float
    max_tokens_per_call: int
    context_tokens: int
    recent: int
    poll: float = 0.05


def limits() -> Limits:
    """Return the brain's bounds from settings (read on every act, so tests can override them)."""
    return Limits(
        retries=int(settings.TETHER_ANTHROPIC_RETRIES),
        backoff=float(settings.TETHER_ANTHROPIC_BACKOFF_SECONDS),
        backoff_max=float(settings.TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS),
        call_timeout=float(settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS),
        max_tokens_per_call=int(settings.TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL),
        context_tokens=int(settings.TETHER_CONTEXT_BUDGET_TOKENS),
        recent=int(settings.TETHER_CONTEXT_RECENT),
    )


def model_for(instance: Any) -> str:
    return instance.model or str(settings.TETHER_ANTHROPIC_DEFAULT_MODEL)


# --- compaction (pure) ------------------------------------------------------------------------

REPEATED_CHARS = 200  # of each field of an entry standing for several iterations alike


def estimate_tokens(text: str) -> int:
    """Return a rough token count (four characters a token)."""
    return math.ceil(len(text) / 4)


def clip(text: str, limit: int) -> str:
    """Return `text` cut to about `limit` characters, keeping its head and its tail."""
    text = text or ""
    if len(text) <= limit:
        return text
    if limit < 40:
        return text[:limit]
    head = limit // 3
    tail = limit - head - 20
    return f"{text[:head]} …[{len(text) - head - tail} chars]… {text[-tail:]}"


def _checks(value: Any) -> list[tuple[str, bool | None, str]]:
    """Normalise check results given as {name: passed} or [{name, passed|ok|status, output}]."""
    found: list[tuple[str, bool | None, str]] = []
    if isinstance(value, Mapping):
        for name, passed in value.items():
            found.append((str(name), passed if isinstance(passed, bool) else None, ""))
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, Mapping):
                continue
            passed = item.get("passed", item.get("ok"))
            if passed is None and "status" in item:
                passed = item["status"] in ("passed", "pass", "ok", True)
            output = item.get("output") or item.get("detail") or ""
            found.append((str(item.get("name", "?")), passed if isinstance(passed, bool) else None, str(output)))
    return found


def _verdict(item: Mapping[str, Any]) -> str:
    decision = item.get("decision")
    if isinstance(decision, Mapping) and decision.get("verdict"):
        return str(decision["verdict"])
    return str(item.get("verdict") or "")


def _number(item: Mapping[str, Any]) -> int:
    value = item.get("iteration", item.get("number", 0))
    return value if isinstance(value, int) else 0


def _times(item: Mapping[str, Any]) -> int:
    """How many iterations alike the entry stands for (the loop keeps one entry for them)."""
    value = item.get("times", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _alike_since(item: Mapping[str, Any], number_sign: str = "iteration ") -> str:
    """Return " (and 96 alike since iteration 3)" for an entry standing for several iterations, else ""."""
    times, first = _times(item), item.get("first")
    if times == 1:
        return ""
    start = f", since {number_sign}{first}" if isinstance(first, int) and not isinstance(first, bool) else ""
    return f" (and {times - 1} earlier alike{start})"


def _refused(item: Mapping[str, Any]) -> str:
    refused = item.get("refused")
    return "; ".join(str(r) for r in refused) if isinstance(refused, list | tuple) else ""


def summarise_iteration(item: Mapping[str, Any]) -> str:
    """Return one line for an older iteration: verdict, check tally, instruction gist."""
    checks = _checks(item.get("checks"))
    verdict = _verdict(item)
    parts = [f"#{_number(item)}{_alike_since(item, '#')} {verdict}".rstrip()]
    if item.get("act_ok") is False:
        parts.append("act failed")
    if checks:
        passed = sum(1 for _, ok, _ in checks if ok)
        failing = [name for name, ok, _ in checks if ok is False]
        tally = f"checks {passed}/{len(checks)}"
        parts.append(tally + (f" (failing: {', '.join(failing[:4])})" if failing else ""))
    if delegated := str(item.get("delegated") or ""):
        parts.append(f"delegated {clip(delegated, 100)}")
    if refused := _refused(item):
        parts.append(f"refused: {clip(refused, 100)}")
    instruction = " ".join(str(item.get("instruction") or "").split())
    parts.append(f"did: {clip(instruction, 100)}")
    return "- " + "; ".join(parts)


def render_iteration(item: Mapping[str, Any], limit: int) -> str:
    """Return an iteration nearly verbatim, each field clipped so the whole fits `limit` chars.

    An entry standing for several iterations alike says how many, and its fields are clipped to
    `REPEATED_CHARS`: the model is told that it went so again, not all of it again.
    """
    field_limit = max(limit // 3, 80) if _times(item) == 1 else REPEATED_CHARS
    lines = [f"Iteration {_number(item)}{_alike_since(item)}:"]
    if instruction := str(item.get("instruction") or ""):
        lines.append(f"  instruction: {clip(instruction, field_limit)}")
    response = str(item.get("response") or item.get("text") or "")
    if response:
        lines.append(f"  agent answered: {clip(response, field_limit)}")
    if delegated := str(item.get("delegated") or ""):
        lines.append(f"  delegated {clip(delegated, field_limit)}")
    if refused := _refused(item):
        lines.append(f"  refused: {clip(refused, field_limit)}")
    if item.get("act_ok") is False or item.get("act_detail"):
        lines.append(f"  act: {'ok' if item.get('act_ok') else 'failed'} {clip(str(item.get('act_detail') or ''), 200)}")
    for name, ok, output in _checks(item.get("checks")):
        state = "passed" if ok else "FAILED" if ok is False else "?"
        lines.append(f"  check {name}: {state}" + (f" — {clip(output, 300)}" if output and not ok else ""))
    decision = item.get("decision")
    reason = decision.get("reason", "") if isinstance(decision, Mapping) else ""
    # An earlier iteration went on, as a rule: its verdict is said when it is news.
    if (verdict := _verdict(item)) and (verdict != "continue" or reason):
        lines.append(f"  verdict: {verdict}" + (f" — {clip(str(reason), 200)}" if reason else ""))
    return clip("\n".join(lines), limit)


def compact_history(items: Iterable[Mapping[str, Any]], *, budget_tokens: int, recent: int = 3) -> str:
    """Return earlier iterations as text within `budget_tokens`: recent ones verbatim, older summarised.

    Pure. Older summaries are kept newest first until the budget runs out; the rest are
    counted, not shown, so the text stops growing however long the run gets. An entry that
    stands for several iterations alike is shown once, with how many and since when: the
    history of a loop that repeats itself stays the size it had when it first repeated.
    """
    ordered = sorted((i for i in items if isinstance(i, Mapping)), key=_number)
    if not ordered:
        return ""
    budget = max(budget_tokens, 200) * 4
    latest = ordered[-recent:] if recent > 0 else []
    older = ordered[: len(ordered) - len(latest)]
    share = (budget * 2 // 3) // max(len(latest), 1)
    verbatim = [render_iteration(item, share) for item in latest]
    room = budget - sum(len(v) + 1 for v in verbatim) - 120
    lines: list[str] = []
    for item in reversed(older):
        line = summarise_iteration(item)
        if len(line) + 1 > room:
            break
        lines.append(line)
        room -= len(line) + 1
    total = sum(map(_times, ordered))  # said when not all of them are shown in full
    heading = f"History of this run ({total} earlier iterations; recent ones in full):" if older else ""
    parts = [heading or "History of this run:"]
    if omitted := sum(map(_times, older[: len(older) - len(lines)])):
        parts.append(f"- ({omitted} older iteration(s) not shown)")
    parts += reversed(lines)
    parts += verbatim
    return "\n".join(parts)


def render_checks(checks: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for name, ok, output in _checks(list(checks)):
        state = "passed" if ok else "FAILED" if ok is False else "unknown"
        lines.append(f"- {name}: {state}" + (f"\n{clip(output, 1500)}" if output and not ok else ""))
    return "Latest check results:\n" + "\n".join(lines) if lines else ""


# --- the model call --------------------------------------------------------------------------


class _Stopped(Exception):
    pass


class _TimedOut(Exception):
    pass


def _retry_after(exc: anthropic.APIStatusError) -> float | None:
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue
    return None


def classify(exc: BaseException) -> tuple[str, str, float | None]:
    """Return (kind, description, retry-after seconds) for a failed call.

    kind is "credential" (never retried), "transient" (retried) or "fatal" (not retried).
    """
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        kind_name = str(exc.type or "")
        message = str(exc.api_message or "")
        said = f"{status} {kind_name}".strip() + (f": {clip(message, 300)}" if message else "")
        if status == 401 or kind_name == "authentication_error":
            return "credential", f"Anthropic rejected the API key ({said}); check the instance's credential", None
        if status == 403 or kind_name == "permission_error":
            return "credential", f"the API key is not allowed to make this request ({said})", None
        billing = (
            status == 402
            or kind_name == "billing_error"
            or "credit balance" in message.lower()
            or (exc.error_code or "") in BILLING_CODES
        )
        if billing:
            return "credential", f"Anthropic refused the request for billing reasons ({said}); add credits or use another key", None
        if status in (408, 409, 429) or status >= 500:
            return "transient", f"Anthropic is unavailable ({said})", _retry_after(exc)
        return "fatal", f"Anthropic refused the request ({said})", None
    if isinstance(exc, anthropic.APITimeoutError):
        return "transient", "the model call timed out", None
    if isinstance(exc, anthropic.APIConnectionError):
        return "transient", "the connection to the model endpoint failed", None
    if isinstance(exc, httpx2.TransportError):  # a stream cut once it had begun: the SDK raises it as is
        return "transient", f"the connection to the model endpoint was cut mid-answer ({type(exc).__name__})", None
    return "fatal", f"the model call failed ({type(exc).__name__})", None


KEY_CHECK_TIMEOUT = 20.0


def check_key(instance: Any) -> str:
    """Ask the provider whether `instance`'s key works now, spending nothing; return "" or why it does not.

    One `count_tokens` request (free, not metered) with the key and endpoint the brain uses: a key
    Anthropic rejects answers 401 or 403 there as it would on a model call. Any failure — the key
    refused, no key, the endpoint unreachable — is a "no": the caller must not spend on a maybe.
    The answer names no key (redacted).
    """
    try:
        key = credentials.resolve_api_key(instance)
    except credentials.CredentialUnreadable as exc:
        return f"the instance's credential cannot be read: {exc}"
    if not key:
        return credentials.missing_key_message(instance)
    secrets = tuple(dict.fromkeys([key, *credentials.secrets_for(instance)]))
    client = anthropic.Anthropic(
        api_key=key, base_url=credentials.resolve_base_url(instance), max_retries=0,
        timeout=min(KEY_CHECK_TIMEOUT, limits().call_timeout),
    )
    try:
        client.messages.count_tokens(model=model_for(instance), messages=[{"role": "user", "content": "ping"}])
    except Exception as exc:  # noqa: BLE001 - every failure is an answer: "it does not work (yet)"
        _, detail, _ = classify(exc)
        return redaction.redact(detail, secrets)
    finally:
        client.close()
    return ""


class Session:
    """One act's (or one decision's) client, usage tally, retry budget and stop/deadline watch."""

    def __init__(
        self, instance: Any, *, stop: threading.Event, deadline: float, model: str, meter: Meter | None = None
    ) -> None:
        self.instance = instance
        self.meter = meter
        self.stop = stop
        self.deadline = deadline
        self.limits = limits()
        self.usage = Usage(model=model)
        self.retries = 0
        self.abandoned = 0
        try:
            key = credentials.resolve_api_key(instance)
        except credentials.CredentialUnreadable as exc:
            raise CredentialError(str(exc), self.usage) from None
        if not key:
            raise CredentialError(credentials.missing_key_message(instance), self.usage)
        self.secrets = tuple(dict.fromkeys([key, *credentials.secrets_for(instance)]))
        self.base_url = credentials.resolve_base_url(instance)
        self.sockets: list[socket.socket] = []  # every connection this session opened, for a stop to hang up
        self.client = anthropic.Anthropic(
            api_key=key,
            base_url=self.base_url,
            max_retries=0,
            timeout=self.limits.call_timeout,
            http_client=anthropic.DefaultHttpxClient(event_hooks={"request": [self._watch]}),
        )

    def scrub(self, text: str) -> str:
        return redaction.redact(text, self.secrets)

    def _watch(self, request: httpx2.Request) -> None:
        """Have the transport report the connection it opens for `request` (its `trace` extension)."""
        request.extensions = {**request.extensions, "trace": self._opened}

    def _opened(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                self.sockets.append(sock)

    def _hang_up(self) -> None:
        """End every connection this session opened at once, whichever thread is reading it.

        A socket is shut down, not merely closed: closing a socket that another thread is blocked
        reading frees its descriptor but not the connection, which stays up until that read returns
        — and the read may wait on whatever takes the freed descriptor next (on PostgreSQL, the
        runner's next database connection), so the provider would go on streaming for the whole
        call timeout. Shutting it down sends the provider the end of the connection and wakes the
        reader.
        """
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already (or, under TLS, the plain socket the TLS one took over)

    def close(self) -> None:
        # Closing the pool also releases a call abandoned in flight (a stop has hung it up already).
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing must never mask the act's own result
            log.debug("closing the anthropic client failed", exc_info=False)

    def create(self, params: dict[str, Any]) -> dict[str, Any]:
        """Send one Messages request, retrying transient failures; return the raw response body.

        With a meter, every attempt reserves its worst case first (`max_tokens` may come back
        clamped to what the headroom can pay) and is settled at its usage, even when it fails.
        """
        while True:
            if self.stop.is_set():
                raise _Stopped
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise _TimedOut
            grant = None
            if self.meter is not None:
                request_bytes = len(json.dumps(params, default=str).encode())
                try:
                    grant = self.meter.before(
                        model=str(params["model"]), request_bytes=request_bytes, max_tokens=int(params["max_tokens"])
                    )
                except grants.BudgetExhausted as exc:
                    raise BudgetExhausted(exc.detail, self.usage) from None  # with what the act spent so far
                params = {**params, "max_tokens": grant.max_tokens}
            before = dataclasses.replace(self.usage)
            with tracing.model_call("anthropic", str(params["model"])) as traced:
                cost = 0
                try:
                    ok, value = self._send(params, min(self.limits.call_timeout, remaining))
                finally:
                    if grant is not None and self.meter is not None:
                        cost = self.meter.after(grant, _since(before, self.usage))
                        self.usage.metered_micros += cost
                failed = "" if ok else "the provider refused or failed the call"
                trace_call(traced, params, _since(before, self.usage), cost, value if ok and isinstance(value, dict) else None,
                           secrets=self.secrets, failed=failed)
            self.usage.calls += 1
            if ok:
                body: dict[str, Any] = value
                return body
            kind, detail, retry_after = classify(value)
            detail = self.scrub(detail)
            if kind == "credential":
                log.warning("instance %s: %s", self.instance.pk, detail)
                raise CredentialError(detail, self.usage)
            if kind == "fatal":
                log.warning("instance %s: %s", self.instance.pk, detail)
                raise ProviderError(detail, self.usage)
            if self.retries >= self.limits.retries:
                raise ProviderError(f"{detail}; gave up after {self.usage.calls} attempt(s)", self.usage)
            self.retries += 1
            delay = min(self.limits.backoff_max, self.limits.backoff * 2 ** (self.retries - 1))
            delay *= 0.5 + random.random() / 2
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.limits.backoff_max))
            log.info(
                "instance %s: %s; retry %d of %d in %.2fs",
                self.instance.pk, detail, self.retries, self.limits.retries, delay,
            )
            if delay >= remaining:
                raise _TimedOut
            if self.stop.wait(delay):
                raise _Stopped

    def _send(self, params: dict[str, Any], timeout: float) -> tuple[bool, Any]:
        """Stream one request in a worker thread; a stop closes its connection at once.

        Streaming is what makes a stop stop spending: hanging up tears down the HTTP connection
        (the provider stops generating), whether or not the answer has begun, and what arrived so
        far — the input from `message_start` plus the output received — is what the call is
        counted at.
        """
        box: dict[str, Any] = {}
        done = threading.Event()
        opened: list[Any] = []

        def call() -> None:
            try:
                with self.client.messages.stream(**params, timeout=timeout) as stream:
                    opened.append(stream)
                    for _ in stream:
                        pass
                    box["body"] = stream.get_final_message().model_dump(mode="json", exclude_none=True)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=call, name="tether-anthropic-call", daemon=True)
        worker.start()
        while not done.wait(self.limits.poll):
            if self.stop.is_set():
                self._hang_up()
                done.wait(self.limits.poll)  # the worker sees the end and closes its own stream
                self.abandoned += 1
                self.usage.calls += 1
                self._count_partial(opened[0] if opened else None, params)
                if opened:
                    try:
                        opened[0].close()
                    except Exception:  # noqa: BLE001 - the stream may be closing under us already
                        pass
                raise _Stopped
        if "error" in box:
            if opened and self._began(opened[0]):
                # Cut after `message_start` (a network error, a timeout mid-stream): the provider
                # bills what it sent, so it is counted as a stop's call is.
                self._count_partial(opened[0], params)
            return False, box["error"]
        body = box.get("body")
        if not isinstance(body, dict):
            return False, ValueError("the model endpoint returned something other than a message")
        self._count(body)
        return True, body

    @staticmethod
    def _began(stream: Any) -> bool:
        """Return whether the stream's `message_start` arrived (the provider had begun the call)."""
        try:
            return stream._current_snapshot_or_none() is not None
        except Exception:  # noqa: BLE001 - a snapshot half-built by the other thread
            return False

    def _count_partial(self, stream: Any, params: dict[str, Any]) -> None:
        """Count a call stopped mid-stream: its input as the provider reported it, and the output so far.

        Before `message_start` arrived the input is estimated from the request (generously).
        """
        snapshot = None
        if stream is not None:
            try:
                snapshot = stream._current_snapshot_or_none()
            except Exception:  # noqa: BLE001 - a snapshot half-built by the other thread
                snapshot = None
        if snapshot is None:
            self.usage.input_tokens += estimate_tokens(json.dumps(params, default=str))
            return
        used = snapshot.usage
        received = estimate_tokens(json.dumps([b.model_dump(mode="json") for b in snapshot.content], default=str))
        self.usage.input_tokens += int(used.input_tokens or 0)
        self.usage.cache_write_tokens += int(getattr(used, "cache_creation_input_tokens", 0) or 0)
        self.usage.cache_read_tokens += int(getattr(used, "cache_read_input_tokens", 0) or 0)
        self.usage.output_tokens += max(int(used.output_tokens or 0), received)

    def _count(self, body: Mapping[str, Any]) -> None:
        usage = body.get("usage") or {}
        self.usage.input_tokens += int(usage.get("input_tokens") or 0)
        self.usage.output_tokens += int(usage.get("output_tokens") or 0)
        self.usage.cache_write_tokens += int(usage.get("cache_creation_input_tokens") or 0)
        self.usage.cache_read_tokens += int(usage.get("cache_read_input_tokens") or 0)


def _since(before: Usage, after: Usage) -> Usage:
    """Return the tokens `after` gained over `before`: one call's usage."""
    return Usage(
        model=after.model,
        input_tokens=after.input_tokens - before.input_tokens,
        output_tokens=after.output_tokens - before.output_tokens,
        cache_write_tokens=after.cache_write_tokens - before.cache_write_tokens,
        cache_read_tokens=after.cache_read_tokens - before.cache_read_tokens,
    )


def _with_cache_marker(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return messages with a cache breakpoint on the last block of the last (user) message.

    Only that message is copied; the assistant turns are sent exactly as received.
    """
    if not messages or messages[-1]["role"] != "user":
        return messages
    last = messages[-1]
    content = last["content"]
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    )
    blocks[-1]["cache_control"] = CACHE
    return [*messages[:-1], {"role": "user", "content": blocks}]


def _texts(content: Iterable[Mapping[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text" and b.get("text"))


def _brief_input(value: Any, limit: int = 300) -> Any:
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, Mapping):
        return {k: _brief_input(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_brief_input(v, limit) for v in value[:20]]
    return value


def _storable(value: Any) -> Any:
    """Return `value` with every NUL in its text replaced: a model's input may hold one; PostgreSQL's JSON cannot."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value


def call_signature(name: str, arguments: Any) -> str:
    """Return a stable text naming one tool call, to match an approval to a call."""
    return f"{name} {json.dumps(arguments, sort_keys=True, separators=(',', ':'))}"


# --- the brain ------------------------------------------------------------------------------


class AnthropicBrain:
    """Claude acting with tools in the instance's workspace (see the module docstring)."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def unmetered_reserve(self) -> int:
        return 0  # every model call reserves its own worst case just before it goes out (budgets.metering)

    def act(self, request: ActRequest) -> Reply:
        session = Session(
            self.instance,
            stop=request.stop,
            deadline=time.monotonic() + max(float(request.timeout), 1.0),
            model=model_for(self.instance),
            meter=request.meter,
        )
        try:
            return _Act(self.instance, request, session).run()
        finally:
            session.close()


class _Act:
    def __init__(self, instance: Any, request: ActRequest, session: Session) -> None:
        self.instance = instance
        self.request = request
        self.session = session
        self.limits = session.limits
        self.texts: list[str] = []
        self.executed: list[dict[str, Any]] = []
        self.enabled = list(instance.tools or [])
        self.journal = request.journal
        self.replayed: dict[int, JournaledTurn] = {}  # what an earlier attempt of this iteration journaled
        self.mcp = McpTools(instance, workspace=request.workspace, stop=request.stop, secrets=session.secrets)
        self.pinned: Pinned | None = None
        # The act's `delegate` calls vetted and accepted so far: their children start when the act ends.
        self.delegations: list[dict[str, Any]] = []
        self.refused: dict[str, str] = {}  # this turn's refused `delegate` calls: id -> why
        self.approved = {
            call_signature(c["name"], c.get("input", {}))
            for c in getattr(request, "approved_calls", None) or []
            if isinstance(c, Mapping) and "name" in c
        }

    def run(self) -> Reply:
        try:
            return self._run()
        except BrainError as exc:  # e.g. the budget ended the act: what it said and ran so far is kept
            if not exc.text and not exc.tool_calls:
                kept = self._reply(False, exc.detail, delegations=False)
                exc.text, exc.tool_calls = kept.text, kept.tool_calls
            raise
        finally:
            self.mcp.close()
            if self.pinned is not None:
                self.pinned.close()

    def _run(self) -> Reply:
        instance, request = self.instance, self.request
        request.workspace.mkdir(parents=True, exist_ok=True)
        # The file tools work through the workspace held open from here: what is swapped on its
        # path during the act changes nothing they reach.
        try:
            self.pinned = Pinned(sandbox.checked_workspace(request.workspace))
        except (sandbox.WorkspaceRefused, OSError) as exc:
            return self._reply(False, f"the workspace cannot be opened: {exc}")
        # The MCP servers the agent may use: connected for this act, their secrets redacted like its keys.
        self.mcp.open()
        self.session.secrets = self.mcp.secrets
        for server, why in self.mcp.failures:
            self.executed.append(
                {"name": f"mcp__{server}", "input": {}, "is_error": True, "result": clip(f"could not connect: {why}", 300)}
            )
        context = ToolContext(
            workspace=request.workspace,
            timeout=float(instance.tool_timeout_seconds),
            output_cap=int(settings.TETHER_OUTPUT_CAP_BYTES),
            command_allow=tuple(instance.command_allow or ()),
            command_deny=tuple(instance.command_deny or ()),
            stop=request.stop,
            secrets=self.session.secrets,
            instance_id=instance.pk,
            network=bool(getattr(instance, "network", False)),
            pinned=self.pinned,
        )
        try:
            tools = definitions(self.enabled) + self.mcp.definitions()
        except ValueError as exc:
            return self._reply(False, f"the instance's tools are misconfigured: {exc}")
        # Breakpoints: tools + system prompt (shared by every run of the instance), + the
        # objective (shared by every iteration of the run), + the act's latest turn.
        system = [
            {"type": "text", "text": instance.system_prompt or DEFAULT_SYSTEM_PROMPT, "cache_control": CACHE},
            {
                "type": "text",
                "text": f"The objective of this run:\n{request.objective}\n\n"
                "Your workspace is the current directory of every tool; give paths relative to it.",
                "cache_control": CACHE,
            },
        ]
        try:
            if self.journal is not None:
                self.replayed = self.journal.replay()
            messages: list[dict[str, Any]] = [{"role": "user", "content": self._opening(context)}]
            if approved_delegations := self._approved_delegations():
                return approved_delegations  # a person approved them: the loop starts the children now
            turns = 0
            while True:
                room = int(instance.max_output_tokens) - self.session.usage.output_tokens
                if room <= 0:
                    return self._reply(True, f"the act used its {instance.max_output_tokens} output tokens")
                params: dict[str, Any] = {
                    "model": self.session.usage.model,
                    "max_tokens": min(room, self.limits.max_tokens_per_call),
                    "system": system,
                    "messages": _with_cache_marker(messages),
                }
                if tools:
                    params["tools"] = tools
                    params["tool_choice"] = {"type": "auto"}
                content: list[dict[str, Any]]
                kept = self.replayed.get(turns + 1)
                if kept is not None and kept.content is not None:
                    # An earlier attempt was given this answer and journaled its calls: not asked again.
                    content, stop_reason = kept.content, "tool_use"
                else:
                    body = self.session.create(params)
                    content, stop_reason = body.get("content") or [], str(body.get("stop_reason"))
                messages.append({"role": "assistant", "content": content})
                if said := _texts(content):
                    self.texts.append(said)
                calls = [b for b in content if b.get("type") == "tool_use"]
                if stop_reason == "refusal":
                    return self._reply(False, "the model declined to continue (refusal)")
                if stop_reason == "max_tokens":
                    return self._reply(True, "the model reached the output token limit mid-answer")
                if stop_reason != "tool_use" or not calls:
                    return self._reply(True, "")
                if turns >= int(instance.max_tool_turns):
                    return self._reply(True, f"the act stopped at its limit of {instance.max_tool_turns} tool turns")
                if parked := self._needing_approval(calls):
                    return parked
                if delegating := self._delegating(turns + 1, content, calls, context):
                    return delegating
                messages.append({"role": "user", "content": self._run_tools(turns + 1, content, calls, context)})
                turns += 1
        except _Stopped:
            detail = "stopped during the act"
            if self.session.abandoned:
                detail += "; the model call in flight was abandoned and its input counted as an estimate"
            return self._reply(False, detail, stopped=True)
        except _TimedOut:
            return self._reply(False, f"the act passed its {request.timeout:g}s time limit", timed_out=True)
        except JournalError as exc:  # a call that cannot be journaled is not run
            return self._reply(False, str(exc))

    def _opening(self, context: ToolContext) -> list[dict[str, Any]]:
        request = self.request
        blocks: list[dict[str, Any]] = []
        if history := compact_history(
            request.snapshot, budget_tokens=self.limits.context_tokens, recent=self.limits.recent
        ):
            blocks.append({"type": "text", "text": history})
        if checks := render_checks(request.checks):
            blocks.append({"type": "text", "text": checks})
        if self.mcp.notes:
            blocks.append({"type": "text", "text": self.session.scrub("\n".join(self.mcp.notes))})
        ran = []
        for index, call in enumerate(getattr(request, "approved_calls", None) or []):
            if not isinstance(call, Mapping) or "name" not in call or call["name"] == "delegate":
                continue  # (an approved delegate call is the loop's to start: `_approved_delegations`)
            result = self._journaled_call(0, index, call, None, context)
            state = "failed" if result.is_error else "ran"
            ran.append(f"- {call_signature(str(call['name']), call.get('input', {}))} {state}:\n{clip(result.content, 4000)}")
        if ran:
            blocks.append({"type": "text", "text": "A person approved the calls you proposed; they were run:\n" + "\n".join(ran)})
        blocks.append({"type": "text", "text": f"Iteration {request.iteration}. Instruction:\n{request.instruction}"})
        return blocks

    def _needing_approval(self, calls: list[dict[str, Any]]) -> Reply | None:
        gated = {n for n in self.instance.approval_tools or () if not is_mcp_name(n)}  # MCP tools: self.mcp says
        pending = [
            c for c in calls
            if (c.get("name") in gated or self.mcp.needs_approval(str(c.get("name"))))
            and call_signature(c["name"], c.get("input", {})) not in self.approved
        ]
        if not pending:
            return None
        shown = "; ".join(self.session.scrub(clip(call_signature(c["name"], c.get("input", {})), 500)) for c in pending)
        reply = self._reply(False, f"needs approval: {shown}")
        reply.tool_calls = [
            {"name": c["name"], "input": c.get("input", {}), "id": c.get("id", ""), "needs_approval": True}
            for c in pending
        ]
        return reply

    def _approved_delegations(self) -> Reply | None:
        """End the act with the `delegate` calls a person approved, for the loop to start (never run here)."""
        approved = [
            c for c in getattr(self.request, "approved_calls", None) or []
            if isinstance(c, Mapping) and c.get("name") == "delegate" and "delegate" in self.enabled
        ]
        if not approved:
            return None
        reply = self._reply(True, f"a person approved {len(approved)} delegation(s); waiting for them")
        reply.tool_calls = [
            *reply.tool_calls,
            *({"name": "delegate", "input": c.get("input", {}), "id": c.get("id", ""), "delegate": True}
              for c in approved),
        ]
        return reply

    def _delegating(
        self, turn: int, content: list[dict[str, Any]], calls: list[dict[str, Any]], context: ToolContext
    ) -> Reply | None:
        """Vet the turn's `delegate` calls at once; end the act for the loop to start them if all were accepted.

        The turn's other calls run first. When one is refused (bounds, arguments, fit, reach), nothing
        ends: every call of the turn gets its tool_result now — the refusal for that call, "accepted"
        for the others — and the act goes on; what was accepted starts when the act ends.
        """
        if "delegate" not in self.enabled:
            return None
        delegated = [c for c in calls if c.get("name") == "delegate"]
        if not delegated:
            return None
        self.refused = {}
        for call in delegated:
            try:
                kept = check_delegate(self.request.run_id, call.get("input", {}), list(self.delegations))
            except DelegateRefused as exc:
                self.refused[str(call.get("id", ""))] = str(exc)
            else:
                self.delegations.append({"name": "delegate", "input": kept, "id": call.get("id", ""), "delegate": True})
        if self.refused:
            return None  # `_run_tools` answers every call of the turn, the refusals included
        self._run_tools(turn, content, calls, context, skipping="delegate")
        return self._reply(True, f"delegated {len(self.delegations)} sub-objective(s); waiting for them")

    def _run_tools(
        self,
        turn: int,
        content: list[dict[str, Any]],
        calls: list[dict[str, Any]],
        context: ToolContext,
        *,
        skipping: str = "",
    ) -> list[dict[str, Any]]:
        """Run the turn's calls in order (but those named `skipping`); return their tool_result blocks."""
        results = []
        for index, call in enumerate(calls):
            if call.get("name") == skipping:
                continue
            if self.request.stop.is_set():
                raise _Stopped
            if time.monotonic() >= self.session.deadline:
                raise _TimedOut
            if call.get("name") == "delegate" and "delegate" in self.enabled:
                result = self._delegate_result(call)
            else:
                result = self._journaled_call(turn, index, call, content, context)
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": call["id"],
                "content": result.content or "(no output)",
            }
            if result.is_error:
                block["is_error"] = True
            results.append(block)
        return results

    def _delegate_result(self, call: Mapping[str, Any]) -> ToolResult:
        """The tool_result of a `delegate` call `_delegating` vetted: its refusal, or that it is accepted."""
        why = self.refused.get(str(call.get("id", "")))
        if why is not None:
            result = ToolResult(f"refused, and no run was made: {why}", True)
            self._record(call, result)
            return result
        return ToolResult(
            "accepted: the child run starts when you end this turn (answer without calling a tool); your run then "
            "waits for it, and its outcome comes in your next instruction",
            False,
        )

    def _journaled_call(
        self,
        turn: int,
        index: int,
        call: Mapping[str, Any],
        content: list[dict[str, Any]] | None,
        context: ToolContext,
    ) -> ToolResult:
        """Run one call under the journal (when the act has one) and record it in the reply.

        A call an earlier attempt finished gives its journaled result again; one it started and
        never finished is reported as interrupted; any other is journaled, run, then journaled
        with its result.
        """
        name, arguments = str(call.get("name")), call.get("input", {})
        if self.journal is None:
            result = self._call_tool(name, arguments, context)
            self._record(call, result)
            return result
        kept = self.replayed.get(turn)
        done = kept.calls.get(index) if kept is not None else None
        if done is not None:
            result = ToolResult(done.result, done.is_error) if done.finished else ToolResult(INTERRUPTED, True)
            self._record(call, result, key=done.key, replayed="result" if done.finished else "interrupted")
            return result
        key = self.journal.started(turn, index, {"id": call.get("id", ""), "name": name, "input": arguments}, content)
        with tracing.span(f"execute_tool {name}", gen_ai__operation__name="execute_tool", gen_ai__tool__name=name) as traced:
            result = self._call_tool(name, arguments, context)
            traced.set(tether__tool__is_error=bool(result.is_error))
        self.journal.finished(key, self.session.scrub(result.content), result.is_error)
        self._record(call, result, key=key)
        return result

    def _call_tool(self, name: str, arguments: Any, context: ToolContext) -> ToolResult:
        """Run one call: an MCP server's tool through its connection, a built-in tool if enabled."""
        if is_mcp_name(name):
            timeout = min(context.timeout, max(self.session.deadline - time.monotonic(), 1.0))
            text, is_error = self.mcp.call(name, arguments, timeout=timeout, output_cap=context.output_cap)
            return ToolResult(text, is_error)
        if name in self.enabled:
            return run_tool(name, arguments, context)
        have = [n for n in self.enabled if not is_mcp_name(n)] + list(self.mcp.tools)
        return ToolResult(f"unknown tool {name!r}: this agent has {', '.join(have) or 'no tools'}", True)

    def _record(self, call: Mapping[str, Any], result: Any, *, key: str = "", replayed: str = "") -> None:
        entry = {
            "name": call.get("name"),
            "input": _brief_input(call.get("input", {})),
            "is_error": result.is_error,
            "result": clip(result.content, 300),
        }
        if key:
            entry["key"] = key  # the journal's idempotency key
        if replayed:
            entry["replayed"] = replayed  # from an earlier attempt's journal: "result" or "interrupted"
        self.executed.append(entry)
        log.debug("run %s: tool %s %s", self.request.run_id, call.get("name"), "refused" if result.is_error else "ran")

    def _reply(
        self, ok: bool, detail: str, *, stopped: bool = False, timed_out: bool = False, delegations: bool = True
    ) -> Reply:
        scrub = self.session.scrub
        calls = _storable(json.loads(scrub(json.dumps(self.executed)))) if self.executed else []
        if delegations and not stopped:
            calls.extend(self.delegations)  # accepted: the loop starts them now that the act ends
        return Reply(
            ok=ok,
            text=scrub("\n\n".join(self.texts)),
            usage=self.session.usage,
            detail=scrub(detail),
            tool_calls=calls,
            stopped=stopped,
            timed_out=timed_out,
        )


# --- the decider ----------------------------------------------------------------------------


def render_decider_prompt(snapshot: Mapping[str, Any], *, budget_tokens: int, recent: int) -> str:
    """Return the decider's view of a finished iteration as text. Pure."""
    parts = [f"Objective:\n{clip(str(snapshot.get('objective') or ''), 6000)}"]
    if history := compact_history(snapshot.get("history") or [], budget_tokens=budget_tokens, recent=recent):
        parts.append(history)
    iteration, most = snapshot.get("iteration"), snapshot.get("max_iterations")
    if iteration:
        parts.append(f"This was iteration {iteration}" + (f" of at most {most}." if most else "."))
    if instruction := snapshot.get("instruction"):
        parts.append(f"The agent was told:\n{clip(str(instruction), 3000)}")
    act = "succeeded" if snapshot.get("act_ok", True) else "failed"
    detail = str(snapshot.get("act_detail") or "")
    parts.append(f"The act {act}." + (f" ({clip(detail, 500)})" if detail else ""))
    if response := snapshot.get("response"):
        parts.append(f"The agent answered:\n{clip(str(response), 4000)}")
    checks = render_checks(snapshot.get("checks") or [])
    parts.append(checks or "No machine checks are configured; judge from the agent's account.")
    parts.append("Decide now with record_decision.")
    return "\n\n".join(parts)


def decide(
    instance: Any,
    snapshot: dict[str, Any],
    *,
    stop: threading.Event | None = None,
    timeout: float | None = None,
    meter: Meter | None = None,
) -> tuple[str, Usage]:
    """Ask Claude to judge an iteration; return its raw answer text and the usage of the call(s)."""
    session = Session(
        instance,
        stop=stop or threading.Event(),
        deadline=time.monotonic() + (timeout or float(instance.act_timeout_seconds)),
        model=model_for(instance),
        meter=meter,
    )
    lim = session.limits
    params = {
        "model": session.usage.model,
        "max_tokens": 1024,
        "system": [{"type": "text", "text": DECIDER_PROMPT, "cache_control": CACHE}],
        "tools": [DECISION_TOOL],
        "tool_choice": {"type": "auto"},
        "messages": [
            {
                "role": "user",
                "content": render_decider_prompt(snapshot, budget_tokens=lim.context_tokens, recent=lim.recent),
            }
        ],
    }
    try:
        body = session.create(params)
    except _Stopped:
        raise ProviderError("the decision was stopped before Claude answered", session.usage) from None
    except _TimedOut:
        raise ProviderError("the decision timed out", session.usage) from None
    finally:
        session.close()
    content = body.get("content") or []
    for block in content:
        if block.get("type") == "tool_use" and block.get("name") == DECISION_TOOL["name"]:
            return session.scrub(json.dumps(block.get("input") or {})), session.usage
    return session.scrub(_texts(content)), session.usage
