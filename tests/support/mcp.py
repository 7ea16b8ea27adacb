"""Talk to Tether's MCP server the way an MCP client does: the `mcp` client SDK over HTTP or stdio."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from django.conf import settings
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.cluster import worker_env

TOOLS = {
    "list_instances", "start_run", "get_run", "list_runs", "run_events", "interject", "answer", "cancel",
    "continue_run", "delegate", "list_templates", "create_instance", "update_instance", "archive_instance",
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}
MCP_ACCEPT = "application/json, text/event-stream"


@contextlib.asynccontextmanager
async def http_client(base_url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """An MCP client session on `base_url`/mcp, sending `token` as a Bearer token when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode) as client:
            yield client


def stdio_client(username: str) -> Client:
    """An MCP client that starts `manage.py mcp --user USERNAME` on the test database."""
    params = StdioServerParameters(
        command=sys.executable,
        args=[str(settings.BASE_DIR / "manage.py"), "mcp", "--user", username],
        env=worker_env(),
        cwd=str(settings.BASE_DIR),
    )
    return Client(params)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; return its structured result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}({arguments}) failed: {result.content[0].text}"
    return result.structured_content or json.loads(result.content[0].text)


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must fail; return its error text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) should have been refused: {result.structured_content}"
    return result.content[0].text
