"""The metering gateway's calls upstream: where a call goes, forwarding it, and settling what it cost.

A metered call is reserved before it goes out (`instances.gateway`), forwarded here with the
owner's key, and settled exactly once (`Call.settle`) at the usage the provider returned (for a
stream: from `message_start` and `message_delta`; one cut short at what arrived). Each metered
call is a model-call span (`tether.tracing`) under the act's span, filled by the one owner of a
model call's span (`brains.base.trace_call`) as it is settled.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
from django.conf import settings
from django.db import connection

from budgets import pricing, selectors
from budgets.grants import BudgetExhausted, Grant
from instances import capabilities
from instances.brains.base import Usage, trace_call
from instances.gateway_acts import Act, Answer, GatewayError, error
from tether import redaction, tracing

log = logging.getLogger(__name__)

POLL = 0.1  # seconds between looks at a call's act, stop signal and client
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta", "content-type", "user-agent")
RETURNED_HEADERS = ("content-type", "request-id", "retry-after", "x-should-retry")


@dataclass(frozen=True)
class Target:
    """Where a call goes: its URL, and the Host header and TLS name when the URL names a checked address."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


def target_for(act: Act, route: str) -> Target:
    """Return where to send a call; for the instance's own base_url, its host resolved and checked now.

    Every address the name resolves to must pass the rule the URL was saved under; the call goes
    to the first, so the address checked is the address connected to.
    """
    try:
        url = httpx2.URL(act.base_url + route)
    except httpx2.InvalidURL:
        raise GatewayError(502, "api_error", "the model endpoint's URL is not usable") from None
    if not act.own_base_url or _is_address(url.host):
        return Target(str(url))
    name = url.raw_host.decode("ascii")
    try:
        found = socket.getaddrinfo(name, url.port or (443 if url.scheme == "https" else 80), proto=socket.IPPROTO_TCP)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found)) or [""]
    except (OSError, UnicodeError):
        raise GatewayError(502, "api_error", f"the model endpoint's host {name!r} does not resolve") from None
    for address in addresses:
        try:
            capabilities.check_base_url(str(url.copy_with(host=address)))
        except (capabilities.CapabilityError, httpx2.InvalidURL) as refused:
            raise GatewayError(
                403, "permission_error", f"base_url host {name!r} resolves to {address} now, which is refused: {refused}"
            ) from None
    host = name if url.port is None else f"{name}:{url.port}"
    tls = {"sni_hostname": name} if url.scheme == "https" else {}
    return Target(str(url.copy_with(host=addresses[0])), {"host": host}, tls)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def forward(
    act: Act, target: Target, headers: dict[str, str], body: dict[str, Any], call: Call | None, gone: Any
) -> Answer:
    """Send the request upstream with the owner's key; return the answer (streamed when it is a stream).

    A metered call is settled on every path: here, or by the stream's relay once it ends.
    """
    outgoing = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    outgoing.setdefault("anthropic-version", "2023-06-01")
    outgoing["content-type"] = "application/json"
    outgoing["x-api-key"] = act.key
    outgoing.update(target.headers)
    timeout = float(settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS)
    client = httpx2.Client(timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)))
    watch = _Watch(act, gone)
    handed_off = False
    usage: Any = None
    if call is not None:
        act.enter()
    try:
        request = client.build_request(
            "POST", target.url, headers=outgoing, content=json.dumps(body).encode(),
            extensions={"trace": watch.trace, **target.extensions},
        )
        watch.start()
        try:
            response = client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            if watch.aborted:
                return error(499, "request_aborted", "the act ended before the model answered")
            log.info("gateway: the model endpoint could not be reached (%s)", type(exc).__name__)
            return error(502, "api_error", "the model endpoint could not be reached")
        returned = {k: v for k, v in response.headers.items() if k.lower() in RETURNED_HEADERS}
        if call is not None and call.stream and response.status_code == 200:
            call.answered(200, None)
            handed_off = True
            return Answer(200, returned, _relay(act, call, client, response, watch))
        try:
            data = response.read()
        except httpx2.HTTPError:
            return error(499, "request_aborted", "the call was cut short before the model answered")
        finally:
            response.close()
        if response.status_code == 200:
            try:
                payload = json.loads(data)
            except ValueError:
                payload = None
            usage = payload.get("usage") if isinstance(payload, dict) else None
            if call is not None:
                call.answered(200, payload)
        else:
            if call is not None:
                call.answered(response.status_code, None)
            usage = {}  # the API bills no refused call
            data = redaction.redact(data.decode(errors="replace"), (act.key,)).encode()
        return Answer(response.status_code, returned, data)
    finally:
        if not handed_off:
            watch.done()
            client.close()
            if call is not None:
                try:
                    call.settle(usage=usage, aborted=usage is None)
                finally:
                    act.leave()


def _relay(act: Act, call: Call, client: httpx2.Client, response: httpx2.Response, watch: _Watch) -> Iterator[bytes]:
    """Yield the stream's bytes as they arrive, reading its usage; settle when it ends or is cut."""
    pending = b""
    complete = False
    try:
        for chunk in response.iter_raw():
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                complete = call.read_event(event) or complete
            yield chunk
    except httpx2.HTTPError:
        pass
    finally:
        watch.done()
        response.close()
        client.close()
        call.settle(aborted=not complete)
        act.leave()


class _Watch:
    """Close a call's upstream connection when its act ends, the run is stopped or the client leaves."""

    def __init__(self, act: Act, gone: Any) -> None:
        self.act, self.gone = act, gone
        self.sockets: list[socket.socket] = []
        self.finished = threading.Event()
        self.aborted = False
        self._thread = threading.Thread(target=self._run, name="tether-gateway-watch", daemon=True)

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                self.sockets.append(sock)

    def start(self) -> None:
        self._thread.start()

    def done(self) -> None:
        self.finished.set()

    def _run(self) -> None:
        while not self.finished.wait(POLL):
            if self.act.ended.is_set() or self.act.stop.is_set() or (self.gone is not None and self.gone()):
                self.aborted = True
                for sock in self.sockets:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read; the server sees us leave
                    except OSError:
                        pass
                return


class Call:
    """One metered call: its grant, the usage read from its answer, settled exactly once; its span."""

    def __init__(self, act: Act, grant: Grant, request: dict[str, Any], size: int) -> None:
        self.act, self.grant, self.request, self.size = act, grant, request, size
        self.model, self.stream = str(request["model"]), request.get("stream") is True
        self.usage: dict[str, int] = {}
        self.streamed_bytes = 0
        self.status = 0  # the endpoint's HTTP status, once it answered
        self.answer: dict[str, Any] = {}  # what its span tells of the answer (id, model, stop reason, content)
        self._settled = False
        self._lock = threading.Lock()
        self.traced = tracing.model_call_started(act.trace_parent, "anthropic", self.model)
        self._texts: list[str] | None = [] if self.traced.span is not None and tracing.capture_content() else None

    def answered(self, status: int, payload: Any) -> None:
        """Keep the endpoint's status and (not streamed) its answer, for the call's span."""
        self.status = status
        if isinstance(payload, dict):
            self.answer = payload

    def read_event(self, event: bytes) -> bool:
        """Take the usage from one Server-Sent Event; return True at `message_stop`."""
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            return False
        if not isinstance(payload, dict):
            return False
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message") or {}
            self._take(message.get("usage"))
            self.answer.update({k: message[k] for k in ("id", "model") if isinstance(message.get(k), str)})
        elif kind == "message_delta":
            self._take(payload.get("usage"))
            if isinstance(reason := (payload.get("delta") or {}).get("stop_reason"), str):
                self.answer["stop_reason"] = reason
        elif kind == "content_block_delta":
            delta = payload.get("delta") or {}
            self.streamed_bytes += len(json.dumps(delta))
            if self._texts is not None and isinstance(delta.get("text"), str):
                if sum(map(len, self._texts)) < tracing.CONTENT_MAX_CHARS:
                    self._texts.append(delta["text"])
        return kind == "message_stop"

    def _take(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for name, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    self.usage[name] = value

    def settle(self, *, usage: Any = None, aborted: bool = False) -> None:
        """Settle at the provider's usage; a call cut short at what is known of it."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        self._take(usage)
        got = self.usage
        spent = Usage(
            model=self.model,
            input_tokens=got.get("input_tokens", 0),
            output_tokens=got.get("output_tokens", 0),
            cache_write_tokens=got.get("cache_creation_input_tokens", 0),
            cache_read_tokens=got.get("cache_read_input_tokens", 0),
            calls=1,
        )
        if aborted:
            # Cut short: the provider may bill the input and what it generated. With no usage
            # seen, count the input from the request's size; output at least what arrived.
            if "input_tokens" not in got:
                spent.input_tokens = math.ceil(self.size / 4)
            spent.output_tokens = max(spent.output_tokens, math.ceil(self.streamed_bytes / 4))
        spent.output_tokens = min(spent.output_tokens, self.grant.max_tokens)
        try:
            cost = self.act.meter.after(self.grant, spent)
        finally:
            connection.close()
        self.act.charge(spent, cost)
        self._trace(spent, cost, aborted)

    def _trace(self, spent: Usage, cost: int, aborted: bool) -> None:
        """End the call's span: what it used and cost, how it ended (`brains.base.trace_call`)."""
        if self.traced.span is None:
            return
        failed = ""
        if self.status and self.status != 200:
            failed = f"the model endpoint answered HTTP {self.status}"
        elif aborted:
            failed = "the call was cut short before its answer ended"
        answer = dict(self.answer)
        if self._texts:
            answer["content"] = [{"type": "text", "text": "".join(self._texts)}]
        trace_call(self.traced, self.request, spent, cost, answer or None, secrets=self.act.secrets, failed=failed)
        self.traced.set(http__response__status_code=self.status or None, tether__gateway=True)
        self.traced.end()


def metered(
    act: Act, target: Target, headers: dict[str, str], body: dict[str, Any], size: int, worst: int, gone: Any
) -> Answer:
    model = body["model"]
    if act.ended.is_set() or act.stop.is_set():
        raise GatewayError(401, "authentication_error", "this gateway token's act has ended; it is no longer valid")
    try:
        selectors.price_for_model(model)  # an unpriced model is the agent's mistake, not the budget's end
        # The meter prices `request_bytes` as input tokens (one per byte at most): given the bound in tokens.
        grant = act.meter.before(model=model, request_bytes=worst, max_tokens=body["max_tokens"])
    except pricing.UnpricedModel as exc:
        raise GatewayError(400, "invalid_request_error", f"{exc}; ask the operator to add a price for it") from None
    except BudgetExhausted as exc:
        act.exhausted = act.exhausted or exc.detail
        return error(402, "budget_exhausted", f"Tether's budget for this run is spent: {exc.detail}")
    finally:
        connection.close()
    body = {**body, "max_tokens": grant.max_tokens}
    call = Call(act, grant, body, size)
    return forward(act, target, headers, body, call, gone)
