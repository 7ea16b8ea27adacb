"""A local, scripted stand-in for the Anthropic Messages API.

A threaded HTTP server on 127.0.0.1 (a free port) answering `POST /v1/messages` in the
documented shapes: message responses with `text` and `tool_use` content blocks, a
`stop_reason`, and `usage` including `cache_creation_input_tokens` and
`cache_read_input_tokens`; errors as `{"type": "error", "error": {"type", "message"}}`
with the status codes the API uses (400, 401, 402, 403, 429, 500, 529).

Tests script it: `enqueue` replies (or errors, delays, dropped connections) in order,
or set `responder` to compute a reply from each request; then inspect `requests`
(method, path, headers, body) to count calls and see exactly what was sent.

A request with `"stream": true` is answered with Server-Sent Events exactly as the API
streams: `message_start` (with the input usage), `content_block_start` / `_delta` /
`_stop` per block (`text_delta`, or `input_json_delta` for `tool_use`), `message_delta`
(with `stop_reason` and the output tokens) and `message_stop`. `Trickle(reply, every=)`
streams that reply slowly, one event per interval; a client that goes away mid-stream
(or during a `Delay`) is noticed at once and counted in `disconnects` (and sets the
`disconnected` event). `POST /v1/messages/count_tokens` answers `{"input_tokens": n}`.

Like the real API it is strict about the conversation: roles alternate, every
`tool_use` is answered by a `tool_result` in the next user turn, and — unlike the real
API, to catch clients that rewrite history — an assistant turn sent back must equal,
block for block, content this server returned.

Token counts are computed, not scripted, unless a reply gives its own `usage`: about
four characters a token over tools, system and messages, with prompt caching
simulated at `cache_control` breakpoints as the API documents it: each breakpoint looks
back up to 20 blocks for a prefix cached before (a cache read); the prefix up to the last
breakpoint not yet cached is a cache write; the rest is plain input. `cache_min_tokens`
sets the shortest cacheable prefix (the API's is 1024 tokens or more; 0 by default here).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
CREDIT_TOO_LOW = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)


def text(value: str, *, stop_reason: str = "end_turn", usage: dict | None = None) -> dict:
    """Return a scripted reply holding one text block."""
    reply: dict[str, Any] = {"content": [{"type": "text", "text": value}], "stop_reason": stop_reason}
    if usage is not None:
        reply["usage"] = usage
    return reply


def tool_use(
    name: str, input: dict, *, id: str | None = None, say: str = "", usage: dict | None = None
) -> dict:
    """Return a scripted reply asking for one tool call (optionally after some text)."""
    return tool_uses([(name, input, id)], say=say, usage=usage)


def tool_uses(calls: list[tuple], *, say: str = "", usage: dict | None = None) -> dict:
    """Return a scripted reply asking for several tool calls: [(name, input[, id])]."""
    content: list[dict] = [{"type": "text", "text": say}] if say else []
    for call in calls:
        name, arguments = call[0], call[1]
        call_id = call[2] if len(call) > 2 and call[2] else None
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    reply: dict[str, Any] = {"content": content, "stop_reason": "tool_use"}
    if usage is not None:
        reply["usage"] = usage
    return reply


@dataclass
class Error:
    status: int
    message: str
    type: str = ""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Delay:
    """Hold the response this long (or until the server stops), then send `then`."""

    seconds: float
    then: Any = None


@dataclass
class Trickle:
    """Stream `reply` slowly: one event every `every` seconds (a streamed request only).

    Text is sent `size` characters per delta, so a longer text trickles for longer.
    """

    reply: Any
    every: float = 0.5
    size: int = 4
    cut_after: int | None = None  # drop the connection after this many events (a cut mid-stream)


@dataclass
class Drop:
    """Close the connection without answering."""


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    at: float
    status: int | None = None
    reply: Any = None  # the JSON the server answered with (None for a dropped connection)
    streamed: bool = False  # answered with Server-Sent Events (`reply` is the whole message)
    events_sent: int = 0  # for a stream: events the client was sent before it ended or went away
    disconnected: bool = False  # the client went away before the answer was complete


LOOKBACK = 20


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def count_tokens(value: Any) -> int:
    """About four characters a token, at least one per non-empty piece."""
    if value is None:
        return 0
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return math.ceil(len(value) / 4) if value else 0


def _strip_cache(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache(v) for v in value]
    return value


def segments(body: dict) -> list[tuple[Any, bool]]:
    """Return the request's cacheable pieces in prefix order: (piece, has a cache_control breakpoint)."""
    pieces: list[tuple[Any, bool]] = []
    for tool in body.get("tools") or []:
        pieces.append((_strip_cache(tool), "cache_control" in tool))
    system = body.get("system")
    if isinstance(system, str):
        pieces.append((system, False))
    elif isinstance(system, list):
        for block in system:
            pieces.append((_strip_cache(block), "cache_control" in block))
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            pieces.append(({"role": message.get("role"), "text": content}, False))
            continue
        for block in content or []:
            piece = {"role": message.get("role"), **_strip_cache(block)}
            pieces.append((piece, isinstance(block, dict) and "cache_control" in block))
    return pieces


def _piece_tokens(piece: Any) -> int:
    if isinstance(piece, dict):
        kind = piece.get("type")
        if kind == "text":
            return count_tokens(piece.get("text", ""))
        if kind == "tool_use":
            return count_tokens(piece.get("name", "")) + count_tokens(piece.get("input", {}))
        if kind == "tool_result":
            return count_tokens(piece.get("content", ""))
    return count_tokens(piece)


class MessagesServer:
    """The scripted server. Use as a context manager, or call `start()` and `stop()`."""

    def __init__(self, *, api_key: str | None = None, cache_min_tokens: int = 0) -> None:
        self.api_key = api_key
        self.cache_min_tokens = cache_min_tokens
        self.script: deque[Any] = deque()
        self.responder: Callable[[dict], Any] | None = None
        self.requests: list[Received] = []
        self.problems: list[str] = []
        self._returned: set[str] = set()
        self._cached: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._released = threading.Event()
        self.disconnects = 0
        self.disconnected = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> MessagesServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> MessagesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # --- scripting -------------------------------------------------------------------
    def enqueue(self, *replies: Any) -> None:
        with self._lock:
            self.script.extend(replies)

    def enqueue_error(self, status: int, message: str = "", *, type: str = "", headers: dict | None = None) -> None:
        self.enqueue(Error(status, message or f"scripted {status}", type, headers or {}))

    @property
    def calls(self) -> int:
        return sum(1 for r in self.requests if r.path.startswith("/v1/messages"))

    @property
    def bodies(self) -> list[dict]:
        return [r.body for r in self.requests]

    # --- serving ---------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        received = Received(
            handler.command,
            handler.path,
            {k.lower(): v for k, v in handler.headers.items()},
            body,
            raw,
            time.monotonic(),
        )
        with self._lock:
            self.requests.append(received)
        route = handler.path.split("?")[0]
        if handler.command != "POST" or route not in ("/v1/messages", "/v1/messages/count_tokens"):
            return self._send_error(handler, Error(404, f"no route for {handler.command} {handler.path}"), received)
        if problem := self._check_auth(received):
            return self._send_error(handler, problem, received)
        if not isinstance(body, dict):
            return self._send_error(handler, Error(400, "the request body must be a JSON object"), received)
        if route == "/v1/messages/count_tokens":
            return self._count(handler, body, received)
        if problem_text := self._validate(body):
            self.problems.append(problem_text)
            return self._send_error(handler, Error(400, problem_text), received)
        with self._lock:
            scripted = self.script.popleft() if self.script else None
        if scripted is None and self.responder is not None:
            scripted = self.responder(body)
        if scripted is None:
            self.problems.append("no scripted reply left")
            return self._send_error(handler, Error(500, "the fake server has no scripted reply left"), received)
        self._answer(handler, body, scripted, received)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict, scripted: Any, received: Received) -> None:
        while isinstance(scripted, Delay):
            if not self._wait(handler, scripted.seconds, received):
                return self._drop(handler)
            scripted = scripted.then
            if scripted is None:
                with self._lock:
                    scripted = self.script.popleft() if self.script else None
        if isinstance(scripted, Drop):
            return self._drop(handler)
        if isinstance(scripted, Error):
            return self._send_error(handler, scripted, received)
        every, size, cut_after = 0.0, 20, None
        if isinstance(scripted, Trickle):
            every, size, cut_after, scripted = scripted.every, scripted.size, scripted.cut_after, scripted.reply
        message = self._message(body, scripted)
        received.status, received.reply = 200, message
        if body.get("stream") is True:
            return self._stream(handler, message, received, every=every, size=size, cut_after=cut_after)
        self._send_json(handler, 200, message)

    def _count(self, handler: BaseHTTPRequestHandler, body: dict, received: Received) -> None:
        """Answer count_tokens: every input token of the request, caching aside; nothing is cached."""
        for name in ("model", "messages"):
            if name not in body:
                return self._send_error(handler, Error(400, f"{name}: Field required"), received)
        if not isinstance(body["messages"], list) or not body["messages"]:
            return self._send_error(handler, Error(400, "messages: at least one message is required"), received)
        payload = {"input_tokens": sum(_piece_tokens(piece) for piece, _ in segments(body))}
        received.status, received.reply = 200, payload
        self._send_json(handler, 200, payload)

    # --- streaming -------------------------------------------------------------------
    @staticmethod
    def events(message: dict, *, size: int = 20) -> list[dict]:
        """Return the Server-Sent Events that stream `message`, in the API's order and shapes."""
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = {**usage, "output_tokens": min(1, usage["output_tokens"])}
        events: list[dict] = [{"type": "message_start", "message": start}, {"type": "ping"}]
        for index, block in enumerate(message["content"]):
            if block.get("type") == "tool_use":
                opening = {**block, "input": {}}
                whole = json.dumps(block.get("input", {}), separators=(",", ":"))
                deltas = [{"type": "input_json_delta", "partial_json": whole[i : i + size]} for i in range(0, len(whole), size)]
            else:
                opening = {**block, "text": ""}
                whole = block.get("text", "")
                deltas = [{"type": "text_delta", "text": whole[i : i + size]} for i in range(0, len(whole), size)]
            events.append({"type": "content_block_start", "index": index, "content_block": opening})
            events.extend({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas)
            events.append({"type": "content_block_stop", "index": index})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": {"output_tokens": usage["output_tokens"]},
            }
        )
        events.append({"type": "message_stop"})
        return events

    def _stream(
        self, handler: BaseHTTPRequestHandler, message: dict, received: Received, *, every: float, size: int,
        cut_after: int | None = None,
    ) -> None:
        received.streamed = True
        try:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.send_header("cache-control", "no-cache")
            handler.send_header("transfer-encoding", "chunked")
            handler.send_header("request-id", f"req_fake_{len(self.requests):06d}")
            handler.end_headers()
            for number, event in enumerate(self.events(message, size=size)):
                if cut_after is not None and number >= cut_after:
                    return self._drop(handler)
                if number and every and not self._wait(handler, every, received):
                    return self._drop(handler)
                data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
                received.events_sent += 1
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            self._went_away(received)
            handler.close_connection = True

    def _wait(self, handler: BaseHTTPRequestHandler, seconds: float, received: Received) -> bool:
        """Wait `seconds`, watching the client: False as soon as it goes away or the server stops."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._released.is_set():
                return False
            try:
                readable, _, _ = select.select([handler.connection], [], [], min(left, 0.05))
                if readable and not handler.connection.recv(1, socket.MSG_PEEK):
                    self._went_away(received)
                    return False
            except OSError:
                self._went_away(received)
                return False
        return not self._released.is_set()

    def _went_away(self, received: Received) -> None:
        if received.disconnected:
            return
        received.disconnected = True
        with self._lock:
            self.disconnects += 1
        self.disconnected.set()

    def _check_auth(self, received: Received) -> Error | None:
        if received.headers.get("anthropic-version") is None:
            return Error(400, "anthropic-version header is required")
        if self.api_key is None:
            return None
        bearer = received.headers.get("authorization", "")
        given = bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else received.headers.get("x-api-key")
        if given != self.api_key:
            return Error(401, "invalid x-api-key")
        return None

    def _validate(self, body: dict) -> str:
        for name in ("model", "max_tokens", "messages"):
            if name not in body:
                return f"{name}: Field required"
        if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
            return "max_tokens: must be a positive integer"
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        if messages[0].get("role") != "user":
            return "messages: the first message must use the user role"
        breakpoints = sum(1 for _, marked in segments(body) if marked)
        if breakpoints > 4:
            return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        for index, message in enumerate(messages):
            role = message.get("role")
            if index and role == messages[index - 1].get("role"):
                return f"messages.{index}: roles must alternate between user and assistant"
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not isinstance(blocks, list) or not blocks:
                return f"messages.{index}: content must be a non-empty string or list"
            if role == "assistant":
                if _canonical(blocks) not in self._returned:
                    return f"messages.{index}: assistant content differs from what this server returned"
                wanted = {b["id"] for b in blocks if b.get("type") == "tool_use"}
                following = messages[index + 1]["content"] if index + 1 < len(messages) else None
                answered = {
                    b.get("tool_use_id") for b in (following if isinstance(following, list) else [])
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                }
                if index + 1 < len(messages) and wanted - answered:
                    return (
                        f"messages.{index + 1}: tool_use ids were found without tool_result blocks "
                        f"immediately after: {', '.join(sorted(wanted - answered))}"
                    )
            if role == "user" and index:
                previous = messages[index - 1]["content"]
                issued = {b.get("id") for b in previous if isinstance(b, dict) and b.get("type") == "tool_use"}
                for block in blocks:
                    if block.get("type") == "tool_result" and block.get("tool_use_id") not in issued:
                        return f"messages.{index}: unexpected tool_use_id {block.get('tool_use_id')!r}"
        return ""

    def _usage(self, body: dict) -> dict[str, int]:
        pieces = segments(body)
        tokens = [_piece_tokens(p) for p, _ in pieces]
        total = sum(tokens)
        # Hash of the prefix ending at each block, and the tokens up to and including it.
        prefixes: list[tuple[str, int]] = []
        digest = hashlib.sha256()
        running = 0
        for index, (piece, _) in enumerate(pieces):
            digest.update(json.dumps(piece, sort_keys=True).encode())
            running += tokens[index]
            prefixes.append((digest.copy().hexdigest(), running))
        marks = [index for index, (_, marked) in enumerate(pieces) if marked]
        with self._lock:
            # Like the API: each breakpoint looks back up to LOOKBACK blocks for a cached prefix.
            read = 0
            for mark in marks:
                for index in range(mark, max(-1, mark - LOOKBACK - 1), -1):
                    prefix, upto = prefixes[index]
                    if prefix in self._cached:
                        read = max(read, upto)
                        break
            written = 0
            for mark in marks:
                prefix, upto = prefixes[mark]
                if upto >= self.cache_min_tokens:
                    self._cached.add(prefix)
                    written = max(written, upto - read)
        return {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }

    def _message(self, body: dict, scripted: dict) -> dict:
        number = next(self._ids)
        content = []
        for block in scripted.get("content", []):
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = f"toolu_fake_{number}_{len(content)}"
            content.append(block)
        usage = self._usage(body)
        usage["output_tokens"] = count_tokens(content)
        usage.update(scripted.get("usage") or {})
        for name in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            usage.setdefault(name, 0)
        message_id = f"msg_fake_{number:06d}"
        with self._lock:
            self._returned.add(_canonical(content))
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": scripted.get("stop_reason", "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        }

    def _send_json(self, handler: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(data)))
            handler.send_header("request-id", f"req_fake_{len(self.requests):06d}")
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
        except OSError:
            pass

    def _send_error(self, handler: BaseHTTPRequestHandler, error: Error, received: Received | None = None) -> None:
        payload = {
            "type": "error",
            "error": {"type": error.type or ERROR_TYPES.get(error.status, "api_error"), "message": error.message},
            "request_id": f"req_fake_{len(self.requests):06d}",
        }
        if received is not None:
            received.status, received.reply = error.status, payload
        self._send_json(handler, error.status, payload, error.headers)

    def _drop(self, handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
