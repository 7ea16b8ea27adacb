"""MCP servers as tools: an act's connections to the MCP servers its agent may use.

Runs in the worker, during an act: starts sandboxed programs and makes network calls; reads
the registry (`McpServer`) once, before connecting, and writes nothing. Never raises for a
server's failure: a server that cannot be reached is left out of the act with a note the
model reads, and a call that fails comes back as an error result.

An operator registers a server (`instances.models.McpServer`); an instance (or its template)
names the ones it uses in `mcp_servers`. For each act `McpTools.open` connects to them in
parallel with the `mcp` SDK's client — a `stdio` server is started through `instances.sandbox`
(the instance's sandbox: its workspace, its uid, no network, an environment of the server's
own variables and nothing of the platform's), an `http` server is reached at its URL after the
same address check as `base_url` — and lists their tools. Each tool reaches Claude as
`mcp__<server>__<tool>`, so it cannot collide with a built-in tool or another server's.

What an agent gets of a server: its tools minus the operator's `tool_deny`, within the
operator's `tool_allow` (empty: all), and within the instance's `tools` when that names any
pattern of this server (`mcp__docs__search_*`). A call needs a person's approval when the
operator's `approval_tools` or the instance's `approval_tools` match it. Results are rendered
to text, capped at the instance's output cap and redacted (the instance's keys and the
server's own secrets) like every tool's.

The SDK is async; an act is not. `McpTools` runs one event loop in a thread of its own (an
anyio blocking portal) holding every connection of the act, and closes them all when the act
ends (a stdio server's whole process tree goes with it).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import logging
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from django.db import DatabaseError

from instances import capabilities, sandbox
from instances.tools.shell import minimal_env
from tether.redaction import redact

log = logging.getLogger(__name__)

PREFIX = "mcp__"
SEPARATOR = "__"
# A server's name: lower-case words joined by single - or _ (never "__", which separates the parts).
SERVER_NAME = re.compile(r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$")
# What an instance's `tools` / `approval_tools` may say about a server's tools: a name or a glob.
PATTERN = re.compile(r"^mcp__([a-z0-9]+(?:[-_][a-z0-9]+)*)__([A-Za-z0-9_\-*?.\[\]!]+)$")
TOOL_NAME_MAX = 128  # what the Messages API accepts as a tool name
MAX_TOOLS_PER_SERVER = 100
MAX_LIST_PAGES = 10
POLL = 0.05
CLOSE_GRACE = 10.0


@functools.cache
def _sdk() -> ModuleType:
    """The `mcp` SDK's pieces (`instances.tools.mcp_sdk`), imported on first use: for MCP acts only."""
    from instances.tools import mcp_sdk  # lazy: the mcp SDK takes seconds to import, for MCP acts only

    return mcp_sdk


def is_mcp_name(name: str) -> bool:
    """Return whether `name` names (or matches) an MCP server's tool rather than a built-in one."""
    return name.startswith(PREFIX)


def check_pattern(name: str) -> str:
    """Return `name` if it is a well-formed `mcp__<server>__<tool or glob>`, else raise ValueError."""
    if not PATTERN.match(name):
        raise ValueError(
            f"{name!r} is not an MCP tool name; write mcp__<server>__<tool>, where <tool> may be a glob like search_*"
        )
    return name


def split(name: str) -> tuple[str, str]:
    """Return (server, tool) of `mcp__<server>__<tool>`; raise ValueError for anything else."""
    if not is_mcp_name(name) or SEPARATOR not in name[len(PREFIX) :]:
        raise ValueError(f"{name!r} is not an MCP tool name")
    server, tool = name[len(PREFIX) :].split(SEPARATOR, 1)
    return server, tool


def full_name(server: str, tool: str) -> str:
    """Return the name Claude sees for `tool` of `server` (characters the API refuses become _)."""
    return f"{PREFIX}{server}{SEPARATOR}{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class McpTool:
    name: str  # as Claude sees it
    server: str
    remote: str  # as the server names it
    definition: dict[str, Any]
    gated: bool


@dataclass
class _Connection:
    server: Any  # McpServer
    secrets: dict[str, dict[str, str]]
    client: Any = None
    listing: list[Any] = field(default_factory=list)
    error: str = ""
    ready: threading.Event = field(default_factory=threading.Event)
    closing: Any = None  # anyio.Event, made in the loop
    future: Future[Any] | None = None
    errlog: Any = None
    launch: Any = None  # sandbox.Launch: what it mounts, held open while the server runs

    def secret_values(self) -> list[str]:
        return [v for part in self.secrets.values() for v in part.values() if v]


class McpTools:
    """The MCP tools of one act (see the module docstring). Use as a context manager, or open/close."""

    def __init__(
        self, instance: Any, *, workspace: Path, stop: threading.Event, secrets: Sequence[str] = ()
    ) -> None:
        self.instance = instance
        self.workspace = workspace
        self.stop = stop
        self.base_secrets = tuple(secrets)
        self.tools: dict[str, McpTool] = {}
        self.notes: list[str] = []
        self.failures: list[tuple[str, str]] = []  # (server, why): unreachable servers, for the record
        self._connections: dict[str, _Connection] = {}
        self._unavailable: dict[str, str] = {}
        self._stack = contextlib.ExitStack()
        self._portal: Any = None

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> McpTools:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def secrets(self) -> tuple[str, ...]:
        """Return every secret a text of this act must not carry: the instance's and the servers'."""
        extra = [s for c in self._connections.values() for s in c.secret_values()]
        return tuple(dict.fromkeys([*self.base_secrets, *extra]))

    def open(self) -> None:
        """Connect to the instance's usable servers in parallel and list their tools."""
        names = [str(n) for n in (getattr(self.instance, "mcp_servers", None) or [])]
        if not names:
            return
        try:
            servers, refused = capabilities.mcp_servers_for(self.instance)
        except DatabaseError:
            log.warning(
                "instance %s: the MCP server registry could not be read", getattr(self.instance, "pk", None)
            )
            self.notes.append(
                "Your MCP servers could not be looked up just now; their tools are unavailable in this turn."
            )
            return
        for name, why in refused.items():
            self._unavailable[name] = why
            self.notes.append(f"MCP server {name!r} is not available to you: {why}.")
        for server in servers:
            try:
                secrets = server.secrets()
            except ValueError:
                self._fail(
                    server.name, "its stored secrets cannot be decrypted; an operator must enter them again"
                )
                continue
            self._connections[server.name] = _Connection(server=server, secrets=secrets)
        if not self._connections:
            return
        self._portal = self._stack.enter_context(_sdk().start_blocking_portal(name="tether-mcp"))
        for connection in self._connections.values():
            connection.future = self._portal.start_task_soon(self._hold, connection)
        timeout = {c.server.name: float(c.server.timeout_seconds) for c in self._connections.values()}
        started = time.monotonic()
        waiting = set(self._connections)
        while waiting:
            for name in list(waiting):
                connection = self._connections[name]
                if connection.ready.is_set() or (connection.future is not None and connection.future.done()):
                    waiting.discard(name)
                elif time.monotonic() - started > timeout[name]:
                    connection.error = f"it did not answer within {timeout[name]:g}s"
                    if connection.future is not None:
                        connection.future.cancel()
                    waiting.discard(name)
            if waiting and self.stop.wait(POLL):
                break
        for name, connection in list(self._connections.items()):
            if connection.client is None or connection.error:
                why = connection.error or "the connection ended before it was ready"
                self._fail(name, self._with_stderr(connection, why))
                continue
            self._offer(connection)

    def close(self) -> None:
        """Close every connection (stopping stdio servers) and the event loop's thread."""
        portal = self._portal
        if portal is not None:
            for connection in self._connections.values():
                future = connection.future
                if future is None or future.done():
                    continue
                try:
                    if connection.closing is not None:
                        portal.call(connection.closing.set)
                    else:
                        future.cancel()
                except RuntimeError:
                    future.cancel()
            deadline = time.monotonic() + CLOSE_GRACE
            for connection in self._connections.values():
                future = connection.future
                if future is None:
                    continue
                try:
                    future.result(timeout=max(deadline - time.monotonic(), 0.01))
                except BaseException:  # noqa: BLE001 - closing never masks the act's own result
                    future.cancel()
        try:
            self._stack.close()
        except Exception:  # noqa: BLE001
            log.debug("closing the MCP event loop failed", exc_info=True)
        finally:
            self._portal = None
            for connection in self._connections.values():
                if connection.errlog is not None:
                    connection.errlog.close()
                if connection.launch is not None:
                    connection.launch.close()

    # --- what the model sees ---------------------------------------------------------------

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition for tool in self.tools.values()]

    def needs_approval(self, name: str) -> bool:
        """Return whether a call of `name` waits for a person (a tool not offered is refused instead)."""
        tool = self.tools.get(name)
        return tool is not None and tool.gated

    def call(self, name: str, arguments: Any, *, timeout: float, output_cap: int) -> tuple[str, bool]:
        """Run one call of `name`; return (text, is_error). Never raises for the server's failures."""
        text, is_error = self._call(name, arguments, timeout=timeout, output_cap=output_cap)
        # A server may answer anything: no NUL or lone surrogate reaches the events (PostgreSQL's JSON refuses them).
        text = text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
        return redact(text, self.secrets), is_error

    def _call(self, name: str, arguments: Any, *, timeout: float, output_cap: int) -> tuple[str, bool]:
        tool = self.tools.get(name)
        if tool is None:
            return self._refusal(name), True
        if not isinstance(arguments, dict):
            return "tool input must be an object", True
        connection = self._connections[tool.server]
        if connection.error:
            return f"MCP server {tool.server!r} is unavailable: {connection.error}", True
        if self._portal is None or connection.client is None:
            return f"MCP server {tool.server!r} is not connected", True
        timeout = max(min(timeout, float(connection.server.timeout_seconds)), 1.0)
        future = self._portal.start_task_soon(self._call_async, connection, tool.remote, arguments, timeout)
        deadline = time.monotonic() + timeout + 5.0
        while True:
            try:
                result = future.result(timeout=POLL)
                break
            except TimeoutError:
                pass
            if self.stop.is_set():
                future.cancel()
                return "stopped: the run was stopped while the tool ran", True
            if time.monotonic() > deadline:
                future.cancel()
                return f"{name} timed out after {timeout:g}s", True
        kind, value = result
        if kind == "error":
            return f"MCP server {tool.server!r} failed: {value}", True
        return _render(value, output_cap)

    def _refusal(self, name: str) -> str:
        try:
            server, tool = split(name)
        except ValueError:
            return f"unknown tool {name!r}"
        connection = self._connections.get(server)
        if connection is None:
            if server in self._unavailable:
                return f"MCP server {server!r} is unavailable: {self._unavailable[server]}"
            return f"unknown tool {name!r}: this agent has no MCP server {server!r}"
        if connection.error:
            return f"MCP server {server!r} is unavailable: {connection.error}"
        if tool in {t.remote for t in self.tools.values() if t.server == server} or any(
            full_name(server, t.name) == name for t in connection.listing
        ):
            return (
                f"refused: {name} is not allowed for this agent (the operator's or the instance's tool lists)"
            )
        return f"unknown tool {name!r}: MCP server {server!r} has no such tool"

    # --- internals ---------------------------------------------------------------------------

    def _fail(self, name: str, why: str) -> None:
        why = redact(why, self.secrets)
        connection = self._connections.get(name)
        if connection is not None:
            connection.error = why
        else:
            self._unavailable.setdefault(name, why)
        self.failures.append((name, why))
        self.notes.append(
            f"MCP server {name!r} could not be reached ({why}); its tools are unavailable in this turn."
        )

    def _with_stderr(self, connection: _Connection, why: str) -> str:
        if connection.errlog is None:
            return why
        try:
            connection.errlog.flush()
            connection.errlog.seek(0)
            tail = connection.errlog.read()[-600:].strip()
        except (OSError, ValueError):
            tail = ""
        return f"{why}; its stderr ends: {tail}" if tail else why

    def _offer(self, connection: _Connection) -> None:
        server = connection.server
        own = [p for p in (self.instance.tools or []) if is_mcp_name(p) and split(p)[0] == server.name]
        gates = [p for p in (self.instance.approval_tools or []) if is_mcp_name(p)]
        offered = 0
        for remote in connection.listing:
            name = full_name(server.name, remote.name)
            if _matches(remote.name, server.tool_deny or []):
                continue
            if server.tool_allow and not _matches(remote.name, server.tool_allow):
                continue
            if own and not _matches(name, own):
                continue
            if len(name) > TOOL_NAME_MAX or name in self.tools:
                self.notes.append(
                    f"MCP tool {remote.name!r} of {server.name!r} is left out: its name is too long or taken."
                )
                continue
            if offered >= MAX_TOOLS_PER_SERVER:
                self.notes.append(
                    f"MCP server {server.name!r} offers more than {MAX_TOOLS_PER_SERVER} tools; the rest are left out."
                )
                break
            schema = remote.input_schema if isinstance(remote.input_schema, dict) else {}
            description = (
                remote.description or remote.title or f"{remote.name} of MCP server {server.name}"
            ).strip()
            self.tools[name] = McpTool(
                name=name,
                server=server.name,
                remote=remote.name,
                definition={
                    "name": name,
                    "description": f"[MCP server {server.name}] {description}"[:4000],
                    "input_schema": {"type": "object", **schema}
                    if schema.get("type") in (None, "object")
                    else {"type": "object", "properties": {}},
                },
                gated=_matches(remote.name, server.approval_tools or []) or _matches(name, gates),
            )
            offered += 1

    def _target(self, connection: _Connection) -> Any:
        """Return what the SDK's Client connects to: sandboxed stdio parameters, or an HTTP transport."""
        sdk = _sdk()
        server = connection.server
        if server.transport == server.Transport.HTTP:
            capabilities.check_url(server.url, field="url", allow_private=server.allow_private_url)
            client = sdk.create_mcp_http_client(headers=connection.secrets["headers"] or None)
            return sdk.streamable_http_client(server.url, http_client=client), client
        if not server.command:
            raise ValueError("it has no command")
        self.workspace.mkdir(parents=True, exist_ok=True)
        launch = sandbox.prepare(
            [str(a) for a in server.command],
            sandbox.Spec(
                workspace=self.workspace, instance_id=getattr(self.instance, "pk", None), network=False
            ),
            passes_fds=False,  # the SDK starts the server: the workspace stays held until it ends
        )
        connection.launch = launch
        # The SDK adds HOME, LOGNAME, PATH, SHELL, TERM and USER from the server's own environment
        # unless they are given: give every one of them, so nothing of the platform's passes.
        env = {
            "LOGNAME": "sandbox",
            "USER": "sandbox",
            "SHELL": "/bin/sh",
            "TERM": "dumb",
            **minimal_env(self.workspace),
            **connection.secrets["env"],
        }
        connection.errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        params = sdk.StdioServerParameters(
            command=launch.argv[0], args=launch.argv[1:], env=env, cwd=str(launch.cwd)
        )
        return sdk.stdio_client(params, errlog=connection.errlog), None

    async def _hold(self, connection: _Connection) -> None:
        """Connect, list the tools, then keep the connection open until the act closes it."""
        sdk = _sdk()
        connection.closing = sdk.anyio.Event()
        try:
            target, http_client = self._target(connection)
            async with contextlib.AsyncExitStack() as stack:
                if http_client is not None:
                    await stack.enter_async_context(http_client)
                client = await stack.enter_async_context(
                    sdk.Client(target, read_timeout_seconds=float(connection.server.timeout_seconds), cache=None)
                )
                listing: list[Any] = []
                cursor = None
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    listing += list(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                connection.listing = listing
                connection.client = client
                connection.ready.set()
                await connection.closing.wait()
        except Exception as exc:  # noqa: BLE001 - any failure of the server is reported, never raised
            connection.error = connection.error or _describe(exc)
        finally:
            connection.client = None if connection.error else connection.client
            connection.ready.set()

    async def _call_async(
        self, connection: _Connection, remote: str, arguments: dict[str, Any], timeout: float
    ) -> tuple[str, Any]:
        try:
            return "ok", await connection.client.call_tool(remote, arguments, read_timeout_seconds=timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the model as the call's error
            return "error", _describe(exc)


def _describe(exc: BaseException) -> str:
    """Return a short account of a failure (the innermost of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    if isinstance(exc, TimeoutError) and not text:
        text = "timed out"
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


def _render(result: Any, output_cap: int) -> tuple[str, bool]:
    """Return an MCP tool result as (text, is_error), capped at `output_cap` bytes."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(block.text))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data)} base64 characters]")
        elif kind == "resource":
            resource = block.resource
            parts.append(str(getattr(resource, "text", None) or f"[resource {resource.uri}, binary]"))
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, default=str))
    text = "\n".join(parts) or "(no output)"
    data = text.encode()
    if len(data) > output_cap:
        text = (
            data[:output_cap].decode(errors="ignore")
            + f"\n…[output truncated: {len(data) - output_cap} more bytes]"
        )
    return text, bool(getattr(result, "is_error", False))
