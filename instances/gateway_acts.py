"""The metering gateway's acts: their registration, their tokens, and the answers' error shape.

An act of a `command` brain is registered with its worker's gateway (`instances.gateway.open_act`)
for as long as it runs; a token (signed with the server's secret, naming the run, the iteration,
a nonce and the worker's socket) is honoured only while its act is registered (`act_for`), and
the act's end removes it (`Act.close`).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.core import signing

from instances.brains.base import Meter, Usage

TOKEN_PREFIX = "tether-gateway-"
SALT = "tether.gateway.token"
MAX_BODY_BYTES = 32 << 20


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
    # Where its model calls' spans go: the act's span, in the thread the act runs in (`tracing.current`).
    trace_parent: Any = None
    # What its calls' traced text is kept clear of beyond the server's keys (the key, the token).
    secrets: tuple[str, ...] = ()
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


def register(act: Act) -> None:
    """Honour `act`'s token until the act closes."""
    with _acts_lock:
        _acts[act.nonce] = act


def new_token(run_id: int, iteration: int, socket_path: str) -> tuple[str, str]:
    """Return a fresh (token, nonce) for an act of `run_id`'s `iteration` served at `socket_path`."""
    nonce = secrets.token_urlsafe(18)
    claims = {"run": run_id, "it": iteration, "n": nonce, "s": socket_path}
    return TOKEN_PREFIX + signing.dumps(claims, salt=SALT), nonce


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
