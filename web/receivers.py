"""What the surfaces hear and route, connected once by `WebConfig.ready` (`connect`).

An act's MCP endpoint on every worker's gateway socket, and a sign-in lockout in the audit trail.
"""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out

from instances import gateway
from web import accounts


def _act_mcp(*args: Any, **kwargs: Any) -> Any:
    from web import mcp_act  # lazy: the MCP SDK loads only in a process that serves an act's /mcp

    return mcp_act.handle(*args, **kwargs)


def connect() -> None:
    """Route the act's MCP endpoint and connect the lockout's receiver."""
    # An act's MCP endpoint (how a command agent delegates) on every worker's gateway socket.
    gateway.route("/mcp", _act_mcp)
    # A sign-in lockout is in the audit trail, on the locked-out person's page.
    user_locked_out.connect(accounts.on_locked_out, dispatch_uid="tether-locked-out")
