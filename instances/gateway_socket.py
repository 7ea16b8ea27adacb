"""The metering gateway's wire: each worker's unix socket, and the relay an act reaches it through.

Each worker process serves its acts on one unix socket (`serve`, started lazily, a small threaded
HTTP server calling the handler it is given: `instances.gateway.handle`), bound into each sandbox
at `SOCKET`. Inside the sandbox a tiny relay on the act's own loopback (`wrap`) pipes to it.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import socketserver
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from instances import sandbox
from instances.gateway_acts import MAX_BODY_BYTES, Act, Answer, error

log = logging.getLogger(__name__)

SOCKET = f"{sandbox.SCRATCH}/gateway.sock"  # where an act sees its worker's socket
Handler = Callable[..., Answer]  # handle(method, path, headers, raw, gone=...)


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
            server = self.server
            assert isinstance(server, _Server)
            answer = server.answer(self.command, self.path, headers, raw, gone=self._gone)
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

    def __init__(self, path: str, handle: Handler) -> None:
        super().__init__(path, _Handler)
        self.answer = handle


def serve(handle: Handler) -> str:
    """Start this process's gateway socket, answering with `handle`, if it is not running; return its path."""
    global _server
    with _server_lock:
        if _server is not None and _server[0] == os.getpid():
            return _server[1]
        directory = tempfile.mkdtemp(prefix="tether-gw-")
        path = str(Path(directory) / "gateway.sock")
        server = _Server(path, handle)
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
