"""The tools an agent may call, by name: their Messages API definitions and handlers.

An instance (or its template) enables tools by name in its `tools` field. `definitions`
returns what the model is shown; `run_tool` executes one call inside the instance's
workspace and guardrails and never raises for the agent's mistakes: every refusal or
failure comes back as a `ToolResult` with `is_error` and a message fit for the model.
Tool output is redacted (`tether.redaction`) before it leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instances.pinned import Pinned
from instances.tools import mcp, shell, workspace
from tether.redaction import redact


@dataclass(frozen=True)
class ToolContext:
    """Where and under which guardrails a tool call runs."""

    workspace: Path
    timeout: float = 120.0
    output_cap: int = 64 * 1024
    command_allow: tuple[str, ...] = ()
    command_deny: tuple[str, ...] = ()
    stop: threading.Event | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)
    instance_id: int | None = None  # whose sandbox uid commands run as
    network: bool = False  # whether commands may reach the outside network
    pinned: Pinned | None = None  # the workspace held open for the act: file tools work through it

    @property
    def files(self) -> Path | Pinned:
        return self.pinned or self.workspace


@dataclass
class ToolResult:
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[[ToolContext, dict[str, Any]], str]

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


class ToolInputError(Exception):
    """The model called a tool with arguments of the wrong shape."""


def _str(arguments: dict[str, Any], name: str, *, default: str | None = None) -> str:
    value = arguments.get(name, default)
    if not isinstance(value, str):
        raise ToolInputError(f"{name!r} must be a string")
    return value


def _int(arguments: dict[str, Any], name: str, default: int | None) -> int | None:
    value = arguments.get(name, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ToolInputError(f"{name!r} must be a whole number")
    return value


def _list_files(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return workspace.list_files(
        ctx.files, _str(arguments, "path", default="."), recursive=bool(arguments.get("recursive", False))
    )


def _read_file(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return workspace.read_file(
        ctx.files,
        _str(arguments, "path"),
        offset=_int(arguments, "offset", 1) or 1,
        limit=_int(arguments, "limit", None),
    )


def _write_file(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return workspace.write_file(ctx.files, _str(arguments, "path"), _str(arguments, "content"))


def _edit_file(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return workspace.edit_file(
        ctx.files, _str(arguments, "path"), _str(arguments, "old_text"), _str(arguments, "new_text")
    )


def _search_files(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return workspace.search_files(
        ctx.files,
        _str(arguments, "pattern"),
        _str(arguments, "path", default="."),
        regex=bool(arguments.get("regex", False)),
    )


def _run_command(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    command: str | list[str]
    if "argv" in arguments and arguments["argv"] is not None:
        argv = arguments["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ToolInputError("'argv' must be a non-empty list of strings")
        command = argv
    else:
        command = _str(arguments, "command")
    timeout = ctx.timeout
    asked = _int(arguments, "timeout_seconds", None)
    if asked is not None and asked > 0:
        timeout = min(timeout, float(asked))
    result = shell.run_command(
        command,
        workspace=ctx.workspace,
        timeout=timeout,
        output_cap=ctx.output_cap,
        allow=ctx.command_allow,
        deny=ctx.command_deny,
        stop=ctx.stop,
        instance_id=ctx.instance_id,
        network=ctx.network,
    )
    return result.as_text()


def _delegate(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    # The brain never runs this: a delegate call ends the act and the loop starts the children.
    raise ToolInputError("delegate is handled by the loop, not inside an act")


_PATH = {"type": "string", "description": "a path relative to the workspace root"}

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in [
        Tool(
            "list_files",
            "List files and directories in the workspace. Directories end in '/'.",
            {
                "type": "object",
                "properties": {
                    "path": {**_PATH, "default": "."},
                    "recursive": {"type": "boolean", "description": "list the whole tree below path"},
                },
            },
            _list_files,
        ),
        Tool(
            "read_file",
            "Read a text file from the workspace, optionally a range of lines.",
            {
                "type": "object",
                "properties": {
                    "path": _PATH,
                    "offset": {"type": "integer", "description": "first line to read, from 1"},
                    "limit": {"type": "integer", "description": "how many lines to read"},
                },
                "required": ["path"],
            },
            _read_file,
        ),
        Tool(
            "write_file",
            "Create or overwrite a text file in the workspace with the given content.",
            {
                "type": "object",
                "properties": {"path": _PATH, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
            _write_file,
        ),
        Tool(
            "edit_file",
            "Replace one exact, unique occurrence of old_text with new_text in a workspace file.",
            {
                "type": "object",
                "properties": {"path": _PATH, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
                "required": ["path", "old_text", "new_text"],
            },
            _edit_file,
        ),
        Tool(
            "search_files",
            "Search workspace files for lines containing a text (or a regular expression).",
            {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {**_PATH, "default": "."},
                    "regex": {"type": "boolean", "description": "treat pattern as a regular expression"},
                },
                "required": ["pattern"],
            },
            _search_files,
        ),
        Tool(
            "run_command",
            "Run a command in the workspace (a shell command line, run with sh -c, or an argv list). "
            "It has a timeout, no network may be available, and the output is capped. "
            "Use paths relative to the workspace.",
            {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "a shell command line"},
                    "argv": {"type": "array", "items": {"type": "string"}, "description": "or an argv list"},
                    "timeout_seconds": {"type": "integer"},
                },
            },
            _run_command,
        ),
        Tool(
            "delegate",
            "Hand a sub-objective to another agent: an instance you own (by name or id) or a template "
            "(e.g. coder). It runs as a child run with its own budget carved from yours; your act ends "
            "here and you continue once every child you started in this act has finished, with their "
            "outcomes, answers and costs. Call it several times in one turn to run children in parallel. "
            "workspace: own (the child's own), copy (a copy of yours; its changes come back as a patch), "
            "shared (yours; you wait while it works). Refusals (too deep, too many, over budget) come back "
            "as errors you can read.",
            {
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "an instance name or id you own, or a template name"},
                    "objective": {"type": "string", "description": "what the child must achieve, self-contained"},
                    "max_cost_usd": {"type": "number", "description": "the child's budget, carved from yours"},
                    "max_iterations": {"type": "integer"},
                    "workspace": {"type": "string", "enum": ["own", "copy", "shared"], "default": "own"},
                },
                "required": ["to", "objective", "max_cost_usd"],
            },
            _delegate,
        ),
    ]
}


def check_names(names: Iterable[str]) -> list[str]:
    """Return `names` as a list, or raise ValueError naming the unknown ones.

    Besides built-in tools, a name may be an MCP server's tool or a glob of them
    (`mcp__<server>__<tool>`, see `instances.tools.mcp`), checked for its shape only.
    """
    names = list(names)
    for name in names:
        if mcp.is_mcp_name(name):
            mcp.check_pattern(name)
    unknown = [n for n in names if n not in TOOLS and not mcp.is_mcp_name(n)]
    if unknown:
        raise ValueError(
            f"unknown tool(s): {', '.join(unknown)}; known: {', '.join(TOOLS)}, "
            "or an MCP server's tools as mcp__<server>__<tool>"
        )
    return names


def definitions(names: Sequence[str]) -> list[dict[str, Any]]:
    """Return the Messages API tool definitions for the enabled built-in tools, in a stable order."""
    return [TOOLS[name].definition() for name in check_names(names) if not mcp.is_mcp_name(name)]


def run_tool(name: str, arguments: Any, context: ToolContext) -> ToolResult:
    """Execute one tool call; every refusal or failure is an error result, never an exception."""
    tool = TOOLS.get(name)
    if tool is None:
        return ToolResult(f"unknown tool {name!r}", is_error=True)
    if not isinstance(arguments, dict):
        return ToolResult("tool input must be an object", is_error=True)
    try:
        content, is_error = tool.handler(context, arguments), False
    except (workspace.WorkspaceError, shell.CommandRefused, ToolInputError) as exc:
        content, is_error = str(exc), True
    except OSError as exc:
        content, is_error = f"{name} failed: {exc.strerror or exc}", True
    return ToolResult(redact(content, context.secrets), is_error=is_error)
