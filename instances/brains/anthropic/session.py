"""One act's (or one decision's) Messages client: the SDK session, retries, errors, stops and usage.

The only module of Tether that imports the `anthropic` SDK (tests/instances/test_anthropic_layout.py
keeps it so); provider words (HTTP 529, `authentication_error`) stop here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import anthropic
import httpx2

from budgets import grants
from instances import credentials
from instances.brains.anthropic.config import limits, model_for
from instances.brains.base import BudgetExhausted, CredentialError, Meter, ProviderError, Usage, trace_call
from instances.brains.text import clip, estimate_tokens
from tether import redaction, tracing

log = logging.getLogger(__name__)

BILLING_CODES = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
        "organization_on_hold",
    }
)


class Stopped(Exception):
    pass


class TimedOut(Exception):
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
                raise Stopped
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimedOut
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
                raise TimedOut
            if self.stop.wait(delay):
                raise Stopped

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
                raise Stopped
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
