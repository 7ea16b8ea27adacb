"""`python manage.py loginlink USERNAME` — print a one-time sign-in link.

The link names the address `serve` listens on (HOST, PORT); when that is every interface
(HOST=0.0.0.0) it names this machine's LAN address, and says so when Django would refuse it.
"""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from loops.accounts import login_link
from tether import addresses


class Command(BaseCommand):
    help = "Print a one-time sign-in link for USERNAME."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--base-url", help="the server's address (default: from HOST and PORT)")

    def handle(self, username, base_url, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        if not base_url:
            host = os.environ.get("HOST", "127.0.0.1")
            base_url = addresses.base_url(host, os.environ.get("PORT", "8000"))
            if problem := addresses.hint(addresses.reachable_host(host)):
                self.stderr.write(f"WARNING: {problem}")
        self.stdout.write(login_link(user, base_url))
