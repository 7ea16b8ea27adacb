from typing import Any

from django.apps import AppConfig


def _act_mcp(*args: Any, **kwargs: Any) -> Any:
    from web import mcp_act  # lazy: the MCP SDK loads only in a process that serves an act's /mcp

    return mcp_act.handle(*args, **kwargs)


class WebConfig(AppConfig):
    """The surfaces: the console, the REST API, the websockets, MCP, sign-in and tokens, ops, the CLI."""

    name = "web"

    def ready(self) -> None:
        from axes.signals import user_locked_out  # lazy: the app registry is not ready when apps.py is read

        from instances import gateway  # lazy: the app registry is not ready when apps.py is read
        from web import accounts  # lazy: the app registry is not ready when apps.py is read

        # An act's MCP endpoint (how a command agent delegates) on every worker's gateway socket.
        gateway.route("/mcp", _act_mcp)
        # A sign-in lockout is in the audit trail, on the locked-out person's page.
        user_locked_out.connect(accounts.on_locked_out, dispatch_uid="tether-locked-out")
