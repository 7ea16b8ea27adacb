"""The metering gateway: an Anthropic Messages-compatible endpoint for agent CLIs.

A `command`-brain act whose instance has a usable credential gets, in its environment, a
per-act token as `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` pointing here (through a tiny
relay on the sandbox's own loopback, or straight at the unix socket `TETHER_GATEWAY_SOCKET`).
`POST /v1/messages` (streamed or not) is forwarded to the instance owner's endpoint with the
owner's key — the agent never sees it — and metered through the iteration's
`budgets.metering.RunMeter`, the path every model call in Tether takes: the call's worst case
is reserved before it goes out (its input bounded by `instances.gateway_bounds`, which refuses
what it cannot bound; `max_tokens` clamped to the headroom, in the forwarded body too), and
settled at the usage the provider returned (for a stream: from `message_start` and
`message_delta`; a stream cut short is settled at what arrived). Once the headroom cannot pay
for a call the agent gets HTTP 402 `budget_exhausted` in the API's error shape, and the act
ends the run `budget_exhausted`. `POST /v1/messages/count_tokens` is forwarded unmetered (it
is free), under the same size cap and refusals. Bad input is a 4xx in the same shape, never a
5xx of Tether's own.

An instance's own `base_url` names a host its owner chose: at each call the host is resolved
once, every address is checked by the rule the URL was saved under
(`capabilities.check_base_url`), and the call goes to the checked address, the name kept in
the Host header and TLS (a name cannot resolve to one address for the check and to another
for the connection).

A token is a value signed with the server's secret, naming its run, iteration, a nonce and the
worker's socket; it is honoured only while its act is registered in the worker that runs the
act (`open_act`), and the act's end removes it: a token is dead once its act returns. An act
that ends (or a run that is stopped) closes its calls' upstream connections within a poll.

Each worker process serves its acts on one unix socket (`serve`, started lazily, a small
threaded HTTP server calling `handle`), bound into each sandbox at `SOCKET`. The web view
(`instances.views.gateway`) checks the token's signature and relays to the socket it names.

The same token, and the same socket, also serve the act's MCP endpoint (`/mcp`, handled by
the route `web.mcp_act` registers with `route`), through which a `command` agent whose
instance enables the `delegate` tool asks for child runs: the act is then registered even
without a credential (`open_act(delegation=True)`), and the calls it accepted are read from
`Act.delegated` once the act has ended.

Moves money (through the meter). Runs in the worker; each request's thread closes its own
database connection.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import secrets
import select
import socket
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx2
from django.conf import settings
from django.core import signing
from django.db import connection

from budgets import pricing, selectors
from budgets.grants import BudgetExhausted, Grant
from instances import capabilities, credentials, gateway_bounds, sandbox
from instances.brains.base import Meter, Usage
from tether import redaction

log = logging.getLogger(__name__)

PREFIX = "/gateway/anthropic"
SOCKET = f"{sandbox.SCRATCH}/gateway.sock"  # where an act sees its worker's socket
TOKEN_PREFIX = "tether-gateway-"
SALT = "tether.gateway.token"
MAX_BODY_BYTES = 32 << 20
POLL = 0.1  # seconds between looks at a call's act, stop signal and client
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta", "content-type", "user-agent")
RETURNED_HEADERS = ("content-type", "request-id", "retry-after", "x-should-retry")


class GatewayError(Exception):
    """A request the gateway answers itself, in the Messages API's error shape."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message

    def answer(self) -> Answer:
        return error(self.status, self.kind, self.message)


@dataclass
class Answer:
    """What to send back: a status, headers and a body (bytes, or chunks for a stream)."""

    status: int
    headers: dict[str, str]
    body: bytes | Iterator[bytes]


def error(status: int, kind: str, message: str) -> Answer:
    """Return an answer in the Messages API's error shape."""
    payload = {"type": "error", "error": {"type": kind, "message": message}}
    return Answer(status, {"content-type": "application/json"}, json.dumps(payload).encode())


# --- acts -------------------------------------------------------------------------------


@dataclass
class Act:
    """One act's registration: its token, meter, credential and what its calls spent."""

    token: str
    nonce: str
    run_id: int
    iteration: int
    meter: Meter
    key: str
    base_url: str
    stop: threading.Event
    usage: Usage
    exhausted: str = ""  # why a call was refused for budget, if one was
    ended: threading.Event = field(default_factory=threading.Event)
    may_delegate: bool = False  # the instance enables `delegate`: the act's MCP endpoint takes calls
    own_base_url: bool = False  # `base_url` is the instance's own: its host is checked at each call
    # The delegate calls the act's MCP endpoint accepted, as the loop reads tool calls; final once closed.
    delegated: list[dict[str, Any]] = field(default_factory=list)
    _inflight: int = 0
    _idle: threading.Condition = field(default_factory=threading.Condition)

    def env(self, socket_path: str) -> dict[str, str]:
        """Return the variables the act's program gets (the relay adds the loopback URLs)."""
        env = {"TETHER_GATEWAY_SOCKET": socket_path}
        if self.key:
            env["ANTHROPIC_API_KEY"] = self.token
        if self.may_delegate:
            env["TETHER_TOKEN"] = self.token
        return env

    def charge(self, usage: Usage, cost: int) -> None:
        with self._idle:
            self.usage = self.usage.add(usage)
            self.usage.metered_micros += cost

    def enter(self) -> None:
        with self._idle:
            self._inflight += 1

    def try_enter(self) -> bool:
        """Count a request in, unless the act has ended (then False, and nothing to leave)."""
        with self._idle:
            if self.ended.is_set():
                return False
            self._inflight += 1
            return True

    def accept_delegate(self, call: dict[str, Any]) -> bool:
        """Keep a delegate call for the loop; False when the act ended first (the call is lost)."""
        with self._idle:
            if self.ended.is_set():
                return False
            self.delegated.append(call)
            return True

    def leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def close(self, wait: float = 5.0) -> None:
        """End the act: its token is refused from now on; wait for its calls to settle."""
        _forget(self.nonce)
        with self._idle:
            self.ended.set()
        deadline = time.monotonic() + wait
        with self._idle:
            while self._inflight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)


_acts: dict[str, Act] = {}
_acts_lock = threading.Lock()


def _forget(nonce: str) -> None:
    with _acts_lock:
        _acts.pop(nonce, None)


def usable_key(instance: Any) -> str | None:
    """Return the key the gateway would forward with for `instance`, or None (then no gateway)."""
    try:
        return credentials.resolve_api_key(instance) or None
    except credentials.CredentialUnreadable:
        return None


@contextmanager
def open_act(
    instance: Any, *, run_id: int, iteration: int, meter: Meter | None, stop: threading.Event,
    delegation: bool = False,
) -> Iterator[Act | None]:
    """Register an act with this worker's gateway for as long as the block runs; yield it.

    Yields None (no gateway: the agent's own report stays the only measure) when the instance
    has no usable credential or the act is not metered, unless the act may `delegation`
    (then it is registered for its MCP endpoint, and model calls are refused without a key).
    """
    key = usable_key(instance) if meter is not None else None
    if meter is None or (key is None and not delegation):
        yield None
        return
    path = serve()
    nonce = secrets.token_urlsafe(18)
    token = TOKEN_PREFIX + signing.dumps({"run": run_id, "it": iteration, "n": nonce, "s": path}, salt=SALT)
    act = Act(
        token=token, nonce=nonce, run_id=run_id, iteration=iteration, meter=meter, key=key or "",
        base_url=credentials.resolve_base_url(instance) if key else "", stop=stop,
        usage=Usage(model=instance.model or ""), may_delegate=delegation, own_base_url=bool(instance.base_url),
    )
    with _acts_lock:
        _acts[nonce] = act
    try:
        yield act
    finally:
        act.close()


def read_token(token: str) -> dict[str, Any]:
    """Return a token's signed claims; raise GatewayError(401) for anything Tether did not sign."""
    if not token.startswith(TOKEN_PREFIX):
        raise GatewayError(401, "authentication_error", "invalid x-api-key: not a Tether gateway token")
    try:
        claims = signing.loads(token[len(TOKEN_PREFIX) :], salt=SALT)
    except signing.BadSignature:
        raise GatewayError(401, "authentication_error", "invalid x-api-key: not a Tether gateway token") from None
    if not isinstance(claims, dict) or not isinstance(claims.get("n"), str):
        raise GatewayError(401, "authentication_error", "invalid x-api-key: not a Tether gateway token")
    return claims


def token_from(headers: dict[str, str]) -> str:
    """Return the token a request carries (`x-api-key`, or `Authorization: Bearer`)."""
    bearer = headers.get("authorization", "")
    if bearer[:7].lower() == "bearer ":
        return bearer[7:].strip()
    return headers.get("x-api-key", "").strip()


def act_for(headers: dict[str, str]) -> Act:
    """Return the live act whose token the request carries; raise GatewayError(401) otherwise."""
    token = token_from(headers)
    if not token:
        raise GatewayError(401, "authentication_error", "x-api-key header is required")
    claims = read_token(token)
    with _acts_lock:
        act = _acts.get(claims["n"])
    if act is None or not secrets.compare_digest(act.token, token) or act.ended.is_set():
        raise GatewayError(401, "authentication_error", "this gateway token's act has ended; it is no longer valid")
    return act


# --- the protocol -------------------------------------------------------------------------


Handler = Callable[..., Answer]
ROUTES: dict[str, Handler] = {}


def route(path: str, handler: Handler) -> None:
    """Serve `path` on every worker socket with `handler(method, path, headers, raw, gone=...)`.

    For surfaces of an act that live in apps above this one (the act's MCP endpoint).
    """
    ROUTES[path] = handler


def handle(method: str, path: str, headers: dict[str, str], raw: bytes, *, gone: Any = None) -> Answer:
    """Answer one request to the gateway. `headers` are lower-cased; `gone()` says the client left."""
    route = path.split("?")[0]
    if route.rstrip("/") in ROUTES:
        return ROUTES[route.rstrip("/")](method, path, headers, raw, gone=gone)
    if route.startswith(PREFIX):
        route = route[len(PREFIX) :]
    if route not in ("/v1/messages", "/v1/messages/count_tokens"):
        return error(404, "not_found_error", f"no route for {method} {path}")
    if method != "POST":
        return error(405, "invalid_request_error", f"{method} is not allowed here; use POST")
    try:
        act = act_for(headers)
        if len(raw) > MAX_BODY_BYTES:
            raise GatewayError(413, "request_too_large", f"the request body is over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            raise GatewayError(400, "invalid_request_error", "the request body must be JSON") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "invalid_request_error", "the request body must be a JSON object")
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise GatewayError(400, "invalid_request_error", "model: Field required")
        if not act.key:
            raise GatewayError(401, "authentication_error", "this act has no model credential: its instance has no key")
        counting = route.endswith("/count_tokens")
        if not counting:
            max_tokens = body.get("max_tokens")
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise GatewayError(400, "invalid_request_error", "max_tokens: must be a positive integer")
        try:
            worst = gateway_bounds.input_tokens(body, headers, len(raw))
        except gateway_bounds.Unbounded as why:
            raise GatewayError(400, "invalid_request_error", f"{why}; the gateway forwards only calls it can cap") from None
        target = _target(act, route)
        if counting:
            return _forward(act, target, headers, body, None, gone)
        return _metered(act, target, headers, body, len(raw), worst, gone)
    except GatewayError as refused:
        return refused.answer()


def unmeterable(body: dict[str, Any], headers: dict[str, str]) -> str:
    """Say why a Messages request could cost more than any reservation bounds, or "" if it cannot."""
    try:
        gateway_bounds.input_tokens(body, headers, 0)
    except gateway_bounds.Unbounded as why:
        return str(why)
    return ""


@dataclass(frozen=True)
class _Target:
    """Where a call goes: its URL, and the Host header and TLS name when the URL names a checked address."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


def _target(act: Act, route: str) -> _Target:
    """Return where to send a call; for the instance's own base_url, its host resolved and checked now.

    Every address the name resolves to must pass the rule the URL was saved under; the call goes
    to the first, so the address checked is the address connected to.
    """
    try:
        url = httpx2.URL(act.base_url + route)
    except httpx2.InvalidURL:
        raise GatewayError(502, "api_error", "the model endpoint's URL is not usable") from None
    if not act.own_base_url or _is_address(url.host):
        return _Target(str(url))
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
    return _Target(str(url.copy_with(host=addresses[0])), {"host": host}, tls)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _metered(
    act: Act, target: _Target, headers: dict[str, str], body: dict[str, Any], size: int, worst: int, gone: Any
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
    call = _Call(act, grant, model, size, stream=body.get("stream") is True)
    return _forward(act, target, headers, body, call, gone)


def _forward(
    act: Act, target: _Target, headers: dict[str, str], body: dict[str, Any], call: _Call | None, gone: Any
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
        else:
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


def _relay(act: Act, call: _Call, client: httpx2.Client, response: httpx2.Response, watch: _Watch) -> Iterator[bytes]:
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


class _Call:
    """One metered call: its grant, the usage read from its answer, settled exactly once."""

    def __init__(self, act: Act, grant: Grant, model: str, size: int, *, stream: bool) -> None:
        self.act, self.grant, self.model, self.size, self.stream = act, grant, model, size, stream
        self.usage: dict[str, int] = {}
        self.streamed_bytes = 0
        self._settled = False
        self._lock = threading.Lock()

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
            self._take((payload.get("message") or {}).get("usage"))
        elif kind == "message_delta":
            self._take(payload.get("usage"))
        elif kind == "content_block_delta":
            self.streamed_bytes += len(json.dumps(payload.get("delta") or {}))
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


# --- the worker's unix socket -------------------------------------------------------------

_server: tuple[int, str, socketserver.BaseServer] | None = None
_server_lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "gateway"

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def _answer(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._send(error(413, "request_too_large", f"the request body is over {MAX_BODY_BYTES} bytes"))
        raw = self.rfile.read(length) if length else b""
        try:
            answer = handle(self.command, self.path, headers, raw, gone=self._gone)
        except Exception:
            log.exception("gateway: the request failed")
            answer = error(500, "api_error", "the gateway failed to handle this request")
        self._send(answer)

    def _gone(self) -> bool:
        try:
            if not socket_readable(self.connection):
                return False
            return not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def _send(self, answer: Answer) -> None:
        body = answer.body
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if isinstance(body, bytes):
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for chunk in body:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            if not isinstance(body, bytes):
                body.close()  # type: ignore[attr-defined]  # settles a stream the client left


def socket_readable(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False


def serve() -> str:
    """Start this process's gateway socket if it is not running; return its path."""
    global _server
    with _server_lock:
        if _server is not None and _server[0] == os.getpid():
            return _server[1]
        directory = tempfile.mkdtemp(prefix="tether-gw-")
        path = str(Path(directory) / "gateway.sock")
        server = _Server(path, _Handler)
        os.chmod(path, 0o666)  # the sandbox's user may connect; the directory keeps everyone else out
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="tether-gateway",
                         daemon=True).start()
        _server = (os.getpid(), path, server)
        return path


# --- inside the sandbox -------------------------------------------------------------------

RELAY = r"""
import os, selectors, signal, socket, subprocess, sys, threading
path, serves, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)

def pipe(client):
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    peer = {client: upstream, upstream: client}
    open_ = {client, upstream}
    sel = selectors.DefaultSelector()
    for s in open_:
        sel.register(s, selectors.EVENT_READ)
    try:
        while open_:
            for key, _ in sel.select():
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if data:
                    peer[s].sendall(data)
                    continue
                sel.unregister(s)
                open_.discard(s)
                try:
                    peer[s].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        client.close()
        upstream.close()

def accept():
    while True:
        client, _ = listener.accept()
        threading.Thread(target=pipe, args=(client,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
base = "http://127.0.0.1:%d" % listener.getsockname()[1]
env = dict(os.environ)
if "m" in serves:
    env["ANTHROPIC_BASE_URL"] = base
if "d" in serves:
    env["TETHER_MCP_URL"] = base + "/mcp"
child = subprocess.Popen(argv, env=env)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda number, frame: child.send_signal(number))
code = child.wait()
sys.exit(code if code >= 0 else 128 - code)
"""


def wrap(argv: list[str], socket_path: str, act: Act | None = None) -> list[str]:
    """Return `argv` started behind the loopback relay to the gateway socket at `socket_path`.

    The relay names itself to the program as `ANTHROPIC_BASE_URL` (when the act may call models)
    and as `TETHER_MCP_URL` (when it may delegate).
    """
    serves = "m" if act is None or act.key else ""
    serves += "d" if act is not None and act.may_delegate else ""
    return [sys.executable, "-I", "-c", RELAY, socket_path, serves or "-", *argv]
