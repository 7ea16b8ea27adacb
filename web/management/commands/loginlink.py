"""`python manage.py loginlink USERNAME` — print a one-time sign-in link.

The link names the address a running `serve` of this TETHER_HOME listens on (it notes it in
$TETHER_HOME/serve.json), else HOST and PORT as `serve` would read them (127.0.0.1:8000). When
that is every interface (HOST=0.0.0.0) it names this machine's LAN address, and says so when Django
would refuse it. A TETHER_HOME without Tether's database is explained, not a traceback.
"""

import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection

from tether import addresses
from web.accounts import login_link
from web.management.commands.serve import read_address


def no_database(exc: Exception) -> CommandError:
    home = settings.TETHER_HOME
    where = (
        f"TETHER_HOME is {home}"
        if "TETHER_HOME" in os.environ
        else f"TETHER_HOME is not set in this terminal, so it is the default, {home}"
    )
    database = connection.settings_dict["NAME"] if connection.vendor == "sqlite" else "the database (DATABASE_URL)"
    return CommandError(
        f"there is no Tether database at {database} ({exc}).\n"
        f"{where}. Run loginlink with the TETHER_HOME (and DATABASE_URL) that `serve` uses, or start\n"
        "Tether once (`make run`, or `python manage.py serve`), which creates the database and prints a\n"
        "first sign-in link."
    )


class Command(BaseCommand):
    help = "Print a one-time sign-in link for USERNAME."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--base-url", help="the server's address (default: the running serve's, or HOST and PORT)")

    def handle(self, username, base_url, **options):
        try:
            user = get_user_model().objects.filter(username=username, is_active=True).first()
        except DatabaseError as exc:
            raise no_database(exc) from None
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        if not base_url:
            running = read_address()
            if running:
                host, port = running["host"], running["port"]
            else:
                host, port = os.environ.get("HOST", "127.0.0.1"), os.environ.get("PORT", "8000")
                if "PORT" not in os.environ:  # a guess: say so
                    self.stderr.write(
                        f"Note: no `serve` is running with TETHER_HOME={settings.TETHER_HOME} and PORT is not "
                        f"set here; the link names port {port}. Pass --base-url if Tether listens elsewhere."
                    )
            base_url = addresses.base_url(host, port)
            if problem := addresses.hint(addresses.reachable_host(host)):
                self.stderr.write(f"WARNING: {problem}")
        self.stdout.write(login_link(user, base_url))
