"""The `mcp` SDK's pieces an act's MCP client uses, in one place, for `instances.tools.mcp` alone.

Importing the SDK takes seconds, so this module is imported only when an act connects to an MCP
server (`instances.tools.mcp._sdk`): an agent with no MCP servers never loads it.
"""

import anyio
from anyio.from_thread import start_blocking_portal
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

__all__ = [
    "Client",
    "StdioServerParameters",
    "anyio",
    "create_mcp_http_client",
    "start_blocking_portal",
    "stdio_client",
    "streamable_http_client",
]
