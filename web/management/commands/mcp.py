"""`python manage.py mcp --user USERNAME` — Tether's MCP server over stdio, for a local MCP client.

The client starts this command and speaks MCP on its stdin/stdout; every tool call acts as
USERNAME (chosen by the operator who configures the command, since whoever can run
manage.py already holds the server's secrets) and is audited with the interface `mcp`.
Nothing but the protocol is written to stdout; logs go to stderr.
"""

import anyio
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve Tether's run API as MCP tools over stdio, acting as one user."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="the username every tool call acts as")

    def handle(self, user, **options):
        from web.mcp_server import (  # lazy: the MCP SDK loads only when this command runs
            build_server,
            stdio_caller,
        )

        found = get_user_model().objects.filter(username=user).first()
        if found is None:
            raise CommandError(f"no user {user!r}; create one with `python manage.py createsuperuser` or in admin")
        if not found.is_active:
            raise CommandError(f"user {user!r} is not active")
        server = build_server(stdio_caller(found.pk))
        anyio.run(server.run_stdio_async)
