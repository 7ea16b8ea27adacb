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

Each metered call is a model-call span of the run's trace (`tether.tracing`), a child of the
act's span, with its model, tokens, cost and status (its text only when
`TETHER_OTEL_CAPTURE_CONTENT` is on, redacted).

The modules: this one (acts opened, requests answered, calls metered), `gateway_acts` (the acts'
registration and tokens, the error shape), `gateway_upstream` (forwarding a call, settling what
it cost, its span), `gateway_socket` (the worker's socket, the relay in the sandbox) and
`gateway_bounds` (the worst case of a call's input).

Moves money (through the meter). Runs in the worker; each request's thread closes its own
database connection.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from instances import credentials, gateway_acts, gateway_bounds, gateway_socket
from instances.brains.base import Meter, Usage
from instances.gateway_acts import (
    MAX_BODY_BYTES,
    SALT,
    TOKEN_PREFIX,
    Act,
    Answer,
    GatewayError,
    act_for,
    error,
    read_token,
    token_from,
)
from instances.gateway_socket import SOCKET, Handler, wrap
from instances.gateway_upstream import RETURNED_HEADERS, forward, metered, target_for
from tether import tracing

__all__ = [
    "MAX_BODY_BYTES", "PREFIX", "RETURNED_HEADERS", "SALT", "SOCKET", "TOKEN_PREFIX", "Act", "Answer",
    "GatewayError", "act_for", "error", "handle", "open_act", "read_token", "route", "serve", "token_from",
    "unmeterable", "usable_key", "wrap",
]

PREFIX = "/gateway/anthropic"


# --- acts -------------------------------------------------------------------------------


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
    Its model calls' spans are children of the span current here (the act's).
    """
    key = usable_key(instance) if meter is not None else None
    if meter is None or (key is None and not delegation):
        yield None
        return
    token, nonce = gateway_acts.new_token(run_id, iteration, serve())
    act = Act(
        token=token, nonce=nonce, run_id=run_id, iteration=iteration, meter=meter, key=key or "",
        base_url=credentials.resolve_base_url(instance) if key else "", stop=stop,
        usage=Usage(model=instance.model or ""), may_delegate=delegation, own_base_url=bool(instance.base_url),
        trace_parent=tracing.current(), secrets=_secrets(instance, key, token),
    )
    gateway_acts.register(act)
    try:
        yield act
    finally:
        act.close()


def _secrets(instance: Any, key: str | None, token: str) -> tuple[str, ...]:
    """What the act's traced text is kept clear of beyond the server's keys: its key, its token."""
    return tuple(dict.fromkeys(s for s in (key, token, *credentials.secrets_for(instance)) if s))


def serve() -> str:
    """Start this process's gateway socket if it is not running; return its path."""
    return gateway_socket.serve(handle)


# --- the protocol -------------------------------------------------------------------------


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
        target = target_for(act, route)
        if counting:
            return forward(act, target, headers, body, None, gone)
        return metered(act, target, headers, body, len(raw), worst, gone)
    except GatewayError as refused:
        return refused.answer()


def unmeterable(body: dict[str, Any], headers: dict[str, str]) -> str:
    """Say why a Messages request could cost more than any reservation bounds, or "" if it cannot."""
    try:
        gateway_bounds.input_tokens(body, headers, 0)
    except gateway_bounds.Unbounded as why:
        return str(why)
    return ""
